"""Sans-IO HTTP/1.1: a request parser (bytes in, events out) and response framing.

Theory of operation
-------------------
`RequestParser` owns one connection's inbound byte stream and knows nothing about
sockets or time. The caller feeds whatever bytes arrived, in pieces of any size (one
byte at a time works), and gets back the events those bytes completed:

    Request(...)          the request line and headers are complete and valid
    Body(data)            zero or more pieces of the decoded body (never empty)
    EndOfMessage()        the body is complete
    ParseError(status, m) the request is unacceptable; answer `status` and close

A request moves through REQUEST_LINE → HEADERS → (LENGTH | CHUNK_SIZE ⇄ CHUNK_DATA
→ CHUNK_END … → TRAILERS) → DONE. In DONE the parser stops: bytes fed meanwhile are
only buffered, because they belong to the next pipelined request and must not be
acted on until the response to this one has gone out. `start_next()` begins the next
cycle and returns the events the buffered bytes already complete. After a ParseError
the parser is dead: the framing of what follows can no longer be trusted, so the only
safe move is to close the connection.

Strictness. Head lines may end in CRLF or a bare LF (as most servers accept), but the
chunked framing must use CRLF (lenient chunk parsing is a known smuggling vector), and
obs-fold,
invalid header names, control characters, a Content-Length alongside
Transfer-Encoding, conflicting or malformed Content-Length values, any coding but
plain `chunked`, and malformed chunk framing are all rejected: each is a way to make
two parsers disagree about where a request ends. Limits (`Limits`) are checked while
bytes accumulate, so a hostile peer cannot make the buffer grow past them.

The response side is pure formatting: `render_head`, `render_chunk`, `LAST_CHUNK`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator, Union
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Limits:
    """Bounds on what one connection may send, and how slowly; and on how many
    connections and how much unread response the server holds.

    Header bytes count every header line without its line ending (the request line
    is bounded separately by `max_request_line`, also without its ending); chunked
    trailers get their own budget of the same size.
    """
    max_request_line: int = 8192        # longer → 414
    max_header_bytes: int = 32768       # more → 431
    max_header_count: int = 100         # more → 431
    max_body_bytes: int = 16 * 1024 * 1024  # more → 413
    header_timeout: float = 10.0        # first byte of a request → end of its headers
    body_timeout: float = 60.0          # end of headers → end of body
    keepalive_timeout: float = 5.0      # idle wait for the next request
    write_timeout: float = 60.0         # one write waiting for the peer to read
    write_buffer: int = 64 * 1024       # unread response bytes held per socket and in asyncio
    max_connections: int = 256          # open connections; more → 503 and close


class Headers:
    """Case-insensitive, order-preserving multi-dict of (lowercased name, value)."""

    def __init__(self, items: list[tuple[str, str]] | None = None) -> None:
        self._items = [(n.lower(), v) for n, v in (items or [])]

    def get(self, name: str, default: str | None = None) -> str | None:
        """The first value of `name`, or `default`."""
        name = name.lower()
        for n, v in self._items:
            if n == name:
                return v
        return default

    def get_all(self, name: str) -> list[str]:
        """Every value of `name`, in arrival order."""
        name = name.lower()
        return [v for n, v in self._items if n == name]

    def tokens(self, name: str) -> list[str]:
        """Comma-separated tokens across all `name` lines, lowercased (e.g. Connection)."""
        return [t.strip().lower() for v in self.get_all(name) for t in v.split(",") if t.strip()]

    def items(self) -> list[tuple[str, str]]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Headers) and self._items == other._items

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    version: str                 # "1.0" or "1.1"
    headers: Headers
    keep_alive: bool             # the client allows another request on this connection
    expect_continue: bool        # the client waits for "100 Continue" before the body


@dataclass(frozen=True)
class Body:
    data: bytes


@dataclass(frozen=True)
class EndOfMessage:
    pass


@dataclass(frozen=True)
class ParseError:
    status: int
    message: str
    target: str | None = None  # the request's target, once its line was read


Event = Union[Request, Body, EndOfMessage, ParseError]


class _Reject(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_FIELD_VALUE = re.compile(rb"[\t\x20-\x7e\x80-\xff]*")
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_MAX_CHUNK_LINE = 1024   # size plus extensions; nobody legitimate comes close

_REQUEST_LINE, _HEADERS, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, \
    _DONE, _ERROR = range(9)


class RequestParser:
    """Turns one connection's inbound bytes into request events (see module doc)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._buf = bytearray()
        self._scan = 0            # bytes of _buf already known to hold no LF
        self._state = _REQUEST_LINE
        self._reset_request()

    def _reset_request(self) -> None:
        self._started = False
        self._line: tuple[str, str, str] | None = None
        self._fields: list[tuple[str, str]] = []
        self._field_bytes = 0
        self._left = 0            # body bytes still due in this message / chunk
        self._body_total = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet consumed (e.g. a pipelined next request)."""
        return len(self._buf)

    @property
    def in_progress(self) -> bool:
        """True once any byte of the current request has arrived."""
        return self._started or bool(self._buf) or self._state not in (_REQUEST_LINE, _DONE)

    @property
    def target(self) -> str | None:
        """The current request's target, once its line was read."""
        return self._line[1] if self._line is not None else None

    @property
    def done(self) -> bool:
        """True between EndOfMessage and `start_next()`."""
        return self._state == _DONE

    def feed(self, data: bytes) -> list[Event]:
        """Consume `data`; return the events it completes (none while DONE or dead)."""
        if self._state == _ERROR:
            return []
        self._buf += data
        if self._state == _DONE:
            return []
        return self._run()

    def start_next(self) -> list[Event]:
        """Leave DONE for the next request; return events its buffered bytes complete."""
        if self._state != _DONE:
            raise RuntimeError("start_next() before EndOfMessage")
        self._state = _REQUEST_LINE
        self._reset_request()
        return self._run()

    # -- state machine ----------------------------------------------------------------

    def _run(self) -> list[Event]:
        out: list[Event] = []
        try:
            while self._state != _DONE and self._step(out):
                pass
        except _Reject as e:
            self._state = _ERROR
            self._buf.clear()
            out.append(ParseError(e.status, e.message, self.target))
        return out

    def _step(self, out: list[Event]) -> bool:
        """Advance one unit (a line or a piece of body); False when more bytes are needed."""
        s = self._state
        if s == _REQUEST_LINE:
            self._started = self._started or bool(self._buf)
            line = self._take_line(self.limits.max_request_line, 414, "request line too long")
            if line is None:
                return False
            if line:  # RFC 9112 §2.2: ignore empty lines before the request line
                self._line = _parse_request_line(line)
                self._state = _HEADERS
            return True
        if s in (_HEADERS, _TRAILERS):
            budget = self.limits.max_header_bytes - self._field_bytes
            line = self._take_line(budget, 431, "request header fields too large",
                                   strict=s == _TRAILERS)
            if line is None:
                return False
            if not line:
                if s == _HEADERS:
                    self._end_headers(out)
                else:
                    out.append(EndOfMessage())
                    self._state = _DONE
                return True
            self._field_bytes += len(line)
            field = _parse_field(line)
            if s == _HEADERS:  # trailers are checked for syntax, then ignored
                self._fields.append(field)
                if len(self._fields) > self.limits.max_header_count:
                    raise _Reject(431, "too many request header fields")
            return True
        if s in (_LENGTH, _CHUNK_DATA):
            if not self._buf:
                return False
            n = min(self._left, len(self._buf))
            out.append(Body(bytes(self._buf[:n])))
            del self._buf[:n]
            self._left -= n
            if self._left == 0:
                if s == _LENGTH:
                    out.append(EndOfMessage())
                    self._state = _DONE
                else:
                    self._state = _CHUNK_END
            return True
        if s == _CHUNK_SIZE:
            line = self._take_line(_MAX_CHUNK_LINE, 400, "chunk size line too long", strict=True)
            if line is None:
                return False
            size = _parse_chunk_size(line)
            if size == 0:
                self._field_bytes = 0
                self._state = _TRAILERS
                return True
            self._body_total += size
            if self._body_total > self.limits.max_body_bytes:
                raise _Reject(413, "request body too large")
            self._left = size
            self._state = _CHUNK_DATA
            return True
        if s == _CHUNK_END:
            if self._buf[:2] == b"\r\n":
                del self._buf[:2]
                self._state = _CHUNK_SIZE
                return True
            if self._buf in (b"", b"\r"):
                return False
            raise _Reject(400, "chunk data not followed by CRLF")
        raise AssertionError(f"parser stepped in state {s}")

    def _take_line(self, limit: int, status: int, message: str,
                   strict: bool = False) -> bytes | None:
        """Remove and return one line without its CRLF (or bare LF unless `strict`),
        or None if incomplete. A line longer than `limit` is rejected as soon as that
        is certain.
        """
        i = self._buf.find(b"\n", self._scan)
        if i < 0:
            self._scan = len(self._buf)
            if len(self._buf) > limit + 1:  # +1: the CR may still be waiting for its LF
                raise _Reject(status, message)
            return None
        line = bytes(self._buf[:i])
        del self._buf[:i + 1]
        self._scan = 0
        if line.endswith(b"\r"):
            line = line[:-1]
        elif strict:
            raise _Reject(400, "bare LF in chunked framing")
        if len(line) > limit:
            raise _Reject(status, message)
        return line

    def _end_headers(self, out: list[Event]) -> None:
        assert self._line is not None
        method, target, version = self._line
        h = Headers(self._fields)
        te, cl = h.get_all("transfer-encoding"), h.get_all("content-length")
        if te and cl:
            raise _Reject(400, "both Content-Length and Transfer-Encoding")
        hosts = h.get_all("host")
        if len(hosts) > 1 or (version == "1.1" and not hosts):
            raise _Reject(400, "a request needs exactly one Host header")
        if not target.startswith("/") and target != "*":
            # absolute-form: its authority is the host, whatever Host says (RFC 9112 3.2.2)
            h = Headers([(n, v) for n, v in h if n != "host"] + [("host", urlsplit(target).netloc)])
        length = 0
        if te:
            if version == "1.0":
                raise _Reject(400, "Transfer-Encoding in an HTTP/1.0 request")
            if [t.strip().lower() for t in te] != ["chunked"]:
                raise _Reject(501, "only 'chunked' transfer-coding is supported")
            self._state = _CHUNK_SIZE
        else:
            if cl:
                values = {v.strip() for line in cl for v in line.split(",")}
                if len(values) != 1:
                    raise _Reject(400, "conflicting Content-Length values")
                value = values.pop()
                if not _DIGITS.fullmatch(value):
                    raise _Reject(400, "invalid Content-Length")
                huge = len(value.lstrip("0")) > 18  # decided before int() of a huge string
                length = self.limits.max_body_bytes + 1 if huge else int(value)
                if length > self.limits.max_body_bytes:
                    raise _Reject(413, "request body too large")
            self._left = length
            self._state = _LENGTH if length else _DONE
        expect = h.get("expect")
        if expect is not None and expect.strip().lower() != "100-continue":
            raise _Reject(417, "unsupported expectation")
        conn = h.tokens("connection")
        keep_alive = "close" not in conn and (version == "1.1" or "keep-alive" in conn)
        out.append(Request(method, target, version, h, keep_alive,
                           expect is not None and version == "1.1"))
        if self._state == _DONE:
            out.append(EndOfMessage())


