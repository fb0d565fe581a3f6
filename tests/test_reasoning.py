"""Tests for llmd/reasoning.py: <think> blocks split from the answer, whole and streamed."""
import itertools

import pytest

from llmd.reasoning import ReasoningStream


def split(text: str, inside: bool = False, step: int = 0) -> tuple[str, str]:
    """(reasoning, content) of `text` fed whole (step 0) or in pieces of `step` characters."""
    stream = ReasoningStream(inside)
    pieces = [text] if not step else [text[i:i + step] for i in range(0, len(text), step)]
    out = [p for piece in pieces for p in stream.feed(piece)] + stream.finish()
    return ("".join(t for kind, t in out if kind == "reasoning"), "".join(t for kind, t in out if kind == "content"))


CASES = [
    ("qwen3_block_then_answer", "<think>\nThe user asks.\n\nA fact.\n</think>\n\nParis.", False,
     ("The user asks.\n\nA fact.", "Paris.")),
    ("r1_prompt_opened_the_block", "Let me think.\n</think>\n\nParis.", True, ("Let me think.", "Paris.")),
    ("thinking_disabled_empty_block", "<think>\n\n</think>\n\nParis.", False, ("", "Paris.")),
    ("no_block_is_all_content", "Paris is <think> the capital.", False, ("", "Paris is <think> the capital.")),
    ("unclosed_block_is_all_reasoning", "<think>still thinking ", False, ("still thinking", "")),
    ("almost_a_tag_is_content", "<thin", False, ("", "<thin")),
    ("close_tag_text_later_is_content", "<think>a</think>b</think>c", False, ("a", "b</think>c")),
    ("leading_whitespace_before_the_block", "\n <think>x</think>y", False, ("x", "y")),
    ("content_keeps_its_inner_whitespace", "<think>x</think>\n\na  b\n", False, ("x", "a  b\n")),
]


@pytest.mark.parametrize("name, text, inside, expected", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("step", [0, 1, 2, 3, 7])
def test_reasoning_is_split_from_content_however_the_text_is_cut(name, text, inside, expected, step):
    assert split(text, inside, step) == expected


def test_streamed_reasoning_is_released_before_the_block_closes():
    stream = ReasoningStream()
    assert stream.feed("<think>\nfirst") == [("reasoning", "first")]
    assert stream.feed(" second </thi") == [("reasoning", " second")]
    assert stream.feed("nk>\n\n") == []
    assert stream.feed("Answer") == [("content", "Answer")]
    assert stream.finish() == []


def test_every_cut_of_a_reply_gives_the_same_split():
    text = "<think>\nA b.\n</think>\n\nC d."
    for a, b in itertools.combinations(range(1, len(text)), 2):
        stream = ReasoningStream()
        out = stream.feed(text[:a]) + stream.feed(text[a:b]) + stream.feed(text[b:]) + stream.finish()
        assert "".join(t for k, t in out if k == "reasoning") == "A b."
        assert "".join(t for k, t in out if k == "content") == "C d."


def test_chat_output_keeps_reasoning_out_of_content_and_tool_calls():
    from llmd.api import Output
    from llmd.reasoning import ReasoningDelta
    from llmd.tools import ContentDelta
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    output = Output([], tools, reasoning=False)
    text = '<think>\nI should call f.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    deltas = [d for i in range(0, len(text), 5) for d in output.feed(text[i:i + 5].encode())[0]] + output.finish()
    assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == "I should call f."
    assert not [d for d in deltas if isinstance(d, ContentDelta) and d.text.strip()]
    assert output.content() == "" and "".join(output.reasoning) == "I should call f."
    assert output.tool_calls()[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_output_without_a_reasoning_template_leaves_think_tags_in_content():
    from llmd.api import Output
    output = Output([], None)
    output.feed(b"<think>x</think>y")
    output.finish()
    assert output.content() == "<think>x</think>y" and output.reasoning == []


@pytest.mark.parametrize("name, enable_thinking, expected", [
    ("Qwen-Qwen3-0.6B.jinja", None, False),
    ("Qwen-Qwen3-0.6B.jinja", False, False),  # the prompt closes an empty block itself
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", None, True),  # its generation prompt opens the block
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", True, True),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", None, False),  # closes it unless thinking is enabled
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", None, None),
])
def test_reasoning_start_follows_the_template_and_its_generation_prompt(name, enable_thinking, expected):
    from llmd import chat, jinja
    from tests.reference_data import require
    template = chat.JinjaTemplate(jinja.Template(require(f"models/templates/{name}").read_text("utf-8")))
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    prompt = chat.render_chat(template, [{"role": "user", "content": "Hi"}], template_kwargs=kwargs)
    assert chat.reasoning_start(template, prompt.text) is expected
