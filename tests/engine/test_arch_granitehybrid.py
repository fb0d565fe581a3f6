"""arch/granite.cpp's granitehybrid (Granite 4.0-H) on tiny random models
(tests/support/gguf_writer.py: build_tiny_granitehybrid): Mamba-2 layers (recurrent.h:
mamba2) interleaved with attention (q/k/v separate or fused in one attn_qkv), Granite's
multipliers, dense and MoE feed-forwards, checked against llama.cpp, and the Mamba-2
state in a session.

Golden numbers: `python -m tests.support.make_arch_golden LLAMA_DIR --tests tests.engine.test_arch_granitehybrid`
(llama-perplexity -c 128 -b 128, and a greedy continuation through libllama with the
top-2 logit margins) on exactly the models build() writes, with the llama.cpp of the
llama-cpp-python 0.3.36 sdist. Perplexity within PPL_TOLERANCE (F32); greedy ids up to
the first near-tie. The file llama.cpp's own writer makes is checked in
tests/engine/test_llama_archs.py; the hybrid session memory (export and import, the
prefix cache) in test_session_state.py and test_prefix_cache.py.
"""
from __future__ import annotations

import math
import random

import pytest

from llmd._native import ffi, lib
from llmd.engine.native import Engine, kernel_variants
from tests.support.gguf_writer import BOOL, F32, U32, build_tiny_granitehybrid, fuse_qkv
from tests.support.llama_cpp_golden import golden_tests
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)

# Seeds whose 12 greedy steps have no near-tie, so that every step is compared.
CONFIGS = {
    "granitehybrid": dict(seed=2),                                # mamba, attention (RoPE), mamba, mamba, attention
    "granitehybrid_nope_moe": dict(rope=False, n_expert=4, seed=4),  # Granite 4.0-H-Tiny's kind: no RoPE, experts
    "granitehybrid_fused_qkv": dict(seed=2, fused_qkv=True),  # granitehybrid, q/k/v in one attn_qkv and its bias
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "granitehybrid": (1363.5678,
        [91, 125, 290, 160, 63, 205, 282, 13, 94, 124, 260, 114],
        [1.397, 0.725, 0.206, 0.579, 1.228, 0.232, 0.939, 0.316, 0.387, 0.61, 0.407, 0.222]),
    "granitehybrid_nope_moe": (1009.8829,
        [118, 154, 177, 267, 108, 60, 61, 39, 64, 260, 279, 185],
        [0.49, 0.149, 0.152, 0.087, 1.016, 1.26, 1.392, 1.041, 0.686, 0.285, 0.165, 0.535]),
    "granitehybrid_fused_qkv": (1363.5678,  # granitehybrid's own: llama.cpp's fused path computes the same
        [91, 125, 290, 160, 63, 205, 282, 13, 94, 124, 260, 114],
        [1.397, 0.725, 0.206, 0.579, 1.228, 0.232, 0.939, 0.316, 0.387, 0.61, 0.407, 0.222]),
}


def build(name: str):
    options = dict(CONFIGS[name])
    w = build_tiny_granitehybrid(n_ctx=N_CTX, **{k: v for k, v in options.items() if k != "fused_qkv"})
    return fuse_qkv(w) if options.get("fused_qkv") else w


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


# ---- the session's memory ------------------------------------------------------------------

