import json

import pytest

from llmd.api.chat_completions import parse_chat_request
from llmd.api.completions import parse_completion_request
from llmd.api.validation import (_JSON_STRING, MAX_DEPTH, ChatRequest, CompletionRequest, DetokenizeRequest,
                                 Message, ResponseFormat, Sampling, Speculative, Tool, ToolCall, check_token_ids,
                                 check_vocab, parse_detokenize_request, parse_json_object, parse_tokenize_request)
from llmd.errors import ApiError

USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatRequest:
    body = {"model": "m", "messages": USER, **fields}
    return parse_chat_request(json.dumps(body).encode())


def completion(**fields) -> CompletionRequest:
    body = {"model": "m", "prompt": "Once", **fields}
    return parse_completion_request(json.dumps(body).encode())


def refused(parse, raw) -> ApiError:
    """Parse `raw` (dict or bytes), expect a 400, return the error."""
    body = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    with pytest.raises(ApiError) as info:
        parse(body)
    assert info.value.status == 400
    return info.value


def chat_refused(**fields) -> ApiError:
    return refused(parse_chat_request, {"model": "m", "messages": USER, **fields})


def completion_refused(**fields) -> ApiError:
    return refused(parse_completion_request, {"model": "m", "prompt": "Once", **fields})


# --- JSON body ----------------------------------------------------------------------

def test_minimal_chat_request_gets_openai_defaults():
    req = chat()
    assert req.model == "m"
    assert req.messages == [Message("user", "hi")]
    assert req.sampling == Sampling(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                                    presence_penalty=0.0, frequency_penalty=0.0,
                                    repetition_penalty=1.0, logit_bias={})
    assert (req.max_tokens, req.stop, req.stream, req.include_usage) == (None, [], False, False)
    assert (req.tools, req.tool_choice, req.parallel_tool_calls, req.session_id) == ([], "none", True, None)


@pytest.mark.parametrize("raw", [b"", b"{", b"{'a': 1}", b'{"a": 1,}', b"[1] [2]", b"\xef\xbb\xbf{}"])
def test_invalid_json_is_refused_with_invalid_json(raw):
    assert refused(parse_json_object, raw).code == "invalid_json"


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"s"', b"null", b"true"])
def test_non_object_top_level_is_refused(raw):
    err = refused(parse_json_object, raw)
    assert err.code == "invalid_type"
    assert "object" in err.message


@pytest.mark.parametrize("raw", [b'{"a": "\xff"}', b'{"a": "\xc3"}', b'{"a": "\xed\xa0\x80"}'])
def test_invalid_utf8_is_refused(raw):
    err = refused(parse_json_object, raw)
    assert err.code == "invalid_json" and "UTF-8" in err.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused(literal):
    err = refused(parse_json_object, f'{{"temperature": {literal}}}'.encode())
    assert err.code == "invalid_json" and literal.lstrip("-") in err.message


@pytest.mark.parametrize("number", ["1e400", "-1e400"])
def test_float_overflowing_to_infinity_is_refused(number):
    assert refused(parse_json_object, f'{{"t": {number}}}'.encode()).code == "invalid_json"


def test_integer_with_too_many_digits_is_refused_not_crashed():
    assert refused(parse_json_object, b'{"seed": ' + b"9" * 5000 + b"}").code == "invalid_json"


def test_duplicate_keys_are_refused():
    err = refused(parse_json_object, b'{"model": "a", "model": "b"}')
    assert err.code == "invalid_json" and "'model'" in err.message


def test_duplicate_keys_in_nested_objects_are_refused():
    assert refused(parse_json_object, b'{"x": [{"k": 1, "k": 2}]}').code == "invalid_json"


