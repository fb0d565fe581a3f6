"""Chaos: rounds of randomly interleaved, concurrent client and operator behaviours
against a real server with few session slots, checking after every round that
nothing leaked, stuck or lied.

Behaviours: a plain request; a stream closed right at `data: [DONE]`; a reset
(SO_LINGER 0) before the response head or after it; a half-close (shutdown
SHUT_WR) after the request, which must still get its whole answer; a disconnect
while a long prompt is being prefilled; DELETE and reset of a session; and, since
more session ids are used than there are slots, evictions. After each round: no
5xx, no generation or request left running, the engine's live sessions equal the
table's, no KV block is held once its sessions are gone, every session id is
usable, RSS and open file descriptors are back to their baseline, and every
temperature-0 answer that arrived equals the answer the same prompt gets alone.

Seeded and bounded: LLMD_CHAOS_SEED (default 14) and LLMD_CHAOS_ROUNDS (default 6)
choose the run; a larger round count is for soak runs by hand.
"""
import concurrent.futures
import json
import os
import random
import re
import socket
import time
from collections import Counter

from tests.conftest import llmd_process
from tests.system.test_limits import address, wait_for
from tests.serving.test_sessions import read_all, read_until, reset

SEED = int(os.environ.get("LLMD_CHAOS_SEED", "14"))
ROUNDS = int(os.environ.get("LLMD_CHAOS_ROUNDS", "6"))
CLIENTS = 10            # behaviours per round, all at once
SESSION_IDS = ["s0", "s1", "s2", "s3", "s4", None]  # 3 named slots: the rest evict
MAX_TOKENS = 12
RSS_SLACK = 16 << 20   # allocator and interpreter drift; a leaked session holds about 12 MB
PROMPTS = ["Name a colour.", "What is two plus two?", "Say hello in French.", "Name a fruit."]
LONG_PROMPT = "Summarise this: " + "the quick brown fox jumps over the lazy dog " * 40


class Server:
    def __init__(self, llmd):
        self.llmd = llmd
        self.host, self.port = address(llmd.url)

    def send(self, method: str, path: str, body: dict | None = None) -> socket.socket:
        data = json.dumps(body).encode() if body is not None else b""
        sock = socket.create_connection((self.host, self.port), timeout=30)
        head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        sock.sendall(head.encode() + b"\r\n" + data)
        return sock

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        """(status, decoded body) of one exchange."""
        sock = self.send(method, path, body)
        raw = read_all(sock)
        sock.close()
        return parse_response(raw)

    def json(self, path: str) -> dict:
        status, body = self.call("GET", path)
        assert status == 200, (path, status, body[:300])
        return json.loads(body)

    def metrics(self) -> dict[str, float]:
        status, body = self.call("GET", "/metrics")
        return {m.group(1): float(m.group(2))
                for m in re.finditer(r"^(llmd_[a-z_]+) ([0-9.e+-]+)$", body.decode(), re.M)}

    def rss_and_fds(self) -> tuple[int, int]:
        pid = self.llmd.proc.pid
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        return rss, len(os.listdir(f"/proc/{pid}/fd"))


def dechunk(data: bytes, complete: bool = True) -> bytes:
    """A chunked body's content; `complete` requires its last chunk."""
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        out, data = out + rest[:n], rest[n + 2:]
    assert not complete, "the chunked body has no last chunk"
    return out


