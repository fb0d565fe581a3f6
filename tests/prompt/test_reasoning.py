"""Tests for llmd/prompt/reasoning.py: <think> blocks split from the answer, whole and streamed."""
import itertools

import pytest

from llmd.prompt.reasoning import ReasoningStream


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
    from llmd.api.reply import Output
    from llmd.prompt.reasoning import ReasoningDelta
    from llmd.prompt.tool_calls import ContentDelta
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    output = Output([], tools, reasoning=False)
    text = '<think>\nI should call f.\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    deltas = [d for i in range(0, len(text), 5) for d in output.feed(text[i:i + 5].encode())[0]] + output.finish()
    assert "".join(d.text for d in deltas if isinstance(d, ReasoningDelta)) == "I should call f."
    assert not [d for d in deltas if isinstance(d, ContentDelta) and d.text.strip()]
    assert output.content() == "" and "".join(output.reasoning) == "I should call f."
    assert output.tool_calls()[0]["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_output_without_a_reasoning_template_leaves_think_tags_in_content():
    from llmd.api.reply import Output
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
    from llmd.prompt import jinja
    from llmd.prompt import templates
    from tests.reference_data import require
    template = templates.JinjaTemplate(jinja.Template(require(f"models/templates/{name}").read_text("utf-8")))
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    prompt = templates.render_chat(template, [{"role": "user", "content": "Hi"}], template_kwargs=kwargs)
    assert templates.reasoning_start(template, prompt.text) is expected


@pytest.mark.parametrize("name, prefill, expected", [
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "Let me see", True),  # inside the block the prompt opened
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "Let me see.\n</think>\n\nThe", False),
    ("Qwen-Qwen3-0.6B.jinja", "<think>\nFirst", True),  # the prefill opens the block itself
    ("Qwen-Qwen3-0.6B.jinja", "<think>\nx</think>\n\nSo", False),
    ("Qwen-Qwen3-0.6B.jinja", "The answer", False),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<think>", None),  # no reasoning block in this template
])
def test_reasoning_start_follows_a_continued_reply(name, prefill, expected):
    from llmd.prompt import jinja
    from llmd.prompt import templates
    from tests.reference_data import require
    template = templates.JinjaTemplate(jinja.Template(require(f"models/templates/{name}").read_text("utf-8")))
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": prefill}]
    prompt = templates.render_chat(template, msgs, continue_final=True)
    assert prompt.text.endswith(prefill)
    assert templates.reasoning_start(template, prompt.text, prompt.prefill) is expected


# ---- reasoning through each API surface's format -------------------------------------------

