"""`python -m llmd bench --accuracy`: what the quantized kernels cost in perplexity.

Theory of operation. A quantized file's exact result is that of its F32 twin: the
same weights decoded to F32 (`python -m llmd quantize --allow-requantize IN TWIN F32`
writes them bit for bit), computed without quantizing the activations. What a kernel
variant costs on the file is ppl(file) / ppl(twin) - 1, both measured under that
variant: the activations' int8 rounding and the kernels' accumulation, nothing of
the weights' own quantization. The engine fixes its variant once per process
(LLMD_KERNELS), so every measurement runs `python -m llmd perplexity` in a process
of its own.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from llmd.engine.native import kernel_variants

MAX_COST = 0.005  # the ceiling: no variant loses more than 0.5 % to its file's exact result


@dataclass(frozen=True)
class Cost:
    """One variant's figures: the perplexities, and the cost with its standard error.
    The int8 rounding moves each token's log-probability by a few hundredths either
    way, so on a few thousand tokens the cost itself is uncertain by a few tenths of
    a percent: `stderr` says how much (paired over the tokens, on the log scale)."""
    variant: str
    exact: float      # perplexity of the F32 twin
    quantized: float  # perplexity of the file itself
    cost: float       # quantized / exact - 1
    stderr: float     # of the mean per-token difference in log-probability
    tokens: int


def compare(variant: str, exact: list[float], quantized: list[float]) -> Cost:
    """The cost from two runs' per-token log-probabilities of the same text."""
    n = len(exact)
    diffs = [e - q for e, q in zip(exact, quantized)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / n)
    return Cost(variant, math.exp(-sum(exact) / n), math.exp(-sum(quantized) / n), math.exp(mean) - 1,
                sd / math.sqrt(n), n)


def variants() -> list[str]:
    """The kernel variants this CPU runs, the scalar references first."""
    return [v.name for v in kernel_variants() if v.runs]


def logprobs(paths: list[str], text_file: str, variant: str, threads: int = 0, ctx: int = 512) -> list[list[float]]:
    """Each model's per-token log-probabilities of the text (perplexity.text_logprobs) under
    one kernel variant, in one process that runs it (this module's main)."""
    cmd = [sys.executable, "-m", "llmd.commands.accuracy", text_file, str(ctx), str(threads), *paths]
    # The child imports this llmd, wherever the caller's working directory is.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, LLMD_KERNELS=variant, PYTHONPATH=path)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"LLMD_KERNELS={variant} {' '.join(cmd)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _main(text_file: str, ctx: str, threads: str, *paths: str) -> None:
    from llmd.commands.perplexity import text_logprobs
    from llmd.engine.native import Engine
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    found = []
    for path in paths:
        with Engine(path, n_threads=int(threads), n_ctx=int(ctx), max_sessions=1) as engine:
            scored, _ = text_logprobs(engine, text, int(ctx))
        if not scored:
            raise SystemExit(f"{text_file} is too short; perplexity needs at least {2 * int(ctx)} tokens")
        found.append(scored)
    print(json.dumps(found))


def write_twin(model: str, twin: str, threads: int = 0) -> None:
    """The F32 twin of `model` at `twin` (its matrices decoded, nothing else changed)."""
    from llmd.commands.quantize import quantize_file
    with open(os.devnull, "w") as quiet:
        quantize_file(model, twin, "F32", n_threads=threads, allow_requantize=True, out=quiet)


def costs(model: str, text_file: str, twin: str | None = None, threads: int = 0, ctx: int = 512) -> list[Cost]:
    """Each variant's cost on `model`, against `twin` (written first when it does not
    exist; a temporary file beside the model, removed afterwards, when None)."""
    if twin is None:
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(model))) as folder:
            return costs(model, text_file, os.path.join(folder, "twin-F32.gguf"), threads, ctx)
    if not os.path.exists(twin):
        write_twin(model, twin, threads)
    return [compare(v, *logprobs([twin, model], text_file, v, threads, ctx)) for v in variants()]


def run(model: str, text_file: str, twin: str | None, threads: int, as_json: bool) -> int:
    """Prints each variant's cost; 1 when one is above MAX_COST."""
    rows = costs(model, text_file, twin, threads)
    if as_json:
        print(json.dumps([{"variant": r.variant, "exact": round(r.exact, 4), "quantized": round(r.quantized, 4),
                           "cost_pct": round(100 * r.cost, 3), "stderr_pct": round(100 * r.stderr, 3),
                           "tokens": r.tokens} for r in rows]))
    else:
        print(f"llmd bench --accuracy: {model} on {text_file} ({rows[0].tokens} tokens scored), context 512")
        print(f"  {'variant':<10} {'exact (F32 twin)':>17} {'quantized':>10} {'cost':>8}  standard error")
        for r in rows:
            print(f"  {r.variant:<10} {r.exact:>17.4f} {r.quantized:>10.4f} {100 * r.cost:>+7.2f}%  "
                  f"{100 * r.stderr:.2f}%")
    return 1 if any(r.cost > MAX_COST for r in rows) else 0


if __name__ == "__main__":
    _main(*sys.argv[1:])
