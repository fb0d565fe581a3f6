"""Named sessions through HTTP on the default model: routing, admission, eviction,
the session routes, ordering, isolation and warm resume."""
import concurrent.futures
from urllib.parse import quote

import pytest

from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.system.test_limits import wait_for

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    """3 named slots + scratch, strict table (no eviction)."""
    with running_llmd("--max-sessions", "4", "--ctx", "2048", "--session-eviction", "none") as url:
        yield Client(url + "/v1", model=MODEL)


def chat(client: Client, content: str, headers: dict | None = None, history: list | None = None, **params):
    messages = (history or []) + [{"role": "user", "content": content}]
    return client.request("POST", "/chat/completions", client.chat_body(messages, **params), headers)


def session_ids(client: Client) -> set[str]:
    return {s["id"] for s in client.get_json("/sessions").json()["data"]}


def delete_all(client: Client) -> None:
    for sid in session_ids(client):
        assert client.request("DELETE", f"/sessions/{quote(sid, safe='')}").status == 200


def test_body_session_id_wins_over_headers(server):
    delete_all(server)
    body = server.chat_body([{"role": "user", "content": "Hi"}], session_id="from-body", max_tokens=2)
    resp = server.request("POST", "/chat/completions", body, {"X-Session-ID": "from-header"})
    assert resp.status == 200
    assert session_ids(server) == {"from-body"}


def test_headers_are_read_in_the_documented_order(server):
    delete_all(server)
    headers = {"X-Session-ID": "last", "x-session-affinity": "third", "session_id": "second",
               "X-ExecuTorch-Session-ID": "first"}
    assert chat(server, "Hi", headers, max_tokens=2).status == 200
    del headers["X-ExecuTorch-Session-ID"]
    assert chat(server, "Hi", headers, max_tokens=2).status == 200
    del headers["session_id"]
    assert chat(server, "Hi", headers, max_tokens=2).status == 200
    assert session_ids(server) == {"first", "second", "third"}


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "caf\u00e9", ""])
def test_invalid_session_id_is_400(server, bad):
    body = server.chat_body([{"role": "user", "content": "Hi"}], session_id=bad, max_tokens=2)
    resp = server.post_json("/chat/completions", body)
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "invalid_session_id"


def test_full_table_is_429_with_retry_after_before_any_stream_byte(server):
    delete_all(server)
    for sid in ("a", "b", "c"):
        assert chat(server, "Hi", {"X-Session-ID": sid}, max_tokens=2).status == 200
    plain = chat(server, "Hi", {"X-Session-ID": "d"}, max_tokens=2)
    assert plain.status == 429
    assert plain.headers["Retry-After"]
    assert plain.json()["error"]["type"] == "capacity_error"
    assert plain.json()["error"]["code"] == "capacity_exhausted"
    body = server.chat_body([{"role": "user", "content": "Hi"}], stream=True, max_tokens=2)
    streamed = server.request("POST", "/chat/completions", body, {"X-Session-ID": "d"})
    assert streamed.status == 429
    assert streamed.headers.get_content_type() == "application/json"
    # anonymous requests still have the scratch slot
    assert chat(server, "Hi", max_tokens=2).status == 200


def test_session_routes_list_get_reset_delete(server):
    delete_all(server)
    assert chat(server, "Hello there", {"X-Session-ID": "s1"}, max_tokens=3).status == 200
    info = server.get_json("/sessions/s1").json()
    assert info["id"] == "s1" and info["resident_tokens"] > 0 and info["in_flight"] == 0
    assert info["kv_bytes"] > 0
    assert server.request("POST", "/sessions/s1/reset").json()["reset"] is True
    assert server.get_json("/sessions/s1").json()["resident_tokens"] == 0
    assert server.request("DELETE", "/sessions/s1").json()["deleted"] is True
    assert server.request("DELETE", "/sessions/s1").json()["deleted"] is False  # idempotent
    missing = server.get_json("/sessions/s1")
    assert missing.status == 404 and missing.json()["error"]["code"] == "session_not_found"
    assert server.request("POST", "/sessions/nope/reset").status == 200


@pytest.mark.parametrize("sid", ["team/alice", "a?b#c", "100%", "x/reset"])
def test_the_session_routes_reach_an_id_of_any_printable_characters_percent_encoded(server, sid):
    delete_all(server)
    assert chat(server, "Hello", {"X-Session-ID": sid}, max_tokens=2).status == 200
    path = f"/sessions/{quote(sid, safe='')}"
    assert server.get_json(path).json()["id"] == sid
    assert server.request("POST", path + "/reset").json()["reset"] is True
    assert server.request("DELETE", path).json()["deleted"] is True
    assert session_ids(server) == set()


def test_warm_resume_reuses_the_previous_turns(server):
    delete_all(server)
    history = []
    # A salt of its own: no other session's cached prefix, so that only warm resume is seen.
    first = chat(server, "Name three colours.", {"X-Session-ID": "warm"}, max_tokens=12, cache_salt="warm").json()
    assert first["session_reset_reason"] == "new"
    history += [{"role": "user", "content": "Name three colours."},
                {"role": "assistant", "content": first["choices"][0]["message"]["content"]}]
    second = chat(server, "And three animals?", {"X-Session-ID": "warm"}, history=history, max_tokens=4,
                  cache_salt="warm").json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 0.9 * first["usage"]["prompt_tokens"]
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - cached
    assert second["session_reset_reason"] in ("exact_prefix", "common_prefix")


