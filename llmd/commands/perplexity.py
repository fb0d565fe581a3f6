"""`python -m llmd perplexity --file F`: a text's perplexity, by llama-perplexity's method."""
from __future__ import annotations

import json
import math
import sys
import time

from llmd.commands.model import open_engine


def perplexity_windows(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """llama-perplexity's windows: the text's ids as a prompt (BOS first when the model
    adds one), cut into len // ctx windows of ctx tokens, each of which then starts
    with BOS in place of its first token (so the first window loses no text token)."""
    stream = ([bos] if bos is not None else []) + ids
    windows = [stream[w * ctx:(w + 1) * ctx] for w in range(len(stream) // ctx)]
    for window in windows:
        if bos is not None:
            window[0] = bos
    return windows


def text_logprobs(engine, text: str, ctx: int) -> tuple[list[float], int]:
    """llama-perplexity's method: over perplexity_windows(), the second half of each
    window scored given the first. Returns the scored tokens' log-probabilities and
    the number of windows; a text shorter than two windows scores nothing."""
    windows = perplexity_windows(engine.tokenize(text), ctx, engine.info.bos_id if engine.info.add_bos else None)
    if len(windows) < 2:
        return [], len(windows)
    logprobs: list[float] = []
    with engine.new_session() as session:
        for window in windows:
            session.reset()
            logprobs += session.score(window, ctx // 2)
    return logprobs, len(windows)


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    """The mean of values and its standard error."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / n) / math.sqrt(n)


def cost_over(exact: list[float], logprobs: list[float], windows: int) -> tuple[float, float]:
    """The perplexity cost of logprobs over exact (the same tokens of `windows` equal
    windows, scored twice): exp(mean difference) - 1, and the standard error of the
    mean difference over the windows' means, since a window's tokens share their
    context and are not independent draws."""
    per = len(exact) // windows
    diffs = [e - q for e, q in zip(exact, logprobs)]
    mean, stderr = mean_and_stderr([sum(diffs[w * per:(w + 1) * per]) / per for w in range(windows)])
    return math.exp(mean) - 1, stderr


def run(model: str | None, n_threads: int, ctx: int, path: str, kv_types: tuple[str, str] = ("f16", "f16"),
        against_f16: bool = False) -> int:
    """The perplexity of text_logprobs() on a file, as JSON, the KV cache storing keys
    and values as kv_types; against_f16: the text scored again with an f16 cache, and
    the cost of kv_types over it."""
    if ctx < 3:
        print("llmd: --ctx must be at least 3: each window's second half is scored given its first", file=sys.stderr)
        return 2
    if against_f16 and kv_types == ("f16", "f16"):
        print("llmd: --against-f16 compares a quantized cache with f16: give --kv-type, --kv-type-k or "
              "--kv-type-v q8_0 or q4_0", file=sys.stderr)
        return 2
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open_engine(model, n_threads, ctx, generate=True, kv_types=kv_types) as engine:
        start = time.perf_counter()
        logprobs, windows = text_logprobs(engine, text, ctx)
        elapsed = time.perf_counter() - start
    if not logprobs:
        print(f"llmd: {path} is too short; perplexity needs at least {2 * ctx} tokens", file=sys.stderr)
        return 2
    figures = {"ppl": round(math.exp(-sum(logprobs) / len(logprobs)), 4), "tokens_scored": len(logprobs),
               "tok_s": round(windows * ctx / elapsed, 1)}
    if against_f16:
        with open_engine(model, n_threads, ctx, generate=True) as engine:
            exact, _ = text_logprobs(engine, text, ctx)
        cost, stderr = cost_over(exact, logprobs, windows)
        figures.update(f16_ppl=round(math.exp(-sum(exact) / len(exact)), 4), cost_pct=round(100 * cost, 3),
                       cost_stderr_pct=round(100 * stderr, 3))
    print(json.dumps(figures))
    return 0
