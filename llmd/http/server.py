"""asyncio glue: sockets ⇄ the sans-IO parser in llmd.http.parser ⇄ the application.

Each connection is one task that serves its requests strictly one after another:
read a head (idle/header timeouts), read the body (body timeout; "100 Continue" first
if asked), call the app, write the response, then let the parser start on whatever the
client pipelined meanwhile. While the app runs, a watcher task keeps reading so that a
client that goes away is noticed at once: a reset sets `HttpRequest.disconnected`,
and a stream in progress is stopped and its iterator closed. An end of input (EOF)
is not a departure: a client may half-close its sending side once the request is
out (shutdown(SHUT_WR)) and still read the whole answer, so the request runs on and
the connection closes after its response. A client that closed both sides is
noticed when a write to it fails (a stream writes at least its keep-alive pings).
Every write waits for the socket to drain (bounded by `write_timeout`), so a
slow reader slows its producer instead of growing our buffers; the kernel's send
buffer and asyncio's are both capped at `write_buffer` bytes, so a reader that stops
reading is noticed after a bounded amount of stream, not after megabytes. Parse errors
and app failures are answered with the app's own refusal (`Refusal`); every answer, the
refusals included, is reported to `answered` (for the app's request count); nothing that
happens on one connection escapes its task. Past `max_connections` open connections, a new
one is answered 503 at once, without reading its request, and closed. Shutting
down is two steps: `drain` keeps accepting but ends each connection after its
response until nothing is in flight, then `close` stops accepting and cuts what is
left.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import uuid
from collections import deque
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import AsyncIterator, Awaitable, Callable, Union
from urllib.parse import urlsplit

from llmd.http.parser import (CONTINUE, LAST_CHUNK, Body, EndOfMessage, Event, Headers, Limits,
                       ParseError, Request, RequestParser, render_chunk, render_head)

log = logging.getLogger("llmd.server")
access_log = logging.getLogger("llmd.access")


@dataclass
class HttpRequest:
    method: str
    path: str                 # as sent, not percent-decoded
    query: str                # without the "?"
    headers: Headers          # case-insensitive: headers.get("x-session-id")
    body: bytes
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    client: tuple[str, int] | None = None
    id: str = ""              # X-Request-Id: the client's, else one made up; logged, echoed
    principal: str = ""       # the API key it authenticated with, as a digest ("" without keys)
    log: dict = field(default_factory=dict)  # access-log fields the app knows before it answers


@dataclass
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "application/json"
    log: dict = field(default_factory=dict)  # extra access-log fields from the app


@dataclass
class StreamResponse:
    status: int
    chunks: AsyncIterator[bytes]
    headers: list[tuple[str, str]] = field(default_factory=list)
    content_type: str = "text/event-stream"
    log: dict = field(default_factory=dict)  # filled by the app as the stream ends


App = Callable[[HttpRequest], Awaitable[Union[Response, StreamResponse]]]

_PARSE_CODES = {400: "bad_request", 408: "request_timeout", 413: "request_too_large",
                414: "uri_too_long", 417: "expectation_failed", 431: "headers_too_large",
                501: "not_implemented", 505: "http_version_not_supported"}
_FRAMING = {"content-length", "transfer-encoding", "connection"}  # only the glue sets these
_READ_SIZE = 65536
_READ_AHEAD = 256 * 1024   # while busy, buffer at most this much of pipelined requests
_LINGER = 1.0              # seconds to drain a rejected client before closing
_DRAIN_POLL = 0.05         # seconds between looks for requests still in flight while draining
CUT_SECONDS = 1.0          # after the shutdown grace, for cut responses to be written


def _request_id(headers: Headers) -> str:
    """The client's X-Request-Id if it is 1-128 printable ASCII characters, else a new one."""
    rid = headers.get("x-request-id") or ""
    if 1 <= len(rid) <= 128 and all(0x21 <= ord(c) <= 0x7E for c in rid):
        return rid
    return "req-" + uuid.uuid4().hex


def _access_log(request: HttpRequest, response: Response | StreamResponse | None, seconds: float) -> None:
    """One line per request; the app's fields (session, token counts, or why it was
    refused) follow the status."""
    fields = {"method": request.method, "path": request.path,
              "status": response.status if response is not None else 500, "ms": round(seconds * 1000, 1),
              "client": request.client[0] if request.client else "-", "request_id": request.id}
    extra = {**request.log, **(response.log if response is not None else {})}
    fields.update(extra)
    access_log.info("%s %s %d %.1fms client=%s request_id=%s%s", request.method, request.path,
                    fields["status"], fields["ms"], fields["client"], request.id,
                    "".join(f" {k}={v}" for k, v in extra.items()), extra={"fields": fields})


class _Disconnected(Exception):
    pass


