"""The load figure of docs/deployment.md: conversations per second and first-token
latency through nginx (contrib/nginx-llmd.conf) in front of 1, 2 or 3 llmd instances
on the default model, sharing one --session-dir.

    python -m tests.system.scale_out_load --instances 3 [--rounds 5]

Each round starts the instances and nginx afresh, then runs CONVERSATIONS multi-turn
conversations, CONCURRENCY at a time, each turn a streamed chat request naming its
session in X-Session-ID; a turn's first-token latency is the time from sending it to
its first content delta. Prints one JSON line per round and the medians.
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import llmd_process
from tests.system.test_limits import address
from tests.system.test_scale_out import nginx

MODEL = "SmolLM2-135M-Instruct"
CONVERSATIONS, TURNS, CONCURRENCY, MAX_TOKENS = 24, 3, 8, 32
QUESTIONS = ("Name a city in {}.", "What is it known for?", "Give one more fact about it.")
PLACES = ("France", "Japan", "Brazil", "Kenya", "Canada", "India", "Italy", "Peru")


def streamed_turn(port: int, sid: str, history: list[dict]) -> float:
    """Send the conversation's next turn as a stream; its reply joins the history.
    Seconds to the first content delta."""
    body = {"model": MODEL, "messages": history, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    started, first, text = time.perf_counter(), 0.0, []
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", "X-Session-ID": sid})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and (piece := delta[0]["delta"].get("content")):
                first = first or time.perf_counter() - started
                text.append(piece)
    finally:
        conn.close()
    history.append({"role": "assistant", "content": "".join(text)})
    return first


def conversation(port: int, index: int) -> list[float]:
    history: list[dict] = []
    latencies = []
    for question in QUESTIONS[:TURNS]:
        history.append({"role": "user", "content": question.format(PLACES[index % len(PLACES)])})
        latencies.append(streamed_turn(port, f"load-{index}", history))
    return latencies


def round_figures(instances: int) -> dict:
    threads = max(1, 2 // instances)  # this machine has two cores
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        flags = ("--threads", str(threads), "--max-sessions", "40", "--session-dir", f"{tmp}/sessions",
                 "--session-save-delay", "0")
        servers = [stack.enter_context(llmd_process(*flags)) for _ in range(instances)]
        (Path(tmp) / "nginx").mkdir()
        port = stack.enter_context(nginx(Path(tmp) / "nginx", [address(s.url)[1] for s in servers]))
        started = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            latencies = [t for c in pool.map(lambda i: conversation(port, i), range(CONVERSATIONS)) for t in c]
        seconds = time.perf_counter() - started
    latencies.sort()
    return {"instances": instances, "threads_each": threads, "conversations_per_s": CONVERSATIONS / seconds,
            "ttft_p50_ms": 1000 * statistics.median(latencies),
            "ttft_p99_ms": 1000 * latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    results: dict[int, list[dict]] = {n: [] for n in args.instances}
    for _ in range(args.rounds):  # interleaved: each round runs every instance count once
        for n in args.instances:
            figures = round_figures(n)
            results[n].append(figures)
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}),
                  flush=True)
    for n, rounds in results.items():
        print(json.dumps({"instances": n, "rounds": len(rounds), **{
            key: round(statistics.median(r[key] for r in rounds), 2)
            for key in ("conversations_per_s", "ttft_p50_ms", "ttft_p99_ms")}}))


if __name__ == "__main__":
    main()
