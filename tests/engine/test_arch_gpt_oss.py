"""arch/gpt_oss.cpp on tiny random models (tests/support/gguf_writer.py: build_tiny_gpt_oss):
attention sinks, q/k/v and output biases, even layers over a sliding window that the
text passes, YaRN, a router with a bias choosing 2 of 4 experts (1 of 4, 4 of 8) weighted
by the softmax of the chosen scores, gpt-oss's SwiGLU with expert biases, MXFP4
experts, the sliding-window layers' own RoPE base (scaled by the file's factor even
where its scaling type is none) and q/k/v fused in one matrix,
checked against llama.cpp; then what those figures cannot show on their own (the sinks
and the router bias count; the metadata llama.cpp does not read for this family
changes nothing; files llama.cpp refuses are refused) and the batch and
chunking properties the sinks and the windows must keep.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy continuation
through libllama (n_ctx 128, top-2 log-prob margins) on exactly the models build()
writes, by `python -m tests.support.make_arch_golden LLAMA_DIR --tests
tests.engine.test_arch_gpt_oss` with the llama.cpp of the llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import (
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, logits_after, open_error,
)
from tests.engine.test_arch_gemma3 import TEXT
from tests.support.gguf_writer import F32, GGML_F32, GGML_MXFP4, STRING, U32, build_tiny_gpt_oss, encode_f32, fuse_qkv
from tests.support.llama_cpp_golden import golden_tests

N_CTX = 128
PROMPT_TOKENS = 60
GREEDY_STEPS = 12
PPL_TOLERANCE = 0.001
QUANTIZED_TOLERANCE = 0.01  # int8 activations: see tests/engine/test_arch.py

CONFIGS = {
    "gpt_oss": dict(),
    "gpt_oss_yarn": dict(yarn=(4.0, 32)),
    "gpt_oss_1_of_4_mqa": dict(n_expert_used=1, n_head_kv=1),
    "gpt_oss_4_of_8_no_qkv_bias": dict(n_expert=8, n_expert_used=4, q_bias=False),
    "gpt_oss_strong_sinks": dict(sinks=4.0),
    # experts MXFP4 as in the published files (the rest F32: with Q8_0 beside them, int8
    # activations move both engines by about 1 % on these random models, llama.cpp's own
    # figure by 0.7 % between -ub 128 and -ub 8)
    "gpt_oss_mxfp4": dict(expert_type=GGML_MXFP4, yarn=(4.0, 32)),
    # the sliding-window layers turned by a base of their own (rope.freq_base_swa; the
    # global one is 150000), and YaRN-scaled as the global ones are (seeds whose 12
    # greedy steps have no near-tie)
    "gpt_oss_swa_base": dict(rope_base_swa=10000.0, seed=2),
    "gpt_oss_swa_base_yarn": dict(rope_base_swa=10000.0, yarn=(4.0, 32), seed=5),
    # gpt_oss with q, k and v fused in one attn_qkv and its bias
    "gpt_oss_fused_qkv": dict(fused_qkv=True),
    # rope.scaling.type none with a factor: the global layers turn unscaled, the window
    # layers (their own base) by the factor, linearly, as llama.cpp's freq_scale_swa has it
    "gpt_oss_scaling_none_factor": dict(rope_base_swa=10000.0, scaling_none_factor=4.0, seed=3),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "gpt_oss": (2673.0098,
                [292, 296, 275, 59, 241, 182, 56, 45, 230, 49, 271, 289],
                [1.231, 0.192, 3.239, 0.408, 0.824, 0.584, 0.309, 0.55, 0.049, 1.123, 0.267, 0.317]),
    "gpt_oss_yarn": (3620.9811,
                     [270, 56, 92, 55, 246, 49, 186, 179, 107, 170, 265, 194],
                     [0.281, 0.087, 0.052, 1.079, 0.358, 0.472, 1.153, 0.737, 1.291, 0.128, 1.745, 0.363]),
    "gpt_oss_1_of_4_mqa": (3664.3423,
                           [62, 30, 155, 280, 272, 118, 218, 221, 212, 102, 282, 84],
                           [0.487, 0.69, 0.721, 0.363, 1.831, 1.058, 0.817, 2.29, 0.194, 0.669, 0.349, 0.204]),
    "gpt_oss_4_of_8_no_qkv_bias": (5172.2817,
                                   [87, 93, 22, 101, 132, 152, 198, 52, 224, 71, 152, 186],
                                   [2.165, 1.73, 0.041, 0.678, 0.031, 0.689, 0.378, 0.623, 0.283, 1.051, 0.973,
                                    0.284]),
    "gpt_oss_strong_sinks": (2752.7456,
                             [292, 296, 275, 59, 251, 139, 83, 260, 289, 104, 150, 260],
                             [0.485, 0.123, 2.517, 0.0, 0.128, 1.2, 0.66, 0.251, 2.025, 0.955, 4.087, 0.378]),
    "gpt_oss_mxfp4": (4964.6159,
                      [68, 54, 189, 169, 149, 11, 279, 136, 249, 75, 129, 15],
                      [1.051, 0.255, 2.099, 0.523, 0.724, 0.219, 0.289, 1.08, 0.142, 1.688, 0.663, 0.294]),
    "gpt_oss_swa_base": (3917.7544,
                         [153, 169, 277, 210, 169, 0, 216, 12, 246, 268, 285, 13],
                         [0.309, 0.257, 1.143, 0.293, 0.567, 0.333, 1.833, 0.811, 0.357, 0.454, 0.583, 1.492]),
    "gpt_oss_swa_base_yarn": (5011.2878,
                              [279, 49, 96, 91, 63, 100, 282, 187, 79, 21, 130, 231],
                              [0.524, 0.228, 1.653, 0.349, 0.346, 0.757, 0.065, 1.047, 0.268, 2.513, 0.269, 0.234]),
    "gpt_oss_scaling_none_factor": (5230.0531,
                                    [73, 241, 283, 208, 127, 55, 55, 55, 55, 55, 55, 55],
                                    [0.083, 1.123, 0.584, 0.471, 2.526, 0.768, 0.635, 0.698, 0.622, 0.989, 0.854,
                                     0.67]),
    "gpt_oss_fused_qkv": (2673.0098,  # gpt_oss's own: llama.cpp's fused path computes the same
                          [292, 296, 275, 59, 241, 182, 56, 45, 230, 49, 271, 289],
                          [1.231, 0.192, 3.239, 0.408, 0.824, 0.584, 0.309, 0.55, 0.049, 1.123, 0.267, 0.317]),
}


def build(name: str):
    options = dict(CONFIGS[name])
    fused, rope_base_swa = options.pop("fused_qkv", False), options.pop("rope_base_swa", None)
    none_factor = options.pop("scaling_none_factor", None)
    w = build_tiny_gpt_oss(n_ctx=N_CTX, **options)
    if rope_base_swa is not None:
        w.set("gpt-oss.rope.freq_base_swa", F32, rope_base_swa)
    if none_factor is not None:
        w.set("gpt-oss.rope.scaling.type", STRING, "none")
        w.set("gpt-oss.rope.scaling.factor", F32, none_factor)
    return fuse_qkv(w) if fused else w


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


def with_tensor(name: str, values: list[float], **options):
    """The default model with tensor `name` of every layer set to values."""
    w = build_tiny_gpt_oss(n_ctx=N_CTX, **options)
    for t in w.tensors:
        if t.name.endswith(name):
            t.data = encode_f32(values)
    return w


def test_sinks_take_their_share_of_the_softmax_and_very_low_ones_none(tmp_path):
    """A sink far below every score adds nothing to the denominator: all such sinks give
    one result; sinks at 0 take a share of each softmax and give another."""
    low = logits_after(with_tensor("attn_sinks.weight", [-80.0] * 4).write(tmp_path / "low.gguf"))
    lower = logits_after(with_tensor("attn_sinks.weight", [-90.0] * 4).write(tmp_path / "lower.gguf"))
    zero = logits_after(with_tensor("attn_sinks.weight", [0.0] * 4).write(tmp_path / "zero.gguf"))
    assert low == lower
    assert max(abs(a - b) for a, b in zip(low, zero)) > 1e-3


def test_the_router_bias_chooses_and_weighs_the_experts(tmp_path):
    """The bias is added to the router's scores, which both choose the experts and weigh
    them: a bias of 0 differs from the file's, and one bias added to every expert
    alike changes neither choice nor softmax."""
    base = build_tiny_gpt_oss(n_ctx=N_CTX)
    zero = logits_after(with_tensor("ffn_gate_inp.bias", [0.0] * 4).write(tmp_path / "zero.gguf"))
    shifted = logits_after(with_tensor("ffn_gate_inp.bias", [3.0] * 4).write(tmp_path / "shifted.gguf"))
    assert zero != logits_after(base.write(tmp_path / "base.gguf"))
    assert max(abs(a - b) for a, b in zip(zero, shifted)) < 1e-4


def test_metadata_llama_cpp_does_not_read_for_gpt_oss_changes_nothing(tmp_path):
    """llama.cpp's gpt-oss fixes its routing (the softmax of the chosen scores, never
    renormalised or scaled), whatever the file says; test-llama-archs' own files say
    expert_gating_func 2 (sigmoid)."""
    w = build_tiny_gpt_oss(n_ctx=N_CTX)
    w.set("gpt-oss.expert_gating_func", U32, 2)
    w.set("gpt-oss.expert_weights_scale", F32, 2.5)
    assert logits_after(w.write(tmp_path / "keys.gguf")) == logits_after(
        build_tiny_gpt_oss(n_ctx=N_CTX).write(tmp_path / "plain.gguf"))


def test_forms_llama_cpp_does_not_run_are_refused_with_their_reason(tmp_path):
    w = build_tiny_gpt_oss(n_ctx=N_CTX)
    w.remove("gpt-oss.attention.sliding_window")  # llama.cpp requires it
    assert open_error(w.write(tmp_path / "window.gguf")) == "model metadata lacks gpt-oss.attention.sliding_window"
    w = build_tiny_gpt_oss(n_ctx=N_CTX)
    w.remove_tensor("blk.1.attn_sinks.weight")
    assert open_error(w.write(tmp_path / "sinks.gguf")) == "model lacks tensor blk.1.attn_sinks.weight"


@pytest.fixture(scope="module", params=[GGML_F32, GGML_MXFP4], ids=["F32", "MXFP4"])
def engine(request, tmp_path_factory):
    """A 4-layer model whose windows of 32 the 120-odd tokens below pass, its KV cache
    of several blocks."""
    path = build_tiny_gpt_oss(n_ctx=256, expert_type=request.param).write(tmp_path_factory.mktemp("oss") / "m.gguf")
    with Engine(str(path), n_threads=2, n_ctx=256, max_sessions=4) as e:
        e.ids = e.tokenize(TEXT)[:120]
        yield e


def test_prefill_does_not_depend_on_chunks(engine):
    assert_prefill_does_not_depend_on_chunks(engine, engine.ids)


def test_decode_batch_equals_decode_one(engine):
    assert_decode_batch_equals_decode_one(engine, [engine.ids[:100], engine.ids[5:20], engine.ids[:3]])
