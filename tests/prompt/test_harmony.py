"""Tests for llmd/prompt/harmony.py: gpt-oss channels split into reasoning, content and tool
calls, whole and streamed; and through the chat Output with the real template."""
import itertools

import pytest

from llmd.prompt.harmony import HarmonyStream
from llmd.prompt.reasoning import ReasoningDelta
from llmd.prompt.tool_calls import ContentDelta, ToolCallDelta, merge_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


def run(text: str, step: int = 0, tools=TOOLS) -> tuple[str, str, list]:
    """(reasoning, content, OpenAI tool calls) of text fed whole (step 0) or in pieces."""
    counter = itertools.count()
    stream = HarmonyStream(tools, lambda: f"call_{next(counter)}")
    pieces = [text] if not step else [text[i:i + step] for i in range(0, len(text), step)]
    events = [e for p in pieces for e in stream.feed(p)] + stream.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return reasoning, content, merge_tool_calls(events)


@pytest.mark.parametrize("step", [0, 1, 2, 5, 11])
def test_analysis_is_reasoning_and_final_is_content(step):
    text = ("<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
            "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?")
    assert run(text, step) == ("The user greets; answer briefly.", "Hello! How can I help?", [])


@pytest.mark.parametrize("step", [0, 1, 3, 8])
@pytest.mark.parametrize("header", [
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>",
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
])
def test_a_message_to_a_declared_function_is_a_tool_call(step, header):
    text = "<|channel|>analysis<|message|>Need weather.<|end|>" + header + '{"city":"Paris"}'
    reasoning, content, calls = run(text, step)
    assert (reasoning, content) == ("Need weather.", "")
    assert calls == [{"id": "call_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]


@pytest.mark.parametrize("text", [
    "<|channel|>commentary to=functions.unknown<|message|>{}",          # not declared
    "<|channel|>commentary to=functions.get_weather<|message|>{bad",    # not JSON
])
def test_a_call_that_cannot_be_made_stays_content_as_written(text):
    assert run(text, 4) == ("", text, [])


def test_commentary_without_recipient_is_content_and_text_without_message_is_content():
    assert run("<|channel|>commentary<|message|>Let me check.<|end|>") == ("", "Let me check.", [])
    assert run("plain text, no channels") == ("", "plain text, no channels", [])


def test_reasoning_streams_before_the_message_ends():
    stream = HarmonyStream(TOOLS)
    assert stream.feed("<|channel|>analysis<|mess") == []
    assert stream.feed("age|>Thinking hard<|e") == [ReasoningDelta("Thinking hard")]
    assert stream.feed("nd|><|start|>assistant<|channel|>final<|message|>Ok") == [ContentDelta("Ok")]
    assert stream.finish() == []


def test_chat_output_for_the_gpt_oss_template_splits_channels():
    from llmd.api.reply import Output
    from llmd.prompt import jinja
    from llmd.prompt import templates
    from tests.reference_data import require
    template = templates.JinjaTemplate(jinja.Template(require("models/templates/openai-gpt-oss-120b.jinja").read_text()))
    assert templates.tool_format(template) == "harmony"
    output = Output([], TOOLS, templates.reasoning_start(template, "<|start|>assistant"), templates.tool_format(template))
    text = ("<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant to=functions.get_weather"
            "<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}")
    deltas = [d for i in range(0, len(text), 6) for d in output.feed(text[i:i + 6].encode())[0]] + output.finish()
    assert "".join(output.reasoning) == "Weather needed." and output.content() == ""
    assert [(d.name, d.arguments) for d in deltas if isinstance(d, ToolCallDelta) and d.name] == [
        ("get_weather", '{"city": "Oslo"}')]


def test_without_channels_the_hermes_blocks_of_constrained_calls_are_read():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    assert run(text, 7) == ("", "", [{"id": "call_0", "type": "function",
                                      "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}])


def test_whole_and_streamed_agree_on_random_harmony_text():
    import random
    rng = random.Random(7)
    fragments = ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "assistant", "analysis", "final", "commentary",
                 " to=functions.get_weather", " to=functions.nope", " json", '{"a": 1}', "{", "text", " ", "\n",
                 "<tool_call>", "</tool_call>", '{"name": "get_weather", "arguments": {}}']
    for _ in range(300):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 14)))
        whole = run(text)
        for step in (1, 3, 7):
            assert run(text, step) == whole, (text, step)


def test_an_assistant_s_reasoning_is_the_harmony_template_s_thinking_and_nothing_elsewhere():
    """Reasoning sent back renders as gpt-oss's analysis message before the turn's call
    (the template's `thinking`); a template without harmony channels leaves it out."""
    from llmd.prompt import jinja, templates
    from tests.reference_data import require
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "Need the tool."},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    without = [{k: v for k, v in m.items() if k != "reasoning"} for m in messages]
    tools = [{"type": "function", "function": {**TOOLS[0]["function"], "description": "Weather now."}}]

    def text(name: str, msgs: list[dict]) -> str:
        template = templates.JinjaTemplate(jinja.Template(require(f"models/templates/{name}").read_text()))
        return templates.render_chat(template, msgs, tools).text

    oss = text("openai-gpt-oss-120b.jinja", messages)
    assert ("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>"
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>") in oss
    assert oss.replace("<|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|>", "") == \
        text("openai-gpt-oss-120b.jinja", without)
    hermes = "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"
    assert text(hermes, messages) == text(hermes, without)
