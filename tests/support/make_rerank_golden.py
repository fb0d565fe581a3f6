"""Prints tests/api/test_rerank.py's GOLDEN table from llama.cpp (run by hand, never by the tests).

    python -m tests.support.make_rerank_golden LLAMA_DIR

LLAMA_DIR is a llama.cpp source tree built in LLAMA_DIR/build with the llama-server
target. It writes the tiny qwen3 reranker with test_rerank.build(), serves it with
`llama-server --reranking` (one slot, so that no two documents share a batch), and asks
POST /v1/rerank for test_rerank.DOCUMENTS against each of test_rerank.QUERIES, keeping
each document's score (in input order) to 7 decimals.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.api.test_rerank import DOCUMENTS, N_CTX, QUERIES, build
from tests.conftest import free_port



def scores(url: str, query: str) -> list[float]:
    body = json.dumps({"query": query, "documents": DOCUMENTS}).encode()
    request = urllib.request.Request(url + "/v1/rerank", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as reply:
        results = json.load(reply)["results"]
    return [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]


def main(llama: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model, port = build(Path(tmp) / "reranker.gguf"), free_port()
        server = subprocess.Popen(
            [str(llama / "build" / "bin" / "llama-server"), "-m", str(model), "--reranking", "-c", str(N_CTX),
             "-np", "1", "-t", "2", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    with urllib.request.urlopen(url + "/health") as reply:
                        if reply.status == 200:
                            break
                except OSError:
                    time.sleep(0.1)
            print("GOLDEN = [")
            for query in QUERIES:
                print("    [" + ", ".join(f"{x:.7f}" for x in scores(url, query)) + "],")
            print("]")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
