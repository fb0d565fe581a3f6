"""Hostile input, seeded and bounded: mutated HTTP requests fed to the sans-IO parser
(llmd/http/parser.py) and sent to a real server, and mutated JSON bodies sent to every
generation and tokenizer route. Every case must be answered with a 2xx or a 4xx (or
the parser's 501/505), never crash or wedge the server, and a well-formed request must
still succeed afterwards."""
import http.client
import json
import random
import re
import socket

import pytest

from llmd.http.parser import Body, EndOfMessage, Limits, ParseError, Request, RequestParser
from tests.conftest import llmd_process
from tests.http.test_parser import merged
from tests.system.test_limits import address
from tests.serving.test_sessions import read_all

PARSER_CASES = 3000
RAW_CASES = 2000
JSON_CASES = 2000

CHAT = {"model": "model", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Hi there"}],
        "max_tokens": 2, "temperature": 0.5, "stop": ["\n"], "session_id": "fuzz"}
COMPLETION = {"model": "model", "prompt": "Once upon", "max_tokens": 2, "seed": 7}


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST %b HTTP/1.1\r\nHost: llmd\r\nContent-Type: application/json\r\n%b"
            b"Content-Length: %d\r\n\r\n%b" % (path.encode(), extra, len(body), body))


SEEDS = [
    b"GET /health HTTP/1.1\r\nHost: llmd\r\n\r\n",
    b"HEAD /health HTTP/1.1\r\nHost: llmd\r\n\r\n",
    b"GET /v1/models HTTP/1.0\r\n\r\n",
    post("/v1/chat/completions", json.dumps(CHAT).encode()),
    post("/v1/completions", json.dumps({**COMPLETION, "stream": True}).encode(), b"X-Session-ID: s1\r\n"),
    post("/tokenize", b'{"content": "hello"}', b"Expect: 100-continue\r\n"),
    b"POST /v1/completions HTTP/1.1\r\nHost: llmd\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"10;ext=1\r\n" + json.dumps(COMPLETION).encode()[:16] + b"\r\n" +
    b"%x\r\n" % (len(json.dumps(COMPLETION)) - 16) + json.dumps(COMPLETION).encode()[16:] +
    b"\r\n0\r\nX-Trailer: t\r\n\r\n",
    b"GET /v1/sessions HTTP/1.1\r\nHost: llmd\r\n\r\nDELETE /v1/sessions/s1 HTTP/1.1\r\nHost: llmd\r\n\r\n",
    b"GET /v1/models/model?x=1 HTTP/1.1\r\nHost: llmd\r\nConnection: close\r\n\r\n",
]

TOKENS = [b"\r\n", b"\n", b"\r", b"\x00", b" ", b":", b"\t", b"\x7f", b"\xff", b";", b",", b"0", b"-1",
          b"ffffffffffffffffffff", b"\r\n\r\n", b"Content-Length: 7\r\n", b"Content-Length: 1, 2\r\n",
          b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: gzip, chunked\r\n",
          b"Connection: close\r\n", b"Expect: 100-continue\r\n", b"Expect: 200-ok\r\n", b"Host: b\r\n",
          b" HTTP/1.1", b"HTTP/2.0", b"GET / HTTP/1.1\r\n", b"X-Session-ID: \xc3\xa9\r\n", b"%00",
          b"0\r\n\r\n", b"A" * 9000]


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at:at] = rng.choice(TOKENS)
        elif op == 2:
            del out[at:at + rng.randint(1, 16)]
        elif op == 3:
            end = min(len(out), at + rng.randint(1, 64))
            out[at:at] = out[at:end] * rng.randint(1, 3)
        elif op == 4:
            del out[at:]
        elif op == 5:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 6 and out:
            out[min(at, len(out) - 1)] = rng.choice(TOKENS)[0]
    return bytes(out)


def raw_cases(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    return [mutate_bytes(rng.choice(SEEDS), rng) for _ in range(n)]


# ---- the sans-IO parser ---------------------------------------------------------------

LIMITS = Limits(max_body_bytes=4096, max_header_count=20, max_header_bytes=2048, max_request_line=512)
PARSE_STATUSES = {400, 413, 414, 417, 431, 501, 505}


def parse_all(pieces: list[bytes]) -> list:
    """Events of feeding `pieces` one after another, answering each request at once."""
    parser, events = RequestParser(LIMITS), []
    for piece in pieces:
        events += parser.feed(piece)
        while parser.done:
            events += parser.start_next()
    return events


def random_split(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 6)))) if len(data) > 1 else []
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]


def check_events(events: list) -> None:
    body = 0
    for i, ev in enumerate(events):
        assert isinstance(ev, (Request, Body, EndOfMessage, ParseError)), ev
        if isinstance(ev, ParseError):
            assert ev.status in PARSE_STATUSES and ev.message and i == len(events) - 1, events
        if isinstance(ev, Body):
            body += len(ev.data)
            assert ev.data and body <= LIMITS.max_body_bytes
        if isinstance(ev, Request):
            body = 0
            assert ev.version in ("1.0", "1.1") and ev.method and ev.target


