"""arch/glm4.cpp and arch/glm4moe.cpp on tiny random models (tests/support/gguf_writer.py:
build_tiny_glm4). glm4: q/k/v biases (or one attn_qkv with its bias), each sublayer's
input and output normed, RoPE over 16 of each head's 32 dims in adjacent pairs (or,
with rope.dimension_sections, the multi-section RoPE of text positions in NEOX halves,
one pair of eight unturned), gate and up in one ffn_up; a file with a
multi-token-prediction block runs without it. glm4moe: NEOX RoPE, a leading dense
layer or none, sigmoid-gated experts chosen with a selection bias, renormalised or
scaled, shared experts, q/k head norms. Checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy
continuation through libllama (n_ctx 128, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden --tests
tests.engine.test_arch_glm4 LLAMA_DIR` printed them with the llama.cpp of the
llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks,
)
from tests.support.gguf_writer import GGML_Q8_0, build_tiny_glm4
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "glm4": dict(),
    "glm4_fused_q8_0": dict(fused_qkv=True, weight_type=GGML_Q8_0),
    "glm4_sections": dict(sections=(2, 3, 2, 1)),
    "glm4_nextn": dict(nextn=1),
    # layer 0 dense, then 8 experts (2 per token) and one shared
    "glm4moe": dict(arch="glm4moe"),
    # every layer routed, 3 of 8 experts unrenormalised and scaled, two shared, q/k head norms
    "glm4moe_qk_norm_scaled": dict(arch="glm4moe", lead=0, n_expert_used=3, norm_weights=False, scale=2.5,
                                   n_shared=2, qk_norm=True),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "glm4": (547.5272,
             [212, 200, 280, 146, 93, 183, 14, 14, 14, 14, 14, 14],
             [0.117, 0.665, 0.341, 0.226, 0.028, 0.534, 0.096, 0.086, 0.151, 0.151, 0.185, 0.233]),
    "glm4_fused_q8_0": (481.3479,
                        [11, 207, 168, 243, 58, 246, 256, 256, 256, 11, 274, 139],
                        [0.334, 0.553, 0.09, 0.298, 0.178, 0.186, 0.048, 0.048, 0.095, 0.041, 0.133, 0.434]),
    "glm4_sections": (557.5871,
                      [212, 200, 280, 146, 200, 280, 146, 93, 183, 217, 198, 107],
                      [0.327, 0.7, 0.26, 0.054, 0.079, 0.252, 0.155, 0.112, 0.095, 0.073, 0.168, 1.897]),
    # the block's tensors come after the model's, which are drawn as glm4's
    "glm4_nextn": (547.5272,
                   [212, 200, 280, 146, 93, 183, 14, 14, 14, 14, 14, 14],
                   [0.117, 0.665, 0.341, 0.226, 0.028, 0.534, 0.096, 0.086, 0.151, 0.151, 0.185, 0.233]),
    "glm4moe": (581.9847,
                [296, 165, 107, 1, 189, 23, 37, 49, 171, 1, 189, 23],
                [0.318, 0.071, 0.811, 0.75, 0.255, 0.492, 0.158, 0.028, 0.058, 0.201, 0.191, 0.681]),
    "glm4moe_qk_norm_scaled": (520.6055,
                               [258, 243, 117, 96, 144, 0, 225, 243, 117, 240, 252, 236],
                               [0.439, 0.534, 0.257, 0.163, 1.067, 0.394, 0.154, 0.369, 0.228, 0.045, 0.402, 0.356]),
}


def build(name: str):
    return build_tiny_glm4(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


@pytest.mark.parametrize("name", ["glm4", "glm4_sections", "glm4moe"])
def test_logits_do_not_depend_on_chunks_or_decode_steps(models, name):
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        ids = engine.tokenize(TEXT)
        assert_prefill_does_not_depend_on_chunks(engine, ids[:100])
        assert_decode_batch_equals_decode_one(engine, [ids[:60], ids[3:30]])
