"""llmd/structured/constrain.py: the grammar of a request's output (response_format, tool calls),
checked by running it over texts (llmd_grammar_match) and by the 400s it raises."""
import json

import pytest

from llmd.api.chat_completions import parse_chat_request
from llmd.api.completions import parse_completion_request
from llmd.engine.native import grammar_match
from llmd.errors import ApiError
from llmd.prompt.tool_calls import CALL_ARGUMENTS, CALL_HEAD, CALL_SEPARATOR, CALL_TAIL, CLOSE_TAG, OPEN_TAG, parse_tool_calls
from llmd.structured import constrain

NO, PREFIX, MAY_END, COMPLETE = 0, 1, 2, 3
USER = [{"role": "user", "content": "hi"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def chat_grammar(**fields):
    return constrain.chat_grammar(parse_chat_request(json.dumps({"model": "m", "messages": USER, **fields}).encode()))


def match(grammar, text):
    return grammar_match(grammar, text.encode())


def block(name, arguments):
    return OPEN_TAG + CALL_HEAD + name + CALL_ARGUMENTS + arguments + CALL_TAIL + CLOSE_TAG


def test_a_reply_that_starts_inside_a_reasoning_block_thinks_first():
    """With the prompt's reasoning block open (Qwen3.5's, Nemotron's generation prompts
    end with <think>), the model thinks freely, closes the block, and only then does the
    constraint apply: the JSON or the call lands in the content, not in the reasoning."""
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    for fields, answer in [({"response_format": schema}, '{"a": 1}'),
                           ({"tools": [WEATHER], "tool_choice": "required"}, block("get_weather", '{"city": "Oslo"}'))]:
        req = parse_chat_request(json.dumps({"model": "m", "messages": USER, **fields}).encode())
        g = constrain.chat_grammar(req, thinking=True)
        assert match(g, "Rome is a <b>city</b>.\nSo:</think>\n\n" + answer) >= MAY_END
        assert match(g, "</think>" + answer) >= MAY_END
        assert match(g, answer) == PREFIX                              # still thinking: any text may follow
        assert match(g, "a</think>b</think>" + answer) == NO           # the block closes once
        assert match(g, "</think>\n\nSure: " + answer) == NO          # then the constraint holds
        assert constrain.chat_grammar(req) != g


def test_nothing_to_constrain_is_no_grammar():
    assert chat_grammar() is None
    assert chat_grammar(response_format={"type": "text"}) is None
    assert chat_grammar(tools=[WEATHER], tool_choice="none") is None
    body = {"model": "m", "prompt": "x"}
    assert constrain.completion_grammar(parse_completion_request(json.dumps(body).encode())) is None


def test_json_object_is_an_object_and_completes_with_its_brace():
    g = chat_grammar(response_format={"type": "json_object"})
    assert match(g, '{"a": [1, {"b": null}]}') == COMPLETE
    assert match(g, '{"a": ') == PREFIX
    assert match(g, "[1]") == NO and match(g, '"s"') == NO


def test_json_schema_response_format_on_chat_and_completions():
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    g = chat_grammar(response_format=rf)
    assert match(g, '{"n": 3}') == COMPLETE and match(g, '{"n": "3"}') == NO
    body = {"model": "m", "prompt": "x", "response_format": rf}
    assert constrain.completion_grammar(parse_completion_request(json.dumps(body).encode())) == g


def test_required_tool_choice_starts_with_a_call_to_a_declared_tool():
    g = chat_grammar(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False)
    call = block("get_weather", '{"city": "Paris"}')
    assert match(g, call) == COMPLETE  # one call only: nothing may follow
    assert match(g, block("get_time", "{}")) == COMPLETE
    assert match(g, block("get_time", '{"tz": [1]}')) == COMPLETE  # no parameters: any object
    assert match(g, block("get_weather", "{}")) == NO  # city is required
    assert match(g, block("get_date", "{}")) == NO
    assert match(g, "Sure") == NO
    content, calls = parse_tool_calls(call, [WEATHER, TIME])
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}


def test_parallel_calls_follow_a_separator_which_may_also_end_the_answer():
    g = chat_grammar(tools=[WEATHER, TIME], tool_choice="required")
    one, two = block("get_time", "{}"), block("get_weather", '{"city": "Oslo"}')
    assert match(g, one) == MAY_END
    assert match(g, one + CALL_SEPARATOR) == MAY_END
    assert match(g, one + CALL_SEPARATOR + two) == MAY_END
    assert match(g, one + CALL_SEPARATOR + "Done") == NO


def test_a_named_function_is_the_only_call_allowed():
    g = chat_grammar(tools=[WEATHER, TIME], tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert match(g, block("get_time", "{}")) == MAY_END
    assert match(g, block("get_weather", '{"city": "Oslo"}')) == NO


def test_auto_allows_text_then_calls_starting_at_the_tag():
    g = chat_grammar(tools=[WEATHER])
    assert match(g, "") == MAY_END
    assert match(g, "It is sunny <b>today</b> <tool_cal") == MAY_END
    assert match(g, "Let me check.\n" + block("get_weather", '{"city": "Rome"}')) == MAY_END
    assert match(g, "text <tool_call>not a call") == NO
    assert match(g, block("get_weather", '{"city": "Rome"}') + " and more text") == NO


def test_auto_with_a_response_format_is_that_json_or_calls():
    g = chat_grammar(tools=[WEATHER], response_format={"type": "json_object"})
    assert match(g, '{"answer": 1}') == COMPLETE
    assert match(g, block("get_weather", '{"city": "Rome"}')) == MAY_END
    assert match(g, "plain text") == NO


def test_grammars_are_cached_by_content_the_most_recently_used_kept():
    a = chat_grammar(tools=[WEATHER], tool_choice="required")
    assert chat_grammar(tools=[WEATHER], tool_choice="required") is a
    spec = constrain.chat_spec(parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER],
                                                              "tool_choice": "required"}).encode()))
    for i in range(constrain.CACHE_SIZE):  # a schema in use stays while others come and go
        assert constrain.cached(spec) is a
        chat_grammar(response_format={"type": "json_schema", "json_schema": {"name": f"n{i}", "schema": {
            "type": "integer", "title": f"churn {i}"}}})
    assert constrain.cached(spec) is a


