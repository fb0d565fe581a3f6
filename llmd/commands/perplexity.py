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


def run(model: str | None, n_threads: int, ctx: int, path: str, kv_types: tuple[str, str] = ("f16", "f16")) -> int:
    """The perplexity of text_logprobs() on a file, as JSON, the KV cache storing keys
    and values as kv_types."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open_engine(model, n_threads, ctx, generate=True, kv_types=kv_types) as engine:
        start = time.perf_counter()
        logprobs, windows = text_logprobs(engine, text, ctx)
        elapsed = time.perf_counter() - start
    if not logprobs:
        print(f"llmd: {path} is too short; perplexity needs at least {2 * ctx} tokens", file=sys.stderr)
        return 2
    print(json.dumps({"ppl": round(math.exp(-sum(logprobs) / len(logprobs)), 4), "tokens_scored": len(logprobs),
                      "tok_s": round(windows * ctx / elapsed, 1)}))
    return 0
