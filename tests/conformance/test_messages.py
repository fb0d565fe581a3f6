"""POST /v1/messages and /v1/messages/count_tokens (Anthropic Messages): the Message
object, Anthropic's event stream and error shape, tools as tool_use/tool_result blocks."""
from __future__ import annotations

import pytest

from .client import Client, is_int

TOOLS = [{"name": "get_weather", "description": "Get the current weather for a city.",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
HEADERS = {"anthropic-version": "2023-06-01"}
MAX = 12


def body(client: Client, **params) -> dict:
    return {"model": client.model, "max_tokens": MAX, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}], **params}


def post(client: Client, path: str, b: dict):
    return client.request("POST", path, b, HEADERS)


def assert_message(msg: dict) -> dict:
    assert msg["type"] == "message" and msg["role"] == "assistant" and msg["id"].startswith("msg_"), msg
    assert msg["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence", "tool_use"), msg
    assert (msg["stop_sequence"] is None) == (msg["stop_reason"] != "stop_sequence"), msg
    usage = msg["usage"]
    for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert is_int(usage[key]) and usage[key] >= 0, usage
    assert usage["output_tokens"] <= MAX or msg["stop_reason"] == "tool_use"
    for block in msg["content"]:
        assert block["type"] in ("text", "tool_use"), block
        if block["type"] == "tool_use":
            assert block["name"] == "get_weather" and isinstance(block["input"], dict), block
    return msg


def assert_anthropic_error(resp, status: int) -> dict:
    assert resp.status == status, resp.body[:300]
    err = resp.json()
    assert err["type"] == "error" and set(err["error"]) == {"type", "message"}, err
    return err["error"]


@pytest.fixture(scope="module")
def reference(client: Client) -> dict:
    resp = post(client, "/messages", body(client))
    assert resp.status == 200, resp.body[:300]
    return assert_message(resp.json())


def test_message_object_has_the_documented_shape(reference):
    assert reference["content"] and reference["content"][0]["type"] == "text"


def test_stream_events_follow_anthropics_order(client: Client, reference):
    stream = client.post_events("/messages", body(client, stream=True), HEADERS)
    names = [n for n, _ in stream.chunks]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert set(names[1:-2]) <= {"ping", "content_block_start", "content_block_delta", "content_block_stop"}
    start = stream.chunks[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    text = "".join(e["delta"]["text"] for n, e in stream.chunks if n == "content_block_delta")
    assert text == reference["content"][0]["text"]
    delta = stream.chunks[-2][1]
    assert delta["delta"]["stop_reason"] == reference["stop_reason"]
    assert delta["usage"]["output_tokens"] == reference["usage"]["output_tokens"]


def test_system_blocks_and_stop_sequences(client: Client):
    b = body(client, system=[{"type": "text", "text": "You count."}], stop_sequences=[","],
             messages=[{"role": "user", "content": [{"type": "text", "text": "Count: one, two, three"}]}],
             max_tokens=MAX)
    msg = assert_message(post(client, "/messages", b).json())
    if msg["stop_reason"] == "stop_sequence":
        assert msg["stop_sequence"] == "," and "," not in msg["content"][0]["text"]


def test_forced_tool_gives_a_tool_use_block(client: Client):
    b = body(client, tools=TOOLS, tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=40,
             messages=[{"role": "user", "content": "Weather in Paris?"}])
    msg = assert_message(post(client, "/messages", b).json())
    assert msg["stop_reason"] == "tool_use"
    use = next(c for c in msg["content"] if c["type"] == "tool_use")
    assert isinstance(use["input"]["city"], str) and use["id"]


def test_streamed_tool_use_input_json_adds_up(client: Client):
    import json
    b = body(client, tools=TOOLS, tool_choice={"type": "any"}, max_tokens=40, stream=True,
             messages=[{"role": "user", "content": "Weather in Paris?"}])
    events = client.post_events("/messages", b, HEADERS).chunks
    starts = [e for n, e in events if n == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    assert starts and starts[0]["content_block"]["input"] == {}
    partial = "".join(e["delta"]["partial_json"] for n, e in events
                      if n == "content_block_delta" and e["delta"]["type"] == "input_json_delta")
    assert isinstance(json.loads(partial)["city"], str)


def test_tool_result_blocks_continue_a_conversation(client: Client):
    b = body(client, tools=TOOLS, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}])
    assert_message(post(client, "/messages", b).json())


def test_count_tokens_equals_the_messages_input_tokens(client: Client, reference):
    b = body(client)
    del b["max_tokens"]
    resp = post(client, "/messages/count_tokens", b)
    assert resp.status == 200 and resp.json() == {"input_tokens": reference["usage"]["input_tokens"]
                                                  + reference["usage"]["cache_read_input_tokens"]}


def test_errors_have_anthropics_shape(client: Client):
    err = assert_anthropic_error(post(client, "/messages", body(client, temperature=1.5)), 400)
    assert err["type"] == "invalid_request_error" and "temperature" in err["message"]
    b = body(client)
    del b["max_tokens"]
    assert "max_tokens" in assert_anthropic_error(post(client, "/messages", b), 400)["message"]
    assert assert_anthropic_error(post(client, "/messages", body(client, model="nope")), 404)["type"] == \
        "not_found_error"


def test_image_blocks_are_refused_naming_the_block(client: Client):
    b = body(client, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert "'image'" in assert_anthropic_error(post(client, "/messages", b), 400)["message"]