def nested(depth: int) -> bytes:
    # depth counts the top-level object: {"a": [[...]]} with depth-1 arrays
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def depth_of(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    return 0


def test_nesting_at_the_depth_limit_is_accepted():
    assert depth_of(parse_json_object(nested(MAX_DEPTH))) == MAX_DEPTH


def test_nesting_one_over_the_depth_limit_is_refused():
    err = refused(parse_json_object, nested(MAX_DEPTH + 1))
    assert err.code == "invalid_json" and "deeper" in err.message


def test_very_deep_nesting_is_refused_without_recursion_error():
    err = refused(parse_json_object, b'{"a": ' + b"[" * 1_000_000 + b"]" * 1_000_000 + b"}")
    assert err.code == "invalid_json"


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = "[" * 500 + '\\"{' * 100
    assert parse_json_object(json.dumps({"content": text}).encode()) == {"content": text}


@pytest.mark.parametrize("tail", ['"' + '\\"' * 4000, '"' + '\\"' * 4000 + "\\", '"' + '[\\"{' * 4000])
def test_an_unterminated_string_is_read_once_not_from_each_quote(tail):
    # The nesting check's string pattern matches from any quote to the end, so it is
    # never retried from each later quote (quadratic: a 68 KB body held the event loop
    # for 12 s); json.loads then refuses the body.
    assert _JSON_STRING.match(tail).end() == len(tail)
    assert refused(parse_json_object, ('{"a": ' + "[" * 70 + tail).encode()).code == "invalid_json"


def test_lone_surrogate_escape_is_refused():
    assert refused(parse_json_object, b'{"content": "a\\ud800b"}').code == "invalid_json"
    assert refused(parse_json_object, b'{"x": ["\\uDC00"]}').code == "invalid_json"


def test_surrogate_pair_escape_is_one_character():
    assert parse_json_object(b'{"c": "\\ud83d\\ude00"}') == {"c": "\U0001F600"}


def test_escaped_backslash_before_u_is_not_a_surrogate():
    assert parse_json_object(b'{"c": "\\\\ud800"}') == {"c": "\\ud800"}


# --- unknown, ignored and unsupported fields --------------------------------------------

def test_unknown_top_level_field_is_refused_naming_it():
    err = chat_refused(n_predict=5)
    assert (err.param, err.code) == ("n_predict", "unknown_parameter")


@pytest.mark.parametrize("key, value", [
    ("user", "u1"), ("metadata", {"a": "b"}), ("store", False), ("service_tier", "auto"),
    ("prompt_cache_key", "k"), ("safety_identifier", "s")])
def test_fields_with_no_effect_on_output_are_accepted(key, value):
    assert chat(**{key: value}).model == "m"


def test_user_must_be_a_string():
    assert chat_refused(user=5).param == "user"


@pytest.mark.parametrize("key, value", [
    ("audio", {"voice": "alloy", "format": "wav"}), ("prediction", {"type": "content", "content": "x"}),
    ("functions", [{"name": "f"}]), ("function_call", "auto"), ("web_search_options", {}),
    ("verbosity", "low")])
def test_known_but_unsupported_fields_are_refused(key, value):
    err = chat_refused(**{key: value})
    assert (err.param, err.code) == (key, "unsupported_parameter")


def test_chat_template_kwargs_and_reasoning_effort_become_template_variables():
    req = chat(chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low")
    assert req.template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    assert chat().template_kwargs == {}
    assert chat_refused(chat_template_kwargs=["x"]).param == "chat_template_kwargs"
    assert chat_refused(reasoning_effort="extreme").param == "reasoning_effort"
    assert chat_refused(reasoning_effort=1).param == "reasoning_effort"


def test_known_but_unsupported_fields_set_to_null_are_accepted():
    assert chat(audio=None, functions=None).model == "m"


def test_null_means_default_for_optional_fields():
    req = chat(temperature=None, max_tokens=None, stop=None, stream=None, tools=None)
    assert (req.sampling.temperature, req.max_tokens, req.stop, req.stream) == (1.0, None, [], False)


def test_modalities_text_is_accepted_and_audio_refused():
    assert chat(modalities=["text"]).model == "m"
    assert chat_refused(modalities=["text", "audio"]).code == "unsupported_parameter"


# --- model and messages ------------------------------------------------------------------

def test_model_is_required():
    err = refused(parse_chat_request, {"messages": USER})
    assert (err.param, err.code) == ("model", "missing_required_parameter")


def test_model_must_be_a_string():
    err = chat_refused(model=3)
    assert (err.param, err.code) == ("model", "invalid_type")


def test_messages_are_required_and_non_empty():
    assert refused(parse_chat_request, {"model": "m"}).param == "messages"
    assert chat_refused(messages=[]).param == "messages"
    assert chat_refused(messages={"role": "user"}).code == "invalid_type"


def test_message_must_be_an_object():
    assert chat_refused(messages=["hi"]).param == "messages[0]"


def test_every_role_is_accepted():
    msgs = [{"role": "system", "content": "s"}, {"role": "developer", "content": "d"},
            {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
            {"role": "tool", "content": "t", "tool_call_id": "c1"}]
    assert [m.role for m in chat(messages=msgs).messages] == ["system", "developer", "user",
                                                               "assistant", "tool"]


def test_invalid_role_is_refused_naming_the_message():
    err = chat_refused(messages=USER + [{"role": "robot", "content": "x"}])
    assert (err.param, err.code) == ("messages[1].role", "invalid_value")


def test_missing_role_is_refused():
    assert chat_refused(messages=[{"content": "x"}]).param == "messages[0].role"


def test_legacy_function_role_is_unsupported():
    err = chat_refused(messages=[{"role": "function", "name": "f", "content": "x"}])
    assert (err.param, err.code) == ("messages[0].role", "unsupported_parameter")


def test_content_of_wrong_type_names_the_message_content():
    err = chat_refused(messages=USER + [{"role": "user", "content": 5}])
    assert (err.param, err.code) == ("messages[1].content", "invalid_type")


def test_user_content_is_required():
    err = chat_refused(messages=[{"role": "user"}])
    assert (err.param, err.code) == ("messages[0].content", "missing_required_parameter")
    assert chat_refused(messages=[{"role": "user", "content": None}]).param == "messages[0].content"


def test_empty_string_content_is_accepted():
    assert chat(messages=[{"role": "user", "content": ""}]).messages[0].content == ""


def test_text_parts_are_joined_with_newlines():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert chat(messages=[{"role": "user", "content": parts}]).messages[0].content == "a\nb"


def test_extra_keys_in_a_text_part_are_ignored():
    parts = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]
    assert chat(messages=[{"role": "user", "content": parts}]).messages[0].content == "a"


@pytest.mark.parametrize("part", [
    {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
    {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
    {"type": "file", "file": {"file_id": "f"}}])
def test_non_text_content_parts_are_unsupported_naming_the_part(part):
    msgs = USER + USER + [{"role": "user", "content": [part]}]
    err = chat_refused(messages=msgs)
    assert (err.param, err.code) == ("messages[2].content[0].type", "unsupported_parameter")


def test_unknown_part_type_is_invalid():
    err = chat_refused(messages=[{"role": "user", "content": [{"type": "blob"}]}])
    assert (err.param, err.code) == ("messages[0].content[0].type", "invalid_value")


def test_text_part_needs_string_text():
    err = chat_refused(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}])
    assert err.param == "messages[0].content[0].text"


def test_assistant_with_tool_calls_may_have_null_content():
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{\"a\":1}"}}
    msgs = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    req = chat(messages=msgs)
    assert req.messages[1] == Message("assistant", None, None, (ToolCall("c1", "get", "{\"a\":1}"),))
    assert req.messages[2] == Message("tool", "42", tool_call_id="c1")


def test_assistant_without_content_or_tool_calls_is_refused():
    err = chat_refused(messages=USER + [{"role": "assistant", "content": None}])
    assert err.param == "messages[1].content"


def test_tool_call_arguments_must_be_a_string():
    call = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"a": 1}}}
    err = chat_refused(messages=USER + [{"role": "assistant", "tool_calls": [call]}])
    assert (err.param, err.code) == ("messages[1].tool_calls[0].function.arguments", "invalid_type")


