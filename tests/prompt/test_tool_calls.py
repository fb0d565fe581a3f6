"""Tests for llmd/prompt/tool_calls.py: Hermes tool-call parsing, whole and streamed."""

import itertools
import json
import re

import pytest

from llmd.prompt.tool_calls import (CALL_ARGUMENTS, CALL_HEAD, CALL_TAIL, CLOSE_TAG, OPEN_TAG, ContentDelta,
                                   JsonReplyCallStream, ToolCallDelta, ToolCallStream, decode_call, merge_tool_calls,
                                   new_call_id, parse_tool_calls, tool_names)
from llmd.serving.sessions import canonical_arguments

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "get_time"}}]
PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOKYO = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "Asia/Tokyo"}}\n</tool_call>'


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def call(i, name, arguments):
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}


def stream(text, pieces, tools=TOOLS):
    """Feed `text` cut into pieces of the given sizes (cycled); return all events."""
    parser, events, pos = ToolCallStream(tools, ids()), [], 0
    for size in itertools.cycle(pieces):
        if pos >= len(text):
            break
        events += parser.feed(text[pos:pos + size])
        pos += size
    return events + parser.finish()


def collapse(events):
    """(content, calls) from events, as parse_tool_calls reports them."""
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = merge_tool_calls(events)
    return (None if calls and not content else content), calls


# --- whole-text parsing -------------------------------------------------------------

def test_single_call_becomes_openai_tool_call_with_null_content():
    content, calls = parse_tool_calls(PARIS, TOOLS, ids())
    assert content is None
    assert calls == [call(0, "get_weather", '{"city": "Paris"}')]


def test_text_before_the_calls_is_content_without_the_separating_whitespace():
    content, calls = parse_tool_calls("Let me check.\n" + PARIS + "\n" + TOKYO + "\n", TOOLS, ids())
    assert content == "Let me check."
    assert calls == [call(0, "get_weather", '{"city": "Paris"}'),
                     call(1, "get_time", '{"tz": "Asia/Tokyo"}')]


def test_compact_block_without_newlines_is_parsed():
    content, calls = parse_tool_calls('<tool_call>{"name":"get_time","arguments":{}}</tool_call>',
                                      TOOLS, ids())
    assert (content, calls) == (None, [call(0, "get_time", "{}")])


def test_text_without_calls_is_returned_unchanged():
    text = "  Plain answer with <b>tags</b> and a trailing newline\n"
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_unknown_tool_name_degrades_to_plain_content():
    text = '<tool_call>\n{"name": "launch_rocket", "arguments": {}}\n</tool_call>'
    assert parse_tool_calls(text, TOOLS) == (text, [])


@pytest.mark.parametrize("body", [
    '{"name":"get_weather","arguments":{"city":"Paris"}',   # truncated JSON
    "get_weather(city='Paris')",
    '["get_weather"]',
    '{"name": "get_weather", "arguments": [1, 2]}',
    '{"name": "get_weather", "arguments": "not json"}',
    '{"name": ["get_weather"], "arguments": {}}',
])
def test_malformed_call_degrades_to_plain_content(body):
    text = "Hi\n<tool_call>\n" + body + "\n</tool_call>"
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_invalid_block_stays_content_while_valid_block_becomes_a_call():
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    content, calls = parse_tool_calls(bad + "\n" + PARIS, TOOLS, ids())
    assert content == bad
    assert calls == [call(0, "get_weather", '{"city": "Paris"}')]


def test_unclosed_block_outside_the_constrained_layout_stays_content():
    text = 'Sure.\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Par'
    assert parse_tool_calls(text, TOOLS) == (text, [])


