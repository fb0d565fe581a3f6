"""Log-probabilities: chat `logprobs` + `top_logprobs`, completions `logprobs` + `echo`,
and `n` choices; shapes and the relations between the numbers, not their values."""
from __future__ import annotations

from .client import Client, assert_ok


def assert_chat_entry(entry: dict, top: int) -> None:
    assert isinstance(entry["token"], str) and entry["logprob"] <= 0, entry
    assert entry["bytes"] is None or isinstance(entry["bytes"], list), entry
    assert len(entry["top_logprobs"]) == top, entry
    lps = [t["logprob"] for t in entry["top_logprobs"]]
    assert lps == sorted(lps, reverse=True), entry


def test_chat_logprobs_follow_the_content(client: Client):
    body = assert_ok(client.chat([{"role": "user", "content": "Say hi."}], logprobs=True, top_logprobs=3))
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert content, choice
    for entry in content:
        assert_chat_entry(entry, 3)
    assert "".join(e["token"] for e in content) == choice["message"]["content"]


def test_greedy_chat_token_is_its_top_logprob(client: Client):
    body = assert_ok(client.chat([{"role": "user", "content": "Say hi."}], logprobs=True, top_logprobs=1))
    for entry in body["choices"][0]["logprobs"]["content"]:
        assert entry["top_logprobs"][0]["token"] == entry["token"], entry


def test_streamed_chat_logprobs_ride_on_their_chunks(client: Client):
    stream = client.chat_stream([{"role": "user", "content": "Say hi."}], logprobs=True, top_logprobs=2)
    assert stream.status == 200
    with_text = [c["choices"][0] for c in stream.chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert with_text and all(c["logprobs"]["content"] for c in with_text)
    for c in with_text:
        for entry in c["logprobs"]["content"]:
            assert_chat_entry(entry, 2)


def test_completion_echo_gives_the_prompt_tokens_first_with_null(client: Client):
    body = assert_ok(client.completion("The sky is", max_tokens=3, echo=True, logprobs=2))
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith("The sky is")
    n = len(lp["tokens"])
    assert n == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x <= 0 for x in lp["token_logprobs"][1:])
    assert all(len(t) <= 2 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert n == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_completion_echo_with_max_tokens_zero_scores_the_prompt_alone(client: Client):
    body = assert_ok(client.completion("The sky is blue", max_tokens=0, echo=True, logprobs=0))
    choice = body["choices"][0]
    assert choice["text"] == "The sky is blue" and body["usage"]["completion_tokens"] == 0
    assert len(choice["logprobs"]["tokens"]) == body["usage"]["prompt_tokens"]


def test_n_choices_have_their_own_index(client: Client):
    body = assert_ok(client.chat([{"role": "user", "content": "Say hi."}], n=2, temperature=1.0, seed=1))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert all(c["message"]["role"] == "assistant" for c in body["choices"])