class StubReply:
    """What a format reads of llmd.api.reply.Reply, for a reply whose text is `text` fed one
    token of `step` characters at a time (finished with `finish_reason`)."""

    def __init__(self, text: str, step: int = 3, inside: bool = False):
        from types import SimpleNamespace

        from llmd.api.reply import Output
        self.output = Output([], None, reasoning=inside)
        self.pieces = [text[i:i + step].encode() for i in range(0, len(text), step)]
        self.model, self.finish_reason, self.logprobs, self.index, self.created = "m", None, [], 0, 0
        self.completion_tokens = len(self.pieces)
        self.g = SimpleNamespace(prompt=[1, 2, 3], plan=SimpleNamespace(keep=0), timings=lambda: {})

    def take_logprobs(self) -> list:
        return []

    def usage(self) -> dict:
        return {"prompt_tokens": 3, "completion_tokens": self.completion_tokens, "total_tokens": 3 + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": self.output.reasoning_tokens}}

    def events(self, fmt) -> list[dict]:
        """The format's stream of this reply, as (event name, data) JSON objects."""
        import json
        frames = fmt.start(self)
        for piece in self.pieces:
            frames += fmt.deltas(self, self.output.feed(piece)[0])
        deltas = self.output.finish()
        self.finish_reason = "stop"
        frames += fmt.deltas(self, deltas) + fmt.end(self)
        return [json.loads(line[6:]) for f in frames for line in f.decode().splitlines() if line.startswith("data: {")]


REPLY = "<think>\nSeven times six.\n</think>\n\n42"


def test_responses_put_reasoning_in_a_reasoning_item_before_the_message():
    from llmd.api.responses import ResponsesFormat
    from llmd.api.responses import parse_responses_request
    req = parse_responses_request(b'{"model": "m", "input": "x", "reasoning": {"summary": "auto"}}')
    reply = StubReply(REPLY)
    events = reply.events(ResponsesFormat(req, None))
    kinds = [e["type"] for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Seven times six."
    assert kinds.index("response.reasoning_summary_text.done") < kinds.index("response.output_text.delta")
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["reasoning"] == {"effort": None, "summary": "auto"}
    reasoning, message = done["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [
        {"type": "reasoning_text", "text": "Seven times six."}]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Seven times six."}]
    assert message["content"][0]["text"] == "42"
    # <think>, its text and </think> are reasoning tokens; the answer is not
    assert 0 < done["usage"]["output_tokens_details"]["reasoning_tokens"] < reply.completion_tokens
    whole = StubReply(REPLY)
    for piece in whole.pieces:
        whole.output.feed(piece)
    whole.output.finish()
    whole.finish_reason = "stop"
    body = ResponsesFormat(req, None).body(whole)
    assert [i["type"] for i in body["output"]] == ["reasoning", "message"]
    assert body["output"][0]["summary"] == reasoning["summary"]


def test_a_reply_that_never_leaves_its_reasoning_is_a_reasoning_item_and_an_empty_message():
    from llmd.api.responses import ResponsesFormat
    from llmd.api.responses import parse_responses_request
    events = StubReply("still thinking", inside=True).events(
        ResponsesFormat(parse_responses_request(b'{"model": "m", "input": "x"}'), None))
    reasoning, message = events[-1]["response"]["output"]
    assert reasoning["content"][0]["text"] == "still thinking" and reasoning["summary"] == []
    assert message["type"] == "message" and message["content"][0]["text"] == ""


def test_messages_stream_a_thinking_block_then_the_text_block():
    from llmd.api import anthropic
    req = anthropic.parse_request(b'{"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}],'
                                 b' "thinking": {"type": "enabled", "budget_tokens": 1024}}')
    reply = StubReply(REPLY)
    events = reply.events(anthropic.MessagesFormat(req))
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": "",
                                                                             "citations": None}]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta") == "Seven times six."
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == "42"
    body = anthropic.MessagesFormat(req).body(reply)
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert body["content"][0]["thinking"] == "Seven times six." and body["usage"]["output_tokens_details"][
        "thinking_tokens"] == reply.output.reasoning_tokens > 0


def test_messages_with_display_omitted_send_thinking_blocks_without_their_text():
    from llmd.api import anthropic
    req = anthropic.parse_request(b'{"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "x"}],'
                                 b' "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}}')
    reply = StubReply(REPLY)
    events = reply.events(anthropic.MessagesFormat(req))
    assert not [e for e in events if e.get("delta", {}).get("type") == "thinking_delta"]
    assert anthropic.MessagesFormat(req).body(reply)["content"][0] == {"type": "thinking", "thinking": "",
                                                                      "signature": ""}


# ---- reasoning end to end: a tiny model under reasoning templates ----------------------------

