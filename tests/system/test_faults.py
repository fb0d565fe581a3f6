"""Faults: a native error in the middle of a generation (injected into the real stack,
in process, on the tiny model), and shutdown by SIGTERM / SIGINT with streams in flight
(a real server process)."""
import asyncio
import http.client
import json
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
import pytest_asyncio

from llmd._native import lib
from llmd.engine.native import EngineError
from llmd.structured import constrain
from tests.conformance.client import Client
from tests.conftest import llmd_process
from tests.support.stack import start_stack
from tests.system.test_limits import address, long_body, stalled_stream, wait_for

# ---- a native error mid-generation ---------------------------------------------------


class FailingDecode:
    """A decode step (`real`: Engine.decode_batch, or Engine.decode_drafts, the step of
    generations that speculate) that raises a native error on the `fail_on`-th call
    from now."""

    def __init__(self, real, several: bool = False):
        self.real = real
        self.several = several  # a step may yield several tokens (a speculative one)
        self.calls = 0
        self.fail_on: int | None = None

    def arm(self, fail_on: int) -> None:
        self.calls, self.fail_on = 0, fail_on

    def __call__(self, *args):
        self.calls += 1
        if self.calls == self.fail_on:
            raise EngineError(lib.LLMD_ERR_INTERNAL, "internal error: injected kernel failure")
        return self.real(*args)


@pytest_asyncio.fixture(params=["off", "ngram"])
async def stack(tiny_model, request):
    """The real server stack in this process, without speculative decoding (a decode step
    is Engine.decode_batch) and with it (a step is Engine.decode_drafts);
    yields (client, table, fault)."""
    s = await start_stack(tiny_model.path, max_sessions=4, speculative=request.param)
    if request.param == "off":
        fault = FailingDecode(s.engine.decode_batch)
        s.engine.decode_batch = fault
    else:
        fault = FailingDecode(s.engine.decode_drafts, several=True)
        s.engine.decode_drafts = fault
    yield s.client, s.table, fault
    await s.stop()


def chat_body(client: Client, **extra) -> dict:
    return client.chat_body([{"role": "user", "content": "hello there"}], max_tokens=8, **extra)


@pytest.mark.asyncio
async def test_native_error_mid_stream_is_an_error_event_and_the_session_is_reset_next_time(stack):
    client, table, fault = stack
    fault.arm(fail_on=3)
    stream = await asyncio.to_thread(client.chat_stream, [{"role": "user", "content": "hello there"}],
                                     session_id="victim", max_tokens=8)
    assert stream.status == 200
    tokens = [c for c in stream.chunks[1:] if "choices" in c]
    # Two steps went well, the third failed (a speculative step may yield several tokens).
    assert 2 <= len(tokens) < 8 if fault.several else len(tokens) == 2
    error = stream.chunks[-1]["error"]
    assert error["type"] == "server_error" and "injected kernel failure" in error["message"]
    assert table.named["victim"].dirty

    again = (await asyncio.to_thread(client.post_json, "/chat/completions",
                                     chat_body(client, session_id="victim"))).json()
    assert again["session_reset_reason"] == "dirty"
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["completion_tokens"] == 8 and not table.named["victim"].dirty


@pytest.mark.asyncio
async def test_native_error_without_stream_is_a_500_and_others_are_still_served(stack):
    client, table, fault = stack
    fault.arm(fail_on=2)
    failed = await asyncio.to_thread(client.post_json, "/chat/completions", chat_body(client, session_id="v2"))
    assert failed.status == 500
    assert "injected kernel failure" in failed.json()["error"]["message"]
    others = await asyncio.gather(*(asyncio.to_thread(client.post_json, "/chat/completions", chat_body(client, **sid))
                                    for sid in ({}, {"session_id": "bystander"}, {"session_id": "v2"})))
    assert [r.status for r in others] == [200, 200, 200]
    assert [r.json()["usage"]["completion_tokens"] for r in others] == [8, 8, 8]


@pytest.mark.asyncio
async def test_grammar_compiles_that_take_long_hold_up_no_other_request(stack, monkeypatch):
    # Schemas that compile for seconds each, more of them than asyncio's shared pool has
    # threads: a request without one is rendered and answered meanwhile, and they all end.
    client, table, _ = stack
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(4))  # the shared pool, smaller than min(32, cores + 4)
    clients = ThreadPoolExecutor(16)  # the clients' own threads
    release, entered = threading.Event(), threading.Semaphore(0)
    request_id = uuid.uuid4().hex
    real = constrain._compile

    def slow(spec):
        if "slow" in spec:
            entered.release()
            release.wait(60)
        return real(spec)

    def schema(name: str) -> dict:  # new to the grammar cache (another run's are in it)
        name += uuid.uuid4().hex if name.startswith("slow") else request_id
        return {"type": "json_schema", "json_schema": {"name": name, "schema": {"title": name, "type": "integer"}}}

    monkeypatch.setattr(constrain, "_compile", slow)

    def post(**extra):
        return loop.run_in_executor(clients, client.post_json, "/chat/completions", chat_body(client, **extra))

    await post(response_format=schema("cached"))
    slow_ones = [post(response_format=schema(f"slow-{i}")) for i in range(8)]
    assert await asyncio.to_thread(entered.acquire, timeout=30)
    try:  # neither a request without a schema nor one whose grammar is cached waits for them
        plain, known = await asyncio.wait_for(asyncio.gather(post(), post(response_format=schema("cached"))), 30)
        assert plain.status == 200 and plain.json()["usage"]["completion_tokens"] == 8
        assert known.status == 200 and int(known.json()["choices"][0]["message"]["content"]) >= 0
    finally:
        release.set()
    assert [r.status for r in await asyncio.gather(*slow_ones)] == [200] * 8
    clients.shutdown()


