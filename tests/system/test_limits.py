"""Limits and overload through a real server on tiny models: each limit exactly at its
bound and one over (connections, queue, max_tokens cap, body size, JSON depth), the
timeouts set from the command line, and a client that stops reading its stream."""
import http.client
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.conformance.client import Client
from tests.conftest import llmd_process


@pytest.fixture(scope="module")
def long_model(tiny_llama_factory):
    """A tiny model with room for thousands of tokens of stream."""
    return tiny_llama_factory(n_ctx=4096)


def no_end(model) -> dict[str, float]:
    """logit_bias that keeps the tiny model from ending on its own."""
    return {str(model.eos_id): -100, str(model.endoftext_id): -100, str(model.im_start_id): -100}


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def wait_for(condition, seconds: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def stalled_stream(url: str, body: dict) -> socket.socket:
    """Send a streaming request on a socket with a tiny receive buffer, and never read it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address(url))
    data = json.dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%b" % (len(data), data))
    return sock


def session(client: Client, sid: str) -> dict:
    resp = client.get_json(f"/v1/sessions/{sid}")
    return resp.json() if resp.status == 200 else {}


def wait_paused(client: Client, sid: str) -> dict:
    """The session's state once its stalled stream has stopped advancing."""
    def paused() -> dict:
        first = session(client, sid)
        time.sleep(0.3)
        second = session(client, sid)
        return second if second.get("in_flight") == 1 and first == second else {}

    return wait_for(paused, what=f"session {sid} to pause for its reader")


def long_body(model, sid: str | None = None, max_tokens: int = 4000) -> dict:
    body = {"model": "model", "prompt": "hello", "max_tokens": max_tokens, "logit_bias": no_end(model)}
    return {**body, "session_id": sid} if sid else body


# ---- connections -------------------------------------------------------------------

def test_connections_up_to_the_limit_are_served_and_one_more_gets_503(tiny_model):
    with llmd_process("--model", str(tiny_model.path), "--max-connections", "3") as llmd:
        host, port = address(llmd.url)
        held = [http.client.HTTPConnection(host, port, timeout=10) for _ in range(3)]
        for conn in held:  # each stays open (keep-alive) after its answer
            conn.request("GET", "/health")
            assert conn.getresponse().read() == b'{"status": "ok"}'
        extra = http.client.HTTPConnection(host, port, timeout=10)
        extra.request("GET", "/health")
        refused = extra.getresponse()
        assert refused.status == 503 and refused.getheader("Retry-After") == "1"
        assert json.loads(refused.read())["error"]["code"] == "too_many_connections"
        assert refused.getheader("Connection") == "close"
        held[0].close()

        def served() -> bool:
            conn = http.client.HTTPConnection(host, port, timeout=10)
            try:
                conn.request("GET", "/health")
                return conn.getresponse().status == 200
            finally:
                conn.close()

        wait_for(served, what="a freed connection slot")
        for conn in held[1:]:
            conn.close()


# ---- queue -------------------------------------------------------------------------

def test_generations_queue_up_to_the_limit_and_one_more_gets_503(long_model):
    with llmd_process("--model", str(long_model.path), "--max-queue", "2", "--max-sessions", "3") as llmd:
        client = Client(llmd.url)
        holder = stalled_stream(llmd.url, long_body(long_model, "q"))  # holds session q
        wait_for(lambda: session(client, "q").get("resident_tokens"), what="the first generation")
        short = {"model": "model", "prompt": "hi", "max_tokens": 2, "session_id": "q"}
        results: list[int] = []
        waiters = [threading.Thread(target=lambda: results.append(client.post_json("/v1/completions", short).status))
                   for _ in range(2)]
        for t in waiters:
            t.start()
        wait_for(lambda: session(client, "q").get("in_flight") == 3, what="two queued requests")
        over = client.post_json("/v1/completions", {**short, "session_id": None})
        assert over.status == 503 and over.headers["Retry-After"] == "1"
        assert over.json()["error"]["type"] == "unavailable_error"
        holder.close()  # the stalled client leaves: the queue drains
        for t in waiters:
            t.join(timeout=20)
        assert results == [200, 200]
        assert client.post_json("/v1/completions", short).status == 200


def test_a_deleted_session_holds_its_slot_until_its_request_ends(long_model):
    flags = ("--model", str(long_model.path), "--max-sessions", "3", "--session-eviction", "none")
    with llmd_process(*flags) as llmd:
        client = Client(llmd.url)
        holder = stalled_stream(llmd.url, long_body(long_model, "a"))
        wait_paused(client, "a")  # its request lasts until the client leaves (or the write times out)
        assert client.request("DELETE", "/v1/sessions/a").json()["deleted"] is True
        short = {"model": "model", "prompt": "hi", "max_tokens": 1}
        assert client.post_json("/v1/completions", {**short, "session_id": "b"}).status == 200
        # Two named slots: b, and a's engine session, which lives until its stream ends.
        full = client.post_json("/v1/completions", {**short, "session_id": "c"})
        assert full.status == 429 and full.json()["error"]["code"] == "capacity_exhausted"
        holder.close()
        wait_for(lambda: client.post_json("/v1/completions", {**short, "session_id": "c"}).status == 200,
                 what="a's slot to be freed")


# ---- a client that stops reading ---------------------------------------------------

def test_a_client_that_stops_reading_is_paused_then_cancelled_and_its_session_stays_usable(long_model):
    # The pause must be seen before the write timeout ends it: 10 s leaves a loaded
    # machine room for the polling.
    with llmd_process("--model", str(long_model.path), "--write-timeout", "10") as llmd:
        client = Client(llmd.url)
        sock = stalled_stream(llmd.url, long_body(long_model, "stall"))
        try:
            # Socket buffers full, the generation waits for its reader instead of
            # running on to its 4000 tokens (about 900 tokens of stream fit).
            held = wait_paused(client, "stall")
            assert 0 < held["resident_tokens"] < 2000
            done = wait_for(lambda: (s := session(client, "stall")) and s["in_flight"] == 0 and s,
                            seconds=30, what="the write timeout to cancel the generation")
            assert done["resident_tokens"] == held["resident_tokens"]
        finally:
            sock.close()
        again = client.post_json("/v1/completions", long_body(long_model, "stall", max_tokens=4)).json()
        assert again["usage"]["completion_tokens"] == 4
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # its cache was kept


# ---- max_tokens, body size, JSON depth, timeouts -------------------------------------

@pytest.fixture(scope="module")
def bounded(tiny_model):
    flags = ("--model", str(tiny_model.path), "--max-tokens-limit", "5", "--max-body-bytes", "4000",
             "--header-timeout", "0.5", "--body-timeout", "0.5", "--keepalive-timeout", "0.5")
    with llmd_process(*flags) as llmd:
        yield llmd.url


@pytest.mark.parametrize("asked", [5, 6, None])
def test_max_tokens_is_capped_at_the_limit(bounded, tiny_model, asked):
    body = {"model": "model", "messages": [{"role": "user", "content": "hi"}],
            "logit_bias": no_end(tiny_model), "max_tokens": asked}
    reply = Client(bounded).post_json("/v1/chat/completions", body).json()
    assert reply["usage"]["completion_tokens"] == 5
    assert reply["choices"][0]["finish_reason"] == "length"


def test_streams_are_capped_too(bounded, tiny_model):
    body = {"model": "model", "prompt": "hi", "max_tokens": 50, "logit_bias": no_end(tiny_model),
            "stream_options": {"include_usage": True}}
    chunks = Client(bounded).post_stream("/v1/completions", {**body, "stream": True}).chunks
    assert chunks[-1]["usage"]["completion_tokens"] == 5


def sized_body(size: int) -> bytes:
    """A valid completion request padded with JSON whitespace to exactly `size` bytes."""
    data = json.dumps({"model": "model", "prompt": "hi", "max_tokens": 1}).encode()
    return data + b" " * (size - len(data))


def test_body_at_the_limit_passes_and_one_byte_over_is_413(bounded):
    client = Client(bounded)
    assert client.post_json("/v1/completions", sized_body(4000)).status == 200
    over = client.post_json("/v1/completions", sized_body(4001))
    assert over.status == 413 and over.json()["error"]["code"] == "request_too_large"


def nested_body(depth: int) -> bytes:
    """A chat request whose JSON nests `depth` levels (the top object is 1) in `metadata`,
    which llmd accepts and ignores."""
    arrays = "[" * (depth - 2) + "]" * (depth - 2)
    return ('{"model": "model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
            '"metadata": {"k": %s}}' % arrays).encode()


def test_json_nesting_at_the_limit_passes_and_one_deeper_is_400(bounded):
    client = Client(bounded)
    assert client.post_json("/v1/chat/completions", nested_body(64)).status == 200
    deep = client.post_json("/v1/chat/completions", nested_body(65))
    assert deep.status == 400 and "deeper than 64" in deep.json()["error"]["message"]


def raw_exchange(url: str, data: bytes) -> tuple[bytes, float]:
    """Send `data`, read until the server closes; (what it sent, seconds it took)."""
    start = time.monotonic()
    with socket.create_connection(address(url), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received, time.monotonic() - start


def test_timeouts_from_the_command_line_apply(bounded):
    # Each of the 0.5 s timeouts fires no earlier than it should, and before the
    # default it replaces (header 10 s, body 60 s, keep-alive 5 s); no tighter bound,
    # so that a loaded machine cannot fail it.
    slow_head, took = raw_exchange(bounded, b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
    assert slow_head.startswith(b"HTTP/1.1 408 ") and 0.4 < took < 9
    slow_body, took = raw_exchange(bounded, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                                            b"Content-Length: 10\r\n\r\n{")
    assert slow_body.startswith(b"HTTP/1.1 408 ") and 0.4 < took < 9
    idle, took = raw_exchange(bounded, b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert idle.startswith(b"HTTP/1.1 200 ") and idle.count(b"HTTP/1.1") == 1 and 0.4 < took < 4.5
