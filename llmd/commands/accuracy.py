"""`python -m llmd bench --accuracy`: what the quantized kernels cost in perplexity.

Theory of operation. A quantized file's exact result is that of its F32 twin: the
same weights decoded to F32 (`python -m llmd quantize --allow-requantize IN TWIN F32`
writes them bit for bit), computed without quantizing the activations. What a kernel
variant costs on the file is ppl(file) / ppl(twin) - 1, both measured under that
variant: the activations' int8 rounding and the kernels' accumulation, nothing of
the weights' own quantization. The engine fixes its variant once per process
(LLMD_KERNELS), so every measurement runs in a process of its own.

The perplexity ratio on a few thousand tokens is a noisy figure: the rounding moves
each token's log-probability a little either way, and a perturbation as small as
storing the activations' scales in f16 moves the ratio by a few tenths of a percent
(`Cost.stderr` says how much). The mean KL divergence of the file's next-token
distribution from the twin's, at the same positions, measures the same loss
precisely (to a few percent of itself): it is the figure to compare with
llama-perplexity's `--kl-divergence` on the same pair of files.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from llmd.commands.perplexity import mean_and_stderr
from llmd.engine.native import kernel_variants

MAX_COST = 0.005  # the ceiling: no variant loses more than 0.5 % to its file's exact result


@dataclass(frozen=True)
class Cost:
    """One variant's figures: the perplexities, the cost with its standard error, and
    the mean KL divergence with its standard error."""
    variant: str
    exact: float      # perplexity of the F32 twin
    quantized: float  # perplexity of the file itself
    cost: float       # quantized / exact - 1
    stderr: float     # of the mean per-token difference in log-probability
    kld: float        # mean KL(twin's next-token distribution || the file's)
    kld_stderr: float
    tokens: int


def compare(variant: str, scored: dict) -> Cost:
    """The figures from one pair's per-token measurements (`pair_scores`)."""
    exact, quantized = scored["exact"], scored["quantized"]
    mean, stderr = mean_and_stderr([e - q for e, q in zip(exact, quantized)])
    kld, kld_stderr = mean_and_stderr(scored["kld"])
    n = len(exact)
    return Cost(variant, math.exp(-sum(exact) / n), math.exp(-sum(quantized) / n), math.exp(mean) - 1, stderr,
                kld, kld_stderr, n)


def variants() -> list[str]:
    """The kernel variants this CPU runs, the scalar references first."""
    return [v.name for v in kernel_variants() if v.runs]


def _log_softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    log_sum = top + math.log(sum(math.exp(v - top) for v in logits))
    return [v - log_sum for v in logits]


def pair_scores(twin, quantized, text: str, ctx: int) -> dict:
    """Two engines (the twin's and the file's) over llama-perplexity's windows
    (perplexity.perplexity_windows), the second half of each scored given the first:
    per scored token, each one's log-probability of it and the KL divergence of the
    file's next-token distribution from the twin's. The positions go one at a time,
    which the engine computes as it would in a batch (its numbers are batch-invariant),
    so that every position's whole distribution can be read."""
    from llmd.commands.perplexity import perplexity_windows
    info = twin.info
    windows = perplexity_windows(twin.tokenize(text), ctx, info.bos_id if info.add_bos else None)
    if len(windows) < 2:
        raise ValueError(f"the text is too short; perplexity needs at least {2 * ctx} tokens")
    first = ctx // 2
    found: dict[str, list[float]] = {"exact": [], "quantized": [], "kld": []}
    with twin.new_session() as a, quantized.new_session() as b:
        for window in windows:
            a.reset()
            b.reset()
            for at in range(first, ctx - 1):
                step = window[:at + 1] if at == first else [window[at]]
                a.prefill(step)
                b.prefill(step)
                p, q = _log_softmax(a.logits()), _log_softmax(b.logits())
                found["exact"].append(p[window[at + 1]])
                found["quantized"].append(q[window[at + 1]])
                found["kld"].append(sum(math.exp(lp) * (lp - lq) for lp, lq in zip(p, q)))
    return found


def measure(pairs: list[tuple[str, str]], text_file: str, variant: str, threads: int = 0,
            ctx: int = 512) -> list[dict]:
    """pair_scores of each (twin, quantized) pair of files under one kernel variant, in
    one process that runs it (this module's main)."""
    cmd = [sys.executable, "-m", "llmd.commands.accuracy", text_file, str(ctx), str(threads),
           *[path for pair in pairs for path in pair]]
    # The child imports this llmd, wherever the caller's working directory is.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, LLMD_KERNELS=variant, PYTHONPATH=path)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"LLMD_KERNELS={variant} {' '.join(cmd)}: {done.stderr.strip()}")
    return json.loads(done.stdout)


def _main(text_file: str, ctx: str, threads: str, *paths: str) -> None:
    from llmd.engine.native import Engine
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    found = []
    for twin_path, quantized_path in zip(paths[0::2], paths[1::2]):
        with Engine(twin_path, n_threads=int(threads), n_ctx=int(ctx), max_sessions=1) as twin, \
                Engine(quantized_path, n_threads=int(threads), n_ctx=int(ctx), max_sessions=1) as quantized:
            try:
                found.append(pair_scores(twin, quantized, text, int(ctx)))
            except ValueError as e:
                raise SystemExit(f"{text_file}: {e}")
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
    return [compare(v, measure([(twin, model)], text_file, v, threads, ctx)[0]) for v in variants()]


def run(model: str, text_file: str, twin: str | None, threads: int, as_json: bool) -> int:
    """Prints each variant's cost; 1 when one is above MAX_COST."""
    with open(text_file, encoding="utf-8") as f:  # readable UTF-8, before the twin is written
        f.read()
    rows = costs(model, text_file, twin, threads)
    if as_json:
        print(json.dumps([{"variant": r.variant, "exact": round(r.exact, 4), "quantized": round(r.quantized, 4),
                           "cost_pct": round(100 * r.cost, 3), "stderr_pct": round(100 * r.stderr, 3),
                           "kld": round(r.kld, 6), "kld_stderr": round(r.kld_stderr, 6),
                           "tokens": r.tokens} for r in rows]))
    else:
        print(f"llmd bench --accuracy: {model} on {text_file} ({rows[0].tokens} tokens scored), context 512")
        print(f"  {'variant':<10} {'exact (F32 twin)':>17} {'quantized':>10} {'cost':>8} {'± error':>8}"
              f" {'mean KLD':>10} {'± error':>9}")
        for r in rows:
            print(f"  {r.variant:<10} {r.exact:>17.4f} {r.quantized:>10.4f} {100 * r.cost:>+7.2f}% "
                  f"{100 * r.stderr:>7.2f}% {r.kld:>10.6f} {r.kld_stderr:>9.6f}")
    return 1 if any(r.cost > MAX_COST for r in rows) else 0


if __name__ == "__main__":
    _main(*sys.argv[1:])