def test_parser_survives_mutated_requests_in_any_split():
    rng = random.Random(7)
    outcomes = set()
    for data in raw_cases(PARSER_CASES, seed=11):
        whole = parse_all([data])
        check_events(whole)
        assert merged(parse_all(random_split(data, rng))) == merged(whole), data
        outcomes.add(type(whole[-1]).__name__ if whole else "incomplete")
    assert outcomes == {"ParseError", "EndOfMessage", "Body", "Request", "incomplete"}


# ---- a real server --------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("fuzz") / "llmd.log"
    flags = ("--model", str(tiny_model.path), "--max-tokens-limit", "2", "--max-body-bytes", "16K",
             "--allowed-host", "llmd")
    with open(log_path, "w") as log, llmd_process(*flags, stderr=log) as llmd:
        yield llmd
        assert llmd.proc.poll() is None, "the server died"
        text = log_path.read_text()
        assert "Traceback" not in text and " 500 " not in text, text[-3000:]


STATUS_LINE = re.compile(rb"HTTP/1\.1 (\d{3}) [A-Za-z -]+\r\n")


def exchange(url: str, data: bytes) -> bytes:
    """Send data, half-close, and read until the server closes."""
    with socket.create_connection(address(url), timeout=10) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):  # refused early: read the answer
            pass
        return read_all(sock)


def answered_request(data: bytes) -> bool:
    """True if the server must answer `data` at least once: the parser (tested above)
    finds a whole first request or refuses it."""
    events = RequestParser().feed(data)
    return any(isinstance(ev, (EndOfMessage, ParseError)) for ev in events)


def well_formed_request_succeeds(url: str) -> None:
    conn = http.client.HTTPConnection(*address(url), timeout=10)
    conn.request("POST", "/v1/completions", json.dumps(COMPLETION), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["usage"]["completion_tokens"] == 2
    conn.close()


def test_server_answers_mutated_requests_with_4xx_or_handles_them(server):
    statuses: dict[int, int] = {}
    for data in raw_cases(RAW_CASES, seed=23):
        received = exchange(server.url, data)
        found = [int(s) for s in STATUS_LINE.findall(received)]
        if answered_request(data):
            assert received.startswith(b"HTTP/1.1 ") and found, (data, received[:300])
        for status in found:
            assert status < 500 or status in (501, 505), (data, received[:300])
            statuses[status] = statuses.get(status, 0) + 1
    assert statuses.get(200, 0) > 50 and statuses.get(400, 0) > 50, statuses
    well_formed_request_succeeds(server.url)


# ---- JSON bodies -------------------------------------------------------------------------

PARAMS = ["model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p",
          "top_k", "min_p", "seed", "stop", "n", "stream", "stream_options", "logit_bias", "tools",
          "tool_choice", "response_format", "session_id", "presence_penalty", "frequency_penalty",
          "repetition_penalty", "logprobs", "user", "metadata", "echo", "suffix", "best_of",
          "content", "tokens", "with_pieces", "add_special", "role", "name", "tool_calls", "x-unknown"]


def random_value(rng: random.Random, depth: int = 0):
    pick = rng.randrange(16 if depth < 3 else 12)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, 1, -1, 2, 7, 2**31 - 1, 2**31, 2**63, -2**63 - 1, 10**30])
    if pick == 3:
        return rng.choice([0.0, -0.5, 0.5, 1.5, 2.0, 1e308, -1e-300, 3.7])
    if pick == 4:
        return rng.choice(["", "model", "user", "assistant", "tool", "auto", "none", "<|im_end|>", "\x00",
                           "é" * 40, "\u202e", "x" * 3000, "json_object", "text"])
    if pick == 5:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)]))
                       for _ in range(rng.randint(0, 20)))
    if pick in (6, 7):
        return rng.randrange(0, 400)  # plausible token ids and counts
    if pick == 8:
        return [rng.randrange(-5, 400) for _ in range(rng.randint(0, 6))]
    if pick == 9:
        return {"role": rng.choice(["user", "system", "bot"]), "content": random_value(rng, 3)}
    if pick == 10:
        return ["\n", "a"]
    if pick == 11:
        return {str(rng.randrange(-2, 400)): rng.choice([-100, 100, 0.5, "x"])}
    if pick in (12, 13):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(PARAMS): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def mutate_json(obj, rng: random.Random):
    """Replace, delete or add one node somewhere in a copy of obj."""
    obj = json.loads(json.dumps(obj))
    node = obj
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = rng.choice(keys)
        child = node[key]
        if isinstance(child, (dict, list)) and child and rng.random() < 0.5:
            node = child
            continue
        op = rng.randrange(3)
        if op == 0:
            node[key] = random_value(rng)
        elif op == 1:
            del node[key]
        elif isinstance(node, dict):
            node[rng.choice(PARAMS)] = random_value(rng)
        else:
            node.append(random_value(rng))
        break
    return obj


