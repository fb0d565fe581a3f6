"""Sans-IO HTTP/1.1 parser and response framing (llmd/http/parser.py): raw bytes in, events out."""
import random

import pytest

from llmd.http.parser import (LAST_CHUNK, Body, EndOfMessage, Headers, Limits, ParseError, Request,
                       RequestParser, render_chunk, render_head)


def merged(events):
    """Join consecutive Body events so different feed splits compare equal."""
    out = []
    for ev in events:
        if isinstance(ev, Body) and out and isinstance(out[-1], Body):
            out[-1] = Body(out[-1].data + ev.data)
        else:
            out.append(ev)
    return out


def feed_whole(raw, limits=None):
    return RequestParser(limits).feed(raw)


def feed_bytewise(raw, limits=None):
    p, events = RequestParser(limits), []
    for i in range(len(raw)):
        events += p.feed(raw[i:i + 1])
    return events


def parse(raw, limits=None):
    """Events for `raw`, checked to be the same fed whole and fed one byte at a time."""
    whole = merged(feed_whole(raw, limits))
    assert merged(feed_bytewise(raw, limits)) == whole
    return whole


def status_of(raw, limits=None):
    events = parse(raw, limits)
    errors = [e for e in events if isinstance(e, ParseError)]
    assert len(errors) == 1 and events[-1] is errors[0], events
    return errors[0].status


# -- well-formed requests ------------------------------------------------------------------

def test_simple_get_gives_request_then_end_of_message():
    events = parse(b"GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nX-Session-ID: s1\r\n\r\n")
    assert len(events) == 2 and events[1] == EndOfMessage()
    req = events[0]
    assert (req.method, req.target, req.version) == ("GET", "/v1/models?x=1", "1.1")
    assert req.headers.get("x-session-id") == "s1"
    assert req.keep_alive and not req.expect_continue


def test_content_length_body_arrives_across_feeds():
    p = RequestParser()
    ev = p.feed(b"POST /c HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello")
    assert isinstance(ev[0], Request) and ev[1:] == [Body(b"hello")]
    assert p.feed(b" world") == [Body(b" world"), EndOfMessage()]
    assert p.done


def test_body_bytes_are_not_interpreted():
    body = b"\r\n\r\nGET / HTTP/1.1\r\n\x00\xff"
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
    assert events[1:] == [Body(body), EndOfMessage()]


