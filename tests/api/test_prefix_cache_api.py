"""The prefix cache through HTTP on the default model: anonymous conversations resume
warm, sessions and sharing stay inside an API key (and a cache_salt), `--prefix-cache
off` turns it off, outputs equal a cold prefill's, and /metrics counts it."""
import re

import pytest

from tests.conformance.client import Client
from tests.conftest import running_llmd

MODEL = "SmolLM2-135M-Instruct"
SYSTEM = "You are a terse assistant. " + "Answer in one short sentence, and never use lists. " * 12


@pytest.fixture(scope="module")
def keyed():
    """Two API keys, the default scope ("key")."""
    with running_llmd("--ctx", "2048", "--max-sessions", "6", "--api-key", "key-a", "--api-key", "key-b") as url:
        yield url


def client(url: str, key: str | None = None) -> Client:
    return Client(url + "/v1", api_key=key, model=MODEL)


def ask(c: Client, messages: list[dict], **params) -> dict:
    resp = c.chat(messages, temperature=0, max_tokens=params.pop("max_tokens", 16), **params)
    assert resp.status == 200, resp.body
    return resp.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(url: str, name: str) -> float:
    text = Client(url, api_key="key-a").request("GET", "/metrics").body.decode()  # a key-less server ignores it
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_an_anonymous_conversation_reuses_the_previous_turn(keyed):
    c = client(keyed, "key-a")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    first = ask(c, messages)
    total = first["usage"]["total_tokens"]
    messages += [first["choices"][0]["message"], {"role": "user", "content": "And a fruit?"}]
    second = ask(c, messages)
    assert cached(second) >= 0.9 * total
    assert second["timings"]["cache_n"] == cached(second)
    assert second["session_reset_reason"] == "prefix_cache"


def test_another_api_key_never_gets_cached_tokens_of_a_prompt(keyed):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which key am I?"}]
    ask(client(keyed, "key-a"), messages)
    assert cached(ask(client(keyed, "key-a"), messages)) > 0
    assert cached(ask(client(keyed, "key-b"), messages)) == 0


@pytest.mark.parametrize("named", [{"prompt_cache_key": "shared-name"}, {"session_id": "shared-session"}],
                         ids=["prompt_cache_key", "session_id"])
def test_a_session_named_by_two_keys_or_salts_lends_its_cache_to_neither_other(keyed, named):
    # the session's own cache, not only the shared blocks: cached_tokens would tell key-b
    # whether key-a sent a prompt (a guess of a secret in it cached more tokens)
    prompt = f"{next(iter(named))}: Zebra PIN 4815. " * 8  # from its first token a prompt no other test sends

    def complete(key: str, **params) -> int:
        resp = client(keyed, key).completion(prompt, max_tokens=2, temperature=0, **named, **params)
        assert resp.status == 200, resp.body
        return cached(resp.json())

    complete("key-a")
    warm = complete("key-a")
    assert warm > 0
    assert complete("key-b") == 0  # key-b's session of that name, not key-a's
    assert complete("key-b", cache_salt="s") == 0
    assert complete("key-a") == warm  # untouched by key-b
    assert complete("key-a", cache_salt="s") == 0  # another salt starts it over
    complete("key-a")  # its scope again: filled afresh, then warm
    assert complete("key-a") == warm


def test_each_api_key_sees_and_frees_only_its_own_sessions(keyed):
    a, b = client(keyed, "key-a"), client(keyed, "key-b")
    prompt = "Kept by key-a. " * 6

    def complete(c: Client) -> int:
        resp = c.completion(prompt, max_tokens=2, temperature=0, session_id="mine")
        assert resp.status == 200, resp.body
        return cached(resp.json())

    def listed(c: Client) -> dict:
        resp = c.request("GET", "/sessions")
        assert resp.status == 200, resp.body
        return {s["id"]: s["resident_tokens"] for s in resp.json()["data"]}

    complete(a)
    warm = complete(a)
    resident = listed(a)["mine"]
    assert "mine" not in listed(b)
    resp = b.request("GET", "/sessions/mine")
    assert resp.status == 404 and resp.json()["error"]["code"] == "session_not_found"
    assert b.request("POST", "/sessions/mine/reset").json()["reset"] is False
    assert b.request("DELETE", "/sessions/mine").json()["deleted"] is False
    assert listed(a)["mine"] == resident and complete(a) == warm  # key-b reached nothing
    complete(b)
    assert listed(b)["mine"] > 0 and listed(a)["mine"] == resident
    body = b.request("GET", "/sessions").json()
    assert body["in_use"] > len(body["data"])  # the count is the server's: key-a's "mine" too
    assert b.request("DELETE", "/sessions/mine").json()["deleted"] is True
    assert "mine" not in listed(b) and complete(a) == warm
    body = b.request("GET", "/sessions").json()
    assert body["engine_sessions"] == body["table_sessions"]