async def _aclose(it: AsyncIterator[bytes]) -> None:
    """Tell a producer it will not be iterated any more (no-op once it has finished)."""
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.exception("closing a stream iterator failed")


def _split_target(target: str) -> tuple[str, str]:
    if target.startswith("/") or target == "*":
        path, _, query = target.partition("?")
        return path, query
    parts = urlsplit(target)  # absolute-form, as sent to proxies
    return parts.path or "/", parts.query


class _Connection:
    def __init__(self, server: HttpServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.server, self.limits = server, server.limits
        self.reader, self.writer = reader, writer
        self.parser = RequestParser(self.limits)
        self.pending: deque[Event] = deque()
        self.eof = False
        self.busy = False       # a request head has arrived and its response is not done
        self.served = 0
        self.loop = asyncio.get_running_loop()
        peer = writer.get_extra_info("peername")
        self.client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        sock = writer.get_extra_info("socket")
        with contextlib.suppress(OSError):  # the peer may already be gone
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.write_buffer)
        writer.transport.set_write_buffer_limits(high=self.limits.write_buffer)

    async def run(self) -> None:
        try:
            # Once the server drains or closes, a connection ends after its current response.
            while await self._exchange() and not self.server.draining:
                self.served += 1
                self.pending.extend(self.parser.start_next())
        except OSError:  # reset, broken pipe, write timeout: the peer is gone or stuck
            pass
        except Exception:
            log.exception("connection from %s failed", self.client)
        finally:
            self.writer.close()

    async def _exchange(self) -> bool:
        """Serve one request; True if the connection may carry another."""
        head = await self._read_head()
        if head is None:
            return False
        self.busy = True
        try:
            if isinstance(head, ParseError):
                return await self._reject(head)
            assert isinstance(head, Request)
            body = await self._read_body(head)
            if body is None:
                return False
            if isinstance(body, ParseError):
                return await self._reject(body)
            path, query = _split_target(head.target)
            request = HttpRequest(head.method, path, query, head.headers, body,
                                  client=self.client, id=_request_id(head.headers))
            watcher = asyncio.create_task(self._watch(request))
            started = self.loop.time()
            response = None
            try:
                response = await self._call_app(request)
                self.server.answered(request.path, response.status)
                response.headers.append(("X-Request-Id", request.id))
                keep_alive = head.keep_alive and not self.server.draining and not self.eof
                if isinstance(response, StreamResponse):
                    return await self._stream(head, request, response, keep_alive)
                return await self._send(head.method, head.version, response, keep_alive)
            finally:
                watcher.cancel()
                await asyncio.wait({watcher})
                _access_log(request, response, self.loop.time() - started)
        finally:
            self.busy = False

    # -- reading ------------------------------------------------------------------------

    async def _fill(self, deadline: float) -> None:
        """Read once into the parser; raises TimeoutError past `deadline`."""
        try:
            data = await asyncio.wait_for(self.reader.read(_READ_SIZE),
                                          max(deadline - self.loop.time(), 0))
        except ConnectionError:
            data = b""
        if data:
            self.pending.extend(self.parser.feed(data))
        else:
            self.eof = True

    async def _read_head(self) -> Request | ParseError | None:
        """The next request head or parse error; None if the client left or idled out."""
        idle = self.limits.keepalive_timeout if self.served else self.limits.header_timeout
        idle_deadline, head_deadline = self.loop.time() + idle, None
        try:
            while not self.pending and not self.eof:
                if head_deadline is None and self.parser.in_progress:
                    head_deadline = self.loop.time() + self.limits.header_timeout
                await self._fill(head_deadline or idle_deadline)
        except TimeoutError:
            if head_deadline is None:
                return None
            return ParseError(408, "timed out reading the request headers", self.parser.target)
        ev = self.pending.popleft() if self.pending else None
        assert ev is None or isinstance(ev, (Request, ParseError))
        return ev

    async def _read_body(self, head: Request) -> bytes | ParseError | None:
        """The whole body, a parse error, or None if the client left mid-body."""
        if head.expect_continue and not self.pending:
            await self._write(CONTINUE)
        body = bytearray()
        deadline = self.loop.time() + self.limits.body_timeout
        while True:
            try:
                while not self.pending and not self.eof:
                    await self._fill(deadline)
            except TimeoutError:
                return ParseError(408, "timed out reading the request body", head.target)
            if not self.pending:
                return None
            ev = self.pending.popleft()
            if isinstance(ev, Body):
                body += ev.data
            elif isinstance(ev, EndOfMessage):
                return bytes(body)
            else:
                assert isinstance(ev, ParseError)
                return ev

    async def _watch(self, request: HttpRequest) -> None:
        """While the app works, read ahead so that a reset is noticed at once (an EOF
        only ends the reading: see the module doc)."""
        while not self.eof and self.parser.buffered < _READ_AHEAD:
            try:
                data = await self.reader.read(_READ_SIZE)
            except OSError:
                self.eof = True
                request.disconnected.set()
                return
            if not data:
                self.eof = True
            self.pending.extend(self.parser.feed(data))  # buffered only: the parser is DONE

    # -- writing ------------------------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        self.writer.write(data)
        async with asyncio.timeout(self.limits.write_timeout):  # a timer, where wait_for makes a task a write
            await self.writer.drain()

    def _head(self, status: int, headers: list[tuple[str, str]],
              defaults: list[tuple[str, str]], framing: list[tuple[str, str]],
              keep_alive: bool, version: str) -> bytes:
        own = [(n, v) for n, v in headers if n.lower() not in _FRAMING]
        names = {n.lower() for n, _ in own}
        defaults = [("Date", formatdate(usegmt=True)), ("Server", "llmd")] + defaults
        all_headers = [(n, v) for n, v in defaults if n.lower() not in names] + own + framing
        if not keep_alive:
            all_headers.append(("Connection", "close"))
        elif version == "1.0":
            all_headers.append(("Connection", "keep-alive"))
        return render_head(status, all_headers)

    async def _call_app(self, request: HttpRequest) -> Response | StreamResponse:
        response = None
        try:
            response = await self.server.app(request)
            if not isinstance(response, (Response, StreamResponse)):
                raise TypeError(f"app returned {type(response).__name__}")
            if not 200 <= response.status <= 999:
                raise ValueError(f"app returned status {response.status}")
            render_head(response.status, response.headers)  # refuse bad headers before sending
            return response
        except Exception:
            log.exception("app failed on %s %s", request.method, request.path)
            if isinstance(response, StreamResponse):
                await _aclose(response.chunks)
            return self.server.refusal(500, "internal server error", "server_error", "server_error", request.path)

    async def _send(self, method: str, version: str, response: Response,
                    keep_alive: bool) -> bool:
        body = bytes(response.body)
        if response.status in (204, 304):  # these never carry a body or its length
            body, framing = b"", []
        else:
            framing = [("Content-Length", str(len(body)))]
        defaults = [("Content-Type", response.content_type)] if body else []
        data = self._head(response.status, response.headers, defaults, framing,
                          keep_alive, version)
        await self._write(data if method == "HEAD" else data + body)
        return keep_alive

    async def _stream(self, head: Request, request: HttpRequest, response: StreamResponse,
                      keep_alive: bool) -> bool:
        chunked = head.version == "1.1"   # HTTP/1.0 has no chunked coding: end by closing
        keep_alive = keep_alive and chunked
        defaults = [("Content-Type", response.content_type), ("Cache-Control", "no-cache")]
        if response.content_type.startswith(("text/event-stream", "application/x-ndjson")):
            defaults.append(("X-Accel-Buffering", "no"))  # tell nginx-like proxies not to buffer
        framing = [("Transfer-Encoding", "chunked")] if chunked else []
        it = response.chunks
        gone = asyncio.ensure_future(request.disconnected.wait())
        try:
            await self._write(self._head(response.status, response.headers, defaults, framing,
                                         keep_alive, head.version))
            if head.method == "HEAD":
                return keep_alive
            await self._until_gone(self._pump(it, chunked), gone)
            return keep_alive
        except (_Disconnected, OSError):
            request.disconnected.set()
            return False
        except Exception:  # the producer failed mid-stream: the client sees a cut message
            log.exception("stream failed on %s %s", request.method, request.path)
            return False
        finally:
            gone.cancel()
            await _aclose(it)

    async def _pump(self, it: AsyncIterator[bytes], chunked: bool) -> None:
        """Writes the producer's chunks, then the end of the body."""
        async for chunk in it:
            if chunk := bytes(chunk):
                await self._write(render_chunk(chunk) if chunked else chunk)
        if chunked:
            await self._write(LAST_CHUNK)

    async def _until_gone(self, pump: Awaitable[None], gone: asyncio.Future) -> None:
        """Runs `pump` as one task for the whole stream; raises _Disconnected if the client
        leaves first, the producer or the writes then stopped wherever they are parked."""
        task = asyncio.ensure_future(pump)
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        if gone.done():
            if not task.cancelled():
                task.exception()  # retrieved, so asyncio does not log it as lost
            raise _Disconnected
        task.result()

    async def refuse(self, response: Response) -> None:
        """Answer without reading any request, then close (the server is over a limit)."""
        try:
            await self._answer_and_close(response)
        except OSError:
            pass
        finally:
            self.writer.close()

    async def _reject(self, err: ParseError) -> bool:
        """Answer a request the parser refused, then close (its framing is lost)."""
        code = _PARSE_CODES.get(err.status, "bad_request")
        path = None if err.target is None else _split_target(err.target)[0]
        self.server.answered(path, err.status)
        return await self._answer_and_close(self.server.refusal(err.status, err.message, code,
                                                                "invalid_request_error", path))

    async def _answer_and_close(self, response: Response) -> bool:
        await self._send("GET", "1.1", response, False)
        # Closing with unread input makes the kernel send a reset, which can destroy
        # the answer before the client reads it; so half-close and drain briefly first,
        # discarding what arrives (never parsing or buffering it).
        with contextlib.suppress(Exception):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = self.loop.time() + _LINGER
            while not self.eof and await asyncio.wait_for(self.reader.read(_READ_SIZE),
                                                          max(deadline - self.loop.time(), 0)):
                pass
        return False


