"""arch/qwen35.cpp on tiny random qwen35 models (tests/support/gguf_writer.py:
build_tiny_qwen35): Gated DeltaNet layers (recurrent.h) interleaved with gated
attention layers, checked against llama.cpp; the DeltaNet scan kernel against its
scalar reference; and the recurrent state's checkpoints on this family.

Golden numbers: `python -m tests.support.make_arch_golden LLAMA_DIR --tests tests.engine.test_arch_qwen35`
(llama-perplexity -c 128 -b 128, and a greedy continuation through libllama with the
top-2 logit margins) on exactly the models build() writes, with the llama.cpp of the
llama-cpp-python 0.3.36 sdist. Perplexity within PPL_TOLERANCE (F32; the Q8_0 model
within QUANTIZED_TOLERANCE, as in tests/engine/test_arch.py); greedy ids up to the first near-tie.
"""
from __future__ import annotations

import math
import random
import re

import pytest

from llmd._native import ffi, lib
from llmd.engine.native import Engine, EngineError, kernel_variants
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import (
    ARRAY, BOOL, F32, GGML_Q8_0, I16, I32, U8, U32, U64, build_tiny_llama, build_tiny_qwen35,
)
from tests.support.llama_cpp_golden import golden_tests
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, chat, model_client, open_error,
)

CONFIGS = {
    "qwen35": dict(),                           # 3 DeltaNet layers, then attention; RoPE sections (3, 3, 2, 0)
    "qwen35_sections": dict(sections=(2, 2, 2, 2)),  # the last 2 of 8 RoPE pairs stay unrotated
    "qwen35_q8_0": dict(weight_type=GGML_Q8_0, interval=2, k_heads=1, conv_len=3),
    "qwen35moe": dict(n_expert=8, n_expert_used=2),  # qwen35's layers, MoE FFNs with a shared expert
    "qwen35moe_q8_0": dict(n_expert=8, n_expert_used=2, weight_type=GGML_Q8_0, interval=2, k_heads=1),
}
# The families whose sessions the tests below drive alike: dense and MoE.
FAMILIES = ["qwen35", "qwen35moe"]

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "qwen35": (1333.3787,
        [211, 201, 282, 145, 181, 95, 184, 229, 145, 70, 142, 287],
        [0.814, 0.193, 0.983, 0.161, 0.002, 1.267, 0.316, 0.107, 0.596, 0.419, 0.59, 0.024]),
    "qwen35_sections": (1333.3199,
        [211, 201, 282, 145, 181, 95, 184, 229, 145, 70, 142, 287],
        [0.815, 0.193, 0.984, 0.161, 0.003, 1.266, 0.316, 0.107, 0.597, 0.419, 0.59, 0.023]),
    "qwen35_q8_0": (1075.6038,
        [183, 212, 192, 123, 51, 260, 112, 46, 255, 138, 62, 139],
        [0.102, 0.044, 0.483, 0.047, 0.078, 0.192, 0.879, 0.492, 0.527, 0.252, 0.409, 0.066]),
    "qwen35moe": (1052.0413,
        [277, 47, 175, 201, 134, 244, 64, 44, 73, 263, 119, 122],
        [0.128, 2.868, 0.217, 0.878, 0.049, 0.254, 0.37, 0.918, 0.051, 0.053, 0.287, 0.616]),
    "qwen35moe_q8_0": (1343.3369,
        [32, 102, 21, 101, 271, 74, 9, 81, 73, 0, 128, 223],
        [2.354, 0.875, 0.64, 0.455, 0.372, 0.294, 1.863, 0.114, 1.25, 2.173, 0.755, 0.261]),
}