def parse_response(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, dechunk(body) if b"transfer-encoding: chunked" in head.lower() else body


def answer_text(status: int, body: bytes, stream: bool) -> str | None:
    """The assistant text of a complete 200 answer (None for any other status)."""
    if status != 200:
        return None
    if not stream:
        reply = json.loads(body)
        assert reply["choices"][0]["finish_reason"] in ("stop", "length"), reply
        return reply["choices"][0]["message"]["content"]
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def chat_body(prompt: str, sid: str | None, stream: bool, max_tokens: int = MAX_TOKENS) -> dict:
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    return {**body, "session_id": sid} if sid else body


# ---- behaviours: each returns (name, status or None if it left early, text or None) ----

def plain(server: Server, rng: random.Random, prompt: str, sid: str | None):
    stream = rng.random() < 0.5
    status, body = server.call("POST", "/v1/chat/completions", chat_body(prompt, sid, stream))
    return "plain", status, answer_text(status, body, stream)


def close_at_done(server, rng, prompt, sid):
    sock = server.send("POST", "/v1/chat/completions", chat_body(prompt, sid, True))
    raw = read_until(sock, b"data: [DONE]\n\n")
    sock.close()  # before the chunk terminator, as many SSE clients do
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if status != 200:
        return "close_at_done", status, None
    return "close_at_done", status, answer_text(status, dechunk(body, complete=False), True)


def reset_before_head(server, rng, prompt, sid):
    reset(server.send("POST", "/v1/chat/completions", chat_body(prompt, sid, True, max_tokens=200)))
    return "reset_before_head", None, None


def reset_after_head(server, rng, prompt, sid):
    sock = server.send("POST", "/v1/chat/completions", chat_body(prompt, sid, True, max_tokens=200))
    raw = read_until(sock, b"data: ")
    reset(sock)
    return "reset_after_head", int(raw.split(b" ", 2)[1]) if raw else None, None


def half_close(server, rng, prompt, sid):
    stream = rng.random() < 0.5
    sock = server.send("POST", "/v1/chat/completions", chat_body(prompt, sid, stream))
    sock.shutdown(socket.SHUT_WR)
    status, body = parse_response(read_all(sock))
    sock.close()
    return "half_close", status, answer_text(status, body, stream)


def leave_mid_prefill(server, rng, prompt, sid):
    sock = server.send("POST", "/v1/chat/completions", chat_body(LONG_PROMPT, sid, True, max_tokens=200))
    time.sleep(rng.uniform(0, 0.05))
    (reset if rng.random() < 0.5 else socket.socket.close)(sock)
    return "leave_mid_prefill", None, None


def delete(server, rng, prompt, sid):
    status, _ = server.call("DELETE", f"/v1/sessions/{sid or 's0'}")
    return "delete", status, None


def reset_session(server, rng, prompt, sid):
    status, _ = server.call("POST", f"/v1/sessions/{sid or 's1'}/reset")
    return "reset", status, None


BEHAVIOURS = [plain, close_at_done, reset_before_head, reset_after_head, half_close, leave_mid_prefill,
              delete, reset_session]


def check_invariants(server: Server, solo: dict[str, str], fds: int) -> None:
    """Everything that must hold once a round's clients are done (see module doc).
    `fds`: the server's open descriptors with no client connected; until it is back
    there, a request whose client already left (closing its sending side only looks
    the same) may still be on its way to a session."""
    def idle():
        if server.rss_and_fds()[1] > fds:
            return False
        m = server.metrics()
        listing = server.json("/v1/sessions")
        return (m["llmd_generations_active"] == 0 and m["llmd_generations_queued"] == 0
                and all(s["in_flight"] == 0 for s in listing["data"])
                and listing["engine_sessions"] == listing["table_sessions"])
    wait_for(idle, seconds=15, what="no connection, generation or request left, and the engine and the table to agree")
    listing, m = server.json("/v1/sessions"), server.metrics()
    assert listing["engine_sessions"] == 1 + len(listing["data"]), listing  # + the scratch session
    assert m["llmd_engine_sessions_live"] == m["llmd_sessions_held"] == 1 + len(listing["data"])
    assert m["llmd_sessions_in_use"] == len(listing["data"])
    for sid in SESSION_IDS:  # every id is usable, evicting as needed; answers are still right
        status, body = server.call("POST", "/v1/chat/completions", chat_body(PROMPTS[0], sid, False))
        assert status == 200, (sid, status, body[:300])
        assert answer_text(status, body, False) == solo[PROMPTS[0]], sid


def test_sessions_survive_random_client_behaviour():
    rng = random.Random(SEED)
    with llmd_process("--max-sessions", "4", "--ctx", "512", "--threads", "2") as llmd:
        server = Server(llmd)
        solo = {}
        for prompt in PROMPTS:
            status, body = server.call("POST", "/v1/chat/completions", chat_body(prompt, None, False))
            solo[prompt] = answer_text(status, body, False)
        _, fds = server.rss_and_fds()
        check_invariants(server, solo, fds)

        def clean() -> tuple[int, int]:
            for s in server.json("/v1/sessions")["data"]:
                assert server.call("DELETE", f"/v1/sessions/{s['id']}")[0] == 200
            return server.rss_and_fds()

        # Warm up: every slot holds a long context once, so that the allocator has seen
        # the most KV memory the server can hold and freed memory is reused, not new.
        warm = [("POST", "/v1/chat/completions", chat_body(LONG_PROMPT, sid, False, max_tokens=4))
                for sid in SESSION_IDS]
        with concurrent.futures.ThreadPoolExecutor(len(warm)) as pool:
            assert {status for status, _ in pool.map(lambda w: server.call(*w), warm)} <= {200, 429}
        baseline_rss, baseline_fds = clean()
        statuses, kinds, answers = Counter(), Counter(), 0
        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            for round in range(ROUNDS):
                plan = [(rng.choice(BEHAVIOURS), rng.choice(PROMPTS), rng.choice(SESSION_IDS),
                         random.Random(rng.random()), rng.uniform(0, 0.2)) for _ in range(CLIENTS)]

                def run(behaviour, prompt, sid, own_rng, delay):
                    time.sleep(delay)
                    return behaviour(server, own_rng, prompt, sid) + (prompt,)

                for name, status, text, prompt in pool.map(lambda p: run(*p), plan):
                    kinds[name] += 1
                    if status is not None:
                        statuses[status] += 1
                        assert status < 500, (round, name, status)
                    if text is not None:
                        answers += 1
                        assert text == solo[prompt], (round, name, prompt, text)
                check_invariants(server, solo, baseline_fds)
                rss, _ = clean()
                # No block leaked: the scratch session alone is left, holding one short
                # chat (check_invariants' last request) in one block.
                wait_for(lambda: server.metrics()["llmd_engine_sessions_live"] == 1, seconds=15,
                         what="deleted sessions freed")
                assert server.metrics()["llmd_kv_blocks_live"] == 1, round
                assert rss <= baseline_rss + RSS_SLACK, (round, rss, baseline_rss)
        rss, fds = server.rss_and_fds()
        print(f"\nchaos seed {SEED}: {ROUNDS} rounds, {sum(kinds.values())} behaviours {dict(kinds)}, "
              f"statuses {dict(statuses)}, {answers} answers equal to solo; RSS {baseline_rss >> 20} -> "
              f"{rss >> 20} MB, fds {baseline_fds} -> {fds}")