# How the application words a refusal the server makes on its own (a request the
# parser refused, an app that failed, a connection over the limit): (status, message,
# a machine-readable code, the kind of error, the request's path where it is known)
# -> the response to send.
Refusal = Callable[[int, str, str, str, Union[str, None]], Response]
# Told of every answer: (the request's path, None when it was refused unread; status).
Answered = Callable[[Union[str, None], int], None]


class HttpServer:
    """An HTTP/1.1 server running `app` on the current event loop."""

    def __init__(self, app: App, limits: Limits | None = None, *, refusal: Refusal,
                 answered: Answered = lambda path, status: None) -> None:
        self.app = app
        self.refusal = refusal
        self.answered = answered
        self.limits = limits or Limits()
        self.closing = False
        self.draining = False           # connections end after their current response
        self._server: asyncio.Server | None = None
        self._port = 0
        self._conns: dict[asyncio.Task, _Connection] = {}
        self._refusing = 0              # connections being answered 503 (over the limit)
        self._closed = asyncio.Event()

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        """Bind and start accepting; port 0 picks a free port (see `port`)."""
        self._server = await asyncio.start_server(self._on_connect, host, port)
        self._port = self._server.sockets[0].getsockname()[1]

    @property
    def port(self) -> int:
        """The bound TCP port."""
        return self._port

    async def serve_forever(self) -> None:
        """Return once `close()` has finished."""
        await self._closed.wait()

    async def drain(self, timeout: float) -> None:
        """Keep accepting, but end every connection after its current response, until
        no request is in flight or `timeout` seconds have passed. The app answers what
        arrives meanwhile: a balancer polling a health route must get an answer (a
        refusal to connect looks like a crash), and a client one it can retry."""
        self.draining = True
        deadline = asyncio.get_running_loop().time() + timeout
        while any(conn.busy for conn in self._conns.values()):
            if asyncio.get_running_loop().time() >= deadline:
                return
            await asyncio.sleep(_DRAIN_POLL)

    async def close(self, grace: float = 5.0, cut: Callable[[], None] | None = None) -> None:
        """Stop accepting; close idle connections now; let busy ones finish their
        current response for up to `grace` seconds. Then call `cut`, with which the
        app ends what is still in flight (a stream with an error event and its
        proper end), give the connections up to CUT_SECONDS to write that, and
        cancel the rest."""
        self.closing = self.draining = True
        if self._server is not None:
            self._server.close()
        for task, conn in list(self._conns.items()):
            if not conn.busy:
                task.cancel()
        if self._conns:
            _, late = await asyncio.wait(list(self._conns), timeout=grace)
            if late and cut is not None:
                cut()
                _, late = await asyncio.wait(late, timeout=CUT_SECONDS)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        if self._server is not None:
            await self._server.wait_closed()
        self._closed.set()

    async def _on_connect(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        if self.closing:
            writer.close()
            return
        conn = _Connection(self, reader, writer)
        if len(self._conns) >= self.limits.max_connections:
            await self._refuse(conn)
            return
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = conn
        try:
            await self._conns[task].run()
        except asyncio.CancelledError:
            pass  # close() ended it; ending the task cancelled would make asyncio log it
        finally:
            self._conns.pop(task, None)


    async def _refuse(self, conn: _Connection) -> None:
        # Refusals linger briefly so the 503 arrives; under a flood of them even that
        # would hold file descriptors, so past as many again they are just closed.
        if self._refusing >= self.limits.max_connections:
            conn.writer.close()
            return
        self._refusing += 1
        try:
            response = self.refusal(503, f"the server is at its limit of {self.limits.max_connections} "
                                         "connections; retry later", "too_many_connections",
                                    "unavailable_error", None)
            response.headers.append(("Retry-After", "1"))
            self.answered(None, 503)
            await conn.refuse(response)
        finally:
            self._refusing -= 1