def build(name: str):
    return build_tiny_qwen35(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


# ---- the DeltaNet scan kernel ----------------------------------------------------------------

def delta_tokens(hd: int, n: int, seed: int = 3) -> tuple[list[float], list[float], list[float], list[float],
                                                        list[float], list[float]]:
    """A random state and n tokens' q, k (unit length), v, decays and betas for one head."""
    rng = random.Random(seed)
    m = [rng.gauss(0.0, 0.3) for _ in range(hd * hd)]
    q, k, v = [], [], []
    for _ in range(n):
        q += [rng.gauss(0.0, 1.0) for _ in range(hd)]
        kt = [rng.gauss(0.0, 1.0) for _ in range(hd)]
        k += [x / math.sqrt(sum(y * y for y in kt)) for x in kt]
        v += [rng.gauss(0.0, 1.0) for _ in range(hd)]
    decay = [rng.uniform(0.5, 1.0) for _ in range(n)]
    beta = [rng.uniform(0.0, 1.0) for _ in range(n)]
    return m, q, k, v, decay, beta


def delta_scan(hd: int, n: int, kernels: str | None, runs: list[int]) -> tuple[list[float], list[float]]:
    """The state and every output after n random tokens through one head, by a kernel
    variant or the scalar reference (None), in calls of runs[i] tokens each."""
    m0, q, k, v, decay, beta = delta_tokens(hd, n)
    m, out = ffi.new("float[]", m0), ffi.new("float[]", n * hd)
    q, k, v = (ffi.new("float[]", x) for x in (q, k, v))
    decay, beta = ffi.new("float[]", decay), ffi.new("float[]", beta)
    variant = ffi.NULL if kernels is None else kernels.encode()
    t = 0
    for run in runs:
        at = t * hd
        assert lib.llmd_kernel_delta_scan(m, q + at, k + at, v + at, decay + t, beta + t, run, hd, out + at,
                                          variant) == lib.LLMD_OK
        t += run
    assert t == n
    return list(ffi.unpack(m, hd * hd)), list(ffi.unpack(out, n * hd))


@pytest.mark.parametrize("kernels", [v.name for v in kernel_variants() if v.runs])
@pytest.mark.parametrize("hd", [16, 24, 128])
def test_the_delta_scan_kernel_matches_its_scalar_reference(hd, kernels):
    (m_fast, out_fast), (m_ref, out_ref) = delta_scan(hd, 20, kernels, [20]), delta_scan(hd, 20, None, [20])
    worst = max(abs(a - b) for a, b in zip(m_fast + out_fast, m_ref + out_ref))
    assert worst < 1e-4, f"max difference {worst}"


@pytest.mark.parametrize("kernels", [v.name for v in kernel_variants() if v.runs])
def test_a_token_scans_to_the_same_bits_in_a_run_of_any_length(kernels):
    whole = delta_scan(128, 20, kernels, [20])
    assert delta_scan(128, 20, kernels, [1] * 20) == whole
    assert delta_scan(128, 20, kernels, [7, 1, 12]) == whole


def test_the_delta_scan_kernel_refuses_bad_arguments():
    m = ffi.new("float[]", 4)
    assert lib.llmd_kernel_delta_scan(m, m, m, m, m, m, 1, 0, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_delta_scan(m, m, m, m, m, m, 0, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_delta_scan(ffi.NULL, m, m, m, m, m, 1, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_delta_scan(m, m, m, m, ffi.NULL, m, 1, 2, m, ffi.NULL) == lib.LLMD_ERR_INVALID_ARGUMENT
    assert lib.llmd_kernel_delta_scan(m, m, m, m, m, m, 1, 2, m, b"no-such-variant") == lib.LLMD_ERR_UNSUPPORTED


# ---- the session's memory ------------------------------------------------------------------

@pytest.fixture(scope="module", params=FAMILIES)
def engine(models, request):
    with Engine(str(models[request.param]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        yield e


@pytest.fixture(scope="module")
def ids(engine):
    return engine.tokenize(TEXT)[:100]


def test_deltanet_layers_keep_a_state_instead_of_keys_and_values(engine):
    info = engine.info
    conv_dim, v_heads, state = 2 * 2 * 32 + 4 * 32, 4, 32
    assert info.n_recurrent_layers == 3
    assert info.kv_bytes_per_token == 1 * 2 * 64 * 2  # one attention layer, one KV head of 64, f16
    per_layer = (4 - 1) * conv_dim + v_heads * state * state  # floats: the convolution window, the heads' states
    assert info.recurrent_bytes == 3 * per_layer * 4 * (1 + 8 + 2)  # the state, 8 checkpoints, a trail of 2


def test_a_prefill_in_chunks_or_token_by_token_gives_exactly_the_same_logits(engine, ids):
    assert_prefill_does_not_depend_on_chunks(engine, ids)


def test_truncate_between_checkpoints_is_a_state_error(engine, ids):
    with engine.new_session() as s:
        s.prefill(ids[:40])
        with pytest.raises(EngineError, match="truncate position 20 is not a checkpoint") as err:
            s.truncate(20)
        assert err.value.status == lib.LLMD_ERR_STATE and s.position == 40


def test_interleaved_sessions_decode_as_they_do_alone(engine, ids):
    assert_decode_batch_equals_decode_one(engine, [ids[:25], ids[30:70], ids[5:15]])


# ---- files the engine refuses -------------------------------------------------------------

def test_inconsistent_deltanet_dimensions_are_refused(tmp_path):
    w = build_tiny_qwen35()
    w.set("qwen35.ssm.inner_size", ARRAY, (BOOL, [True]))
    assert "qwen35.ssm.inner_size" in open_error(w.write(tmp_path / "a.gguf"))
    w = build_tiny_qwen35(k_heads=3, v_heads=4)  # value heads must be a multiple of the key heads
    assert "Gated DeltaNet dimensions (ssm.*) are inconsistent" in open_error(w.write(tmp_path / "b.gguf"))


def test_a_recurrent_layer_list_must_cover_every_layer(tmp_path):
    w = build_tiny_qwen35()
    w.set("qwen35.attention.recurrent_layers", ARRAY, (BOOL, [True, True]))
    assert "attention.recurrent_layers must be one bool, int32 or uint32 per layer" in open_error(
        w.write(tmp_path / "r.gguf"))


@pytest.mark.parametrize("element", [U8, I16, U64, F32], ids=["uint8", "int16", "uint64", "float"])
def test_a_recurrent_layer_list_of_a_type_llama_cpp_refuses_is_refused(tmp_path, element):
    """llama.cpp reads per-layer flags as bools, int32 or uint32 only: llmd is no more lenient."""
    w = build_tiny_qwen35()
    w.set("qwen35.attention.recurrent_layers", ARRAY, (element, [1, 1, 1, 0]))
    assert "attention.recurrent_layers must be one bool, int32 or uint32 per layer" in open_error(
        w.write(tmp_path / "r.gguf"))


@pytest.mark.parametrize("element", [BOOL, I32, U32], ids=["bools", "int32", "uint32"])
def test_the_recurrent_layer_list_overrides_the_interval_as_bools_or_integers(tmp_path, element):
    """llama.cpp's writers give per-layer flags as bools or as integers (test-llama-archs
    writes uint32): both read alike."""
    w = build_tiny_qwen35()  # layer 3 attends; saying it is a DeltaNet layer leaves its tensors unbound
    w.set("qwen35.attention.recurrent_layers", ARRAY, (element, [1, 1, 1, 1] if element != BOOL else [True] * 4))
    assert "lacks tensor blk.3.attn_qkv.weight" in open_error(w.write(tmp_path / "r.gguf"))
    w.set("qwen35.attention.recurrent_layers", ARRAY, (element, [1, 1, 1, 0] if element != BOOL else [True] * 3 + [False]))
    with Engine(w.write(tmp_path / "ok.gguf"), n_threads=1, max_sessions=1) as e:
        assert e.info.n_recurrent_layers == 3


def test_one_recurrent_flag_for_every_layer_is_read_as_llama_cpp_reads_it(tmp_path):
    """A scalar stands for every layer (llama.cpp's get_key_or_arr): 0 makes all of them
    attention layers, whose tensors this file does not have for layer 0 (its DeltaNet
    projection is no fused q/k/v, which llama.cpp would read there)."""
    w = build_tiny_qwen35()
    w.set("qwen35.attention.recurrent_layers", U32, 0)
    assert "tensor blk.0.attn_qkv.weight has shape [128, 256], expected [128, 384]" in open_error(
        w.write(tmp_path / "r.gguf"))
    w = build_tiny_qwen35(interval=1)  # every layer attends
    w.set("qwen35.attention.recurrent_layers", U32, 0)
    with Engine(w.write(tmp_path / "ok.gguf"), n_threads=1, max_sessions=1) as e:
        assert e.info.n_recurrent_layers == 0


def test_rope_sections_are_required(tmp_path):
    w = build_tiny_qwen35()
    w.remove("qwen35.rope.dimension_sections")
    assert "lacks qwen35.rope.dimension_sections" in open_error(w.write(tmp_path / "s.gguf"))


# ---- multi-token-prediction blocks ---------------------------------------------------------

@pytest.mark.parametrize("n_expert", [0, 8], ids=["qwen35", "qwen35moe"])
def test_prediction_blocks_are_loaded_and_leave_the_model_s_logits_as_they_are(tmp_path, n_expert):
    """nextn_predict_layers blocks come after the layers (block_count counts them): they are
    held for drafting, and the model computes exactly what the same file without them does."""
    plain = build_tiny_qwen35(n_ctx=N_CTX, n_expert=n_expert).write(tmp_path / "plain.gguf")
    with_mtp = build_tiny_qwen35(n_ctx=N_CTX, n_expert=n_expert, nextn=1)
    assert with_mtp.get(f"{'qwen35moe' if n_expert else 'qwen35'}.block_count").value == 5
    with_mtp = with_mtp.write(tmp_path / "mtp.gguf")
    logits = []
    for path in (plain, with_mtp):
        with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=2) as e, e.new_session() as s:
            assert e.info.n_layer == 4 and e.info.n_recurrent_layers == 3
            s.prefill(e.tokenize(TEXT)[:30])
            logits.append(s.logits())
    assert logits[0] == logits[1]


def test_a_prediction_block_missing_a_tensor_is_refused_by_name(tmp_path):
    w = build_tiny_qwen35(n_expert=8, nextn=1)
    w.remove_tensor("blk.4.nextn.eh_proj.weight")
    assert "lacks tensor blk.4.nextn.eh_proj.weight" in open_error(w.write(tmp_path / "m.gguf"))


def test_prediction_blocks_of_a_family_that_does_not_keep_them_are_refused_by_name(tmp_path):
    w = build_tiny_llama(arch="qwen3", n_layer=3)
    w.set("qwen3.nextn_predict_layers", U32, 1)  # qwen3 keeps no prediction blocks: the last is left over
    assert "model has tensor blk.2.attn_norm.weight, which the qwen3 architecture does not use" in open_error(
        w.write(tmp_path / "m.gguf"))
    w.set("qwen3.nextn_predict_layers", U32, 3)
    assert "nextn_predict_layers = 3 leaves no layer of the 3 blocks to run" in open_error(w.write(tmp_path / "n.gguf"))


# ---- a conversation through HTTP -----------------------------------------------------------

@pytest.fixture(scope="module", params=FAMILIES)
def server(tmp_path_factory, request):
    path = build_tiny_qwen35(n_ctx=1024, **CONFIGS[request.param]).write(
        tmp_path_factory.mktemp("qwen35_http") / f"{request.param}.gguf")
    with running_llmd("--model", str(path), "--max-sessions", "4", "--ctx", "1024",
                      "--session-eviction", "none") as url:
        yield model_client(url)


def test_a_ten_turn_conversation_resumes_warm_every_turn(server):
    messages, previous_total = [], 0
    for turn in range(10):
        messages.append({"role": "user", "content": f"turn {turn}: tell me about the lighthouse"})
        reply = chat(server, messages, "ten-turns")
        usage = reply["usage"]
        if turn > 0:
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.9 * previous_total, (turn, usage)
        previous_total = usage["prompt_tokens"] + usage["completion_tokens"]
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})


def ask(client, messages: list[dict], **params) -> dict:
    """A chat request without a session id (the scratch slot and the prefix cache)."""
    return client.request("POST", "/chat/completions",
                          client.chat_body(messages, max_tokens=6, logit_bias={}, **params)).json()


def test_an_anonymous_conversation_resumes_from_block_boundaries_and_answers_as_a_cold_request(server):
    messages, previous_prompt = [], 0
    for turn in range(6):
        messages.append({"role": "user", "content": f"turn {turn}: tell me about the lighthouse keeper"})
        warm = ask(server, messages, cache_salt="anonymous")
        cold = ask(server, messages, cache_salt=f"cold-{turn}")  # a salt of its own: nothing to share
        cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        # The state was kept at least at the last block boundary of the previous prompt.
        assert cached % 64 == 0 and cached >= previous_prompt // 64 * 64, (turn, warm["usage"])
        assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
        previous_prompt = warm["usage"]["prompt_tokens"]
        messages.append({"role": "assistant", "content": warm["choices"][0]["message"]["content"]})
    assert previous_prompt >= 3 * 64  # the conversation crossed several boundaries
    metrics = Client(server.base_url.removesuffix("/v1")).request("GET", "/metrics").body.decode()
    assert int(re.search(r"^llmd_prefix_cache_recurrent_snapshots (\d+)$", metrics, re.M).group(1)) > 0


def test_an_anonymous_conversation_resumes_where_its_previous_turn_stood(server):
    messages, previous_prompt = [], 0
    for turn in range(5):
        messages.append({"role": "user", "content": f"turn {turn}: and what about the harbour master"})
        warm = ask(server, messages, cache_salt="alone")
        # The scratch session lends its own state: the checkpoint where the previous
        # prompt ended at least, or the end of the previous reply when it came back as is.
        assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= previous_prompt, (turn, warm["usage"])
        previous_prompt = warm["usage"]["prompt_tokens"]
        messages.append({"role": "assistant", "content": warm["choices"][0]["message"]["content"]})
    messages.append({"role": "user", "content": "the last question"})
    warm, cold = ask(server, messages, cache_salt="alone"), ask(server, messages, cache_salt="cold")
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= previous_prompt > 0
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
