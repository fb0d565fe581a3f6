"""A gpt-oss model end to end: a tiny random-weight gpt-oss file (arch/gpt_oss.cpp) with
gpt-oss's own chat template and Harmony's markers as control tokens of its vocabulary
(<|return|> and <|call|> end generation, <|end|> does not), served by llmd. A
conversation with a tool call and the reasoning before it round-trips through
/v1/chat/completions, /v1/responses and /v1/messages: a required call comes back as each
surface's tool call, and the turn sent back (its reasoning, its call, the call's result)
renders as the template writes it, the reasoning as the analysis message before the
call, the same prompt from all three surfaces. What the model writes in channels
(analysis -> reasoning) is parsed by llmd.prompt.harmony (tests/prompt/test_harmony.py)."""
from __future__ import annotations

import json

import pytest

from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.reference_data import require
from tests.support.gguf_writer import ARRAY, STRING, build_tiny_gpt_oss

HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
WEATHER = {"name": "get_weather", "description": "Weather now.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}
REASONING = "The user wants the weather; call the tool."
CALL = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
RESULT = '{"sky": "clear"}'


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    template = require("models/templates/openai-gpt-oss-120b.jinja").read_text("utf-8")
    w = build_tiny_gpt_oss(n_ctx=4096, reserved=len(HARMONY), chat_template=template)
    tokens = list(w.get("tokenizer.ggml.tokens").value[1])
    for i, marker in enumerate(HARMONY):
        tokens[tokens.index(f"<|reserved_{i}|>")] = marker
    w.set("tokenizer.ggml.tokens", ARRAY, (STRING, tokens))
    path = w.write(tmp_path_factory.mktemp("oss") / "oss.gguf")
    with running_llmd("--model", str(path), "--ctx", "4096", "--max-sessions", "4") as url:
        yield Client(url + "/v1", model="oss")


def chat_messages(reasoning: bool) -> list[dict]:
    call = {"id": CALL["id"], "type": "function", "function": {"name": CALL["name"], "arguments": CALL["arguments"]}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    if reasoning:
        assistant["reasoning_content"] = REASONING
    return [{"role": "user", "content": "Weather in Oslo?"}, assistant,
            {"role": "tool", "tool_call_id": CALL["id"], "content": RESULT}]


def test_a_required_call_comes_back_from_every_surface(client):
    chat = client.post_json("/chat/completions", {
        "model": "oss", "max_tokens": 80, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"type": "function", "function": WEATHER}], "tool_choice": "required"}).json()
    (call,) = chat["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
    assert chat["choices"][0]["finish_reason"] == "tool_calls"

    responses = client.post_json("/responses", {
        "model": "oss", "max_output_tokens": 80, "input": "Weather in Oslo?",
        "tools": [{"type": "function", **WEATHER}], "tool_choice": "required"}).json()
    (item,) = [i for i in responses["output"] if i["type"] == "function_call"]
    assert item["name"] == "get_weather" and "city" in json.loads(item["arguments"])

    messages = client.post_json("/messages", {
        "model": "oss", "max_tokens": 80, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [{"name": WEATHER["name"], "description": WEATHER["description"],
                   "input_schema": WEATHER["parameters"]}], "tool_choice": {"type": "any"}}).json()
    (block,) = [b for b in messages["content"] if b["type"] == "tool_use"]
    assert block["name"] == "get_weather" and "city" in block["input"] and messages["stop_reason"] == "tool_use"


def test_reasoning_sent_back_renders_as_the_analysis_message_before_its_call(client):
    tools = [{"type": "function", "function": WEATHER}]
    prompt = client.post_json(client.origin + "/apply-template", {"messages": chat_messages(True),
                                                                  "tools": tools}).json()["prompt"]
    assert ("<|start|>assistant<|channel|>analysis<|message|>" + REASONING + "<|end|>"
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}<|call|>'
            ) in prompt
    assert prompt.endswith("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
                           + json.dumps(RESULT) + "<|end|><|start|>assistant")
    without = client.post_json(client.origin + "/apply-template", {"messages": chat_messages(False),
                                                                   "tools": tools}).json()["prompt"]
    assert REASONING not in without and len(without) < len(prompt)


def test_the_three_surfaces_render_the_same_conversation_alike(client):
    """The same turn (reasoning, call, result) sent back through each surface's own
    shapes: the same prompt, so the same number of prompt tokens and, greedy, the same
    reply; and more tokens than without the reasoning."""
    def chat(reasoning: bool) -> dict:
        return client.post_json("/chat/completions", {
            "model": "oss", "max_tokens": 8, "temperature": 0, "messages": chat_messages(reasoning),
            "tools": [{"type": "function", "function": WEATHER}]}).json()

    with_reasoning, without = chat(True), chat(False)
    tokens = with_reasoning["usage"]["prompt_tokens"]
    assert tokens > without["usage"]["prompt_tokens"]

    responses = client.post_json("/responses", {
        "model": "oss", "max_output_tokens": 8, "temperature": 0, "tools": [{"type": "function", **WEATHER}],
        "input": [{"role": "user", "content": "Weather in Oslo?"},
                  {"type": "reasoning", "id": "rs_1", "summary": [],
                   "content": [{"type": "reasoning_text", "text": REASONING}]},
                  {"type": "function_call", "call_id": CALL["id"], "name": CALL["name"],
                   "arguments": CALL["arguments"]},
                  {"type": "function_call_output", "call_id": CALL["id"], "output": RESULT}]}).json()
    assert responses["usage"]["input_tokens"] == tokens, responses

    messages = client.post_json("/messages", {
        "model": "oss", "max_tokens": 8, "temperature": 0,
        "tools": [{"name": WEATHER["name"], "description": WEATHER["description"],
                   "input_schema": WEATHER["parameters"]}],
        "messages": [{"role": "user", "content": "Weather in Oslo?"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": REASONING, "signature": ""},
                         {"type": "tool_use", "id": CALL["id"], "name": CALL["name"], "input": {"city": "Oslo"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": CALL["id"], "content": RESULT}]}]}).json()
    usage = messages["usage"]  # Anthropic counts the cached prefix apart
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == tokens, messages

    chat_reply = with_reasoning["choices"][0]["message"]
    chat_text = (chat_reply.get("reasoning_content") or "") + (chat_reply["content"] or "")
    responses_text = "".join(part["text"] for item in responses["output"] for part in item.get("content") or ()
                             if part.get("type") in ("output_text", "reasoning_text"))
    messages_text = "".join(b.get("text") or b.get("thinking") or "" for b in messages["content"])
    assert chat_text and chat_text == responses_text == messages_text