# ---- shutdown --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def long_model(tiny_llama_factory):
    return tiny_llama_factory(n_ctx=4096)


def get(url: str, path: str) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection(*address(url), timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def post(url: str, path: str, body: dict) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection(*address(url), timeout=60)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read())
    finally:
        conn.close()


def test_sigterm_drains_health_503_at_once_in_flight_and_queued_finish_then_exits_0(long_model):
    # A keep-alive timeout and a grace far past the exit wait below: the kept-alive
    # connection must not hold the exit up to either (room for a loaded machine).
    flags = ("--model", str(long_model.path), "--keepalive-timeout", "120", "--shutdown-grace", "120")
    with llmd_process(*flags) as llmd:
        assert get(llmd.url, "/health")[0] == 200
        conn = http.client.HTTPConnection(*address(llmd.url), timeout=20)
        # Long enough that the unread stream outgrows the sockets' buffers and waits for
        # its reader, so it is still running at the scrape below: 300 tokens (60 KB) fit
        # in them, and the tiny model makes those in under 0.1 s.
        body = {**long_body(long_model, sid="s", max_tokens=3000), "stream": True,
                "stream_options": {"include_usage": True}}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.readline()
        assert first.startswith(b"data: ")
        # A second request of the same session waits behind the stream: queued, not started.
        queued: list = []
        waiter = threading.Thread(target=lambda: queued.append(
            post(llmd.url, "/v1/completions", long_body(long_model, sid="s", max_tokens=5))))
        waiter.start()
        wait_for(lambda: get(llmd.url, "/v1/sessions/s")[2]["in_flight"] == 2, what="the second request to queue")
        llmd.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: get(llmd.url, "/health")[0] == 503, seconds=5, what="/health to answer 503")
        status, headers, health = get(llmd.url, "/health")
        assert (status, health, headers["Retry-After"]) == (503, {"status": "draining"}, "1")
        status, headers, refusal = post(llmd.url, "/v1/completions", long_body(long_model, max_tokens=5))
        assert status == 503 and refusal["error"]["type"] == "unavailable_error"
        assert "shutting down" in refusal["error"]["message"] and headers["Retry-After"] == "1"
        assert headers["Connection"] == "close"
        conn_metrics = http.client.HTTPConnection(*address(llmd.url), timeout=10)
        conn_metrics.request("GET", "/metrics")
        scrape = conn_metrics.getresponse()
        assert scrape.status == 200 and b"vllm:num_requests_running 1" in scrape.read()  # still scraped
        conn_metrics.close()
        rest = resp.read().decode()
        assert rest.rstrip().endswith("data: [DONE]")
        usage = [json.loads(line[6:]) for line in rest.splitlines() if '"usage"' in line][-1]["usage"]
        assert usage["completion_tokens"] == 3000  # finished, not cut
        waiter.join(timeout=30)
        status, _, answer = queued[0]
        assert status == 200 and answer["usage"]["completion_tokens"] == 5
        assert llmd.proc.wait(timeout=30) == 0  # the kept-alive connection is not waited for
        assert refused(llmd.url)


def refused(url: str) -> bool:
    try:
        socket.create_connection(address(url), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def test_when_the_grace_period_ends_streams_end_with_an_error_event_then_done(tiny_llama_factory):
    # 60,000 tokens take seconds even on a fast machine (4,000 took 0.55 s here): the
    # stream is still running when the 0.2 s of grace end.
    model = tiny_llama_factory(n_ctx=65536)
    with llmd_process("--model", str(model.path), "--ctx", "65536", "--shutdown-grace", "0.2") as llmd:
        conn = http.client.HTTPConnection(*address(llmd.url), timeout=20)
        body = {**long_body(model, max_tokens=60000), "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.readline().startswith(b"data: ")
        llmd.proc.send_signal(signal.SIGTERM)
        rest = resp.read().decode()  # http.client checks the chunk framing up to its end
        assert llmd.proc.wait(timeout=30) == 0
        events = [line[6:] for line in rest.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "unavailable_error" and "shutting down" in error["message"]


def test_when_the_grace_period_ends_a_stalled_stream_is_cut_and_it_exits_0(long_model):
    with llmd_process("--model", str(long_model.path), "--shutdown-grace", "0.5") as llmd:
        sock = stalled_stream(llmd.url, long_body(long_model))  # would last forever, unread
        time.sleep(0.3)
        llmd.proc.send_signal(signal.SIGTERM)
        # Well before the write timeout (60 s) could end the stalled stream instead.
        assert llmd.proc.wait(timeout=30) == 0
        sock.close()


def test_a_second_signal_exits_at_once(long_model):
    with llmd_process("--model", str(long_model.path), "--shutdown-grace", "60") as llmd:
        sock = stalled_stream(llmd.url, long_body(long_model))
        time.sleep(0.3)
        llmd.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert llmd.proc.poll() is None  # still waiting for the stream
        llmd.proc.send_signal(signal.SIGINT)
        # "At once": well inside the 60 s grace, with room for a loaded machine.
        assert llmd.proc.wait(timeout=30) == 128 + signal.SIGINT
        sock.close()