def refused(**fields) -> ApiError:
    with pytest.raises(ApiError) as info:
        chat_grammar(**fields)
    assert info.value.status == 400
    return info.value


def test_unsupported_schema_keywords_are_400_naming_the_keyword_and_parameter():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]+$"}}}}}
    err = refused(tools=[WEATHER, tool], tool_choice="required")
    assert (err.param, err.code) == ("tools[1].function.parameters", "unsupported_parameter")
    assert "'pattern'" in err.message
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "array", "uniqueItems": True}}}
    err = refused(response_format=rf)
    assert (err.param, err.code) == ("response_format.json_schema.schema", "unsupported_parameter")
    assert "'uniqueItems'" in err.message


def test_malformed_schemas_and_non_object_parameters_are_invalid_values():
    rf = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 3,
                                                                         "maximum": 1}}}
    err = refused(response_format=rf)
    assert (err.param, err.code) == ("response_format.json_schema.schema", "invalid_value")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}
    err = refused(tools=[tool])
    assert (err.param, err.code) == ("tools[0].function.parameters", "invalid_value")
    looping = {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}
    assert refused(response_format=looping).code == "invalid_value"
    endless = {"type": "object", "properties": {"c": {"$ref": "#"}}, "required": ["c"]}  # no finite value
    err = refused(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": endless}})
    assert (err.param, err.code) == ("response_format.json_schema.schema", "invalid_value")
    assert "no finite value" in err.message
    nested = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
    for choice in ("auto", "required"):  # "auto" too: a call to it could never end
        tool = {"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": nested}, "required": ["x"]}}}
        err = refused(tools=[WEATHER, tool], tool_choice=choice)
        assert (err.param, err.code) == ("tools[1].function.parameters", "invalid_value")
    optional = {"type": "object", "properties": {"c": {"$ref": "#"}}}  # may stop: {}
    assert match(chat_grammar(response_format={"type": "json_schema", "json_schema": {
        "name": "n", "schema": optional}}), '{"c": {"c": {}}}') == COMPLETE


def test_llama3_calls_are_constrained_in_llamas_own_json_reply():
    from llmd.prompt.tool_calls import LLAMA3_LAYOUT, JsonReplyCallStream, merge_tool_calls
    req = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER, TIME],
                                         "tool_choice": "required"}).encode())
    g = constrain.chat_grammar(req, LLAMA3_LAYOUT)
    one = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert match(g, one) == MAY_END
    assert match(g, one + "; " + '{"name": "get_time", "parameters": {}}') == MAY_END
    assert match(g, block("get_weather", '{"city": "Paris"}')) == NO  # not the Hermes block
    stream = JsonReplyCallStream([WEATHER, TIME], lambda: "c")
    events = stream.feed(one + "; ") + stream.finish()
    assert [c["function"]["name"] for c in merge_tool_calls(events)] == ["get_weather"]
    auto = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER]}).encode())
    g = constrain.chat_grammar(auto, LLAMA3_LAYOUT)
    assert match(g, "It is sunny.") == MAY_END and match(g, one) == MAY_END
    # the parser reads a JSON reply only as the whole reply: no call after text
    assert match(g, "Sure: " + one) == NO
    events = JsonReplyCallStream([WEATHER], lambda: "c").feed("Sure: " + one)
    assert not merge_tool_calls(events)
    # text never spells Llama's opening: a Hermes block then is no call either
    assert match(g, "x" + block("get_weather", '{"city": "Paris"}')) == NO


