"""asyncio HTTP glue (llmd/http/server.py) over real loopback sockets, with a tiny dummy app."""
import asyncio
import http.client
import json
import socket
import struct

import pytest
import pytest_asyncio

from llmd.api.answers import transport_refusal
from llmd.http.parser import Limits
from llmd.http.server import HttpRequest, HttpServer, Response, StreamResponse


class DummyApp:
    """Routes used by the tests; records what the server told it."""

    def __init__(self):
        self.requests: list[HttpRequest] = []
        self.stream_closed = asyncio.Event()
        self.stream_produced = 0
        self.release = asyncio.Event()

    async def __call__(self, req: HttpRequest):
        self.requests.append(req)
        if req.path == "/echo":
            return Response(200, json.dumps({
                "method": req.method, "path": req.path, "query": req.query,
                "body": req.body.decode(), "session": req.headers.get("X-Session-ID"),
            }).encode(), headers=[("X-Extra", "1")])
        if req.path == "/sleep":
            await asyncio.sleep(float(req.query))
            return Response(200, req.query.encode(), content_type="text/plain")
        if req.path == "/boom":
            raise RuntimeError("boom")
        if req.path == "/wait-disconnect":
            await asyncio.wait_for(req.disconnected.wait(), 3)
            return Response(200, b"gone")
        if req.path == "/stream":
            return StreamResponse(200, self.sse(int(req.query or 3)))
        if req.path == "/stream-forever":
            return StreamResponse(200, self.forever())
        if req.path == "/stream-flood":
            return StreamResponse(200, self.flood(), content_type="application/octet-stream")
        if req.path == "/stream-fail":
            return StreamResponse(200, self.fail())
        return Response(404, b'{"error": "nope"}')

    async def sse(self, n):
        for i in range(n):
            yield b"data: %d\n\n" % i
        yield b"data: [DONE]\n\n"

    async def forever(self):
        try:
            yield b"data: first\n\n"
            await asyncio.Event().wait()  # a producer waiting for a token that never comes
        finally:
            self.stream_closed.set()

    async def flood(self):
        try:
            while True:
                self.stream_produced += 65536
                yield b"x" * 65536
        finally:
            self.stream_closed.set()

    async def fail(self):
        yield b"data: 1\n\n"
        raise RuntimeError("producer broke")


pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def start():
    servers = []

    async def start(app=None, **limits):
        app = app or DummyApp()
        server = HttpServer(app, Limits(**limits), refusal=transport_refusal)
        await server.start("127.0.0.1", 0)
        servers.append(server)
        return server, app

    yield start
    for server in servers:
        await server.close(grace=1.0)


async def within(aw, seconds=3.0):
    return await asyncio.wait_for(aw, seconds)


async def connect(server):
    return await within(asyncio.open_connection("127.0.0.1", server.port))


async def read_response(reader, head_only=False):
    """(status, headers with lowercased names, body) of one response off a raw stream."""
    raw = await within(reader.readuntil(b"\r\n\r\n"))
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if head_only or status == 100:
        return status, headers, b""
    if "content-length" in headers:
        return status, headers, await within(reader.readexactly(int(headers["content-length"])))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int(await within(reader.readuntil(b"\r\n")), 16)
            chunk = await within(reader.readexactly(size + 2))
            if size == 0:
                return status, headers, body
            body += chunk[:-2]
    return status, headers, await within(reader.read())


def error_of(body):
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["param"] is None
    return err


GET_ECHO = b"GET /echo HTTP/1.1\r\nHost: t\r\n\r\n"


async def test_keep_alive_serves_many_requests_on_one_connection(start):
    server, app = await start()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3)
        out = []
        for i in range(3):
            conn.request("POST", f"/echo?i={i}", body=b"hi %d" % i, headers={"X-Session-ID": "s"})
            resp = conn.getresponse()
            out.append((resp.status, dict(resp.getheaders()), json.loads(resp.read()), conn.sock))
        conn.close()
        return out

    out = await within(asyncio.to_thread(client))
    assert [o[2]["body"] for o in out] == ["hi 0", "hi 1", "hi 2"]
    assert [o[2]["query"] for o in out] == ["i=0", "i=1", "i=2"]
    assert out[0][2]["session"] == "s" and out[0][2]["path"] == "/echo"
    assert out[0][3] is out[2][3]  # the same socket throughout
    status, headers = out[0][0], out[0][1]
    assert status == 200 and headers["Server"] == "llmd" and "GMT" in headers["Date"]
    assert headers["Content-Type"] == "application/json" and headers["X-Extra"] == "1"
    assert int(headers["Content-Length"]) > 0 and "Connection" not in headers
    assert app.requests[0].client[0] == "127.0.0.1"