def test_tool_call_needs_an_id():
    call = {"type": "function", "function": {"name": "get", "arguments": "{}"}}
    err = chat_refused(messages=USER + [{"role": "assistant", "tool_calls": [call]}])
    assert err.param == "messages[1].tool_calls[0].id"


def test_tool_calls_on_a_user_message_are_refused():
    err = chat_refused(messages=[{"role": "user", "content": "x", "tool_calls": []}])
    assert err.param == "messages[0].tool_calls"


def test_tool_message_needs_tool_call_id():
    err = chat_refused(messages=USER + [{"role": "tool", "content": "42"}])
    assert (err.param, err.code) == ("messages[1].tool_call_id", "missing_required_parameter")


def test_echoed_response_fields_on_messages_are_ignored_but_an_assistant_s_reasoning_is_kept():
    msg = {"role": "assistant", "content": "x", "refusal": None, "annotations": [],
           "reasoning_content": "because"}
    assert chat(messages=USER + [msg]).messages[1] == Message("assistant", "x", reasoning="because")
    # as llama.cpp reads it: a string on an assistant message, else nothing
    assert chat(messages=USER + [{**msg, "reasoning_content": None}]).messages[1] == Message("assistant", "x")
    user = {"role": "user", "content": "x", "reasoning_content": "because"}
    assert chat(messages=[user]).messages[0] == Message("user", "x")


def test_non_null_message_audio_is_unsupported():
    err = chat_refused(messages=USER + [{"role": "assistant", "content": "x", "audio": {"id": "a"}}])
    assert (err.param, err.code) == ("messages[1].audio", "unsupported_parameter")


def test_message_name_is_kept_and_type_checked():
    assert chat(messages=[{"role": "user", "content": "x", "name": "bob"}]).messages[0].name == "bob"
    assert chat_refused(messages=[{"role": "user", "content": "x", "name": 1}]).param == "messages[0].name"


# --- sampling ranges: at the bound and one over -----------------------------------------