def test_gpt_oss_calls_are_constrained_as_harmony_messages_to_the_function():
    from llmd.prompt.harmony import CALL_LAYOUT
    auto = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER]}).encode())
    g = constrain.chat_grammar(auto, CALL_LAYOUT)
    call = ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    thinking = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
    assert match(g, thinking + call) == MAY_END
    assert match(g, "<|channel|>final<|message|>Hi.") == MAY_END
    assert match(g, thinking + " to=functions.get_time<|channel|>commentary json<|message|>{}") == NO


@pytest.mark.parametrize("fmt, module_name, call", [
    ("harmony", "llmd.prompt.harmony", ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "CITY"}'),
    ("phi4", "llmd.prompt.tool_calls", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "CITY"}}]<|/tool_call|>'),
    ("mistral", "llmd.prompt.tool_calls", '[TOOL_CALLS]get_weather[ARGS]{"city": "CITY"}'),
    ("nemotron", "llmd.prompt.tool_calls", '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "CITY"}}]</TOOLCALL>'),
])
def test_no_string_of_the_arguments_spells_the_marker_that_ends_them(fmt, module_name, call):
    """A parser that ends a call's arguments at a marker (harmony's <|end|>, Phi-4's
    <|/tool_call|>, Mistral's [TOOL_CALLS]) would cut a string spelling it, so the
    grammar refuses that string, bounded or not; JSON's escape of the marker's first
    character writes the same text, and the parser reads it back."""
    import importlib
    from llmd.prompt.harmony import HarmonyStream
    from llmd.prompt.tool_calls import call_stream, merge_tool_calls
    module = importlib.import_module(module_name)
    layout = module.CALL_LAYOUT if fmt == "harmony" else getattr(module, f"{fmt.upper()}_LAYOUT")
    (end,) = layout.ends
    for bound in ({}, {"maxLength": 40}):
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", **bound}}, "required": ["city"]}}}
        req = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [tool],
                                             "tool_choice": "required"}).encode())
        g = constrain.chat_grammar(req, layout)
        assert match(g, call.replace("CITY", "Oslo")) == MAY_END
        assert match(g, call.replace("CITY", "Oslo" + end + "x")) == NO
        escaped = call.replace("CITY", "Oslo" + "\\u%04x" % ord(end[0]) + end[1:])
        assert match(g, escaped) == MAY_END
        stream = HarmonyStream([tool]) if fmt == "harmony" else call_stream(fmt, [tool])
        events = stream.feed(escaped) + stream.finish()
        assert [json.loads(c["function"]["arguments"]) for c in merge_tool_calls(events)] == [{"city": "Oslo" + end}]


@pytest.mark.parametrize("layout_name, call", [
    ("PHI4_LAYOUT", '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]<|/tool_call|>'),
    ("MISTRAL_LAYOUT", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}'),
    ("MISTRAL_NEMO_LAYOUT", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
    ("NEMOTRON_LAYOUT", '<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Oslo"}}]</TOOLCALL>'),
])
def test_family_layouts_write_their_markers_as_text_or_as_control_tokens(layout_name, call):
    """Where the markers are plain text in the model, the call is these bytes (and, in
    parallel, the next call follows at once); where they are control tokens, the same
    bytes are refused: only the token (llmd.structured.grammar.token) can write a marker, and free
    text under "auto" never spells one."""
    from llmd.prompt import tool_calls
    from llmd.prompt.tool_calls import call_stream, merge_tool_calls
    layout = getattr(tool_calls, layout_name)
    req = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER, TIME],
                                         "tool_choice": "required"}).encode())
    g = constrain.chat_grammar(req, layout)
    assert match(g, call) == MAY_END and match(g, call + call.replace("Oslo", "Rome")) == MAY_END
    assert match(g, block("get_weather", '{"city": "Oslo"}')) == NO
    fmt = {"PHI4_LAYOUT": "phi4", "NEMOTRON_LAYOUT": "nemotron"}.get(layout_name, "mistral")
    stream = call_stream(fmt, [WEATHER, TIME])
    events = stream.feed(call + call) + stream.finish()
    assert [c["function"]["arguments"] for c in merge_tool_calls(events)] == ['{"city": "Oslo"}'] * 2
    markers = [m for m in ("[TOOL_CALLS]", "[ARGS]", "<|tool_call|>", "<|/tool_call|>", "<TOOLCALL>", "</TOOLCALL>")
               if m in call]
    controls = {m: 1000 + i for i, m in enumerate(markers)}
    assert match(constrain.chat_grammar(req, layout, controls), call) == NO
    auto = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER]}).encode())
    g = constrain.chat_grammar(auto, layout, controls)
    assert match(g, "It is sunny.") == MAY_END and match(g, "Sure: " + call) == NO


