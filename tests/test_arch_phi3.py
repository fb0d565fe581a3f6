"""arch/phi3.cpp on tiny random phi3 models (tests/gguf_writer.py: build_tiny_phi3):
fused QKV and gate/up matrices, partial rotary (12 of 16 dims), LongRoPE factors
with attn_factor, checked against llama.cpp; the sliding window, which llama.cpp
does not apply to phi3, against llmd's own window-free result.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy
continuation through libllama (n_ctx 128, top-2 log-prob margins) on exactly the
models build() writes, with the llama.cpp of the llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import math

import pytest

from llmd.engine import Engine
from tests.gguf_writer import GGML_Q8_0, build_tiny_phi3
from tests.test_arch_gemma3 import TEXT

N_CTX = 128
PROMPT_TOKENS = 60
GREEDY_STEPS = 12
NEAR_TIE = 0.05
PPL_TOLERANCE = 0.005

CONFIGS = {
    "phi3_long": dict(),                                    # n_ctx 128 > 32: the long factors
    "phi3_short": dict(n_ctx_orig=4096, fused_qkv=False),   # the short ones, separate Q/K/V
    "phi3_q8_0": dict(weight_type=GGML_Q8_0, rope_dim=16, n_ctx_orig=None),  # no LongRoPE, full rotary
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "phi3_long": (5035.6438,
                  [14, 273, 14, 176, 267, 257, 99, 131, 231, 285, 243, 132],
                  [3.33, 0.102, 1.992, 1.709, 0.194, 1.173, 0.054, 0.03, 0.626, 0.314, 0.89, 0.385]),
    "phi3_short": (5117.5355,
                   [14, 273, 196, 65, 138, 176, 258, 14, 176, 257, 217, 164],
                   [2.787, 0.761, 1.309, 0.317, 0.531, 0.501, 1.213, 0.163, 1.281, 2.969, 0.431, 0.583]),
    "phi3_q8_0": (5668.2741,
                  [85, 88, 85, 138, 39, 190, 289, 206, 23, 14, 260, 138],
                  [0.64, 0.845, 0.729, 1.218, 0.177, 0.004, 1.63, 0.252, 0.727, 1.866, 0.108, 0.026]),
}


def build(name: str):
    return build_tiny_phi3(n_ctx=N_CTX, **CONFIGS[name])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("phi3")
    return {name: build(name).write(directory / f"{name}.gguf") for name in CONFIGS}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_perplexity_matches_llama_cpp(models, name):
    expected = GOLDEN[name][0]
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=2) as engine:
        ids = engine.tokenize(TEXT)
        log_probs = []
        for start in range(0, len(ids) - N_CTX + 1, N_CTX):  # llama-perplexity's chunks
            with engine.new_session() as s:
                log_probs += s.score(ids[start:start + N_CTX], N_CTX // 2)
    ppl = math.exp(-sum(log_probs) / len(log_probs))
    assert ppl == pytest.approx(expected, rel=PPL_TOLERANCE)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_tokens_match_llama_cpp_up_to_a_near_tie(models, name):
    _, expected, margins = GOLDEN[name]
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=2) as engine, \
            engine.new_session() as s:
        s.prefill(engine.tokenize(TEXT)[:PROMPT_TOKENS])
        got = [s.decode_one().id for _ in range(GREEDY_STEPS)]
    for step, (a, b, margin) in enumerate(zip(got, expected, margins)):
        if margin < NEAR_TIE:
            break
        assert a == b, f"step {step}: llmd {got}, llama.cpp {expected}"


def last_logits(path, ids, n_ctx=N_CTX):
    with Engine(str(path), n_threads=2, n_ctx=n_ctx, max_sessions=2) as engine, engine.new_session() as s:
        s.prefill(ids)
        return s.logits()


def test_long_factors_apply_only_past_the_original_context(tmp_path):
    """The same file at a context within n_ctx_orig (32) uses the short factors."""
    path = build("phi3_long").write(tmp_path / "long.gguf")
    with Engine(str(path), max_sessions=2) as engine:
        ids = engine.tokenize(TEXT)[:20]
    short = build_tiny_phi3(n_ctx=N_CTX, n_ctx_orig=4096).write(tmp_path / "short.gguf")
    assert last_logits(path, ids, n_ctx=32) == last_logits(short, ids, n_ctx=32)
    assert last_logits(path, ids, n_ctx=33) != last_logits(path, ids, n_ctx=32)


def test_a_sliding_window_limits_attention_once_the_context_exceeds_it(tmp_path):
    plain = build_tiny_phi3(n_ctx=N_CTX).write(tmp_path / "plain.gguf")
    windowed = build_tiny_phi3(n_ctx=N_CTX, window=16).write(tmp_path / "window.gguf")
    with Engine(str(plain), max_sessions=2) as engine:
        ids = engine.tokenize(TEXT)[:40]
    assert last_logits(windowed, ids[:16]) == last_logits(plain, ids[:16])
    assert last_logits(windowed, ids) != last_logits(plain, ids)