def test_chunked_body_with_extensions_and_ignored_trailers():
    raw = (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n1 ; x\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: t\r\n\r\n")
    events = parse(raw)
    assert events[1:] == [Body(b"hello world!"), EndOfMessage()]
    assert "x-trailer" not in events[0].headers


def test_chunked_framing_needs_crlf_even_after_a_bare_lf_head():
    head = b"POST / HTTP/1.1\nHost: a\nTransfer-Encoding: chunked\n\n"
    assert parse(head + b"3\r\nabc\r\n0\r\n\r\n")[1:] == [Body(b"abc"), EndOfMessage()]
    for body in (b"3\nabc\r\n0\r\n\r\n", b"3\r\nabc\n0\r\n\r\n", b"3\r\nabc\r\n0\n\r\n",
                 b"3\r\nabc\r\n0\r\nT: t\n\r\n", b"3\r\nabc\r\n0\r\n\n"):
        assert status_of(head + body) == 400, body


def test_chunked_round_trips_render_chunk():
    data = [b"a" * 300, b"", b"\r\n", bytes(range(256))]
    body = b"".join(render_chunk(d) for d in data) + LAST_CHUNK
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    assert events[1:] == [Body(b"".join(data)), EndOfMessage()]


def test_bare_lf_line_endings_are_accepted():
    events = parse(b"GET / HTTP/1.1\nHost: a\nAccept: */*\n\n")
    assert events[0].headers.items() == [("host", "a"), ("accept", "*/*")]
    assert events[1] == EndOfMessage()


def test_empty_lines_before_request_line_are_ignored():
    assert isinstance(parse(b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")[0], Request)


def test_head_request_has_no_body():
    events = parse(b"HEAD /health HTTP/1.1\r\nHost: a\r\n\r\n")
    assert events[0].method == "HEAD" and events[1] == EndOfMessage()


def test_header_values_are_trimmed_and_keep_obs_text():
    events = parse(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: \t spaced out \t\r\nX-B: caf\xe9\r\nX-C:\r\n\r\n")
    h = events[0].headers
    assert (h.get("x-a"), h.get("x-b"), h.get("x-c")) == ("spaced out", "caf\u00e9", "")


def test_headers_are_a_case_insensitive_multidict():
    h = Headers([("Host", "a"), ("X-Session-ID", "s"), ("Connection", "Keep-Alive, Upgrade"),
                 ("x-session-id", "t")])
    assert h.get("x-session-id") == "s" and h.get("X-SESSION-ID") == "s"
    assert h.get_all("X-Session-Id") == ["s", "t"]
    assert h.get("missing") is None and h.get("missing", "d") == "d"
    assert h.tokens("connection") == ["keep-alive", "upgrade"]
    assert "HOST" in h and "nope" not in h and len(h) == 4
    assert list(h)[0] == ("host", "a")


@pytest.mark.parametrize("version, connection, keep_alive", [
    ("1.1", None, True),
    ("1.1", "close", False),
    ("1.1", "Keep-Alive, CLOSE", False),
    ("1.0", None, False),
    ("1.0", "keep-alive", True),
    ("1.0", "Keep-Alive, close", False),
])
def test_connection_persistence_follows_version_and_header(version, connection, keep_alive):
    extra = b"" if connection is None else b"Connection: %b\r\n" % connection.encode()
    events = parse(b"GET / HTTP/%b\r\nHost: a\r\n%b\r\n" % (version.encode(), extra))
    assert events[0].keep_alive is keep_alive


def test_expect_100_continue_is_flagged_before_the_body():
    p = RequestParser()
    events = p.feed(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 2\r\n\r\n")
    assert len(events) == 1 and events[0].expect_continue
    assert p.feed(b"ok") == [Body(b"ok"), EndOfMessage()]


def test_expect_100_continue_is_ignored_for_http10():
    events = parse(b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n")
    assert not events[0].expect_continue


def test_http10_request_needs_no_host():
    events = parse(b"GET / HTTP/1.0\r\n\r\n")
    assert events[0].version == "1.0" and events[1] == EndOfMessage()


def test_identical_duplicate_content_lengths_are_one():
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nok")
    assert events[1:] == [Body(b"ok"), EndOfMessage()]


# -- pipelining ----------------------------------------------------------------------------

PIPELINE = (b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
            b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n"
            b"POST /c HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n")


def run_pipeline(pieces):
    """Feed pieces, calling start_next() after each message; return events per request."""
    p, requests, current = RequestParser(), [], []
    def take(events):
        current.extend(events)
        while current and isinstance(current[-1], EndOfMessage):
            requests.append(merged(current[:]))
            current.clear()
            current.extend(p.start_next())
    for piece in pieces:
        take(p.feed(piece))
    assert current == []
    return requests


def test_pipelined_requests_wait_for_start_next():
    p = RequestParser()
    first = p.feed(PIPELINE)
    assert [type(e) for e in first] == [Request, Body, EndOfMessage]
    assert p.done and p.buffered == len(PIPELINE) - len(PIPELINE.split(b"abc")[0]) - 3
    assert p.feed(b"") == []  # still parked until start_next
    second = p.start_next()
    assert second[0].target == "/b" and second[1:] == [EndOfMessage()]
    third = p.start_next()
    assert third[0].target == "/c" and third[1:] == [Body(b"hi"), EndOfMessage()]
    assert p.buffered == 0 and not p.in_progress or p.done


def test_pipelined_requests_parse_the_same_for_any_split():
    expected = run_pipeline([PIPELINE])
    assert [r[0].target for r in expected] == ["/a", "/b", "/c"]
    assert run_pipeline([PIPELINE[i:i + 1] for i in range(len(PIPELINE))]) == expected
    rng = random.Random(1234)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(PIPELINE)), rng.randint(1, 12)))
        pieces = [PIPELINE[a:b] for a, b in zip([0] + cuts, cuts + [len(PIPELINE)])]
        assert run_pipeline(pieces) == expected


def test_start_next_before_end_of_message_is_an_error():
    p = RequestParser()
    p.feed(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab")
    with pytest.raises(RuntimeError):
        p.start_next()


def test_in_progress_tracks_the_first_byte_of_a_request():
    p = RequestParser()
    assert not p.in_progress
    p.feed(b"G")
    assert p.in_progress


# -- malformed requests --------------------------------------------------------------------

H = b"Host: a\r\n"


@pytest.mark.parametrize("raw, status", [
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n", 400),          # obs-fold
    (b"GET / HTTP/1.1\r\n folded: x\r\nHost: a\r\n\r\n", 400),                   # leading ws
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n", 400),                       # ws before colon
    (b"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\n: empty-name\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX(A): 1\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x00b\r\n\r\n", 400),                   # NUL
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", 400),                     # bare CR
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\x7fb\r\n\r\n", 400),                   # DEL
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-\x01: 1\r\n\r\n", 400),
    (b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET /\r\nHost: a\r\n\r\n", 400),                                          # HTTP/0.9
    (b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET / http/1.1\r\nHost: a\r\n\r\n", 400),
    (b"GET / HTTP/1.10\r\nHost: a\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505),
    (b"GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505),
    (b"GET / HTTP/1.1\r\n\r\n", 400),                                            # no Host
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \xd9\xa3\r\n\r\n", 400),     # non-ASCII digit
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", 501),
    (b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"POST / HTTP/1.1\r\nHost: a\r\nExpect: something-else\r\n\r\n", 417),
])
def test_malformed_head_is_rejected(raw, status):
    assert status_of(raw) == status


CHUNKED = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize("body, status", [
    (b"zz\r\n", 400),
    (b"-1\r\n", 400),
    (b"\r\n", 400),
    (b" 5\r\nhello\r\n", 400),
    (b"0x5\r\n", 400),
    (b"5;\x00\r\n", 400),
    (b"5\r\nhelloX\r\n", 400),                      # data longer than announced
    (b"5\r\nhel\r\n0\r\n\r\n", 400),               # data shorter than announced
    (b"5\r\nhello\rX", 400),
    (b"1" * 1100 + b"\r\n", 400),                   # absurd size line
    (b"1" + b"0" * 16 + b"\r\n", 413),              # 17 significant hex digits
    (b"0\r\nbad trailer\r\n\r\n", 400),
    (b"0\r\n folded: t\r\n\r\n", 400),
])
def test_malformed_chunked_body_is_rejected(body, status):
    assert status_of(CHUNKED + body) == status


def test_parser_is_dead_after_an_error():
    p = RequestParser()
    assert p.feed(b"BAD\r\n") == [ParseError(400, "malformed request line")]
    assert p.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") == []
    assert p.buffered == 0


# -- limits: exactly at the limit passes, one over fails -----------------------------------

def test_request_line_at_limit_passes_and_one_over_is_414():
    limits = Limits(max_request_line=64)
    at = b"GET /" + b"a" * (64 - len(b"GET / HTTP/1.1")) + b" HTTP/1.1"
    assert len(at) == 64
    assert isinstance(parse(at + b"\r\nHost: a\r\n\r\n", limits)[0], Request)
    over = at.replace(b"/a", b"/aa")
    assert status_of(over + b"\r\nHost: a\r\n\r\n", limits) == 414
    assert status_of(over.replace(b"\r", b"") + b"\nHost: a\n\n", limits) == 414


def test_overlong_request_line_is_refused_before_its_end_arrives():
    p = RequestParser(Limits(max_request_line=64))
    assert p.feed(b"G" * 65) == []            # the 65th byte might still be the CR
    assert p.feed(b"G") == [ParseError(414, "request line too long")]


def header_block(total, lines):
    """Host plus `lines` header lines, their bytes (without line endings) summing to `total`."""
    host = b"Host: a"
    rest = total - len(host)
    sizes = [rest // lines] * lines
    sizes[-1] += rest - sum(sizes)
    out = [host] + [b"X-%d: " % i + b"v" * (n - len(b"X-%d: " % i)) for i, n in enumerate(sizes)]
    assert sum(map(len, out)) == total
    return b"\r\n".join(out) + b"\r\n"


@pytest.mark.parametrize("lines", [1, 3])
def test_header_bytes_at_limit_pass_and_one_over_is_431(lines):
    limits = Limits(max_header_bytes=200)
    ok = parse(b"GET / HTTP/1.1\r\n" + header_block(200, lines) + b"\r\n", limits)
    assert isinstance(ok[0], Request)
    assert status_of(b"GET / HTTP/1.1\r\n" + header_block(201, lines) + b"\r\n", limits) == 431


def test_overlong_header_block_is_refused_before_its_end_arrives():
    p = RequestParser(Limits(max_header_bytes=100))
    events = p.feed(b"GET / HTTP/1.1\r\nHost: a\r\nX: " + b"v" * 200)
    assert events == [ParseError(431, "request header fields too large", "/")]  # the route's error shape


def test_header_count_at_limit_passes_and_one_over_is_431():
    limits = Limits(max_header_count=5)
    at = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: v\r\n" % i for i in range(4))
    assert isinstance(parse(at + b"\r\n", limits)[0], Request)
    assert status_of(at + b"X-4: v\r\n\r\n", limits) == 431


def test_content_length_at_limit_passes_and_one_over_is_413_before_the_body():
    limits = Limits(max_body_bytes=10)
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n" + b"x" * 10, limits)
    assert events[1:] == [Body(b"x" * 10), EndOfMessage()]
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n", limits)
    assert events == [ParseError(413, "request body too large", "/")]  # no Request: never read it


def test_leading_zeros_do_not_count_as_size():
    events = parse(CHUNKED + b"0" * 20 + b"2\r\nhi\r\n0\r\n\r\n")
    assert events[1:] == [Body(b"hi"), EndOfMessage()]
    events = parse(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"0" * 30 + b"2\r\n\r\nhi")
    assert events[1:] == [Body(b"hi"), EndOfMessage()]


def test_huge_content_length_is_413_not_a_crash():
    raw = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: " + b"9" * 40 + b"\r\n\r\n"
    assert status_of(raw) == 413


def test_chunked_total_at_limit_passes_and_one_over_is_413():
    limits = Limits(max_body_bytes=10)
    ok = parse(CHUNKED + b"6\r\nxxxxxx\r\n4\r\nxxxx\r\n0\r\n\r\n", limits)
    assert ok[1:] == [Body(b"x" * 10), EndOfMessage()]
    events = parse(CHUNKED + b"6\r\nxxxxxx\r\n5\r\nxxxxx\r\n0\r\n\r\n", limits)
    assert events[1:] == [Body(b"xxxxxx"), ParseError(413, "request body too large", "/")]


def test_trailers_are_bounded_like_headers():
    limits = Limits(max_header_bytes=50)
    ok = parse(CHUNKED + b"0\r\nT: " + b"t" * 47 + b"\r\n\r\n", limits)
    assert ok[-1] == EndOfMessage()
    assert status_of(CHUNKED + b"0\r\nT: " + b"t" * 48 + b"\r\n\r\n", limits) == 431


# -- response framing ----------------------------------------------------------------------

def test_render_head_writes_status_line_reason_and_headers():
    head = render_head(200, [("Content-Type", "application/json"), ("Content-Length", "2")])
    assert head == (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 2\r\n\r\n")
    assert render_head(431, []).startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert render_head(299, []) == b"HTTP/1.1 299 Unknown\r\n\r\n"


@pytest.mark.parametrize("name, value", [
    ("X-A", "a\r\nSet-Cookie: x"), ("X-A", "a\nb"), ("X A", "v"), ("X-A:", "v"), ("", "v"),
])
def test_render_head_refuses_header_injection(name, value):
    with pytest.raises(ValueError):
        render_head(200, [(name, value)])


def test_render_chunk_frames_with_hex_size_and_skips_empty():
    assert render_chunk(b"a" * 26) == b"1a\r\n" + b"a" * 26 + b"\r\n"
    assert render_chunk(b"") == b""
    assert LAST_CHUNK == b"0\r\n\r\n"


@pytest.mark.parametrize("target", [b"http://[::1", b"http://a]b/", b"http://host:99999/x", b"http://h:port/"])
def test_an_absolute_target_that_is_not_a_url_is_400(target):
    assert parse(b"GET " + target + b" HTTP/1.1\r\nHost: h\r\n\r\n") == [ParseError(400, "invalid request target")]


def test_an_absolute_target_that_is_a_url_is_accepted():
    request = parse(b"GET http://[::1]:8000/v1/models?x=1 HTTP/1.1\r\nHost: h\r\n\r\n")[0]
    assert isinstance(request, Request) and request.target == "http://[::1]:8000/v1/models?x=1"


def test_an_absolute_target_names_the_host_whatever_host_says():
    request = parse(b"GET http://evil.example/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: 1\r\n\r\n")[0]
    assert request.headers.get_all("host") == ["evil.example"] and request.headers.get("x-a") == "1"
