"""Prints an architecture test's GOLDEN table from llama.cpp (run by hand, never by the tests).

    python -m tests.support.make_arch_golden LLAMA_DIR [--tests MODULE] [NAME ...]

LLAMA_DIR is a llama.cpp source tree built in LLAMA_DIR/build (llama-perplexity and
libllama). MODULE is the test module (default tests.engine.test_arch; also
tests.engine.test_arch_gemma3, tests.engine.test_arch_qwen3moe): for every model of its CONFIGS (or
the NAMEs given) it writes the GGUF with its build(), then takes
  - the perplexity over test_arch.TEXT from `llama-perplexity -c N_CTX -b N_CTX`;
  - GREEDY_STEPS greedy ids after TEXT's first PROMPT_TOKENS tokens, each with the gap
    between its top two logits (the log-prob margin), from a small program against
    libllama that this script compiles (the server's probabilities skip tokens that
    end inside a UTF-8 character, so they cannot give one margin per step);
  - where MODULE has a FIRST_CHUNK table, the log-probability llama-perplexity gives each
    token its first chunk scores (tests/llama_archs.py: first_chunk), as a second table.
"""
from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from llmd.engine.native import Engine

GREEDY_SOURCE = r"""
#include "llama.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
// greedy MODEL STEPS ID... : prints "id margin" per generated token
int main(int argc, char **argv) {
    llama_backend_init();
    llama_model *model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) return 1;
    const int steps = atoi(argv[2]);
    std::vector<llama_token> ids;
    for (int i = 3; i < argc; ++i) ids.push_back(atoi(argv[i]));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = atoi(getenv("N_CTX"));
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context *ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    if (llama_decode(ctx, llama_batch_get_one(ids.data(), ids.size()))) return 2;
    std::vector<int> order(n_vocab);
    for (int s = 0; s < steps; ++s) {
        const float *logits = llama_get_logits_ith(ctx, -1);
        for (int i = 0; i < n_vocab; ++i) order[i] = i;
        std::partial_sort(order.begin(), order.begin() + 2, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b]; });
        llama_token t = order[0];
        printf("%d %.4f\n", t, logits[order[0]] - logits[order[1]]);
        if (llama_decode(ctx, llama_batch_get_one(&t, 1))) return 3;
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
"""


def perplexity(llama: Path, model: Path, text: Path, n_ctx: int, logits: Path | None = None) -> float:
    """llama-perplexity's figure; with `logits`, it also writes every scored position's
    log-probabilities there (its --kl-divergence-base file)."""
    extra = ["--kl-divergence-base", str(logits)] if logits is not None else []
    # llama.cpp's log thread sometimes loses the last lines at exit: run until they appear.
    for _ in range(10):
        out = subprocess.run([str(llama / "build/bin/llama-perplexity"), "-m", str(model), "-f", str(text),
                              "-c", str(n_ctx), "-b", str(n_ctx), "-t", "2", *extra], capture_output=True, text=True)
        if m := re.search(r"Final estimate: PPL = ([0-9.]+)", out.stdout + out.stderr):
            return float(m.group(1))
    raise RuntimeError(f"llama-perplexity printed no estimate for {model}")


def main(llama: Path, module: str, names: list[str]) -> None:
    tests = importlib.import_module(module)
    work = Path(tempfile.mkdtemp())
    text = work / "text.txt"
    text.write_text(tests.TEXT)
    greedy = work / "greedy"
    (work / "greedy.cpp").write_text(GREEDY_SOURCE)
    lib = llama / "build/bin"
    subprocess.run(["g++", "-O2", "-std=c++17", str(work / "greedy.cpp"), f"-I{llama}/include",
                    f"-I{llama}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", str(greedy)], check=True)
    first_chunks = []
    for name in names or list(tests.CONFIGS):
        model = tests.build(name).write(work / f"{name}.gguf")
        with Engine(str(model), max_sessions=2) as engine:
            prompt = engine.tokenize(tests.TEXT)[:tests.PROMPT_TOKENS]
        out = subprocess.run([str(greedy), str(model), str(tests.GREEDY_STEPS), *map(str, prompt)],
                             capture_output=True, text=True, check=True,
                             env={"N_CTX": str(tests.N_CTX)}).stdout.split()
        ids, margins = [int(t) for t in out[0::2]], [round(float(m), 3) for m in out[1::2]]
        logits = work / "logits.bin" if hasattr(tests, "FIRST_CHUNK") else None
        ppl = perplexity(llama, model, text, tests.N_CTX, logits=logits)
        print(f'    "{name}": ({ppl},\n        {ids},\n        {margins}),', flush=True)
        if logits is not None:
            from tests.llama_archs import first_chunk
            first_chunks.append(f'    "{name}": {first_chunk(logits)["log_probs"]},')
    if first_chunks:
        print("FIRST_CHUNK:", *first_chunks, sep="\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("llama", type=Path)
    parser.add_argument("--tests", default="tests.engine.test_arch")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    main(args.llama, args.tests, args.names)
