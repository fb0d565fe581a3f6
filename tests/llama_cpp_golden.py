"""How the architecture tests compare llmd with golden numbers llama.cpp computed on
the same tiny models: the perplexity llama-perplexity reports (chunks of n_ctx
tokens, the second half of each scored), and a greedy continuation compared up to
the first near-tie (a top-1/top-2 log-prob margin below NEAR_TIE, where a rounding
difference may legitimately pick the other token)."""
from __future__ import annotations

import math

from llmd.engine import Engine

NEAR_TIE = 0.05


def perplexity(path, text: str, n_ctx: int) -> float:
    """llmd's perplexity over text as llama-perplexity -c n_ctx -b n_ctx computes it."""
    with Engine(str(path), n_threads=2, n_ctx=n_ctx, max_sessions=2) as engine:
        ids = engine.tokenize(text)
        log_probs = []
        for start in range(0, len(ids) - n_ctx + 1, n_ctx):
            with engine.new_session() as s:
                log_probs += s.score(ids[start:start + n_ctx], n_ctx // 2)
    return math.exp(-sum(log_probs) / len(log_probs))


def assert_greedy_matches(path, text: str, n_ctx: int, prompt_tokens: int, expected: list[int],
                          margins: list[float]) -> None:
    """Greedy ids after text's first prompt_tokens tokens equal expected up to a near-tie."""
    with Engine(str(path), n_threads=2, n_ctx=n_ctx, max_sessions=2) as engine, engine.new_session() as s:
        s.prefill(engine.tokenize(text)[:prompt_tokens])
        got = [s.decode_one().id for _ in range(len(expected))]
    for step, (a, b, margin) in enumerate(zip(got, expected, margins)):
        if margin < NEAR_TIE:
            break
        assert a == b, f"step {step}: llmd {got}, llama.cpp {expected}"
