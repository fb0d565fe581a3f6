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


def run(model: str | None, n_threads: int, ctx: int, path: str) -> int:
    """Over perplexity_windows(), the second half of each window scored given the first."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    with open_engine(model, n_threads, ctx, generate=True) as engine:
        first = ctx // 2
        windows = perplexity_windows(engine.tokenize(text), ctx, engine.info.bos_id if engine.info.add_bos else None)
        if len(windows) < 2:
            print(f"llmd: {path} is too short; perplexity needs at least {2 * ctx} tokens", file=sys.stderr)
            return 2
        total, n = 0.0, 0
        start = time.perf_counter()
        with engine.new_session() as session:
            for window in windows:
                session.reset()
                logprobs = session.score(window, first)
                total -= sum(logprobs)
                n += len(logprobs)
        elapsed = time.perf_counter() - start
    print(json.dumps({"ppl": round(math.exp(total / n), 4), "tokens_scored": n,
                      "tok_s": round(len(windows) * ctx / elapsed, 1)}))
    return 0