@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    """A server whose template (DeepSeek-R1's) opens the reasoning block in the
    generation prompt: the random model's whole output is reasoning."""
    from tests.conformance.client import Client
    from tests.conftest import running_llmd
    from tests.support.gguf_writer import write_tiny_llama
    from tests.reference_data import require
    model = write_tiny_llama(tmp_path_factory.mktemp("r1") / "r1.gguf")
    template = require("models/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
    with running_llmd("--model", str(model.path), "--chat-template", str(template), "--ctx", "128") as url:
        yield Client(url + "/v1", model="r1")


def test_chat_completions_put_reasoning_in_reasoning_content_and_count_its_tokens(reasoning_server):
    body = reasoning_server.chat_body([{"role": "user", "content": "Hi"}], max_tokens=6, temperature=0)
    reply = reasoning_server.post_json("/chat/completions", body).json()
    message = reply["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"] == ""
    assert reply["usage"]["completion_tokens_details"] == {"reasoning_tokens": reply["usage"]["completion_tokens"]}


def test_responses_give_a_reasoning_item_with_its_summary_streamed_or_not(reasoning_server):
    body = {"model": "r1", "input": "Hi", "max_output_tokens": 6, "temperature": 0, "reasoning": {"summary": "auto"}}
    whole = reasoning_server.post_json("/responses", body).json()
    reasoning = whole["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["summary"][0]["text"] == reasoning["content"][0]["text"] != ""
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == 6
    events = [data for _, data in reasoning_server.post_events("/responses", {**body, "stream": True}).chunks]
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert streamed == reasoning["content"][0]["text"]
    assert events[-1]["response"]["output"][0]["content"] == reasoning["content"]


def test_messages_give_a_thinking_block_streamed_or_not(reasoning_server):
    body = {"model": "r1", "max_tokens": 2000, "temperature": 0, "messages": [{"role": "user", "content": "Hi"}],
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    whole = reasoning_server.post_json("/messages", body).json()
    assert whole["content"][0]["type"] == "thinking" and whole["content"][0]["thinking"]
    events = [data for _, data in reasoning_server.post_events("/messages", {**body, "stream": True}).chunks]
    streamed = "".join(e["delta"]["thinking"] for e in events
                       if e["type"] == "content_block_delta" and e["delta"]["type"] == "thinking_delta")
    assert streamed == whole["content"][0]["thinking"]


def test_thinking_disabled_turns_a_qwen3_templates_thinking_off(tmp_path):
    from tests.conformance.client import Client
    from tests.conftest import running_llmd
    from tests.support.gguf_writer import write_tiny_llama
    from tests.reference_data import require
    model = write_tiny_llama(tmp_path / "q.gguf")
    template = require("models/templates/Qwen-Qwen3-0.6B.jinja")
    with running_llmd("--model", str(model.path), "--chat-template", str(template), "--ctx", "128") as url:
        client = Client(url + "/v1", model="q")
        body = {"model": "q", "messages": [{"role": "user", "content": "Hi"}]}
        default = client.post_json("/messages/count_tokens", body).json()["input_tokens"]
        off = client.post_json("/messages/count_tokens", {**body, "thinking": {"type": "disabled"}}).json()
    assert off["input_tokens"] > default  # the prompt closes an empty <think></think> block itself


def test_gpt_oss_reasons_in_channels_so_reasoning_may_be_asked_for_but_not_turned_off(tmp_path):
    from tests.conformance.client import Client
    from tests.conftest import running_llmd
    from tests.support.gguf_writer import write_tiny_llama
    from tests.reference_data import require
    model = write_tiny_llama(tmp_path / "oss.gguf")
    template = require("models/templates/openai-gpt-oss-120b.jinja")
    with running_llmd("--model", str(model.path), "--chat-template", str(template), "--ctx", "512") as url:
        client = Client(url + "/v1", model="oss")
        asked = client.post_json("/responses", {"model": "oss", "input": "Hi", "max_output_tokens": 4,
                                                "reasoning": {"summary": "auto"}})
        off = client.post_json("/messages", {"model": "oss", "max_tokens": 4, "thinking": {"type": "disabled"},
                                             "messages": [{"role": "user", "content": "Hi"}]})
    assert asked.status == 200, asked.json()
    assert off.status == 400 and "gpt-oss always reasons" in off.json()["error"]["message"]