def test_stored_responses_are_the_authenticated_keys_whatever_else_is_presented(keyed):
    empty = {"X-Api-Key": ""}  # presented, but no key: the Bearer token authenticates

    def respond(key: str, headers: dict, **body):
        return client(keyed, key).request("POST", "/responses", {"model": MODEL, "max_output_tokens": 2, **body},
                                          headers=headers)

    made = respond("key-a", empty, input="My password is hunter2.")
    assert made.status == 200, made.body
    previous = {"input": "Again?", "previous_response_id": made.json()["id"]}
    assert respond("key-b", empty, **previous).json()["error"]["code"] == "previous_response_not_found"
    assert respond("key-a", {}, **previous).status == 200  # its own, however it presents its key


def test_a_scored_prompt_is_shared_only_within_its_key(keyed):
    prompt = SYSTEM + " Scored."
    scored = client(keyed, "key-a").completion(prompt, echo=True, logprobs=1, max_tokens=0)
    assert scored.status == 200 and cached(scored.json()) == 0
    assert cached(client(keyed, "key-b").completion(prompt, max_tokens=1).json()) == 0
    assert cached(client(keyed, "key-a").completion(prompt, max_tokens=1).json()) > 0


def test_a_cache_salt_shares_only_with_the_same_salt(keyed):
    c = client(keyed, "key-a")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Salted?"}]
    ask(c, messages, cache_salt="tenant-1")
    assert cached(ask(c, messages, cache_salt="tenant-2")) == 0
    assert cached(ask(c, messages, cache_salt="tenant-1")) > 0


def test_a_bad_cache_salt_is_400(keyed):
    resp = client(keyed, "key-a").chat([{"role": "user", "content": "Hi"}], cache_salt="")
    assert resp.status == 400
    assert resp.json()["error"]["param"] == "cache_salt"


def test_named_sessions_share_a_system_prompt_and_the_metrics_show_it(keyed):
    c = client(keyed, "key-a")
    hits = metric(keyed, "llmd_prefix_cache_hits_total")
    replies = [ask(c, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Say {i}."}],
                   session_id=f"shared-{i}", max_tokens=4) for i in range(3)]
    assert cached(replies[0]) < cached(replies[1]) and cached(replies[1]) == cached(replies[2])
    assert metric(keyed, "llmd_prefix_cache_hits_total") >= hits + 2
    assert metric(keyed, "llmd_prefix_cache_blocks_shared") > 0
    assert metric(keyed, "llmd_prefix_cache_bytes_saved") > 0
    for i in range(3):
        assert c.request("DELETE", f"/sessions/shared-{i}").status == 200


def test_outputs_are_the_same_whether_the_prefix_was_cached_or_not():
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell me about the sea."}]
    with running_llmd("--ctx", "2048", "--prefix-cache", "off") as url:
        c = client(url)
        cold = ask(c, messages, max_tokens=24)
        again = ask(c, messages, max_tokens=24)
        assert cached(cold) == cached(again) == 0
    with running_llmd("--ctx", "2048", "--prefix-cache", "global") as url:
        c = client(url)
        ask(c, messages[:1] + [{"role": "user", "content": "Something else entirely."}], max_tokens=2)
        warm = ask(c, messages, max_tokens=24)
        assert cached(warm) > 0
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]


def test_eight_named_sessions_sharing_a_long_system_prompt_store_it_once():
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(170))
    with running_llmd("--ctx", "2048", "--max-sessions", "10") as url:
        c = client(url)
        replies, held = [], []
        for i in range(8):
            replies.append(ask(c, [{"role": "system", "content": system}, {"role": "user", "content": f"Say {i}."}],
                               session_id=f"s{i}", max_tokens=8))
            held.append(metric(url, "llmd_kv_cache_bytes"))
        assert replies[0]["usage"]["prompt_tokens"] >= 1500
        assert all(cached(r) >= 1500 for r in replies[1:])
        assert held[-1] <= 1.5 * held[0]