def test_arguments_given_as_json_string_or_missing_are_normalised_to_object_json():
    text = ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Zürich\\"}"}</tool_call>'
            '<tool_call>{"name": "get_time"}</tool_call>')
    _, calls = parse_tool_calls(text, TOOLS, ids())
    assert [c["function"]["arguments"] for c in calls] == ['{"city": "Zürich"}', "{}"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Zürich"}


def test_no_declared_tools_means_no_calls():
    assert parse_tool_calls(PARIS, None) == (PARIS, [])
    assert parse_tool_calls(PARIS, []) == (PARIS, [])


def test_call_ids_are_unique_openai_style():
    a, b = new_call_id(), new_call_id()
    assert re.fullmatch(r"call_[0-9a-f]{24}", a) and a != b
    _, calls = parse_tool_calls(PARIS + TOKYO, TOOLS)
    assert calls[0]["id"] != calls[1]["id"]


def test_tool_names_and_decode_call_read_declared_functions():
    assert tool_names(TOOLS) == {"get_weather", "get_time"}
    assert decode_call(' {"name": "get_time", "arguments": {"tz": "UTC"}} ', tool_names(TOOLS)) == (
        "get_time", '{"tz": "UTC"}')
    assert decode_call('{"name": "get_time"', tool_names(TOOLS)) is None


# --- streaming ------------------------------------------------------------------------

def test_stream_releases_plain_text_at_once():
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed("Hello") == [ContentDelta("Hello")]
    assert parser.feed(" world.") == [ContentDelta(" world.")]
    assert parser.finish() == []


def test_stream_holds_back_a_possible_start_of_the_open_tag():
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed("Checking <tool_") == [ContentDelta("Checking")]
    assert parser.feed("call>") == []
    assert parser.feed('{"name": "get_time", "arguments": {}}</tool_') == []
    assert parser.feed("call>") == [ToolCallDelta(0, "call_0", "get_time", "{}")]
    assert parser.finish() == []


def test_stream_releases_held_text_that_did_not_become_a_tag():
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed("a <tool") == [ContentDelta("a")]
    assert parser.feed("box> b ") == [ContentDelta(" <toolbox> b")]
    assert parser.finish() == [ContentDelta(" ")]


def test_stream_emits_invalid_block_as_content_when_it_closes():
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed('x\n<tool_call>{"name": "nope"}') == [ContentDelta("x")]
    assert parser.feed("</tool_call>") == [ContentDelta('\n<tool_call>{"name": "nope"}</tool_call>')]


def test_stream_finish_releases_an_unclosed_block_as_content():
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed('<tool_call>{"name": "get_time",') == []
    assert parser.finish() == [ContentDelta('<tool_call>{"name": "get_time",')]


def test_stream_tool_call_deltas_have_openai_delta_shape():
    first, rest = ToolCallStream(TOOLS, ids()).feed(PARIS)
    assert first.to_openai_delta() == {"index": 0, "id": "call_0", "type": "function",
                                       "function": {"name": "get_weather", "arguments": ""}}
    assert rest.to_openai_delta() == {"index": 0, "function": {"arguments": '{"city": "Paris"}'}}


def test_stream_counts_calls_and_indexes_them_in_order():
    parser = ToolCallStream(TOOLS, ids())
    events = parser.feed(PARIS + "\n" + TOKYO) + parser.finish()
    assert [(e.index, e.name) for e in events if e.id is not None] == [(0, "get_weather"), (1, "get_time")]
    assert parser.calls == 2


def test_constrained_layout_streams_arguments_as_they_are_generated():
    assert PARIS == OPEN_TAG + CALL_HEAD + "get_weather" + CALL_ARGUMENTS + '{"city": "Paris"}' + CALL_TAIL + CLOSE_TAG
    parser = ToolCallStream(TOOLS, ids())
    assert parser.feed(OPEN_TAG + CALL_HEAD + "get_wea") == []
    assert parser.feed('ther", "arguments": {"ci') == [ToolCallDelta(0, "call_0", "get_weather", ""),
                                                        ToolCallDelta(0, None, None, '{"ci')]
    assert parser.feed('ty": "Par') == [ToolCallDelta(0, None, None, 'ty": "Par')]
    assert parser.feed('is"}}\n</tool_') == [ToolCallDelta(0, None, None, 'is"}')]
    assert parser.feed("call>") == []
    assert parser.finish() == []


def test_arguments_end_at_the_brace_that_closes_them_not_at_braces_in_strings():
    text = OPEN_TAG + CALL_HEAD + "get_time" + CALL_ARGUMENTS + '{"tz": "}\\"{", "n": [{}]}' + CALL_TAIL + CLOSE_TAG
    content, calls = collapse(stream(text, [1]))
    assert content is None
    assert calls == [call(0, "get_time", '{"tz": "}\\"{", "n": [{}]}')]


def test_a_constrained_call_cut_short_keeps_the_arguments_it_streamed():
    text = OPEN_TAG + CALL_HEAD + "get_time" + CALL_ARGUMENTS + '{"tz": "Eur'
    assert collapse(stream(text, [3])) == (None, [call(0, "get_time", '{"tz": "Eur')])


def test_an_undeclared_name_in_the_constrained_layout_is_held_and_stays_content():
    text = "x" + OPEN_TAG + CALL_HEAD + "get_date" + CALL_ARGUMENTS + "{}" + CALL_TAIL + CLOSE_TAG
    events = stream(text, [2])
    assert not any(isinstance(e, ToolCallDelta) for e in events)
    assert collapse(events) == (text, [])


SAMPLES = [
    "plain text, no calls at all\n",
    "Let me check.\n" + PARIS + "\n" + TOKYO + "\n",
    "  " + PARIS + "  trailing words ",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>\n' + PARIS,
    "tag-like text <tool <tool_call <tool_call> never closed",
    "x < y and a <tool_call>" + '{"name": "get_time", "arguments": {"tz": "</"}}' + "</tool_call>",
]


@pytest.mark.parametrize("text", SAMPLES)
@pytest.mark.parametrize("pieces", [[1], [2, 3], [5], [7, 1, 13], [10_000]])
def test_stream_agrees_with_whole_text_parsing_for_any_chunking(text, pieces):
    assert collapse(stream(text, pieces)) == parse_tool_calls(text, TOOLS, ids())


@pytest.mark.parametrize("text", SAMPLES)
def test_stream_never_releases_content_that_is_part_of_a_valid_call(text):
    for event in stream(text, [1]):
        if isinstance(event, ContentDelta):
            assert '"get_weather"' not in event.text and '"get_time"' not in event.text


def test_flat_tool_records_declare_names_too():
    assert tool_names([{"name": "get_time", "description": None, "parameters": None}]) == {"get_time"}


@pytest.mark.parametrize("text, canonical", [
    ('{"city": "Paris", "days": 3}', '{"city":"Paris","days":3}'),
    ('{\n  "city": "Zürich",\n  "n": [1, 2]\n}', '{"city":"Zürich","n":[1,2]}'),
    ('{"b":1,"a":2}', '{"b":1,"a":2}'),  # key order is the model's, kept
    ('not json', 'not json'),
])
def test_canonical_arguments_is_one_compact_form(text, canonical):
    assert canonical_arguments(text) == canonical


def test_reply_fingerprint_matches_re_serialised_arguments():
    from llmd.serving.sessions import reply_fingerprint
    spaced = reply_fingerprint(None, [("f", '{"a": 1, "b": "é"}')])
    assert reply_fingerprint("", [("f", '{"a":1,"b":"\\u00e9"}')]) == spaced
    assert reply_fingerprint("", [("f", '{"a": 2}')]) != spaced


LLAMA_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
               {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]


def _json_reply(text: str, step: int = 0) -> list:
    ids = iter(f"call_{i}" for i in range(10))
    stream = JsonReplyCallStream(LLAMA_TOOLS, lambda: next(ids))
    pieces = [text] if not step else [text[i:i + step] for i in range(0, len(text), step)]
    return [e for p in pieces for e in stream.feed(p)] + stream.finish()


@pytest.mark.parametrize("step", [0, 1, 4])
def test_llama3_json_reply_is_a_tool_call(step):
    events = _json_reply('{"name": "get_weather", "parameters": {"city": "Paris"}}', step)
    assert events == [ToolCallDelta(0, "call_0", "get_weather", '{"city": "Paris"}')]


def test_llama3_json_replies_separated_by_semicolons_are_parallel_calls():
    events = _json_reply(' {"name": "get_weather", "parameters": {"city": "Paris"}}; '
                         '{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}\n')
    assert [(e.index, e.name, e.arguments) for e in events] == [
        (0, "get_weather", '{"city": "Paris"}'), (1, "search", '{"q": "x"}')]


@pytest.mark.parametrize("text", [
    '{"name": "unknown", "parameters": {}}',           # not a declared tool
    '{"name": "get_weather", "parameters": [1]}',      # arguments not an object
    '{"name": "get_weather", "parameters": {}} and more',
    '{"name": "get_weather", "param',                  # cut short
    '{"answer": 42}',
])
def test_llama3_json_reply_that_is_not_all_calls_is_content_as_written(text):
    assert _json_reply(text, 3) == [ContentDelta(text)]


def test_llama3_reply_not_starting_with_an_object_streams_and_reads_hermes_blocks():
    stream = JsonReplyCallStream(LLAMA_TOOLS, lambda: "c")
    assert stream.feed("Sure: ") == [ContentDelta("Sure:")]
    events = stream.feed('<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>') + stream.finish()
    assert merge_tool_calls(events) == [{"id": "c", "type": "function",
                                         "function": {"name": "search", "arguments": '{"q": "x"}'}}]


def test_llama3_reply_starting_with_an_array_is_content():
    assert _json_reply("[1, 2]") == [ContentDelta("[1, 2]")]


def test_mistral_call_ids_are_nine_letters_and_digits():
    from llmd.prompt.tool_calls import new_mistral_call_id
    ids = {new_mistral_call_id() for _ in range(50)}
    assert len(ids) == 50 and all(len(i) == 9 and i.isalnum() and i.isascii() for i in ids)


CODER_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"}, "opts": {"type": "object"}}}}}]


def test_qwen3_coder_xml_block_is_a_call_with_typed_arguments():
    text = ("Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
            "<parameter=zip>\n01234\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            '<parameter=opts>\n{"metric": true}\n</parameter>\n</function>\n</tool_call>')
    content, calls = parse_tool_calls(text, CODER_TOOLS, new_id=lambda: "c")
    assert content == "Checking."
    assert json.loads(calls[0]["function"]["arguments"]) == {
        "city": "San Francisco", "zip": "01234", "days": 3, "opts": {"metric": True}}


@pytest.mark.parametrize("body", [
    "<function=unknown>\n</function>",
    "<function=get_weather>\n<parameter=city>\nParis\n</function>",   # parameter never closed
    "<function=get_weather>\nstray text\n</function>",
])
def test_xml_block_that_is_not_a_declared_call_stays_content(body):
    text = f"<tool_call>\n{body}\n</tool_call>"
    assert parse_tool_calls(text, CODER_TOOLS) == (text, [])


# --- families whose calls a marker opens ------------------------------------------------

def _marked(tool_format: str, text: str, step: int = 0) -> list:
    """Events of `text` through the format's parser, whole (step 0) or in pieces."""
    from llmd.prompt.tool_calls import call_stream
    counter = itertools.count()
    parser = call_stream(tool_format, LLAMA_TOOLS, lambda: f"call_{next(counter)}")
    pieces = [text] if not step else [text[i:i + step] for i in range(0, len(text), step)]
    return [e for p in pieces for e in parser.feed(p)] + parser.finish()


@pytest.mark.parametrize("step", [0, 1, 3, 7])
def test_mistral_name_args_calls_after_content(step):
    text = ('Let me look.\n[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
            '[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"q": "x"}')
    content, calls = collapse(_marked("mistral", text, step))
    assert content == "Let me look."
    assert calls == [call(0, "get_weather", '{"city": "Paris"}'),
                     {**call(1, "search", '{"q": "x"}'), "id": "a1B2c3D4e"}]  # the model's own id is kept


def test_mistral_nemo_array_after_the_marker_is_parallel_calls():
    content, calls = collapse(_marked("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}},'
                                                 ' {"name": "search", "arguments": {}}]', 2))
    assert content is None
    assert calls == [call(0, "get_weather", '{"city": "Rome"}'), call(1, "search", "{}")]


@pytest.mark.parametrize("text", [
    "[TOOL_CALLS]unknown[ARGS]{}",                   # not a declared tool
    '[TOOL_CALLS]get_weather[ARGS]{"city": "Par',    # cut short
    "[TOOL_CALLS]get_weather{}",                     # no [ARGS]
    '[TOOL_CALLS]get_weather[ARGS]["x"]',            # arguments not an object
])
def test_mistral_block_that_is_not_calls_is_content_as_written(text):
    assert collapse(_marked("mistral", "Hi " + text, 4)) == ("Hi " + text, [])


def test_mistral_text_streams_until_the_marker_and_holds_a_partial_one():
    from llmd.prompt.tool_calls import call_stream
    parser = call_stream("mistral", LLAMA_TOOLS)
    assert parser.feed("Sure, [TOOL") == [ContentDelta("Sure,")]
    assert parser.feed("S] in text") == [ContentDelta(" [TOOLS] in text")]


@pytest.mark.parametrize("step", [0, 1, 5])
def test_gemma4_call_with_quoted_strings_and_bare_values(step):
    text = ('<|tool_call>call:get_weather{city:<|"|>Paris, "FR"<|"|>,days:3,metric:true,'
            'opts:{hours:[1,2],note:<|"|>a:b<|"|>}}<tool_call|>Done.')
    content, calls = collapse(_marked("gemma4", text, step))
    assert content == "Done."
    assert calls == [call(0, "get_weather", json.dumps(
        {"city": 'Paris, "FR"', "days": 3, "metric": True, "opts": {"hours": [1, 2], "note": "a:b"}}))]


@pytest.mark.parametrize("text", ["<|tool_call>call:nope{}<tool_call|>", "<|tool_call>call:get_weather{a:<tool_call|>",
                                  "<|tool_call>get_weather{}<tool_call|>"])
def test_gemma4_block_that_is_not_a_call_is_content(text):
    assert collapse(_marked("gemma4", text, 3)) == (text, [])


@pytest.mark.parametrize("step", [0, 1, 4])
def test_llama31_python_tag_builtin_call_and_json(step):
    tools = LLAMA_TOOLS
    stream = JsonReplyCallStream(tools, ids())
    text = '<|python_tag|>search.call(query="weather in Paris", limit=3)'
    pieces = [text] if not step else [text[i:i + step] for i in range(0, len(text), step)]
    events = [e for p in pieces for e in stream.feed(p)] + stream.finish()
    assert merge_tool_calls(events) == [call(0, "search", '{"query": "weather in Paris", "limit": 3}')]
    events = _json_reply('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}', step)
    assert [(e.name, e.arguments) for e in events] == [("get_weather", '{"city": "Oslo"}')]


@pytest.mark.parametrize("step", [0, 1, 4])
def test_llama31_python_tag_after_text_and_calls_each_opened_by_the_tag(step):
    """Text may come before the tag (as "auto" constrained decoding allows), and parallel
    calls may each be opened by the tag again (as LLAMA3_TAG_LAYOUT writes them)."""
    call = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}'
    content, calls = collapse(_json_reply("Let me check. " + call + "; " + call.replace("Oslo", "Rome"), step))
    assert content == "Let me check."
    assert [c["function"]["arguments"] for c in calls] == ['{"city": "Oslo"}', '{"city": "Rome"}']
    text = "Let me check. <|python_tag|>{\"name\": \"nope\", \"parameters\": {}}"
    assert collapse(_json_reply(text, step)) == (text, [])
    content, calls = collapse(_json_reply("{braces} first " + call, step))
    assert content == "{braces} first" and [c["function"]["name"] for c in calls] == ["get_weather"]


def test_llama31_python_tag_code_goes_to_a_declared_code_tool_else_stays_content():
    from llmd.prompt.tool_calls import python_tag_calls
    names = frozenset({"code_interpreter"})
    assert python_tag_calls("print(2 ** 10)", names) == [("code_interpreter", '{"code": "print(2 ** 10)"}', None)]
    assert python_tag_calls("print(2 ** 10)", frozenset({"search"})) is None
    assert python_tag_calls('search.call(q=__import__("os"))', frozenset({"search"})) is None  # literals only
    assert _json_reply("<|python_tag|>not code(") == [ContentDelta("<|python_tag|>not code(")]


def test_granite_tool_call_tag_with_a_json_list():
    content, calls = collapse(_marked("tagged_json", '<|tool_call|>[{"name": "search", "arguments": {"q": "x"}}]', 3))
    assert content is None and calls == [call(0, "search", '{"q": "x"}')]


@pytest.mark.parametrize("step", [0, 1, 4])
def test_phi4_closed_tool_call_blocks_then_text_and_another_block(step):
    """Phi-4 closes each <|tool_call|> block: a list or a single object inside, text
    after it stays content, and a later block is another call."""
    text = ('Looking.<|tool_call|>[{"name": "search", "arguments": {"q": "x"}}]<|/tool_call|> then '
            '<|tool_call|>{"name": "get_weather", "arguments": {"city": "Oslo"}}<|/tool_call|>')
    content, calls = collapse(_marked("phi4", text, step))
    assert content == "Looking.then"  # whitespace around calls is layout
    assert calls == [call(0, "search", '{"q": "x"}'), call(1, "get_weather", '{"city": "Oslo"}')]


def test_phi4_block_of_an_undeclared_tool_stays_content():
    text = '<|tool_call|>[{"name": "nope", "arguments": {}}]<|/tool_call|>'
    assert collapse(_marked("phi4", text, 2)) == (text, [])


@pytest.mark.parametrize("fmt", ["mistral", "gemma4", "tagged_json", "phi4"])
def test_marked_formats_still_read_the_hermes_blocks_constrained_decoding_writes(fmt):
    content, calls = collapse(_marked(fmt, 'Ok.\n<tool_call>\n{"name": "search", "arguments": {"q": 1}}\n</tool_call>', 5))
    assert content == "Ok." and calls == [call(0, "search", '{"q": 1}')]


def test_unknown_tool_format_is_refused():
    from llmd.prompt.tool_calls import call_stream
    with pytest.raises(ValueError, match="unknown tool format"):
        call_stream("nope", LLAMA_TOOLS)


def test_mistral_control_tokens_reach_the_parser_as_text_and_the_grammar_writes_them(tmp_path):
    """The path of a reply through the API: a Mistral-shaped vocabulary whose
    [TOOL_CALLS] and [ARGS] are control tokens (empty pieces), the real Mistral Small
    3.2 template, the pieces templates.control_pieces shows, the chat Output."""
    from llmd.api import chat_completions
    from llmd.api import validation
    from llmd.api.reply import Output
    from llmd.engine.native import Engine
    from llmd.prompt import templates
    from llmd.structured import constrain
    from tests.support.gguf_writer import ARRAY, F32, I32, STRING, build_spm_vocab
    from tests.reference_data import require
    w = build_spm_vocab(['Checking.get_weather{"city": "Paris"}'], add_space_prefix=False)
    tokens, types, scores = (w.get(k).value[1] for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                                         "tokenizer.ggml.scores"))
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens + ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"]))
    w.set("tokenizer.ggml.token_type", ARRAY, (I32, types + [3, 3, 3]))
    w.set("tokenizer.ggml.scores", ARRAY, (F32, scores + [0.0] * 3))
    with Engine(str(w.write(tmp_path / "mistral.gguf"))) as e:
        template = templates.load_template(None, str(require("models/templates/Mistral-Small-3.2-24B-Instruct-2506.jinja")), e)
        shown = templates.control_pieces(e, templates.output_markers(template))
        assert sorted(shown.values()) == [b"[ARGS]", b"[CALL_ID]", b"[TOOL_CALLS]"]
        reply = e.tokenize('Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', special=True)
        assert not all(e.piece(i) for i in reply)  # the markers alone would vanish from the text
        output = Output([], LLAMA_TOOLS, None, templates.tool_format(template))
        for i in reply:
            output.feed(shown.get(i, e.piece(i)))
        output.finish()
    assert output.content() == "Checking."
    assert [c["function"] for c in output.tool_calls()] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": LLAMA_TOOLS}
    auto = chat_completions.parse_chat_request(json.dumps(body).encode())
    required = chat_completions.parse_chat_request(json.dumps({**body, "tool_choice": "required"}).encode())
    layout = templates.call_layout(template)
    assert (layout.head, layout.between) == ("[TOOL_CALLS]", "[ARGS]")
    controls = {piece.decode(): i for i, piece in shown.items()}
    for req in (auto, required):  # the markers are written as their tokens, never as text
        grammar = constrain.chat_grammar(req, layout, controls)
        assert all(re.search(rf"(?m)(^| )t{controls[m]}>", grammar) for m in ("[TOOL_CALLS]", "[ARGS]"))


@pytest.mark.parametrize("fmt", ["mistral", "gemma4", "tagged_json", "phi4", "llama3_json"])
def test_marked_formats_agree_whole_and_streamed_on_random_text(fmt):
    """Fragments of every format, shuffled: any cut into pieces gives what the whole
    text gives (content and calls), and nothing raises."""
    import random
    rng = random.Random(fmt)
    fragments = ["[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|tool_call>", "<tool_call|>", '<|"|>', "call:",
                 "<|tool_call|>", "<|/tool_call|>", "<|python_tag|>", "get_weather", "search", '{"city": "Paris"}', "{", "}", "[",
                 "]", ",", ":", " ", "\n", "text", '"q"', "<tool_call>", "</tool_call>", ".call(q=1)"]
    for _ in range(200):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 12)))
        whole = collapse(_marked(fmt, text))
        for step in (1, 2, 5):
            assert collapse(_marked(fmt, text, step)) == whole, (text, step)
