"""Prints tests/api/test_embeddings.py's GOLDEN table from llama.cpp (run by hand, never by the tests).

    python -m tests.support.make_embedding_golden LLAMA_DIR

LLAMA_DIR is a llama.cpp source tree built in LLAMA_DIR/build with the llama-embedding
target. For each pooling of test_embeddings.POOLINGS it writes the tiny qwen3 embedding
model with test_embeddings.build() and runs `llama-embedding` over test_embeddings.TEXTS
(one per line, L2-normalised as OpenAI's embeddings are), keeping every component to 7
decimals, as the tool prints them.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.api.test_embeddings import POOLINGS, TEXTS, build

# llama-embedding reserves outputs for up to 256 sequences, which a batch must hold:
# a context of 256 (past the model's 128; the texts are a few tokens each).
CONTEXT = 256
ATTEMPTS = 20


def embed(llama: Path, model: Path) -> list[list[float]]:
    """The tool's vectors. Its log thread may drop the end of its output as the process
    exits (through a pipe, nearly always): it runs again until a whole array comes out."""
    for _ in range(ATTEMPTS):
        with tempfile.TemporaryFile("w+") as out:
            subprocess.run(
                [str(llama / "build" / "bin" / "llama-embedding"), "-m", str(model), "-p", "\n".join(TEXTS),
                 "-c", str(CONTEXT), "-b", str(CONTEXT), "-ub", str(CONTEXT), "-t", "2", "--embd-normalize", "2",
                 "--embd-output-format", "array"],
                check=True, stdout=out, stderr=subprocess.DEVNULL)
            out.seek(0)
            text = out.read()
        start, end = text.find("[["), text.find("]]")
        if 0 <= start < end:
            vectors = json.loads(text[start:end + 2])
            if len(vectors) == len(TEXTS):
                return vectors
    raise RuntimeError(f"llama-embedding gave no whole output in {ATTEMPTS} runs")


def main(llama: Path) -> None:
    print("GOLDEN = {")
    with tempfile.TemporaryDirectory() as tmp:
        for name in POOLINGS:
            vectors = embed(llama, build(Path(tmp) / f"{name}.gguf", name).path)
            print(f"    {name!r}: [")
            for v in vectors:
                print("        [" + ", ".join(f"{x:.7f}" for x in v) + "],")
            print("    ],")
    print("}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