def _parse_request_line(line: bytes) -> tuple[str, str, str]:
    parts = line.split(b" ")
    if len(parts) != 3:
        raise _Reject(400, "malformed request line")
    method, target, version = parts
    if not _TOKEN.fullmatch(method):
        raise _Reject(400, "invalid method")
    if not _TARGET.fullmatch(target):
        raise _Reject(400, "invalid request target")
    if not target.startswith(b"/") and target != b"*":
        try:  # absolute-form, as sent to proxies: it must parse as a URL
            urlsplit(target.decode("ascii")).port  # .port checks the port too
        except ValueError:
            raise _Reject(400, "invalid request target")
    m = _VERSION.fullmatch(version)
    if not m:
        raise _Reject(400, "malformed HTTP version")
    if m.group(1) != b"1" or m.group(2) not in (b"0", b"1"):
        raise _Reject(505, "HTTP version not supported")
    return method.decode("ascii"), target.decode("ascii"), version[5:].decode("ascii")


def _parse_field(line: bytes) -> tuple[str, str]:
    if line[:1] in (b" ", b"\t"):
        raise _Reject(400, "obsolete line folding in header")
    name, colon, value = line.partition(b":")
    if not colon or not _TOKEN.fullmatch(name):
        raise _Reject(400, "invalid header name")
    value = value.strip(b" \t")
    if not _FIELD_VALUE.fullmatch(value):
        raise _Reject(400, "invalid character in header value")
    return name.decode("ascii").lower(), value.decode("latin-1")


