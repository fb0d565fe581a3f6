"""The Responses surface's pure parts: request items read into chat messages
(llmd.api.responses.parse_responses_request) and the bounded, per-key response store."""
import json

import pytest

from llmd.api.responses import ResponseStore, StoredResponse
from llmd.api.responses import parse_responses_request
from llmd.api.validation import Message, ToolCall
from llmd.errors import ApiError


def parse(**fields):
    return parse_responses_request(json.dumps({"model": "m", **fields}).encode())


def refused(**fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    return info.value


def test_a_string_input_is_one_user_message_after_the_instructions():
    req = parse(input="Hi", instructions="Be brief.")
    assert req.chat.messages == [Message("system", "Be brief."), Message("user", "Hi")]
    assert req.input == [Message("user", "Hi")] and req.store is True


def test_function_calls_join_the_assistant_turn_and_outputs_become_tool_messages():
    req = parse(input=[
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}])
    assert req.chat.messages == [
        Message("user", "a\nb"),
        Message("assistant", "Let me look.", None, (ToolCall("c1", "f", "{}"), ToolCall("c2", "g", "{\"x\": 1}"))),
        Message("tool", "one", None, (), "c1"),
        Message("tool", "two", None, (), "c2")]


def test_a_reasoning_item_s_text_is_the_reasoning_of_the_assistant_turn_it_precedes():
    req = parse(input=[
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "Answer."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"type": "reasoning", "id": "rs_3", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]},
        {"role": "user", "content": "Thanks"}])
    assert req.chat.messages == [
        Message("user", "Weather?"),
        Message("assistant", None, None, (ToolCall("c1", "f", "{}"), ToolCall("c2", "g", "{}")), reasoning="Call."),
        Message("tool", "one", None, (), "c1"),
        Message("assistant", "Sunny.", reasoning="Answer."),  # a summary where the item has no text
        Message("user", "Thanks")]  # reasoning before a user turn belongs to no turn


def test_flat_function_tools_and_a_named_tool_choice():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}]
    req = parse(input="x", tools=tools, tool_choice={"type": "function", "name": "f"})
    assert [t.name for t in req.chat.tools] == ["f"]
    assert (req.chat.tool_choice, req.chat.tool_name) == ("required", "f")
    assert req.echo["tools"] == [{"type": "function", "name": "f", "description": None,
                                  "parameters": {"type": "object"}, "strict": True}]
    for choice in ({"type": "function", "name": "g"}, {"type": "function"}):  # named in Responses' shape
        with pytest.raises(ApiError) as info:
            parse(input="x", tools=tools, tool_choice=choice)
        assert info.value.param == "tool_choice.name"


def test_text_format_json_schema_becomes_the_response_format():
    req = parse(input="x", text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}})
    assert req.chat.response_format.type == "json_schema"
    assert req.chat.response_format.schema == {"type": "object"}


def test_sampling_and_token_limit_are_read():
    req = parse(input="x", max_output_tokens=7, temperature=0.5, top_p=0.9, prompt_cache_key="k")
    assert (req.chat.max_tokens, req.chat.sampling.temperature, req.chat.sampling.top_p) == (7, 0.5, 0.9)
    assert req.chat.prompt_cache_key == "k" and req.echo["prompt_cache_key"] == "k"


