"""arch/gemma.cpp's gemma2 on tiny random gemma2 models (tests/support/gguf_writer.py:
build_tiny_gemma2): heads of 256, the even layers over a sliding window (32) far
shorter than the context (384), so that their rings wrap, and attention scores
soft-capped, at the default 50 (which random scores of a few units never near) and at 1
(which bends most of them), checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 384 -b 384) and a greedy
continuation through libllama (n_ctx 384, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden LLAMA_DIR --tests
tests.engine.test_arch_gemma2` printed them with the llama.cpp of the llama-cpp-python
0.3.36 sdist. Perplexity must agree within PPL_TOLERANCE; greedy ids until the first
near-tie.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import (
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)
from tests.engine.test_arch_gemma3 import GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, TEXT, WINDOW
from tests.support.gguf_writer import F32, GGML_Q8_0, build_tiny_gemma2
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "gemma2": dict(),                                       # caps 50 and 30 (the defaults), even layers local
    "gemma2_capped": dict(attn_softcap=1.0, softcap=3.0),   # both bend; uncapped attention: perplexity −1.6 %
    "gemma2_q8_0": dict(weight_type=GGML_Q8_0, n_embd=128, n_head=4, n_head_kv=2, attn_softcap=2.0),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "gemma2": (324.9781,
               [194, 194, 194, 194, 194, 194, 194, 194, 194, 194, 194, 194],
               [0.234, 1.615, 1.768, 1.898, 2.026, 2.044, 1.998, 1.954, 2.035, 2.162, 2.179, 2.148]),
    "gemma2_capped": (309.7459,
                      [299, 194, 194, 194, 194, 194, 194, 194, 194, 194, 194, 194],
                      [0.08, 0.026, 0.623, 0.641, 0.612, 0.617, 0.62, 0.614, 0.646, 0.668, 0.716, 0.771]),
    "gemma2_q8_0": (557.6079,
                    [272, 272, 272, 272, 272, 272, 272, 272, 272, 272, 272, 272],
                    [0.306, 1.274, 1.481, 1.346, 1.334, 1.332, 1.008, 0.858, 0.757, 0.833, 0.529, 0.277]),
}


def build(name: str):
    return build_tiny_gemma2(n_ctx=N_CTX, window=WINDOW, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, PPL_TOLERANCE)


def test_the_even_layers_keep_rings_and_the_odd_ones_every_position(models):
    with Engine(str(models["gemma2"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        kv_row = 2 * 256 * 2  # keys and values of one KV head of 256, f16
        assert e.info.kv_bytes_per_token == 3 * kv_row
        assert e.info.kv_ring_bytes == 3 * 288 * kv_row  # the window plus one forward batch


def test_the_cap_changes_what_the_model_computes(models):
    """The same weights with the attention cap at 1 and at the default 50: different
    logits, so the cap reaches the kernels."""
    def logits(path, ids):
        with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=1) as e, e.new_session() as s:
            s.prefill(ids)
            return s.logits()
    with Engine(str(models["gemma2"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        ids = e.tokenize(TEXT)[:100]
    assert logits(models["gemma2"], ids) != logits(build_tiny_gemma2(
        n_ctx=N_CTX, window=WINDOW, attn_softcap=1.0).write(models["gemma2"].with_name("capped1.gguf")), ids)


def test_logits_do_not_depend_on_chunks_or_decode_steps(models):
    """Past the rings' wrap, capped scores: one prefill, odd chunks, and token-by-token
    steps give bit-identical logits at the last position; decode_batch = decode_one."""
    with Engine(str(models["gemma2_capped"]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        ids = engine.tokenize(TEXT)
        assert_prefill_does_not_depend_on_chunks(engine, ids[:340])
        assert_decode_batch_equals_decode_one(engine, [ids[:330], ids[5:40]])


@pytest.mark.parametrize("key", ["gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping"])
@pytest.mark.parametrize("value", [0.0, -1.0])
def test_a_cap_that_is_not_positive_is_refused(tmp_path, key, value):
    w = build_tiny_gemma2()
    w.set(key, F32, value)
    assert f"{key} must be positive" in open_error(w.write(tmp_path / "c.gguf"))
