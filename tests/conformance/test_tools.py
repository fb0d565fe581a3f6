"""Function tools. The served model may be tiny, so no test requires that it calls a
tool: each checks the shape of whatever comes back."""
from __future__ import annotations

import pytest

from .client import Client, assert_arguments, assert_error, assert_ok, assert_tool_call
from .test_chat import assert_chat_completion
from .test_chat_stream import choice_chunks

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}]
NAMES = {"get_weather"}
WEATHER = [{"role": "user", "content": "What is the weather in Paris? Use the tool."}]
HISTORY = WEATHER + [
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_abc123", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
    }]},
    {"role": "tool", "tool_call_id": "call_abc123", "content": "18 C and sunny"},
]


def assert_tool_reply(body: dict) -> None:
    """Content or tool calls, consistent with finish_reason."""
    choice = assert_chat_completion(body)
    calls = choice["message"].get("tool_calls") or []
    for call in calls:
        assert_tool_call(call, NAMES)
    assert len({c["id"] for c in calls}) == len(calls), "tool call ids repeat"
    assert (choice["finish_reason"] == "tool_calls") == bool(calls), choice
    if not calls:
        assert isinstance(choice["message"]["content"], str), choice


@pytest.fixture(scope="module")
def reply(client: Client) -> dict:
    return assert_ok(client.chat(WEATHER, tools=TOOLS))


def test_tool_request_returns_content_or_tool_calls(reply):
    assert_tool_reply(reply)


def test_tool_calls_are_well_formed_when_present(reply):
    calls = reply["choices"][0]["message"].get("tool_calls")
    if not calls:
        pytest.skip("the model answered with content, not a tool call")
    for call in calls:
        assert_tool_call(call, NAMES)
    assert reply["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_choice_auto_is_accepted(client):
    assert_tool_reply(assert_ok(client.chat(WEATHER, tools=TOOLS, tool_choice="auto")))


def test_tool_choice_none_returns_no_tool_calls(client):
    body = assert_ok(client.chat(WEATHER, tools=TOOLS, tool_choice="none"))
    assert_tool_reply(body)
    assert not body["choices"][0]["message"].get("tool_calls")


def test_history_with_tool_call_and_tool_result_is_accepted(client):
    assert_tool_reply(assert_ok(client.chat(HISTORY, tools=TOOLS)))


def test_tool_without_function_is_400_naming_tools(client):
    resp = client.chat(WEATHER, tools=[{"type": "function"}])
    err = assert_error(resp, 400)
    assert (err["param"] or "").startswith("tools"), err


def test_stream_tool_call_deltas_are_well_formed_when_present(client):
    """Streaming with a tool: content deltas, or tool_call deltas whose first fragment
    carries id and type, whose arguments concatenate to a JSON object."""
    chunks = choice_chunks(client.chat_stream(WEATHER, tools=TOOLS))
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for part in chunk["choices"][0]["delta"].get("tool_calls") or []:
            assert isinstance(part.get("index"), int), part
            call = calls.setdefault(part["index"], {"id": None, "name": "", "arguments": ""})
            if part.get("id") is not None:
                assert call["id"] is None, f"tool call {part['index']} got a second id"
                assert part["id"].startswith("call_") and part.get("type") == "function", part
                call["id"] = part["id"]
            fn = part.get("function") or {}
            call["name"] += fn.get("name") or ""
            call["arguments"] += fn.get("arguments") or ""
    reason = chunks[-1]["choices"][0]["finish_reason"]
    assert (reason == "tool_calls") == bool(calls), (reason, calls)
    for call in calls.values():
        assert call["id"] is not None, call
        assert call["name"] in NAMES, call
        assert_arguments(call["arguments"])