TEXT_EDITS = [lambda t, r: t.replace('"', "'", 1), lambda t, r: t[:r.randrange(len(t))],
              lambda t, r: t.replace("}", ', "model": "model"}', 1),  # a duplicate key
              lambda t, r: t.replace("0.5", "NaN").replace("2", "Infinity", 1),
              lambda t, r: t.replace("Hi", "\\ud800"), lambda t, r: "[" * 70 + t + "]" * 70,
              lambda t, r: t + "garbage", lambda t, r: t.encode("utf-16").decode("latin-1")]


def json_cases(n: int, seed: int) -> list[tuple[str, bytes, dict]]:
    rng = random.Random(seed)
    bases = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
             ("/v1/chat/completions", {**CHAT, "stream": True}),
             ("/v1/completions", {**COMPLETION, "stream": True, "prompt": [1, 2, 3]}),
             ("/tokenize", {"content": "hello", "with_pieces": True}), ("/detokenize", {"tokens": [1, 2]})]
    cases = []
    for _ in range(n):
        path, base = rng.choice(bases)
        obj = base
        for _ in range(rng.randint(1, 3)):
            obj = mutate_json(obj, rng)
        text = json.dumps(obj, ensure_ascii=rng.random() < 0.5)
        if rng.random() < 0.15:
            text = rng.choice(TEXT_EDITS)(text, rng)
        headers = {"Content-Type": "application/json"}
        if rng.random() < 0.2:
            headers["X-Session-ID"] = rng.choice(["s1", "s2", " ", "a" * 129, "ok-id", "\x7f"])
        cases.append((path, text.encode("utf-8", "surrogatepass"), headers))
    return cases


def test_server_answers_mutated_json_with_2xx_or_4xx(server):
    host, port = address(server.url)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    statuses: dict[int, int] = {}
    for path, body, headers in json_cases(JSON_CASES, seed=31):
        conn.request("POST", path, body, headers)
        resp = conn.getresponse()
        data = resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status < 500, (path, body[:300], data[:300])
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            assert data.endswith(b"data: [DONE]\n\n") and b"server_error" not in data, data[-300:]
        else:
            assert set(json.loads(data)) <= {"error", "object", "id", "created", "model", "choices", "usage",
                                             "system_fingerprint", "timings", "session_reset_reason",
                                             "tokens", "content"}
        if resp.getheader("Connection") == "close":
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.close()
    assert statuses.get(200, 0) > 100 and statuses.get(400, 0) > 300, statuses
    well_formed_request_succeeds(server.url)


# Short: the tiny model's context is 128 tokens, its vocabulary mostly single bytes.
RESPONSES = {"model": "model", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                                         {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                                         {"type": "function_call_output", "call_id": "c", "output": "ok"}],
             "max_output_tokens": 2, "temperature": 0.5, "text": {"format": {"type": "text"}}, "top_logprobs": 2}
MESSAGES = {"model": "model", "max_tokens": 2, "system": [{"type": "text", "text": "Hi"}],
            "messages": [{"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]}],
            "stop_sequences": ["\n"], "top_k": 5}


def test_server_answers_mutated_responses_and_messages_bodies_with_2xx_or_4xx(server):
    rng = random.Random(47)
    host, port = address(server.url)
    conn = http.client.HTTPConnection(host, port, timeout=10)
    statuses: dict[int, int] = {}
    bases = [("/v1/responses", RESPONSES), ("/v1/responses", {**RESPONSES, "stream": True}),
             ("/v1/messages", MESSAGES), ("/v1/messages", {**MESSAGES, "stream": True}),
             ("/v1/messages/count_tokens", {k: v for k, v in MESSAGES.items() if k != "max_tokens"})]
    for _ in range(600):
        path, obj = rng.choice(bases)
        for _ in range(rng.randint(1, 3)):
            obj = mutate_json(obj, rng)
        conn.request("POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        statuses[resp.status] = statuses.get(resp.status, 0) + 1
        assert resp.status < 500, (path, obj, data[:300])
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            last = data.rstrip(b"\n").rsplit(b"\n", 2)
            assert b"response.completed" in last[-2] or b"response.incomplete" in last[-2] or \
                b"message_stop" in last[-2], data[-300:]
        else:
            body = json.loads(data)
            assert "error" in body or body.get("object") == "response" or body.get("type") == "message" \
                or "input_tokens" in body, body
        if resp.getheader("Connection") == "close":
            conn.close()
            conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.close()
    assert statuses.get(200, 0) > 50 and statuses.get(400, 0) > 100, statuses
