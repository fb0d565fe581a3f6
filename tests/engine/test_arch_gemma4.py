"""arch/gemma4.cpp on tiny random gemma4 models (tests/support/gguf_writer.py:
build_tiny_gemma4): sliding-window layers with heads of 64 and two KV heads, global
layers with heads of 128, one KV head and their keys as values, the last three layers
reading the caches of layers 1 and 2 with FFNs twice as wide, per-layer inputs, layer
output scales, and the global layers turning 4 of their 64 pairs (rope_freqs); and, as
26B-A4B, experts beside every layer's FFN (separate or fused gate and up stacks, with
and without per-expert scales); checked against llama.cpp. The windows (32) are far shorter than the context (384), so the
rings wrap.

Golden numbers: llama.cpp's llama-perplexity (-c 384 -b 384) and a greedy
continuation through libllama (n_ctx 384, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden LLAMA_DIR --tests
tests.engine.test_arch_gemma4` printed them with the llama.cpp of the llama-cpp-python
0.3.36 sdist. Perplexity must agree within PPL_TOLERANCE; greedy ids until the first
near-tie.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine, Sampling
from tests.engine.test_arch import (
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)
from tests.engine.test_arch_gemma3 import GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, TEXT, WINDOW
from tests.support.gguf_writer import ARRAY, BOOL, GGML_Q8_0, U32, build_tiny_gemma4
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "gemma4": dict(),                                # as E2B and E4B: per-layer inputs, the final cap at 30
    "gemma4_values": dict(values=True, per_layer=0, out_scales=False, softcap=0.0),  # as 31B, uncapped
    # shared layers that keep their own k/v weights (never computed), one KV head everywhere
    "gemma4_shared_weights": dict(shared_weights=True, kv_heads=(1, 1), wide_shared=False),
    "gemma4_q8_0": dict(weight_type=GGML_Q8_0, n_embd=128, n_head=4, kv_heads=(2, 2), per_layer=32),
    # as 26B-A4B: experts in every layer, no shared caches, no per-layer inputs, uncapped
    "gemma4_moe": dict(n_expert=8, n_expert_used=2, per_layer=0, shared=0, expert_scales=True),
    # gate and up fused, with the shared caches and per-layer inputs of the first config
    "gemma4_moe_fused": dict(n_expert=4, n_expert_used=3, n_ff_exp=48, fused_experts=True),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "gemma4": (470.0977,
               [72, 30, 30, 40, 87, 99, 99, 99, 99, 35, 21, 195],
               [0.403, 0.878, 0.624, 0.326, 0.37, 0.407, 1.528, 1.086, 0.578, 0.16, 0.429, 0.214]),
    "gemma4_values": (467.0657,
                      [204, 120, 264, 137, 137, 137, 101, 101, 101, 216, 57, 260],
                      [0.1, 0.003, 0.318, 0.208, 0.107, 0.657, 0.037, 0.437, 0.801, 0.321, 0.011, 0.159]),
    "gemma4_shared_weights": (510.2008,
                              [255, 179, 179, 179, 179, 179, 179, 179, 179, 179, 179, 128],
                              [0.043, 0.67, 1.749, 0.728, 1.582, 1.573, 1.247, 0.839, 1.278, 1.921, 1.198, 0.001]),
    "gemma4_q8_0": (468.7114,
                    [74, 220, 220, 220, 220, 220, 220, 220, 220, 266, 238, 238],
                    [0.017, 0.095, 1.498, 1.57, 2.79, 1.025, 1.082, 1.679, 0.378, 0.089, 0.619, 1.93]),
    "gemma4_moe": (459.623,
                   [2, 208, 142, 142, 274, 274, 274, 274, 274, 274, 274, 274],
                   [1.174, 0.12, 0.033, 1.269, 0.206, 1.872, 1.612, 1.484, 0.792, 1.002, 0.11, 0.452]),
    "gemma4_moe_fused": (534.0106,
                         [204, 156, 179, 225, 225, 225, 225, 225, 225, 225, 225, 225],
                         [0.111, 0.124, 1.569, 0.416, 0.621, 0.472, 0.626, 1.929, 1.245, 0.925, 1.068, 0.57]),
}


def build(name: str):
    return build_tiny_gemma4(n_ctx=N_CTX, window=WINDOW, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, PPL_TOLERANCE)


@pytest.fixture(scope="module")
def ids(models):
    with Engine(str(models["gemma4"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        return e.tokenize(TEXT)


def test_each_layer_keeps_keys_and_values_of_its_own_shape_and_shared_layers_none(models):
    with Engine(str(models["gemma4"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        # Layer 2 (global: a KV head of 128) keeps every position; layers 0 and 1
        # (local: two KV heads of 64) keep rings of the window plus one forward batch
        # (288 positions); layers 3, 4 and 5 read theirs. f16 keys and values.
        assert e.info.kv_bytes_per_token == 1 * 2 * 128 * 2
        assert e.info.kv_ring_bytes == 2 * 2 * 288 * 2 * 64 * 2


@pytest.mark.parametrize("name", ["gemma4", "gemma4_values", "gemma4_moe"])
def test_logits_do_not_depend_on_chunks_or_decode_steps(models, ids, name):
    """Past the rings' wrap: one prefill, odd chunks, and token-by-token steps give
    bit-identical logits at the last position; decode_batch = decode_one."""
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        assert_prefill_does_not_depend_on_chunks(engine, ids[:340])
        assert_decode_batch_equals_decode_one(engine, [ids[:330], ids[5:40]])


def greedy(session, n: int = 8) -> list[int]:
    session.set_sampling(Sampling())
    return [session.decode_one().id for _ in range(n)]


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_a_saved_state_continues_bit_identically(models, ids, kv):
    """Rows of both widths and the shared layers' nothing survive export and import,
    in f16 and in a quantized cache."""
    with Engine(str(models["gemma4"]), n_threads=2, n_ctx=N_CTX, max_sessions=3, kv_type_k=kv,
                kv_type_v=kv) as engine:
        with engine.new_session() as saved, engine.new_session() as restored:
            saved.prefill(ids[:300])
            restored.import_state(saved.export_state())
            saved.prefill(ids[300:310])
            restored.prefill(ids[300:310])
            assert (restored.logits(), greedy(restored)) == (saved.logits(), greedy(saved))


def test_a_shared_prefix_gives_the_logits_of_a_fresh_prefill(models, ids):
    with Engine(str(models["gemma4"]), n_threads=2, n_ctx=N_CTX, max_sessions=3) as engine:
        a = engine.new_session()
        a.share_prefix("t", ids[:300], 0)
        a.prefill(ids[:300])
        b = engine.new_session()
        assert b.share_prefix("t", ids[:320], 0) == 300  # a's blocks, and its rings' window copied
        b.prefill(ids[300:320])
        with engine.new_session() as fresh:
            fresh.prefill(ids[:320])
            assert (b.logits(), greedy(b)) == (fresh.logits(), greedy(fresh))
        a.close()
        b.close()


def test_a_quantized_cache_keeps_both_widths_close_to_f16(models, ids):
    def logits(kv: str) -> list[float]:
        with Engine(str(models["gemma4"]), n_threads=2, n_ctx=N_CTX, max_sessions=1, kv_type_k=kv,
                    kv_type_v=kv) as e, e.new_session() as s:
            s.prefill(ids[:200])
            return s.logits()
    f16, q8 = logits("f16"), logits("q8_0")
    assert f16 != q8
    assert max(abs(a - b) for a, b in zip(f16, q8)) < 0.05 * (max(f16) - min(f16))


def test_a_shared_layer_whose_source_is_of_another_kind_is_refused(tmp_path):
    """llama.cpp maps a shared layer to the last layer of its kind before the shared
    ones, assuming the layer just before them is global and the one before that local
    (its own check aborts otherwise)."""
    w = build_tiny_gemma4()
    w.set("gemma4.attention.sliding_window_pattern", ARRAY, (BOOL, [True, False, True, True, True, False]))
    assert "layer 3 shares the keys and values of layer 1, which has another shape" in open_error(
        w.write(tmp_path / "pattern.gguf"))
    w = build_tiny_gemma4()
    w.set("gemma4.attention.shared_kv_layers", U32, 5)
    assert "shared_kv_layers = 5 leaves fewer than two layers" in open_error(w.write(tmp_path / "shared.gguf"))