@pytest.fixture(scope="module", params=["granitehybrid", "granitehybrid_nope_moe"])
def engine(request, models):
    with Engine(str(models[request.param]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module")
def ids(engine):
    return engine.tokenize(TEXT)[:100]


def test_mamba_layers_keep_a_convolution_window_and_a_state_per_head(engine):
    info = engine.info
    dim, kv_dim, mamba_layers, attention_layers = 128, 2 * 32, 3, 2
    inner, conv_dim, heads, d_state = 2 * dim, 2 * dim + 2 * 2 * 16, 8, 16
    assert info.n_recurrent_layers == mamba_layers
    assert info.kv_bytes_per_token == attention_layers * 2 * kv_dim * 2  # f16 keys and values
    # Each Mamba-2 layer keeps its last conv_len - 1 = 3 inputs of every convolved channel
    # and a (head_dim × d_state) state per head, once live and once per checkpoint.
    state = 3 * conv_dim + heads * (inner // heads) * d_state
    assert info.recurrent_bytes == mamba_layers * state * 4 * (1 + 8 + 2)  # the state, 8 checkpoints, a trail of 2


def test_a_prefill_in_chunks_or_token_by_token_gives_exactly_the_same_logits(engine, ids):
    assert_prefill_does_not_depend_on_chunks(engine, ids)


def test_interleaved_sessions_decode_as_they_do_alone(engine, ids):
    assert_decode_batch_equals_decode_one(engine, [ids[:25], ids[30:70], ids[5:6]])


# ---- the scan kernel ----------------------------------------------------------------------

def ssm_scan(hd: int, ds: int, n: int, kernels: str | None, runs: list[int]) -> tuple[list[float], list[float]]:
    """The state and every output after n random tokens through one Mamba-2 head, by a
    kernel variant or the scalar reference (None), in calls of runs[i] tokens each."""
    rng = random.Random(hd * 1000 + ds)
    s = ffi.new("float[]", [rng.gauss(0.0, 0.3) for _ in range(hd * ds)])
    x, b = (ffi.new("float[]", [rng.gauss(0.0, 1.0) for _ in range(n * w)]) for w in (hd, ds))
    c = ffi.new("float[]", [rng.gauss(0.0, 1.0 / math.sqrt(ds)) for _ in range(n * ds)])
    steps = [rng.uniform(0.01, 1.0) for _ in range(n)]
    dt, decay = ffi.new("float[]", steps), ffi.new("float[]", [math.exp(-2.0 * d) for d in steps])
    y = ffi.new("float[]", n * hd)
    variant = ffi.NULL if kernels is None else kernels.encode()
    t = 0
    for run in runs:
        assert lib.llmd_kernel_ssm_scan(s, x + t * hd, b + t * ds, c + t * ds, dt + t, decay + t, run, hd, ds,
                                        y + t * hd, variant) == lib.LLMD_OK
        t += run
    assert t == n
    return list(ffi.unpack(s, hd * ds)), list(ffi.unpack(y, n * hd))


@pytest.mark.parametrize("kernels", [v.name for v in kernel_variants() if v.runs])
@pytest.mark.parametrize("hd, ds", [(64, 128), (24, 16), (16, 20)])
def test_the_ssm_scan_kernel_matches_its_scalar_reference(hd, ds, kernels):
    (s_fast, y_fast), (s_ref, y_ref) = ssm_scan(hd, ds, 20, kernels, [20]), ssm_scan(hd, ds, 20, None, [20])
    worst = max(abs(a - b) for a, b in zip(s_fast + y_fast, s_ref + y_ref))
    assert worst < 1e-4, f"max difference {worst}"


@pytest.mark.parametrize("kernels", [v.name for v in kernel_variants() if v.runs])
def test_a_token_scans_to_the_same_bits_in_a_run_of_any_length(kernels):
    whole = ssm_scan(64, 128, 20, kernels, [20])
    assert ssm_scan(64, 128, 20, kernels, [1] * 20) == whole
    assert ssm_scan(64, 128, 20, kernels, [7, 1, 12]) == whole


def test_the_ssm_scan_kernel_refuses_bad_arguments():
    m = ffi.new("float[]", 4)
    assert lib.llmd_kernel_ssm_scan(m, m, m, m, m, m, 1, 0, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_ssm_scan(m, m, m, m, m, m, 0, 2, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_ssm_scan(ffi.NULL, m, m, m, m, m, 1, 2, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_ssm_scan(m, m, m, m, m, m, 1, 2, 2, m, b"no-such-variant") == lib.LLMD_ERR_UNSUPPORTED


# ---- what the multipliers and the state do -------------------------------------------------

def logits_of(path, ids):
    with Engine(str(path), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e, e.new_session() as s:
        s.prefill(ids)
        return s.logits()


def test_the_logit_scale_divides_the_logits(tmp_path):
    w = build_tiny_granitehybrid()
    base = logits_of(w.write(tmp_path / "a.gguf"), [1, 2, 3])
    w.set("granitehybrid.logit_scale", F32, 8.0)
    scaled = logits_of(w.write(tmp_path / "b.gguf"), [1, 2, 3])
    assert scaled == pytest.approx([x / 4 for x in base], rel=1e-6)


@pytest.mark.parametrize("key", ["embedding_scale", "residual_scale", "attention.scale"])
def test_each_multiplier_changes_the_model(tmp_path, key):
    w = build_tiny_granitehybrid()
    base = logits_of(w.write(tmp_path / "a.gguf"), [1, 2, 3, 4])
    w.remove("granitehybrid." + key)  # 1 (or 1/√head_dim) instead of the file's
    assert logits_of(w.write(tmp_path / "b.gguf"), [1, 2, 3, 4]) != pytest.approx(base, rel=1e-3)


def test_a_file_without_rope_scaling_finetuned_turns_its_keys_and_one_that_says_false_does_not(tmp_path):
    ids = list(range(1, 30))
    w = build_tiny_granitehybrid()
    roped = logits_of(w.write(tmp_path / "a.gguf"), ids)
    w.set("granitehybrid.rope.scaling.finetuned", BOOL, True)
    assert logits_of(w.write(tmp_path / "b.gguf"), ids) == roped
    w.set("granitehybrid.rope.scaling.finetuned", BOOL, False)
    assert logits_of(w.write(tmp_path / "c.gguf"), ids) != pytest.approx(roped, rel=1e-3)


# ---- files the engine refuses -------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("granitehybrid.ssm.time_step_rank", 7, "Mamba-2 dimensions (ssm.*) are inconsistent"),  # 256 channels
    ("granitehybrid.ssm.group_count", 3, "Mamba-2 dimensions (ssm.*) are inconsistent"),     # of 8 heads
    ("granitehybrid.ssm.conv_kernel", 1, "Mamba-2 dimensions (ssm.*) are inconsistent"),
])
def test_inconsistent_mamba_dimensions_are_refused(tmp_path, key, value, message):
    w = build_tiny_granitehybrid()
    w.set(key, U32, value)
    assert message in open_error(w.write(tmp_path / "m.gguf"))


def test_a_negative_multiplier_is_refused(tmp_path):
    w = build_tiny_granitehybrid()
    w.set("granitehybrid.residual_scale", F32, -0.5)
    assert "granitehybrid.residual_scale must be positive" in open_error(w.write(tmp_path / "m.gguf"))


@pytest.mark.parametrize("name", ["blk.0.ssm_a", "blk.0.ssm_d", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight"])
def test_a_mamba_layer_without_its_vectors_is_refused(tmp_path, name):
    w = build_tiny_granitehybrid()
    w.remove_tensor(name)
    assert f"model lacks tensor {name}" in open_error(w.write(tmp_path / "m.gguf"))