def _parse_chunk_size(line: bytes) -> int:
    size, _, ext = line.partition(b";")
    size = size.rstrip(b" \t")  # RFC 9112 allows whitespace before an extension
    if not _HEX.fullmatch(size) or not _FIELD_VALUE.fullmatch(ext):
        raise _Reject(400, "invalid chunk size")
    if len(size.lstrip(b"0")) > 16:
        raise _Reject(413, "request body too large")
    return int(size, 16)


# -- response side ------------------------------------------------------------------

REASONS = {
    100: "Continue", 200: "OK", 201: "Created", 202: "Accepted", 204: "No Content",
    301: "Moved Permanently", 302: "Found", 304: "Not Modified",
    400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
    405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
    411: "Length Required", 413: "Content Too Large", 414: "URI Too Long",
    415: "Unsupported Media Type", 417: "Expectation Failed", 422: "Unprocessable Content",
    429: "Too Many Requests", 431: "Request Header Fields Too Large", 499: "Client Closed Request",
    500: "Internal Server Error", 501: "Not Implemented", 502: "Bad Gateway",
    503: "Service Unavailable", 504: "Gateway Timeout", 505: "HTTP Version Not Supported",
}

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def render_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    """Status line plus header block, ending in the blank line.

    Raises ValueError for a name or value that could split the response (CR, LF,
    other controls) rather than let an application inject headers.
    """
    if not 100 <= status <= 999:
        raise ValueError(f"invalid status {status}")
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}".encode("ascii")]
    for name, value in headers:
        n, v = name.encode("ascii"), value.encode("latin-1")
        if not _TOKEN.fullmatch(n) or not _FIELD_VALUE.fullmatch(v):
            raise ValueError(f"invalid response header {name!r}: {value!r}")
        lines.append(n + b": " + v)
    return b"\r\n".join(lines) + b"\r\n\r\n"


def render_chunk(data: bytes) -> bytes:
    """One chunk of a chunked body; empty data gives b"" (an empty chunk would end it)."""
    if not data:
        return b""
    return b"%x\r\n%b\r\n" % (len(data), data)