async def test_pipelined_requests_are_answered_in_order(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /sleep?0.3 HTTP/1.1\r\nHost: t\r\n\r\n"
                 b"GET /sleep?0 HTTP/1.1\r\nHost: t\r\n\r\n"
                 b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc")
    bodies = [(await read_response(reader))[2] for _ in range(3)]
    assert bodies[:2] == [b"0.3", b"0"] and json.loads(bodies[2])["body"] == "abc"
    writer.close()


async def test_expect_100_continue_is_answered_before_the_body(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
    assert await within(reader.readuntil(b"\r\n\r\n")) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"body")
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["body"] == "body"
    writer.close()


async def test_expect_100_continue_with_too_large_body_gets_413_not_100(start):
    server, _ = await start(max_body_bytes=10)
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 413 and headers["connection"] == "close"
    assert error_of(body)["type"] == "invalid_request_error"
    assert await within(reader.read()) == b""
    writer.close()


async def test_head_sends_the_get_headers_without_a_body(start):
    server, _ = await start()
    reader, writer = await connect(server)
    get = b"GET /sleep?0.01 HTTP/1.1\r\nHost: t\r\n\r\n"
    writer.write(get + b"HEAD /sleep?0.01 HTTP/1.1\r\nHost: t\r\n\r\n" + get)
    _, get_headers, get_body = await read_response(reader)
    _, head_headers, _ = await read_response(reader, head_only=True)
    status, _, after = await read_response(reader)  # parses only if HEAD sent no body bytes
    assert head_headers["content-length"] == get_headers["content-length"] == str(len(get_body))
    assert head_headers["content-type"] == get_headers["content-type"] == "text/plain"
    assert status == 200 and after == get_body
    writer.close()


@pytest.mark.parametrize("raw", [
    b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n",
    b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nxxxxxx\r\n5\r\nxxxxx\r\n",
])
async def test_too_large_body_is_413_with_an_openai_error(start, raw):
    server, app = await start(max_body_bytes=10)
    reader, writer = await connect(server)
    writer.write(raw)
    status, headers, body = await read_response(reader)
    assert status == 413 and headers["connection"] == "close"
    assert error_of(body)["code"] == "request_too_large"
    assert app.requests == []
    writer.close()


async def test_a_refusal_on_the_messages_route_is_in_anthropics_shape(start):
    server, app = await start(max_body_bytes=10)
    reader, writer = await connect(server)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 413 and json.loads(body) == {
        "type": "error", "error": {"type": "request_too_large", "message": "request body too large"}}
    writer.close()


async def test_body_exactly_at_limit_is_accepted(start):
    server, _ = await start(max_body_bytes=10)
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n0123456789")
    status, _, body = await read_response(reader)
    assert status == 200 and json.loads(body)["body"] == "0123456789"
    writer.close()


@pytest.mark.parametrize("extra", [b"X: " + b"v" * 300 + b"\r\n",
                                   b"".join(b"X-%d: v\r\n" % i for i in range(10))])
async def test_too_large_or_too_many_headers_is_431(start, extra):
    server, _ = await start(max_header_bytes=200, max_header_count=10)
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: t\r\n" + extra + b"\r\n")
    status, _, body = await read_response(reader)
    assert status == 431 and error_of(body)["code"] == "headers_too_large"
    writer.close()


async def test_overlong_target_is_414(start):
    server, _ = await start(max_request_line=100)
    reader, writer = await connect(server)
    writer.write(b"GET /" + b"a" * 200 + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    status, _, body = await read_response(reader)
    assert status == 414 and error_of(body)["code"] == "uri_too_long"
    writer.close()


async def test_malformed_request_is_400_then_closed_and_the_next_connection_works(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET / HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n" + GET_ECHO)
    status, headers, body = await read_response(reader)
    err = error_of(body)
    assert status == 400 and headers["connection"] == "close"
    assert err["type"] == "invalid_request_error" and err["code"] == "bad_request"
    assert await within(reader.read()) == b""  # the pipelined GET is not answered
    writer.close()
    reader, writer = await connect(server)
    writer.write(GET_ECHO)
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_app_exception_is_500_and_the_connection_survives(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /boom HTTP/1.1\r\nHost: t\r\n\r\n" + GET_ECHO)
    status, _, body = await read_response(reader)
    assert status == 500 and error_of(body)["type"] == "server_error"
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_stream_is_chunked_sse_with_no_buffering_headers(start):
    server, _ = await start()

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=3)
        conn.request("GET", "/stream?2")
        resp = conn.getresponse()
        out = resp.status, dict(resp.getheaders()), resp.read()
        conn.request("GET", "/echo")  # the connection is reusable after the last chunk
        out += (conn.getresponse().status,)
        conn.close()
        return out

    status, headers, body, next_status = await within(asyncio.to_thread(client))
    assert status == 200 and next_status == 200
    assert headers["Transfer-Encoding"] == "chunked" and "Content-Length" not in headers
    assert headers["Content-Type"] == "text/event-stream"
    assert headers["Cache-Control"] == "no-cache" and headers["X-Accel-Buffering"] == "no"
    assert body == b"data: 0\n\ndata: 1\n\ndata: [DONE]\n\n"


def reset(writer) -> None:
    """Close with SO_LINGER 0: the peer gets a reset, not an orderly end."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.close()


async def test_client_reset_mid_stream_sets_disconnected_and_closes_the_iterator(start):
    server, app = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /stream-forever HTTP/1.1\r\nHost: t\r\n\r\n")
    await within(reader.readuntil(b"data: first\n\n\r\n"))
    reset(writer)
    await within(app.stream_closed.wait(), 2)
    assert app.requests[0].disconnected.is_set()


async def test_client_reset_while_app_works_sets_disconnected(start):
    server, app = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /wait-disconnect HTTP/1.1\r\nHost: t\r\n\r\n")
    while not app.requests:
        await asyncio.sleep(0.01)
    reset(writer)
    await within(app.requests[0].disconnected.wait(), 2)


async def test_client_reset_before_the_head_closes_a_stream_that_never_started(start):
    opened, closed = asyncio.Event(), asyncio.Event()

    class Chunks:  # an iterator that must be closed even though nobody iterated it
        def __aiter__(self):
            return self

        async def __anext__(self):
            return b"data: x\n\n"

        async def aclose(self):
            closed.set()

    async def app(request):
        opened.set()
        await asyncio.sleep(0.2)  # the client resets meanwhile
        return StreamResponse(200, Chunks())

    server, _ = await start(app)
    reader, writer = await connect(server)
    writer.write(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
    await within(opened.wait())
    reset(writer)
    await within(closed.wait(), 2)


async def test_half_closed_client_is_not_gone_and_gets_the_whole_answer(start):
    server, app = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /sleep?0.3 HTTP/1.1\r\nHost: t\r\n\r\n")
    writer.write_eof()  # shutdown(SHUT_WR): the request is complete, the answer still wanted
    status, headers, body = await read_response(reader)
    assert (status, body) == (200, b"0.3")
    assert headers["connection"] == "close"
    assert not app.requests[0].disconnected.is_set()
    writer.close()


async def test_stream_writes_wait_for_a_slow_reader_and_time_out(start):
    server, app = await start(write_timeout=0.5)
    reader, writer = await connect(server)
    writer.write(b"GET /stream-flood HTTP/1.1\r\nHost: t\r\n\r\n")
    await within(app.stream_closed.wait(), 3)  # the client never reads: writes time out
    assert app.stream_produced < 64 * 1024 * 1024  # bounded by socket buffers, not memory
    assert app.requests[0].disconnected.is_set()
    writer.close()


async def test_failure_mid_stream_cuts_the_connection_without_a_last_chunk(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /stream-fail HTTP/1.1\r\nHost: t\r\n\r\n")
    await within(reader.readuntil(b"\r\n\r\n"))
    rest = await within(reader.read())
    assert rest == b"9\r\ndata: 1\n\n\r\n"  # no "0\r\n\r\n": the client sees a cut stream
    writer.close()


async def test_slow_headers_get_408_and_a_close(start):
    server, _ = await start(header_timeout=0.3)
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHo")
    status, headers, body = await read_response(reader)
    assert status == 408 and error_of(body)["code"] == "request_timeout"
    assert await within(reader.read()) == b""
    writer.close()


async def test_slow_body_gets_408(start):
    server, _ = await start(body_timeout=0.3)
    reader, writer = await connect(server)
    writer.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\nab")
    assert (await read_response(reader))[0] == 408
    writer.close()


async def test_idle_keep_alive_connection_is_closed_silently(start):
    server, _ = await start(keepalive_timeout=0.2)
    reader, writer = await connect(server)
    writer.write(GET_ECHO)
    assert (await read_response(reader))[0] == 200
    assert await within(reader.read(), 2) == b""
    writer.close()


async def test_a_stalled_connection_does_not_delay_others(start):
    server, _ = await start(header_timeout=2)
    _, stalled = await connect(server)
    stalled.write(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-")
    reader, writer = await connect(server)
    writer.write(GET_ECHO)
    assert (await read_response(reader))[0] == 200
    writer.close()
    stalled.close()


async def test_http10_response_closes_and_streams_close_delimited(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /stream?1 HTTP/1.0\r\n\r\n")
    status, headers, body = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert "transfer-encoding" not in headers and body == b"data: 0\n\ndata: [DONE]\n\n"
    writer.close()
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" + b"GET /echo HTTP/1.0\r\n\r\n")
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "keep-alive"
    status, headers, _ = await read_response(reader)
    assert headers["connection"] == "close" and await within(reader.read()) == b""
    writer.close()


async def test_connection_close_is_honoured(start):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" + GET_ECHO)
    status, headers, _ = await read_response(reader)
    assert status == 200 and headers["connection"] == "close"
    assert await within(reader.read()) == b""
    writer.close()


async def test_close_drops_idle_connections_and_lets_busy_ones_finish(start):
    server, app = await start()
    idle_reader, idle_writer = await connect(server)
    reader, writer = await connect(server)
    writer.write(b"GET /sleep?0.3 HTTP/1.1\r\nHost: t\r\n\r\n")
    while not app.requests:  # busy from here: a fixed pause may not be enough under load
        await asyncio.sleep(0.01)
    await within(server.close(grace=2))
    status, headers, body = await read_response(reader)
    assert status == 200 and body == b"0.3" and headers["connection"] == "close"
    assert await within(idle_reader.read()) == b""
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", server.port)
    idle_writer.close()
    writer.close()


async def test_drain_keeps_accepting_ends_connections_after_their_response_and_returns_when_idle(start):
    server, app = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /sleep?0.5 HTTP/1.1\r\nHost: t\r\n\r\n")
    while not app.requests:
        await asyncio.sleep(0.01)
    draining = asyncio.create_task(server.drain(5.0))
    await asyncio.sleep(0.05)
    # A new connection is still accepted and answered (a balancer's health check), and
    # told to close; the drain waits for the request in flight.
    late_reader, late_writer = await connect(server)
    late_writer.write(GET_ECHO)
    status, headers, _ = await read_response(late_reader)
    assert status == 200 and headers["connection"] == "close" and not draining.done()
    status, headers, body = await read_response(reader)
    assert status == 200 and body == b"0.5" and headers["connection"] == "close"
    await within(draining, 2.0)
    assert await within(reader.read()) == b""
    for w in (writer, late_writer):
        w.close()


async def test_drain_gives_up_after_its_timeout(start):
    server, app = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /sleep?3 HTTP/1.1\r\nHost: t\r\n\r\n")
    while not app.requests:
        await asyncio.sleep(0.01)
    started = asyncio.get_running_loop().time()
    await within(server.drain(0.2), 2.0)
    assert asyncio.get_running_loop().time() - started < 1.0
    writer.close()


async def test_request_id_is_echoed_or_generated_on_every_response(start, caplog):
    server, _ = await start()
    reader, writer = await connect(server)
    writer.write(b"GET /echo HTTP/1.1\r\nHost: t\r\nX-Request-Id: abc-123\r\n\r\n"
                 b"GET /missing HTTP/1.1\r\nHost: t\r\nX-Request-Id: bad id\r\n\r\n")
    with caplog.at_level("INFO", logger="llmd.access"):
        _, echoed, _ = await read_response(reader)
        status, made, _ = await read_response(reader)
    writer.close()
    assert echoed["x-request-id"] == "abc-123"
    assert status == 404 and made["x-request-id"].startswith("req-") and len(made["x-request-id"]) == 36
    lines = [r.getMessage() for r in caplog.records if r.name == "llmd.access"]
    assert "request_id=abc-123" in lines[0] and f"request_id={made['x-request-id']}" in lines[1]
