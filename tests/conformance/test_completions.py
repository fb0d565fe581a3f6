"""POST /completions (legacy text completions), plain and streaming."""
from __future__ import annotations

import pytest

from .client import (Client, Stream, assert_no_error_chunk, assert_ok, assert_recent,
                     assert_usage, is_int)

PROMPT = "Once upon a time"
FALLBACK_IDS = [100, 101, 102, 103]   # valid in any real vocabulary


def assert_text_completion(body: dict) -> dict:
    """The envelope and the single choice of a text_completion; returns the choice."""
    assert isinstance(body.get("id"), str) and body["id"].startswith("cmpl-"), body.get("id")
    assert body.get("object") == "text_completion", body.get("object")
    assert_recent(body.get("created"))
    assert isinstance(body.get("model"), str) and body["model"], body.get("model")
    assert isinstance(body.get("choices"), list) and len(body["choices"]) == 1, body.get("choices")
    choice = body["choices"][0]
    assert isinstance(choice.get("text"), str), choice
    assert choice.get("index") == 0, choice
    assert "logprobs" in choice and choice["logprobs"] is None, choice
    assert choice.get("finish_reason") in ("stop", "length"), choice
    assert_usage(body.get("usage"))
    return choice


def assert_completion_chunk(chunk: dict) -> None:
    assert isinstance(chunk.get("id"), str) and chunk["id"].startswith("cmpl-"), chunk
    assert chunk.get("object") == "text_completion", chunk
    assert_recent(chunk.get("created"))
    assert isinstance(chunk.get("model"), str) and chunk["model"], chunk
    assert isinstance(chunk.get("choices"), list) and len(chunk["choices"]) == 1, chunk
    choice = chunk["choices"][0]
    assert choice.get("index") == 0, chunk
    assert isinstance(choice.get("text"), str), chunk
    assert choice.get("logprobs") is None, chunk
    assert "finish_reason" in choice, chunk
    assert choice["finish_reason"] in (None, "stop", "length"), chunk


def completion_chunks(stream: Stream) -> list[dict]:
    assert stream.status == 200, f"HTTP {stream.status}: {stream.body[:300]!r}"
    assert stream.content_type == "text/event-stream"
    assert_no_error_chunk(stream.chunks)
    chunks = [c for c in stream.chunks if c.get("choices") != []]
    assert chunks, "stream carried no chunk with a choice"
    for chunk in chunks:
        assert_completion_chunk(chunk)
    return chunks


@pytest.fixture(scope="module")
def greedy(client: Client) -> dict:
    return assert_ok(client.completion(PROMPT))


@pytest.fixture(scope="module")
def prompt_ids(client: Client) -> tuple[list[int], bool]:
    """Token ids of PROMPT via llmd's /tokenize extension, else FALLBACK_IDS.
    The flag says whether the ids are PROMPT's own."""
    resp = client.post_json(client.origin + "/tokenize",
                            {"content": PROMPT, "add_special": True})
    if resp.status == 200 and resp.content_type == "application/json":
        tokens = resp.json().get("tokens")
        if isinstance(tokens, list) and tokens and all(is_int(t) for t in tokens):
            return tokens, True
    return FALLBACK_IDS, False


def test_completion_envelope(greedy):
    assert_text_completion(greedy)
    assert greedy["choices"][0]["text"]


def test_completion_temperature_0_is_deterministic(client, greedy):
    again = assert_ok(client.completion(PROMPT))
    assert again["choices"][0]["text"] == greedy["choices"][0]["text"]


def test_completion_max_tokens_1_finishes_with_length(client):
    body = assert_ok(client.completion(PROMPT, max_tokens=1))
    assert assert_text_completion(body)["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] <= 1


def test_completion_accepts_prompt_as_token_ids(client, prompt_ids):
    ids, _ = prompt_ids
    body = assert_ok(client.completion(ids))
    assert_text_completion(body)
    assert body["usage"]["prompt_tokens"] == len(ids)


def test_completion_token_ids_prompt_equals_text_prompt(client, prompt_ids, greedy):
    """Needs llmd's /tokenize extension to know PROMPT's ids; skipped without it."""
    ids, own = prompt_ids
    if not own:
        pytest.skip("no /tokenize extension: the prompt's token ids are unknown")
    body = assert_ok(client.completion(ids))
    assert body["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert body["usage"]["prompt_tokens"] == greedy["usage"]["prompt_tokens"]


def test_completion_stream_text_equals_non_streaming_text(client, greedy):
    stream = client.completion_stream(PROMPT)
    chunks = completion_chunks(stream)
    assert "".join(c["choices"][0]["text"] for c in chunks) == greedy["choices"][0]["text"]
    assert {c["id"] for c in stream.chunks} == {chunks[0]["id"]}
    reasons = [c["choices"][0]["finish_reason"] for c in chunks]
    assert [r for r in reasons if r is not None] == [reasons[-1]], reasons
    assert reasons[-1] == greedy["choices"][0]["finish_reason"]
    assert all(c.get("usage") is None for c in stream.chunks)


def test_completion_stream_include_usage_ends_with_usage_chunk(client, greedy):
    stream = client.completion_stream(PROMPT, stream_options={"include_usage": True})
    completion_chunks(stream)
    last = stream.chunks[-1]
    assert last.get("choices") == [], last
    assert last.get("object") == "text_completion", last
    assert_usage(last.get("usage"))
    assert last["usage"]["completion_tokens"] == greedy["usage"]["completion_tokens"]
    assert all(c.get("usage") is None for c in stream.chunks[:-1])
