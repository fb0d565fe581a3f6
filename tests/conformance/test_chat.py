"""POST /chat/completions without streaming."""
from __future__ import annotations

import numbers

import pytest

from .client import (FINISH_REASONS, MAX_TOKENS, Client, assert_ok, assert_recent,
                     assert_usage, is_int)

COUNT = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]


def assert_chat_completion(body: dict) -> dict:
    """The envelope and the single choice of a chat.completion; returns the choice."""
    assert isinstance(body.get("id"), str) and body["id"].startswith("chatcmpl-"), body.get("id")
    assert body.get("object") == "chat.completion", body.get("object")
    assert_recent(body.get("created"))
    assert isinstance(body.get("model"), str) and body["model"], body.get("model")
    assert "system_fingerprint" in body, "system_fingerprint key missing"
    assert body["system_fingerprint"] is None or isinstance(body["system_fingerprint"], str)
    assert isinstance(body.get("choices"), list) and len(body["choices"]) == 1, body.get("choices")
    choice = body["choices"][0]
    assert choice.get("index") == 0, choice
    assert "logprobs" in choice and choice["logprobs"] is None, choice
    assert choice.get("finish_reason") in FINISH_REASONS, choice
    message = choice.get("message")
    assert isinstance(message, dict), choice
    assert message.get("role") == "assistant", message
    assert "content" in message, message
    assert message["content"] is None or isinstance(message["content"], str), message
    assert "refusal" in message and message["refusal"] is None, message
    assert "tool_calls" not in message or isinstance(message["tool_calls"], list), message
    assert_usage(body.get("usage"))
    return choice


def content_of(body: dict) -> str:
    return body["choices"][0]["message"]["content"] or ""


@pytest.fixture(scope="module")
def greedy(client: Client) -> dict:
    return assert_ok(client.chat(COUNT))


def test_chat_completion_envelope(greedy):
    assert_chat_completion(greedy)


def test_chat_completion_message_is_assistant_text(greedy):
    choice = greedy["choices"][0]
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    assert "tool_calls" not in choice["message"] or choice["message"]["tool_calls"] == []


def test_chat_usage_counts_add_up(greedy):
    usage = greedy["usage"]
    assert_usage(usage)
    if greedy["choices"][0]["finish_reason"] == "length":
        assert usage["completion_tokens"] == MAX_TOKENS, usage


def test_chat_temperature_0_is_deterministic(client, greedy):
    again = assert_ok(client.chat(COUNT))
    assert content_of(again) == content_of(greedy)
    assert again["usage"]["completion_tokens"] == greedy["usage"]["completion_tokens"]


def test_chat_seed_makes_sampling_reproducible(client):
    first = assert_ok(client.chat(COUNT, temperature=1.0, seed=1234))
    second = assert_ok(client.chat(COUNT, temperature=1.0, seed=1234))
    assert_chat_completion(first)
    assert content_of(first) == content_of(second)


def test_chat_max_tokens_1_finishes_with_length(client):
    body = assert_ok(client.chat(COUNT, max_tokens=1))
    choice = assert_chat_completion(body)
    assert choice["finish_reason"] == "length", choice
    assert body["usage"]["completion_tokens"] <= 1, body["usage"]


def test_chat_max_completion_tokens_1_finishes_with_length(client):
    body = client.chat_body(COUNT, max_completion_tokens=1)
    del body["max_tokens"]
    body = assert_ok(client.post_json("/chat/completions", body))
    choice = assert_chat_completion(body)
    assert choice["finish_reason"] == "length", choice
    assert body["usage"]["completion_tokens"] <= 1, body["usage"]


def pick_stop(text: str) -> tuple[str, str]:
    """A stop string taken from the middle of `text`, and the text before its first use."""
    for start in range(len(text) // 2, len(text) - 2):
        stop = text[start:start + 3]
        first = text.find(stop)
        if stop.strip() and first > 0:
            return stop, text[:first]
    pytest.skip(f"greedy output too short to derive a stop string: {text!r}")


def test_chat_stop_string_truncates_before_the_stop(client, greedy):
    stop, expected = pick_stop(content_of(greedy))
    body = assert_ok(client.chat(COUNT, stop=stop))
    choice = assert_chat_completion(body)
    assert stop not in content_of(body)
    assert content_of(body) == expected
    assert choice["finish_reason"] == "stop"


def test_chat_stop_list_truncates_at_any_stop(client, greedy):
    stop, expected = pick_stop(content_of(greedy))
    body = assert_ok(client.chat(COUNT, stop=["@@never-generated@@", stop]))
    assert stop not in content_of(body)
    assert content_of(body) == expected
    assert body["choices"][0]["finish_reason"] == "stop"


def test_chat_accepts_multi_turn_history_with_system(client):
    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one."},
    ]
    assert_chat_completion(assert_ok(client.chat(messages, max_tokens=4)))


def test_chat_accepts_text_content_parts(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say hi."}]}]
    assert_chat_completion(assert_ok(client.chat(messages, max_tokens=4)))


def test_chat_timings_extension_is_well_formed_when_present(greedy):
    """llmd extension, not OpenAI: `timings` (llama.cpp style); checked only when present."""
    timings = greedy.get("timings")
    if timings is None:
        pytest.skip("no `timings` extension in the response")
    assert isinstance(timings, dict), timings
    for key, value in timings.items():
        assert isinstance(value, numbers.Real) and not isinstance(value, bool), (key, timings)
        assert value >= 0, (key, timings)
    for key in ("prompt_n", "predicted_n", "cache_n"):
        if key in timings:
            assert is_int(timings[key]), (key, timings)
    if "predicted_n" in timings:
        assert timings["predicted_n"] == greedy["usage"]["completion_tokens"], timings
    if "cache_n" in timings:
        cached = greedy["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert timings["cache_n"] == cached, timings
