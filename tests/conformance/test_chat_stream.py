"""POST /chat/completions with "stream": true (SSE framing is checked by iter_sse)."""
from __future__ import annotations

import pytest

from .client import (FINISH_REASONS, Client, Stream, assert_no_error_chunk, assert_ok,
                     assert_recent, assert_usage)
from .test_chat import COUNT, content_of, pick_stop


def assert_chunk(chunk: dict) -> None:
    """One chat.completion.chunk that carries a choice."""
    assert isinstance(chunk.get("id"), str) and chunk["id"].startswith("chatcmpl-"), chunk
    assert chunk.get("object") == "chat.completion.chunk", chunk
    assert_recent(chunk.get("created"))
    assert isinstance(chunk.get("model"), str) and chunk["model"], chunk
    fingerprint = chunk.get("system_fingerprint")
    assert fingerprint is None or isinstance(fingerprint, str), chunk
    assert isinstance(chunk.get("choices"), list) and len(chunk["choices"]) == 1, chunk
    choice = chunk["choices"][0]
    assert choice.get("index") == 0, chunk
    assert choice.get("logprobs") is None, chunk
    assert "finish_reason" in choice, chunk
    assert choice["finish_reason"] is None or choice["finish_reason"] in FINISH_REASONS, chunk
    delta = choice.get("delta")
    assert isinstance(delta, dict), chunk
    assert delta.get("role") in (None, "assistant"), chunk
    assert delta.get("content") is None or isinstance(delta["content"], str), chunk
    assert delta.get("refusal") is None, chunk


def choice_chunks(stream: Stream) -> list[dict]:
    """The chunks that carry a choice (all but a final usage chunk), each checked."""
    assert stream.status == 200, f"HTTP {stream.status}: {stream.body[:300]!r}"
    assert_no_error_chunk(stream.chunks)
    chunks = [c for c in stream.chunks if c.get("choices") != []]
    assert chunks, "stream carried no chunk with a choice"
    for chunk in chunks:
        assert_chunk(chunk)
    return chunks


def final_usage(stream: Stream) -> dict:
    """The usage of the final `"choices": []` chunk (stream_options.include_usage)."""
    assert stream.status == 200, f"HTTP {stream.status}: {stream.body[:300]!r}"
    last = stream.chunks[-1]
    assert last.get("choices") == [], f"last chunk is not a usage chunk: {last}"
    assert_usage(last.get("usage"))
    return last["usage"]


def streamed_text(stream: Stream) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in choice_chunks(stream))


@pytest.fixture(scope="module")
def reference(client: Client) -> dict:
    return assert_ok(client.chat(COUNT))


@pytest.fixture(scope="module")
def plain(client: Client) -> Stream:
    return client.chat_stream(COUNT)


@pytest.fixture(scope="module")
def with_usage(client: Client) -> Stream:
    return client.chat_stream(COUNT, stream_options={"include_usage": True})


def test_stream_content_type_is_event_stream(plain):
    assert plain.status == 200, plain.body[:300]
    assert plain.content_type == "text/event-stream"


def test_stream_ends_with_done(plain):
    # iter_sse raises unless the stream is data-only, blank-line framed, ends with [DONE]
    assert plain.status == 200 and plain.chunks


def test_stream_chunks_are_chat_completion_chunks(plain):
    choice_chunks(plain)


def test_stream_chunks_share_id_created_and_model(plain):
    chunks = plain.chunks
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert {c["created"] for c in chunks} == {chunks[0]["created"]}
    assert {c["model"] for c in chunks} == {chunks[0]["model"]}


def test_stream_first_delta_has_assistant_role(plain):
    assert choice_chunks(plain)[0]["choices"][0]["delta"].get("role") == "assistant"


def test_stream_content_equals_non_streaming_content(plain, reference):
    assert streamed_text(plain) == content_of(reference)


def test_stream_has_one_finish_reason_on_the_last_chunk(plain, reference):
    reasons = [c["choices"][0]["finish_reason"] for c in choice_chunks(plain)]
    assert [r for r in reasons if r is not None] == [reasons[-1]], reasons
    assert reasons[-1] == reference["choices"][0]["finish_reason"]


def test_stream_without_include_usage_has_no_usage_chunk(plain):
    assert all(c.get("choices") != [] for c in plain.chunks)
    assert all(c.get("usage") is None for c in plain.chunks)


def test_stream_include_usage_ends_with_usage_chunk(with_usage):
    final_usage(with_usage)
    assert with_usage.chunks[-1].get("object") == "chat.completion.chunk"


def test_stream_include_usage_only_the_last_chunk_has_usage(with_usage):
    first, last = with_usage.chunks[0], with_usage.chunks[-1]
    assert all(c.get("usage") is None for c in with_usage.chunks[:-1])
    assert (last["id"], last["created"], last["model"]) == (first["id"], first["created"],
                                                            first["model"])
    reasons = [c["choices"][0]["finish_reason"] for c in choice_chunks(with_usage)]
    assert [r for r in reasons if r is not None] == [reasons[-1]], reasons


def test_stream_usage_equals_non_streaming_usage(with_usage, reference):
    usage, ref = final_usage(with_usage), reference["usage"]
    assert usage["prompt_tokens"] == ref["prompt_tokens"]
    assert usage["completion_tokens"] == ref["completion_tokens"]
    assert streamed_text(with_usage) == content_of(reference)


def test_stream_max_tokens_1_finishes_with_length(client):
    stream = client.chat_stream(COUNT, max_tokens=1, stream_options={"include_usage": True})
    chunks = choice_chunks(stream)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert final_usage(stream)["completion_tokens"] <= 1


def test_stream_stop_string_is_never_streamed(client, reference):
    stop, expected = pick_stop(content_of(reference))
    stream = client.chat_stream(COUNT, stop=stop)
    text = streamed_text(stream)
    assert stop not in text
    assert text == expected
    assert choice_chunks(stream)[-1]["choices"][0]["finish_reason"] == "stop"