A_ID = 81  # the token "a"; "aaaa" is one token when tokenized, four when forced like this


def reply_text(resp) -> str:
    """The assistant content of a JSON or streamed chat response."""
    if hasattr(resp, "chunks"):
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in resp.chunks if c["choices"])
    return resp.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("stream", [False, True])
def test_resent_reply_reuses_the_ids_the_model_generated(server, stream):
    delete_all(server)
    question = [{"role": "user", "content": "Say something."}]
    body = server.chat_body(question, session_id="spliced", max_tokens=4, logit_bias={str(A_ID): 100},
                            stream=stream, stream_options={"include_usage": True} if stream else None)
    if not stream:
        del body["stream"], body["stream_options"]
    first = server.post_stream("/chat/completions", body) if stream else server.post_json("/chat/completions", body)
    assert reply_text(first) == "aaaa"
    prompt_tokens = (first.chunks[-1] if stream else first.json())["usage"]["prompt_tokens"]
    history = question + [{"role": "assistant", "content": "aaaa"}]
    second = chat(server, "Again.", history=history, max_tokens=2, session_id="spliced").json()
    # Re-tokenized, "aaaa" would be one token and reuse would stop at the reply; spliced,
    # the cache's four "a" ids (the last one was never fed) are reused as they are.
    assert second["session_reset_reason"] == "exact_prefix"
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens + 3


def test_edited_or_stop_trimmed_replies_fall_back_to_their_text(server):
    delete_all(server)
    question = [{"role": "user", "content": "Count to five."}]
    first = chat(server, "Count to five.", session_id="trim", max_tokens=16, stop=["3"]).json()
    trimmed = first["choices"][0]["message"]["content"]
    for reply in (trimmed, trimmed + " edited"):
        history = question + [{"role": "assistant", "content": reply}]
        resumed = chat(server, "Go on.", history=history, max_tokens=8, session_id="trim").json()
        fresh = chat(server, "Go on.", history=history, max_tokens=8, session_id="fresh",
                     cache_salt=f"cold {reply}").json()  # a scope of its own: a cold prefill
        assert fresh["session_reset_reason"] == "new"
        assert resumed["choices"][0]["message"]["content"] == fresh["choices"][0]["message"]["content"]
        assert resumed["usage"]["prompt_tokens"] == fresh["usage"]["prompt_tokens"]
        server.request("DELETE", "/sessions/fresh")


def test_identical_request_is_equal_and_answers_the_same(server):
    delete_all(server)
    a = chat(server, "Count to five.", {"X-Session-ID": "same"}, max_tokens=8).json()
    b = chat(server, "Count to five.", {"X-Session-ID": "same"}, max_tokens=8).json()
    assert b["session_reset_reason"] in ("equal", "common_prefix")
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == a["usage"]["prompt_tokens"] - 1
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_sessions_are_isolated_under_concurrency(server):
    delete_all(server)
    prompts = {"iso1": "Write a haiku about rain.", "iso2": "List prime numbers.", "iso3": "Describe a cat."}
    solo = {}
    for sid, text in prompts.items():
        solo[sid] = chat(server, text, max_tokens=24).json()["choices"][0]["message"]["content"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = {sid: pool.submit(chat, server, text, {"X-Session-ID": sid}, max_tokens=24)
                   for sid, text in prompts.items()}
        together = {sid: f.result().json()["choices"][0]["message"]["content"] for sid, f in futures.items()}
    assert together == solo


def test_requests_for_one_session_run_in_arrival_order(server):
    delete_all(server)
    order = []

    def run(i, tokens):
        resp = chat(server, f"Request {i}", {"X-Session-ID": "ordered"}, max_tokens=tokens)
        order.append(i)
        return resp.status

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(run, 1, 48)
        # The session exists once request 1 holds it: only then has it surely arrived
        # first (a fixed pause is not enough on a loaded machine).
        wait_for(lambda: server.get_json("/sessions/ordered").status == 200, what="request 1 to hold the session")
        second = pool.submit(run, 2, 1)
        assert first.result() == 200 and second.result() == 200
    assert order == [1, 2]  # the short request waited for the long one


def test_single_session_engine_refuses_named_sessions():
    with running_llmd("--max-sessions", "1", "--ctx", "512") as url:
        client = Client(url + "/v1", model=MODEL)
        resp = chat(client, "Hi", {"X-Session-ID": "x"}, max_tokens=2)
        assert resp.status == 400 and resp.json()["error"]["code"] == "unsupported_session"
        assert chat(client, "Hi", max_tokens=2).status == 200


def test_lru_eviction_takes_the_least_recently_used_idle_session():
    with running_llmd("--max-sessions", "3", "--ctx", "512", "--session-eviction", "lru") as url:
        client = Client(url + "/v1", model=MODEL)
        for sid in ("old", "new"):
            assert chat(client, "Hi", {"X-Session-ID": sid}, max_tokens=2).status == 200
        assert chat(client, "Hi", {"X-Session-ID": "newest"}, max_tokens=2).status == 200
        assert session_ids(client) == {"new", "newest"}


def test_no_warm_resume_reports_disabled():
    with running_llmd("--max-sessions", "2", "--ctx", "512", "--no-warm-resume") as url:
        client = Client(url + "/v1", model=MODEL)
        chat(client, "Hi", {"X-Session-ID": "cold"}, max_tokens=2)
        again = chat(client, "Hi", {"X-Session-ID": "cold"}, max_tokens=2).json()
        assert again["session_reset_reason"] == "disabled"
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
