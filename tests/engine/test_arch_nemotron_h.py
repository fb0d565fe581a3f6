"""arch/nemotron_h.cpp on tiny random models (tests/support/gguf_writer.py:
build_tiny_nemotron_h): Mamba-2, attention and feed-forward layers as the pattern
"M*-M-*M-" lays them out (one kind of sublayer per block, as Nemotron-H's), attention
without RoPE, relu² feed-forward layers with their biases, or (nemotron_h_moe) experts
of that unit chosen by sigmoid scores and a selection bias, renormalised or scaled,
beside a shared expert. Checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy
continuation through libllama (n_ctx 128, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden --tests
tests.engine.test_arch_nemotron_h LLAMA_DIR` printed them with the llama.cpp of the
llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)
from tests.support.gguf_writer import GGML_Q8_0, U32, build_tiny_nemotron_h
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "nemotron_h": dict(),
    "nemotron_h_q8_0_no_biases": dict(weight_type=GGML_Q8_0, biases=False),
    # 8 experts, 2 per token, renormalised; and 3 of 6, scaled
    "nemotron_h_moe": dict(n_expert=8),
    "nemotron_h_moe_scaled": dict(n_expert=6, n_expert_used=3, norm_weights=False, scale=2.5),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "nemotron_h": (552.9955,
                   [58, 153, 164, 252, 116, 153, 260, 215, 252, 0, 100, 42],
                   [0.236, 0.197, 0.184, 0.152, 0.094, 0.86, 0.957, 0.42, 0.255, 0.063, 0.482, 0.195]),
    "nemotron_h_q8_0_no_biases": (559.2795,
                                  [173, 78, 17, 13, 84, 25, 255, 84, 145, 189, 172, 100],
                                  [1.509, 0.697, 0.553, 0.879, 0.183, 0.476, 0.115, 0.077, 0.1, 0.019, 0.159, 0.041]),
    "nemotron_h_moe": (444.4737,
                       [214, 290, 64, 251, 247, 160, 1, 257, 275, 217, 39, 139],
                       [0.098, 0.445, 0.438, 0.482, 0.062, 0.142, 0.133, 0.549, 0.196, 0.013, 1.01, 0.444]),
    "nemotron_h_moe_scaled": (538.6322,
                              [239, 262, 128, 239, 287, 39, 288, 0, 0, 39, 148, 185],
                              [0.116, 0.251, 0.078, 0.205, 0.613, 1.258, 1.065, 0.367, 0.075, 0.519, 0.116, 0.129]),
}


def build(name: str):
    return build_tiny_nemotron_h(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


@pytest.mark.parametrize("name", ["nemotron_h", "nemotron_h_moe"])
def test_logits_do_not_depend_on_chunks_or_decode_steps(models, name):
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        ids = engine.tokenize(TEXT)
        assert_prefill_does_not_depend_on_chunks(engine, ids[:100])
        assert_decode_batch_equals_decode_one(engine, [ids[:60], ids[3:30]])


def test_a_saved_state_continues_bit_identically(models):
    """The Mamba-2 layers' states and the attention layers' keys and values survive
    export and import; the feed-forward layers keep nothing."""
    with Engine(str(models["nemotron_h_moe"]), n_threads=2, n_ctx=N_CTX, max_sessions=3) as engine:
        ids = engine.tokenize(TEXT)
        with engine.new_session() as saved, engine.new_session() as restored:
            saved.prefill(ids[:90])
            restored.import_state(saved.export_state())
            saved.prefill(ids[90:100])
            restored.prefill(ids[90:100])
            assert restored.logits() == saved.logits()


def test_only_the_attention_layers_keep_keys_and_values(models):
    """Two attention layers of two KV heads of 16 in f16; Mamba-2 and feed-forward layers none."""
    with Engine(str(models["nemotron_h"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        assert e.info.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2


def test_latent_experts_are_refused_by_name(tmp_path):
    w = build_tiny_nemotron_h(n_expert=4)
    w.set("nemotron_h_moe.moe_latent_size", U32, 32)
    assert "Nemotron 3 Super's latent experts" in open_error(w.write(tmp_path / "latent.gguf"))