@pytest.mark.parametrize("layout_name, fmt, call", [
    ("GEMMA4_LAYOUT", "gemma4", '<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>'),
    ("QWEN3_CODER_LAYOUT", "qwen3_coder",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>"),
    ("GLM_LAYOUT", "glm", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>"),
])
def test_gemma_qwen3_coder_and_glm_calls_are_constrained_in_their_own_layouts(layout_name, fmt, call):
    """Each layout's call is accepted as the family writes it and read back by its parser;
    the Hermes block is not; with the markers as control tokens only the tokens write
    them, and under "auto" text may come first."""
    from llmd.prompt import tool_calls
    from llmd.prompt.tool_calls import FORMAT_MARKERS, call_stream, merge_tool_calls
    layout = getattr(tool_calls, layout_name)
    req = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER, TIME],
                                         "tool_choice": "required"}).encode())
    g = constrain.chat_grammar(req, layout)
    separator = layout.separator
    assert match(g, call) == MAY_END and match(g, call + separator + call.replace("Oslo", "Rome")) == MAY_END
    assert match(g, block("get_weather", '{"city": "Oslo"}')) == NO
    stream = call_stream(fmt, [WEATHER, TIME])
    events = stream.feed(call + separator + call) + stream.finish()
    assert [c["function"]["arguments"] for c in merge_tool_calls(events)] == ['{"city": "Oslo"}'] * 2
    controls = {m: 1000 + i for i, m in enumerate(FORMAT_MARKERS[fmt]) if m in call}
    if controls:
        g = constrain.chat_grammar(req, layout, controls)
        assert match(g, call) == NO
        assert all(f"t{i}>" in g for i in controls.values())
    auto = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [WEATHER]}).encode())
    g = constrain.chat_grammar(auto, layout)
    assert match(g, "It is sunny.") == MAY_END and match(g, "Sure: " + call) == MAY_END
    stream = call_stream(fmt, [WEATHER])
    events = stream.feed("Sure: " + call) + stream.finish()
    assert "".join(e.text for e in events if hasattr(e, "text")) == "Sure:"
    assert [c["function"]["name"] for c in merge_tool_calls(events)] == ["get_weather"]


def test_a_constrained_gemma_call_renders_back_into_the_prompt_as_it_was_written():
    """Gemma 4's template writes a call's arguments sorted by name (ignoring case): the
    grammar writes them in that order, so the call the model made, sent back, renders
    into the next prompt byte for byte and the session's cache stays warm."""
    from llmd.prompt import jinja
    from llmd.prompt.templates import JinjaTemplate, render_chat
    from llmd.prompt.tool_calls import GEMMA4_LAYOUT, call_stream, merge_tool_calls
    from tests.reference_data import require
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "zeta": {"type": "string"}, "Alpha": {"type": "integer"}, "mid": {"type": "object", "properties": {
            "y": {"type": "boolean"}, "X": {"type": "number"}}}}, "required": ["zeta", "Alpha", "mid"]}}}
    req = parse_chat_request(json.dumps({"model": "m", "messages": USER, "tools": [tool],
                                         "tool_choice": "required"}).encode())
    g = constrain.chat_grammar(req, GEMMA4_LAYOUT)
    call = '<|tool_call>call:get_weather{Alpha:1,mid:{X:2.5,y:true},zeta:<|"|>x<|"|>}<tool_call|>'
    assert match(g, call) == MAY_END
    assert match(g, '<|tool_call>call:get_weather{zeta:<|"|>x<|"|>,Alpha:1,mid:{y:true,X:2.5}}<tool_call|>') == NO
    stream = call_stream("gemma4", [tool])
    (made,) = merge_tool_calls(stream.feed(call) + stream.finish())
    template = JinjaTemplate(jinja.Template(require("models/templates/google-gemma-4-31B-it.jinja").read_text("utf-8")))
    messages = [*USER, {"role": "assistant", "content": None, "tool_calls": [made]},
                {"role": "tool", "tool_call_id": made["id"], "content": "sunny"}]
    assert call in render_chat(template, messages, [tool]).text