@pytest.mark.parametrize("param, ok, bad", [
    ("temperature", [0, 0.0, 2, 2.0, 0.7], [-0.01, 2.0001, 3]),
    ("top_p", [0, 1, 1.0, 0.5], [-0.1, 1.01, 2]),
    ("min_p", [0, 1, 0.05], [-0.01, 1.5]),
    ("presence_penalty", [-2, 2, 0.5], [-2.01, 2.01]),
    ("frequency_penalty", [-2, 2, -1.5], [-2.5, 2.000001]),
    ("repetition_penalty", [1e-6, 0.0001, 1, 1.3, 1e9], [0, -1, 1e-300, 9.9e-7, 1.0001e9]),
])
def test_number_ranges_are_inclusive_at_the_bounds(param, ok, bad):
    for v in ok:
        assert getattr(chat(**{param: v}).sampling, param) == float(v)
        assert isinstance(getattr(chat(**{param: v}).sampling, param), float)
    for v in bad:
        err = chat_refused(**{param: v})
        assert (err.param, err.code) == (param, "invalid_value"), v


@pytest.mark.parametrize("param", ["temperature", "top_p", "min_p", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty"])
@pytest.mark.parametrize("value", [True, False, "0.5", [1], {"v": 1}])
def test_numbers_of_wrong_type_are_refused_naming_the_param(param, value):
    err = chat_refused(**{param: value})
    assert (err.param, err.code) == (param, "invalid_type")


@pytest.mark.parametrize("param", ["temperature", "top_p", "repetition_penalty"])
def test_huge_integers_are_out_of_range_not_crashes(param):
    err = chat_refused(**{param: 10**300})
    assert (err.param, err.code) == (param, "invalid_value")
    assert len(err.message) < 300


def test_top_k_is_a_non_negative_integer():
    assert chat(top_k=0).sampling.top_k == 0
    assert chat(top_k=40).sampling.top_k == 40
    assert chat(top_k=2**31 - 1).sampling.top_k == 2**31 - 1
    assert chat_refused(top_k=-1).code == "invalid_value"
    assert chat_refused(top_k=2**31).code == "invalid_value"
    assert chat_refused(top_k=40.0).code == "invalid_type"
    assert chat_refused(top_k=True).code == "invalid_type"


def test_seed_is_an_int64():
    assert chat(seed=42).sampling.seed == 42
    assert chat(seed=-2**63).sampling.seed == -2**63
    assert chat(seed=2**63 - 1).sampling.seed == 2**63 - 1
    assert chat_refused(seed=2**63).param == "seed"
    assert chat_refused(seed=-2**63 - 1).param == "seed"
    assert chat_refused(seed=1.5).code == "invalid_type"
    assert chat_refused(seed=True).code == "invalid_type"


def test_bool_is_not_an_int_for_counts():
    assert chat_refused(max_tokens=True).code == "invalid_type"
    assert chat_refused(n=True).code == "invalid_type"


def test_logit_bias_maps_token_ids_to_floats():
    assert chat(logit_bias={"15": 100, "0": -100, "7": 0.5}).sampling.logit_bias == {15: 100.0, 0: -100.0, 7: 0.5}


@pytest.mark.parametrize("bias, param", [
    ({"15": 100.01}, "logit_bias.15"), ({"15": -101}, "logit_bias.15"),
    ({"abc": 1}, "logit_bias"), ({"-1": 1}, "logit_bias"), ({"07": 1}, "logit_bias"),
    ({" 7": 1}, "logit_bias"), ({"1.5": 1}, "logit_bias"), ({"99999999999": 1}, "logit_bias")])
def test_logit_bias_out_of_range_or_bad_key_is_refused(bias, param):
    err = chat_refused(logit_bias=bias)
    assert (err.param, err.code) == (param, "invalid_value")


def test_logit_bias_of_wrong_type_is_refused():
    assert chat_refused(logit_bias=[1]).code == "invalid_type"
    assert chat_refused(logit_bias={"1": "5"}).code == "invalid_type"
    assert chat_refused(logit_bias={"1": True}).code == "invalid_type"


# --- max tokens, stop, n ---------------------------------------------------------------

def test_max_tokens_lower_bound_is_one():
    assert chat(max_tokens=1).max_tokens == 1
    assert chat_refused(max_tokens=0).param == "max_tokens"
    assert chat_refused(max_completion_tokens=0).param == "max_completion_tokens"


def test_max_tokens_upper_bound_is_int32():
    assert chat(max_tokens=2**31 - 1).max_tokens == 2**31 - 1
    assert chat_refused(max_tokens=2**31).code == "invalid_value"


def test_max_completion_tokens_is_used():
    assert chat(max_completion_tokens=7).max_tokens == 7


def test_max_tokens_and_max_completion_tokens_must_agree():
    assert chat(max_tokens=7, max_completion_tokens=7).max_tokens == 7
    assert chat_refused(max_tokens=7, max_completion_tokens=8).param == "max_tokens"


def test_max_tokens_float_is_refused():
    assert chat_refused(max_tokens=10.0).code == "invalid_type"


def test_stop_accepts_a_string_or_up_to_four_strings():
    assert chat(stop="\n").stop == ["\n"]
    assert chat(stop=["a", "b", "c", "d"]).stop == ["a", "b", "c", "d"]
    assert chat(stop=[]).stop == []


def test_stop_with_five_strings_is_refused():
    assert chat_refused(stop=["a", "b", "c", "d", "e"]).param == "stop"


def test_empty_stop_string_is_refused():
    assert chat_refused(stop="").param == "stop"
    assert chat_refused(stop=["a", ""]).param == "stop[1]"


def test_stop_of_wrong_type_is_refused():
    assert chat_refused(stop=5).code == "invalid_type"
    err = chat_refused(stop=["a", 5])
    assert (err.param, err.code) == ("stop[1]", "invalid_type")


def test_n_is_read_up_to_16_choices():
    assert chat().n == 1 and chat(n=4).n == 4 and completion(n=16).n == 16
    assert chat_refused(n=17).code == "invalid_value"
    assert chat_refused(n=0).code == "invalid_value"


# --- streaming, logprobs, response_format ---------------------------------------------

def test_stream_and_include_usage():
    req = chat(stream=True, stream_options={"include_usage": True})
    assert (req.stream, req.include_usage) == (True, True)
    assert chat(stream=True, stream_options={}).include_usage is False


def test_stream_must_be_a_bool():
    assert chat_refused(stream=1).code == "invalid_type"
    assert chat_refused(stream="true").param == "stream"


def test_stream_options_are_validated():
    assert chat_refused(stream_options=True).param == "stream_options"
    assert chat_refused(stream_options={"include_usage": 1}).param == "stream_options.include_usage"
    err = chat_refused(stream_options={"continuous_usage_stats": True})
    assert (err.param, err.code) == ("stream_options.continuous_usage_stats", "unknown_parameter")
    assert chat(stream=True, stream_options={"include_obfuscation": False}).stream is True


def test_chat_logprobs_give_the_top_count_or_none():
    assert chat(logprobs=False).logprobs is None and chat().logprobs is None
    assert chat(logprobs=True).logprobs == 0
    assert chat(logprobs=True, top_logprobs=20).logprobs == 20
    assert chat_refused(logprobs=1).code == "invalid_type"


def test_top_logprobs_needs_logprobs_and_at_most_20():
    assert chat_refused(top_logprobs=1).param == "top_logprobs"
    assert chat_refused(logprobs=True, top_logprobs=21).code == "invalid_value"


def test_llama_cpp_n_probs_are_top_logprobs():
    assert chat(n_probs=3).logprobs == 3 and chat(n_probs=0).logprobs is None
    assert completion(n_probs=5).logprobs == 5
    assert chat_refused(n_probs=21).code == "invalid_value"


def test_llama_cpp_fields_that_cost_nothing_are_accepted():
    req = chat(cache_prompt=True, id_slot=-1, timings_per_token=True, return_progress=False)
    assert req.timings_per_token is True and req.return_progress is False
    assert chat(return_progress=True).return_progress is True
    assert completion(return_progress=True).return_progress is True
    assert chat_refused(cache_prompt="yes").code == "invalid_type"
    assert completion_refused(return_progress="yes").param == "return_progress"


def test_speculative_decoding_is_asked_for_as_llama_cpp_does():
    assert chat().speculative == Speculative(True, None, None)
    assert chat(speculative=False).speculative.enabled is False
    assert completion(**{"speculative.n_max": 8, "speculative.n_min": 2}).speculative == Speculative(True, 8, 2)
    assert chat(**{"speculative.n_max": 0}).speculative.n_max == 0
    assert chat_refused(speculative="no").param == "speculative"
    assert chat_refused(**{"speculative.n_max": 33}).code == "invalid_value"
    assert completion_refused(**{"speculative.n_min": -1}).param == "speculative.n_min"
    assert chat_refused(**{"speculative.n_max": 2.5}).param == "speculative.n_max"
    err = chat_refused(**{"speculative.n_max": 2, "speculative.n_min": 3})
    assert err.param == "speculative.n_min" and "n_max" in err.message
    assert chat_refused(**{"speculative.p_min": 0.5}).code == "unknown_parameter"


def test_id_slot_is_refused_pointing_to_session_id():
    err = chat_refused(id_slot=2)
    assert err.param == "id_slot" and "session_id" in err.message


def test_prompt_cache_retention_values_are_validated():
    assert chat(prompt_cache_retention="24h").model == "m"
    assert completion(prompt_cache_retention="in_memory").model == "m"
    assert chat_refused(prompt_cache_retention="long").param == "prompt_cache_retention"


def test_response_formats_are_parsed():
    assert chat().response_format is None
    assert chat(response_format={"type": "text"}).response_format == ResponseFormat("text")
    assert chat(response_format={"type": "json_object"}).response_format == ResponseFormat("json_object")
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    spec = {"name": "answer", "schema": schema, "strict": True, "description": "An answer."}
    rf = chat(response_format={"type": "json_schema", "json_schema": spec}).response_format
    assert rf == ResponseFormat("json_schema", schema)
    assert chat(response_format={"type": "json_schema", "json_schema": {"name": "a"}}).response_format.schema == {}
    assert completion(response_format={"type": "json_object"}).response_format == ResponseFormat("json_object")


def test_malformed_response_formats_name_the_field():
    assert chat_refused(response_format={"type": "xml"}).param == "response_format.type"
    assert chat_refused(response_format="text").code == "invalid_type"
    err = chat_refused(response_format={"type": "json_schema"})
    assert (err.param, err.code) == ("response_format.json_schema", "missing_required_parameter")
    err = chat_refused(response_format={"type": "json_schema", "json_schema": {"schema": {}}})
    assert err.param == "response_format.json_schema.name"
    err = chat_refused(response_format={"type": "json_schema", "json_schema": {"name": "a b"}})
    assert (err.param, err.code) == ("response_format.json_schema.name", "invalid_value")
    err = chat_refused(response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": 1}})
    assert (err.param, err.code) == ("response_format.json_schema.schema", "invalid_type")
    err = chat_refused(response_format={"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}})
    assert err.param == "response_format.json_schema.strict"
    err = chat_refused(response_format={"type": "json_object", "json_schema": {"name": "a"}})
    assert (err.param, err.code) == ("response_format.json_schema", "unknown_parameter")
    err = chat_refused(response_format={"type": "json_schema", "json_schema": {"name": "a", "regex": "x"}})
    assert err.param == "response_format.json_schema.regex"


# --- tools -----------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                             "parameters": {"type": "object", "properties": {}}}}


def test_tools_are_parsed_and_tool_choice_defaults_to_auto():
    req = chat(tools=[WEATHER])
    assert req.tools == [Tool("get_weather", "Weather.", {"type": "object", "properties": {}})]
    assert req.tool_choice == "auto"


def test_tool_choice_none_and_auto():
    assert chat(tools=[WEATHER], tool_choice="none").tool_choice == "none"
    assert chat(tools=[WEATHER], tool_choice="auto").tool_choice == "auto"
    assert chat(tool_choice="auto").tool_choice == "none"  # nothing to call


def test_tool_choice_required_and_named():
    req = chat(tools=[WEATHER], tool_choice="required")
    assert (req.tool_choice, req.tool_name) == ("required", None)
    req = chat(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert (req.tool_choice, req.tool_name) == ("required", "get_weather")


def test_tool_choice_invalid_values():
    assert chat_refused(tool_choice="sometimes").code == "invalid_value"
    assert chat_refused(tool_choice=1).code == "invalid_type"
    assert chat_refused(tool_choice="required").param == "tool_choice"  # no tools to call
    err = chat_refused(tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert (err.param, err.code) == ("tool_choice.function.name", "invalid_value")
    err = chat_refused(tools=[WEATHER], tool_choice={"type": "function"})
    assert (err.param, err.code) == ("tool_choice.function", "missing_required_parameter")
    assert chat_refused(tools=[WEATHER], tool_choice={"type": "web"}).param == "tool_choice.type"
    err = chat_refused(tools=[WEATHER], tool_choice={"type": "allowed_tools", "allowed_tools": {}})
    assert (err.param, err.code) == ("tool_choice", "unsupported_parameter")


@pytest.mark.parametrize("name", ["", "a" * 65, "get weather", "get.weather", "wé"])
def test_invalid_tool_names_are_refused(name):
    tool = {"type": "function", "function": {"name": name}}
    err = chat_refused(tools=[tool])
    assert (err.param, err.code) == ("tools[0].function.name", "invalid_value")


def test_tool_name_at_64_characters_is_accepted():
    tool = {"type": "function", "function": {"name": "a-_9" * 16}}
    assert chat(tools=[tool]).tools[0].name == "a-_9" * 16


def test_duplicate_tool_names_are_refused():
    err = chat_refused(tools=[WEATHER, WEATHER])
    assert err.param == "tools[1].function.name" and "duplicate" in err.message


def test_tool_structure_errors_name_the_field():
    assert chat_refused(tools={}).code == "invalid_type"
    assert chat_refused(tools=[{"function": {"name": "f"}}]).param == "tools[0].type"
    assert chat_refused(tools=[{"type": "function"}]).param == "tools[0].function"
    err = chat_refused(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}])
    assert (err.param, err.code) == ("tools[0].function.parameters", "invalid_type")


def test_non_function_tool_type_is_unsupported():
    err = chat_refused(tools=[{"type": "custom", "custom": {"name": "x"}}])
    assert (err.param, err.code) == ("tools[0].type", "unsupported_parameter")


def test_strict_tool_is_accepted_since_arguments_are_constrained():
    tool = {"type": "function", "function": {"name": "f", "strict": True}}
    assert chat(tools=[tool]).tools == [Tool("f")]
    tool["function"]["strict"] = "yes"
    assert chat_refused(tools=[tool]).param == "tools[0].function.strict"


def test_parallel_tool_calls_is_a_bool():
    assert chat(parallel_tool_calls=False).parallel_tool_calls is False
    assert chat_refused(parallel_tool_calls="no").code == "invalid_type"


# --- session_id ---------------------------------------------------------------------------

def test_session_id_string_is_passed_through():
    assert chat(session_id="conv-1").session_id == "conv-1"
    assert completion(session_id="conv 1").session_id == "conv 1"  # checked by the sessions layer


def test_session_id_of_wrong_type_is_invalid_session_id():
    err = chat_refused(session_id=7)
    assert (err.param, err.code) == ("session_id", "invalid_session_id")


# --- completions ----------------------------------------------------------------------------

def test_minimal_completion_defaults_max_tokens_to_16():
    req = completion()
    assert (req.model, req.prompt, req.max_tokens, req.stop, req.stream) == ("m", "Once", 16, [], False)
    assert req.sampling == Sampling()


@pytest.mark.parametrize("prompt, expected", [
    ("text", "text"), ([1, 2, 3], [1, 2, 3]), (["text"], "text"), ([[4, 5]], [4, 5]), ([0], [0])])
def test_completion_prompt_forms(prompt, expected):
    assert completion(prompt=prompt).prompt == expected


@pytest.mark.parametrize("prompt", [["a", "b"], [[1], [2]], ["a", [1]]])
def test_batched_prompts_are_unsupported(prompt):
    err = completion_refused(prompt=prompt)
    assert (err.param, err.code) == ("prompt", "unsupported_parameter")


@pytest.mark.parametrize("prompt, param", [
    ("", "prompt"), ([], "prompt"), ([""], "prompt[0]"), ([[]], "prompt[0]")])
def test_empty_prompts_are_refused(prompt, param):
    err = completion_refused(prompt=prompt)
    assert (err.param, err.code) == (param, "invalid_value")


@pytest.mark.parametrize("prompt, param, code", [
    ([1, -1], "prompt[1]", "invalid_value"), ([1, True], "prompt[1]", "invalid_type"),
    ([1, 2.0], "prompt[1]", "invalid_type"), ([[1, "a"]], "prompt[0][1]", "invalid_type"),
    (5, "prompt", "invalid_type"), ({"t": 1}, "prompt", "invalid_type"),
    ([1, "a"], "prompt[1]", "invalid_type")])
def test_bad_prompt_token_ids_are_refused(prompt, param, code):
    err = completion_refused(prompt=prompt)
    assert (err.param, err.code) == (param, code)


def test_completion_prompt_is_required():
    err = refused(parse_completion_request, {"model": "m"})
    assert (err.param, err.code) == ("prompt", "missing_required_parameter")


def test_completion_refuses_what_it_cannot_honour():
    assert completion_refused(suffix="end", echo=True).param == "suffix"  # the model's markers: test_infill
    assert completion_refused(best_of=2).param == "best_of"
    assert completion(suffix="end").suffix == "end"


def test_completion_echo_and_logprobs_are_read():
    req = completion(echo=True, logprobs=5, max_tokens=0)
    assert (req.echo, req.logprobs, req.max_tokens) == (True, 5, 0)
    assert completion_refused(max_tokens=0).param == "max_tokens"


def test_completion_accepts_the_neutral_values():
    req = completion(echo=False, suffix=None, best_of=1, logprobs=None, n=1)
    assert req.prompt == "Once"


def test_completion_wrong_types():
    assert completion_refused(echo=0).code == "invalid_type"
    assert completion_refused(best_of=1.0).code == "invalid_type"
    assert completion_refused(logprobs=True).code == "invalid_type"
    assert completion_refused(logprobs=21).code == "invalid_value"


def test_completion_does_not_accept_chat_only_fields():
    for key, value in [("messages", USER), ("tools", []), ("max_completion_tokens", 5)]:
        assert completion_refused(**{key: value}).code == "unknown_parameter"


def test_completion_sampling_fields_are_shared_with_chat():
    req = completion(temperature=0, top_k=5, seed=3, stop=["\n"], max_tokens=4,
                     stream=True, stream_options={"include_usage": True})
    assert (req.sampling.temperature, req.sampling.top_k, req.sampling.seed) == (0.0, 5, 3)
    assert (req.stop, req.max_tokens, req.stream, req.include_usage) == (["\n"], 4, True, True)
    assert completion_refused(temperature=2.5).param == "temperature"


# --- tokenize / detokenize ---------------------------------------------------------------------

def test_tokenize_request():
    req = parse_tokenize_request(b'{"content": "Hello", "add_special": true}')
    assert (req.content, req.add_special, req.with_pieces) == ("Hello", True, False)
    assert parse_tokenize_request(b'{"content": "", "with_pieces": true}').with_pieces is True


def test_tokenize_request_errors():
    assert refused(parse_tokenize_request, {}).param == "content"
    assert refused(parse_tokenize_request, {"content": 1}).code == "invalid_type"
    assert refused(parse_tokenize_request, {"content": "a", "add_special": 1}).param == "add_special"
    assert refused(parse_tokenize_request, {"content": "a", "parse_special": True}).code == "unknown_parameter"


def test_detokenize_request():
    assert parse_detokenize_request(b'{"tokens": [1, 2, 0]}') == DetokenizeRequest([1, 2, 0])
    assert parse_detokenize_request(b'{"tokens": []}') == DetokenizeRequest([])


def test_detokenize_request_errors():
    assert refused(parse_detokenize_request, {}).param == "tokens"
    assert refused(parse_detokenize_request, {"tokens": "1 2"}).code == "invalid_type"
    assert refused(parse_detokenize_request, {"tokens": [1, -2]}).param == "tokens[1]"
    assert refused(parse_detokenize_request, {"tokens": [1, False]}).code == "invalid_type"


# --- vocabulary checks ------------------------------------------------------------------------

def test_check_token_ids_accepts_ids_below_n_vocab():
    check_token_ids([0, 49151], 49152, "prompt")


def test_check_token_ids_refuses_n_vocab_and_names_the_index():
    with pytest.raises(ApiError) as info:
        check_token_ids([0, 49152], 49152, "prompt")
    assert (info.value.param, info.value.code) == ("prompt[1]", "invalid_value")


def test_check_vocab_covers_prompt_ids_logit_bias_and_detokenize():
    check_vocab(completion(prompt=[1, 99], logit_bias={"99": 1}), 100)
    with pytest.raises(ApiError) as info:
        check_vocab(completion(prompt=[1, 100]), 100)
    assert info.value.param == "prompt[1]"
    with pytest.raises(ApiError) as info:
        check_vocab(chat(logit_bias={"100": 1}), 100)
    assert info.value.param == "logit_bias"
    with pytest.raises(ApiError) as info:
        check_vocab(DetokenizeRequest([5, 100]), 100)
    assert info.value.param == "tokens[1]"


def test_check_vocab_ignores_text_prompts():
    check_vocab(completion(prompt="text"), 1)


def test_embeddings_inputs_are_one_or_many_texts_or_id_lists():
    from llmd.api.embeddings import parse_embeddings_request
    parse = lambda **f: parse_embeddings_request(json.dumps({"model": "m", **f}).encode())
    assert parse(input="a").inputs == ["a"]
    assert parse(input=["a", "b"]).inputs == ["a", "b"]
    assert parse(input=[1, 2]).inputs == [[1, 2]]
    assert parse(input=[[1], [2, 3]], encoding_format="base64").encoding_format == "base64"
    with pytest.raises(ApiError) as info:
        parse(input=[])
    assert info.value.param == "input"
    assert parse(input="a", dimensions=8).dimensions == 8 and parse(input="a").dimensions is None
    with pytest.raises(ApiError) as info:
        parse(input="a", dimensions=0)
    assert info.value.param == "dimensions"
    with pytest.raises(ApiError) as info:
        parse(input=["a"] * 2049)
    assert info.value.param == "input" and "2048" in info.value.message


def test_chat_reasoning_object_sets_the_effort_and_asks_for_the_reasoning():
    req = chat(reasoning={"effort": "low", "summary": "auto"})
    assert req.template_kwargs == {"reasoning_effort": "low"} and req.template_params == {
        "reasoning_effort": "reasoning.effort"}
    assert (req.reasoning, req.reasoning_param) == (True, "reasoning.summary")
    assert chat(reasoning_effort="low", reasoning={"effort": "low"}).template_kwargs == {"reasoning_effort": "low"}
    assert chat_refused(reasoning_effort="low", reasoning={"effort": "high"}).param == "reasoning.effort"
    assert chat_refused(reasoning={"summary": "short"}).param == "reasoning.summary"
    assert chat().reasoning is None


@pytest.mark.parametrize("arguments, ok", [('{"city": "\\ud800"}', False), ('{"city": "\\ud83d\\ude00"}', True),
                                           ('not json \\ud800', True)])
def test_tool_call_arguments_whose_json_holds_a_lone_surrogate_are_refused(arguments, ok):
    # the body may not hold one; arguments are JSON inside a string, decoded later (500)
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                      "function": {"name": "w", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    if ok:
        assert chat(messages=messages).messages[1].tool_calls[0].arguments == arguments
    else:
        err = chat_refused(messages=messages)
        assert err.param == "messages[1].tool_calls[0].function.arguments" and "surrogate" in err.message