@pytest.mark.parametrize("fields, param", [
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "reasoning": {"summary": "brief"}}, "reasoning.summary"),
    ({"input": "x", "reasoning": {"depth": 3}}, "reasoning.depth"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include[0]"),
    ({"input": ""}, "input"),
    ({"input": "x", "previous_response_id": 5}, "previous_response_id"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_field(fields, param):
    assert refused(**fields).param == param


def test_model_is_required():
    with pytest.raises(ApiError) as info:
        parse_responses_request(b'{"input": "x"}')
    assert info.value.param == "model"


def test_the_store_keeps_the_most_recently_used_and_answers_only_the_same_key():
    store = ResponseStore(capacity=2)
    item = StoredResponse([Message("user", "hi")], None)
    for rid in ("a", "b", "c"):
        store.put("key1", rid, item)
    assert store.get("key1", "a") is None and store.get("key1", "c") is item
    assert store.get("key2", "c") is None
    assert store.get("key1", "b") is item  # continued: used more recently than "c"
    store.put("key1", "d", item)
    assert store.get("key1", "c") is None and store.get("key1", "b") is item



def test_a_key_that_stores_many_responses_pushes_out_its_own_not_anothers():
    store = ResponseStore(capacity=4)
    item = StoredResponse([Message("user", "hi")], None)
    store.put("quiet", "q1", item, "quiet")  # with API keys, a key is its own group
    for i in range(20):
        store.put("busy", f"b{i}", item, "busy")
    assert store.get("quiet", "q1", "quiet") is item
    assert [store.get("busy", f"b{i}", "busy") is item for i in range(20)] == [False] * 17 + [True] * 3
    store.put("busy", "b19", item, "busy")  # stored again: still one response
    store.put("quiet", "q2", item, "quiet")  # 2 and 2: the largest gives way to the newcomer
    assert store.get("quiet", "q1", "quiet") is item and store.get("quiet", "q2", "quiet") is item
    assert sum(store.get("busy", f"b{i}", "busy") is item for i in range(20)) == 2


def test_without_api_keys_the_store_is_one_group_whatever_scopes_clients_name():
    # a client presenting a new key each time makes a scope each time: no scope is "the largest"
    store = ResponseStore(capacity=4)
    item = StoredResponse([Message("user", "hi")], None)
    for i in range(3):
        store.put("steady", f"s{i}", item)
    for i in range(3):
        store.put(f"junk{i}", "r", item)
    assert [store.get("steady", f"s{i}") is item for i in range(3)] == [False, False, True]
    assert store.get("junk0", "r") is item and store.get("steady", "s2", "other group") is None


def test_output_text_logprobs_are_asked_for_through_include_or_top_logprobs():
    assert parse(input="x").chat.logprobs is None
    assert parse(input="x", include=["message.output_text.logprobs"]).chat.logprobs == 0
    req = parse(input="x", top_logprobs=3)
    assert req.chat.logprobs == 3 and req.echo["top_logprobs"] == 3


def test_reasoning_effort_is_the_templates_reasoning_effort_and_a_summary_asks_for_reasoning():
    req = parse(input="x", reasoning={"effort": "low", "summary": "auto"})
    assert req.chat.template_kwargs == {"reasoning_effort": "low"}
    assert req.chat.template_params["reasoning_effort"] == "reasoning.effort"
    assert (req.chat.reasoning, req.chat.reasoning_param, req.summary) == (True, "reasoning.summary", "auto")
    assert req.echo["reasoning"] == {"effort": "low", "summary": "auto"}
    plain = parse(input="x")
    assert (plain.chat.reasoning, plain.chat.template_kwargs, plain.summary) == (None, {}, None)
    assert parse(input="x", reasoning={"generate_summary": "concise"}).summary == "concise"


# ---- responses/compact ------------------------------------------------------------------------

def test_a_compaction_item_sent_back_becomes_an_assistant_message_with_the_summary():
    from llmd.api.responses import COMPACTED, compaction_content
    req = parse(input=[{"role": "user", "content": "Launch on Tuesday."},
                       {"type": "compaction", "id": "cmp_1", "encrypted_content": compaction_content("Launch: Tue.")},
                       {"role": "user", "content": "When?"}])
    assert req.chat.messages == [Message("user", "Launch on Tuesday."), Message("assistant", COMPACTED + "Launch: Tue."),
                                 Message("user", "When?")]


@pytest.mark.parametrize("content", ["gAAAAABo-foreign-ciphertext", "llmd-compaction-v1:not base64!", 5])
def test_a_compaction_this_server_did_not_make_is_refused_naming_it(content):
    err = refused(input=[{"type": "compaction", "encrypted_content": content}])
    assert err.param == "input[0].encrypted_content"


def test_a_compact_request_asks_for_a_greedy_bounded_summary_after_the_conversation():
    from llmd.api.responses import COMPACT_MAX_TOKENS, COMPACT_PROMPT, parse_compact_request
    req = parse_compact_request(json.dumps({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}).encode())
    assert req.chat.messages == [Message("system", "Be brief."), Message("user", "a"), Message("assistant", "b"),
                                 Message("user", COMPACT_PROMPT)]
    assert req.input == req.chat.messages[1:3] and req.instructions == "Be brief."
    assert (req.chat.sampling.temperature, req.chat.max_tokens, req.chat.stream) == (0.0, COMPACT_MAX_TOKENS, False)
    assert parse_compact_request(b'{"model": "m", "previous_response_id": "resp_1"}').input == []


@pytest.mark.parametrize("body, param", [
    ({"input": "x"}, "model"),
    ({"model": "m"}, "input"),
    ({"model": "m", "input": "x", "stream": True}, "stream"),
    ({"model": "m", "input": "x", "previous_response_id": 3}, "previous_response_id"),
])
def test_bad_compact_requests_are_refused_naming_the_field(body, param):
    from llmd.api.responses import parse_compact_request
    with pytest.raises(ApiError) as info:
        parse_compact_request(json.dumps(body).encode())
    assert info.value.param == param
