"""Architectures (native/src/arch/) on tiny random models of each family.

Golden numbers: llama.cpp (llama-perplexity, and llama-server greedy completions
with the top-2 log-probs) ran on exactly the models `build()` writes, over TEXT;
`python -m tests.support.make_arch_golden LLAMA_DIR` made them with the llama.cpp of the
llama-cpp-python 0.3.36 sdist. Per model: the perplexity
(llmd must be within PPL_TOLERANCE), the greedy continuation of the first PROMPT_TOKENS
tokens, and at each step the margin between the top two log-probs, so that the
comparison stops at the first near-tie (margin < NEAR_TIE), where a rounding
difference may legitimately pick the other token.

The seam tests check that an optional tensor changes the result exactly as much as
it should (a zero bias not at all, a random one visibly). Warm resume and isolation
are checked through HTTP on each family (tests/engine/test_engine.py runs the engine-level
session tests over one model per family too).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
from array import array

import pytest

from llmd.engine.native import Engine, EngineError
from tests.conformance.client import Client
from tests.conftest import running_llmd
from tests.support.gguf_writer import (
    ARRAY, F32, GGML_F32, GGML_Q8_0, STRING, U32, GGUFWriter, build_tiny_gemma3, build_tiny_llama, build_tiny_qwen35,
    encode_f32, fuse_qkv,
)
from tests.support.llama_cpp_golden import golden_tests

TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. "
        "The hallway smelt of boiled cabbage and old rag mats. At one end of it a coloured poster, "
        "too large for indoor display, had been tacked to the wall. It depicted simply an enormous face, "
        "more than a metre wide: the face of a man of about forty-five, with a heavy black moustache "
        "and ruggedly handsome features. Winston made for the stairs. It was no use trying the lift. "
        "Even at the best of times it was seldom working, and at present the electric current was cut "
        "off during daylight hours. It was part of the economy drive in preparation for Hate Week.")
N_CTX = 128          # llama-perplexity -c 128 -b 128: chunks of 128 tokens, the second half scored
PROMPT_TOKENS = 24   # greedy continuations start after TEXT's first 24 tokens
GREEDY_STEPS = 12
NEAR_TIE = 0.05      # log-prob margin below which the two top tokens may swap
PPL_TOLERANCE = 0.001  # F32 models: measured within 2e-5 (per position ~1e-4 nats)
# Q8_0 models: activations are rounded to int8 blocks, which turns any last-bit
# difference upstream (summation order, f32 or f16 block scales) into whole steps of
# that rounding, so two correct engines drift apart by a median 0.03 nats a position
# on these random models: 0.001 % (llama_q8_0) to 0.6 % (qwen3moe_q8_0) over TEXT.
# llama.cpp itself moves by up to 0.26 % on them with -ub 8 instead of -ub 128, and
# storing our activation scales as f16 like ggml moves ours by as much, either way.
QUANTIZED_TOLERANCE = 0.01

_YARN = [("llama.rope.scaling.type", STRING, "yarn"), ("llama.rope.scaling.factor", F32, 4.0),
         ("llama.rope.scaling.original_context_length", U32, 32)]
_LINEAR = [("llama.rope.scaling.type", STRING, "linear"), ("llama.rope.scaling.factor", F32, 2.0)]

# name -> build_tiny_llama options (all 4 layers: SmolLM3's 4th layer has no RoPE)
CONFIGS = {
    "llama": dict(),
    "llama_bias": dict(attn_bias=True),
    "llama_q8_0": dict(weight_type=GGML_Q8_0),
    "llama_rope_freqs": dict(),  # + a rope_freqs.weight tensor (Llama 3.1 style), see build()
    "llama_linear": dict(extra_metadata=_LINEAR),
    "llama_yarn": dict(extra_metadata=_YARN),
    "qwen2": dict(arch="qwen2"),
    "qwen3": dict(arch="qwen3", head_dim=128),
    "smollm3": dict(arch="smollm3"),
    # Ministral 3's YaRN (a ramp and a magnitude of its own) and Llama 4's attention
    # temperature past every 32 positions
    "mistral3_yarn": dict(arch="mistral3", extra_metadata=[
        ("mistral3.rope.scaling.type", STRING, "yarn"), ("mistral3.rope.scaling.factor", F32, 4.0),
        ("mistral3.rope.scaling.original_context_length", U32, 32), ("mistral3.rope.scaling.yarn_beta_fast", F32, 16.0),
        ("mistral3.rope.scaling.yarn_log_multiplier", F32, 1.0), ("mistral3.attention.temperature_scale", F32, 0.5)]),
    "qwen3moe": dict(arch="qwen3moe"),
    "qwen3moe_q8_0": dict(arch="qwen3moe", weight_type=GGML_Q8_0),  # experts repacked too
    # llama with experts of n_ff (Mixtral's layout). Its Q8_0 form is too chaotic to
    # compare: llama.cpp's own perplexity on it moves by 2 % from -ub 128 to -ub 8.
    "mixtral": dict(experts=True),
    # + LongRoPE factor sets (see build()); llama.cpp picks the long set when the
    # context exceeds original_context_length, as llmd must (llama.cpp pads the
    # context to 256, so the short set needs an original context of 256 there).
    "phi3_short": dict(arch="phi3", extra_metadata=[("phi3.rope.scaling.original_context_length", U32, 256),
                                                    ("phi3.rope.scaling.attn_factor", F32, 1.19)]),
    "phi3_long": dict(arch="phi3", extra_metadata=[("phi3.rope.scaling.original_context_length", U32, 32),
                                                   ("phi3.rope.scaling.attn_factor", F32, 1.19)]),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "llama": (5379.0428,
              [288, 215, 109, 1, 1, 1, 187, 198, 262, 147, 29, 274],
              [0.293, 0.323, 1.114, 0.531, 1.363, 0.28, 0.506, 0.495, 1.439, 0.421, 0.749, 0.5]),
    "llama_bias": (5761.4698,
                   [46, 46, 33, 33, 33, 33, 33, 33, 33, 33, 33, 33],
                   [0.381, 0.28, 0.443, 0.893, 0.586, 0.517, 0.56, 0.767, 0.759, 0.571, 0.502, 0.668]),
    "llama_q8_0": (5337.6061,
                   [288, 215, 109, 1, 1, 1, 187, 198, 262, 147, 29, 274],
                   [0.363, 0.532, 1.24, 0.657, 1.098, 0.21, 0.431, 0.429, 1.55, 0.517, 0.822, 0.482]),
    "llama_rope_freqs": (5071.1716,
                         [288, 215, 109, 1, 1, 1, 187, 198, 262, 147, 29, 274],
                         [0.79, 0.166, 0.734, 1.072, 0.629, 0.008, 0.41, 0.496, 1.507, 0.223, 0.98, 0.345]),
    "llama_linear": (4723.7564,
                     [198, 182, 274, 274, 274, 274, 274, 274, 274, 274, 274, 274],
                     [1.496, 0.759, 1.313, 2.002, 2.316, 2.021, 1.773, 1.486, 1.063, 0.773, 0.765, 0.858]),
    "llama_yarn": (5191.1559,
                   [282, 170, 251, 251, 55, 21, 259, 292, 109, 274, 274, 274],
                   [1.14, 0.87, 0.075, 0.78, 0.062, 0.957, 1.175, 0.275, 0.579, 0.133, 4.521, 3.436]),
    "qwen2": (3368.8207,
              [133, 133, 133, 133, 133, 133, 133, 133, 133, 133, 133, 260],
              [0.273, 1.724, 1.51, 0.784, 0.294, 0.31, 0.659, 0.856, 0.708, 0.325, 0.154, 0.094]),
    "qwen3": (4336.0166,
              [289, 14, 207, 172, 172, 172, 98, 65, 172, 158, 289, 289],
              [2.865, 0.709, 0.057, 1.153, 0.793, 0.396, 0.349, 0.294, 2.22, 0.209, 1.64, 1.348]),
    "smollm3": (5430.0311,
                [198, 251, 251, 251, 158, 42, 274, 274, 274, 274, 274, 274],
                [0.351, 0.139, 1.681, 0.736, 1.482, 0.46, 0.61, 0.82, 0.845, 0.449, 0.74, 1.531]),
    "mistral3_yarn": (5355.3566,
                      [158, 42, 274, 158, 297, 274, 198, 188, 109, 274, 198, 198],
                      [0.241, 0.401, 0.004, 0.595, 0.606, 0.745, 0.546, 0.333, 0.344, 0.5, 2.605, 0.786]),
    "phi3_short": (4762.3273,
                   [182, 288, 147, 198, 182, 259, 292, 202, 202, 202, 86, 183],
                   [0.199, 0.182, 0.721, 1.816, 1.573, 0.528, 0.345, 0.957, 1.098, 0.182, 1.078, 0.259]),
    "phi3_long": (4657.3319,
                  [108, 131, 8, 224, 198, 108, 108, 147, 215, 109, 65, 274],
                  [0.064, 0.261, 0.522, 1.415, 0.197, 1.101, 0.921, 0.755, 0.187, 1.158, 0.17, 0.663]),
    "qwen3moe": (3502.3058,
                 [75, 228, 228, 228, 228, 228, 228, 228, 228, 228, 228, 228],
                 [0.152, 1.222, 2.104, 2.744, 2.004, 0.831, 0.586, 0.57, 0.838, 0.589, 0.265, 0.024]),
    "qwen3moe_q8_0": (3503.1269,
                      [75, 228, 228, 228, 228, 228, 228, 228, 228, 228, 228, 151],
                      [0.063, 1.292, 1.662, 2.457, 2.213, 0.87, 0.482, 0.611, 0.99, 0.675, 0.25, 0.03]),
    "mixtral": (8529.7826,
                [145, 145, 257, 155, 22, 22, 22, 142, 149, 212, 261, 261],
                [0.204, 1.373, 0.909, 0.06, 1.516, 0.103, 0.821, 1.497, 0.259, 0.076, 0.03, 0.992]),
}


def build(name: str) -> GGUFWriter:
    w = build_tiny_llama(n_layer=4, n_ctx=N_CTX, **CONFIGS[name])
    if name == "llama_rope_freqs":  # low frequencies slowed down, as Llama 3.1 does
        w.add_tensor("rope_freqs.weight", [8], GGML_F32, encode_f32([1, 1, 1, 2, 4, 8, 8, 8]))
    if name.startswith("phi3"):  # 6 rotated pairs (12 of 16 dims)
        w.add_tensor("rope_factors_short.weight", [6], GGML_F32, encode_f32([1, 1.1, 1.3, 1.6, 2, 2.5]))
        w.add_tensor("rope_factors_long.weight", [6], GGML_F32, encode_f32([1, 2, 4, 8, 16, 32]))
    return w


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)

PROMPT = "once upon a time there was a little server"


def open_error(path) -> str:
    """The message with which the engine refuses the file at path."""
    with pytest.raises(EngineError) as err:
        Engine(str(path), max_sessions=2)
    return str(err.value)


def logits_after(path, prompt: str = PROMPT) -> list[float]:
    with Engine(str(path), n_threads=2, max_sessions=2) as engine, engine.new_session() as s:
        s.prefill(engine.tokenize(prompt))
        return s.logits()


@pytest.mark.parametrize("weight_type", [GGML_F32, GGML_Q8_0], ids=["F32", "Q8_0"])
def test_llama_attention_biases_are_added_not_ignored(tmp_path, weight_type):
    with_bias = build_tiny_llama(attn_bias=True, weight_type=weight_type)
    biases = [t for t in with_bias.tensors if t.name.endswith(".bias")]
    assert len(biases) == 2 * 4
    without = build_tiny_llama(attn_bias=True, weight_type=weight_type)
    for t in biases:
        without.remove_tensor(t.name)
    zeroed = build_tiny_llama(attn_bias=True, weight_type=weight_type)
    for t in biases:
        zeroed.tensor(t.name).data = encode_f32([0.0] * t.ne[0])

    plain = logits_after(without.write(tmp_path / "plain.gguf"))
    assert logits_after(zeroed.write(tmp_path / "zero.gguf")) == plain
    biased = logits_after(with_bias.write(tmp_path / "bias.gguf"))
    assert max(abs(a - b) for a, b in zip(biased, plain)) > 0.1


@pytest.mark.parametrize("bias", ["attn_q", "attn_k", "attn_v", "attn_output"])
def test_each_llama_bias_on_its_own_changes_the_logits(tmp_path, bias):
    w, plain = build_tiny_llama(attn_bias=True), build_tiny_llama(attn_bias=True)
    for t in list(w.tensors):
        if t.name.endswith(".bias"):
            plain.remove_tensor(t.name)
            if not t.name.endswith(f".{bias}.bias"):
                w.remove_tensor(t.name)
    one, none = logits_after(w.write(tmp_path / "one.gguf")), logits_after(plain.write(tmp_path / "plain.gguf"))
    assert max(abs(a - b) for a, b in zip(one, none)) > 1e-3


@pytest.mark.parametrize("build", [
    *(lambda arch=arch: build_tiny_llama(arch=arch, attn_bias=True) for arch in ("llama", "qwen2", "qwen3", "qwen3moe")),
    build_tiny_gemma3, build_tiny_qwen35], ids=["llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "qwen35"])
def test_q_k_and_v_fused_in_one_matrix_compute_what_they_compute_apart(tmp_path, build):
    """attn_qkv and its bias, as llama.cpp reads them for every family (Binder::fused_qkv;
    Qwen3.5's queries with their gates): the same products, bit for bit."""
    fused = fuse_qkv(build())
    assert any(t.name.endswith(".attn_qkv.weight") and not t.name.startswith("blk.0.") for t in fused.tensors)
    assert logits_after(fused.write(tmp_path / "fused.gguf")) == logits_after(build().write(tmp_path / "apart.gguf"))


def test_separate_biases_beside_a_fused_matrix_are_added_only_all_three_together(tmp_path):
    """llama.cpp adds attn_q/k/v.bias beside an attn_qkv when all three are there, and
    loads one or two alone without adding them."""
    def model(drop: tuple[str, ...] = (), fuse_biases: bool = True) -> GGUFWriter:
        w = build_tiny_llama(attn_bias=True)
        biases = [w.tensor(f"blk.0.attn_{x}.bias") for x in "qkv"]
        for name in drop:
            w.remove_tensor(name)
        w = fuse_qkv(w)
        if not fuse_biases:  # block 0's fused bias as the three it was
            w.remove_tensor("blk.0.attn_qkv.bias")
            for t in biases:
                w.add_tensor(t.name, t.ne, t.ggml_type, t.data)
        return w
    fused = logits_after(model().write(tmp_path / "fused.gguf"))
    assert logits_after(model(fuse_biases=False).write(tmp_path / "three.gguf")) == fused
    two = model(drop=("blk.0.attn_v.bias",)).write(tmp_path / "two.gguf")
    with Engine(str(two), n_threads=1, max_sessions=1) as e:
        assert e.info.warnings == ("tensor blk.0.attn_q.bias and 1 more (which llama.cpp loads and does not apply "
                                   "for llama either) are not used by llmd",)
    none = model(drop=tuple(f"blk.0.attn_{x}.bias" for x in "qkv")).write(tmp_path / "none.gguf")
    assert logits_after(two) == logits_after(none) != fused


# ---- a reranker's classifier head -------------------------------------------------------------

def with_classifier(arch: str, labels: int, labels_key: bool = False) -> GGUFWriter:
    """A tiny model with a classifier head of `labels` rows (one row written as ggml
    writes it: [64], its trailing 1 left out)."""
    w = build_tiny_llama(arch=arch)
    w.add_tensor("cls.output.weight", [64, labels] if labels > 1 else [64], GGML_F32,
                 encode_f32([0.5] * 64 * labels))
    if labels_key:
        w.set(f"{arch}.classifier.output_labels", ARRAY, (STRING, [f"label{i}" for i in range(labels)]))
    return w


def test_a_qwen3_rerankers_classifier_head_is_bound_and_changes_no_logit(tmp_path):
    path = with_classifier("qwen3", 1).write(tmp_path / "reranker.gguf")
    with Engine(str(path), n_threads=1, max_sessions=1) as e:
        assert e.info.warnings == () and e.info.n_labels == 1
    assert logits_after(path) == logits_after(build_tiny_llama(arch="qwen3").write(tmp_path / "plain.gguf"))
    with Engine(str(tmp_path / "plain.gguf"), n_threads=1, max_sessions=1) as e:
        assert e.info.n_labels == 0


def test_a_classifier_head_has_one_row_per_label_as_llama_cpp_checks(tmp_path):
    with Engine(str(with_classifier("qwen3", 2, labels_key=True).write(tmp_path / "two.gguf")), max_sessions=1) as e:
        assert e.info.n_labels == 2
    assert "tensor cls.output.weight has shape [64, 2], expected [64, 1]" in open_error(
        with_classifier("qwen3", 2).write(tmp_path / "unlabelled.gguf"))


def test_a_tensor_nobody_knows_is_still_refused_by_name(tmp_path):
    w = build_tiny_llama(arch="qwen3")
    w.add_tensor("cls.unknown.weight", [64, 1], GGML_F32, encode_f32([0.5] * 64))
    assert "model has tensor cls.unknown.weight, which the qwen3 architecture does not use" in open_error(
        w.write(tmp_path / "unknown.gguf"))
    # llama.cpp reads a classifier head in qwen3 files, not in llama ones
    assert "model has tensor cls.output.weight, which the llama architecture does not use" in open_error(
        with_classifier("llama", 1).write(tmp_path / "llama.gguf"))


def test_an_architecture_llmd_does_not_run_is_refused_with_the_ones_it_does(tmp_path):
    w = build_tiny_llama()
    w.set("general.architecture", STRING, "jamba")
    assert open_error(w.write(tmp_path / "m.gguf")) == (
        "unsupported architecture 'jamba' (llmd runs llama, cohere2, ernie4_5, ernie4_5-moe, exaone4, gemma, gemma2, "
        "gemma3, gemma4, glm4, glm4moe, gpt-oss, granite, granitemoe, granitehybrid, lfm2, lfm2moe, mistral3, "
        "nemotron_h, nemotron_h_moe, olmo2, phi3, qwen2, qwen2moe, qwen3, qwen35, qwen35moe, qwen3moe, smallthinker, "
        "smollm3)")


# ---- per-tensor scales (<weight>.scale, as llama.cpp's writer stores them) ------------------

def scaled(w: GGUFWriter, weight: str, value: float) -> None:
    """Gives weight a per-tensor scale (one per expert for a stack)."""
    t = w.tensor(weight)
    n = t.ne[2] if len(t.ne) == 3 else 1
    w.add_tensor(weight.removesuffix(".weight") + ".scale", [n], GGML_F32, encode_f32([value] * n))


def doubled(w: GGUFWriter, weight: str) -> None:
    """Multiplies an F32 weight by 2 in place (exactly: a power of two)."""
    t = w.tensor(weight)
    t.data = encode_f32([2.0 * v for v in array("f", t.data)])


@pytest.mark.parametrize("arch, weight", [("llama", "blk.1.attn_output.weight"), ("llama", "blk.0.ffn_down.weight"),
                                          ("llama", "blk.1.ffn_up.weight"), ("qwen3", "blk.0.attn_q.weight"),
                                          ("mixtral", "blk.1.ffn_down_exps.weight"),
                                          ("mixtral", "blk.0.ffn_gate_exps.weight")])
def test_a_weight_s_scale_multiplies_its_product(tmp_path, arch, weight):
    """A scale of 2 computes exactly what the weight times 2 does (both are exact)."""
    def build():
        return build_tiny_llama(experts=True) if arch == "mixtral" else build_tiny_llama(arch=arch)
    with_scale, times_two = build(), build()
    scaled(with_scale, weight, 2.0)
    doubled(times_two, weight)
    plain = logits_after(build().write(tmp_path / "plain.gguf"))
    expected = logits_after(times_two.write(tmp_path / "doubled.gguf"))
    assert logits_after(with_scale.write(tmp_path / "scaled.gguf")) == expected != plain


def test_an_ffn_bias_is_scaled_with_its_product_as_llama_cpp_adds_it(tmp_path):
    """llama.cpp's FFN adds a bias before the scale, its attention after: s · (x wᵀ + b)."""
    w, two = build_tiny_llama(), build_tiny_llama()
    for g in (w, two):
        g.add_tensor("blk.0.ffn_down.bias", [64], GGML_F32, encode_f32([0.25 * (i % 5 - 2) for i in range(64)]))
    scaled(w, "blk.0.ffn_down.weight", 2.0)
    doubled(two, "blk.0.ffn_down.weight")
    doubled(two, "blk.0.ffn_down.bias")
    assert logits_after(w.write(tmp_path / "s.gguf")) == logits_after(two.write(tmp_path / "d.gguf"))


def test_scales_a_family_s_llama_cpp_graph_leaves_out_are_named_and_change_nothing(tmp_path):
    w = build_tiny_llama(arch="qwen2")
    scaled(w, "blk.0.ffn_down.weight", 2.0)
    w.add_tensor("blk.0.attn_q.input_scale", [1], GGML_F32, encode_f32([3.0]))
    path = w.write(tmp_path / "qwen2.gguf")
    with Engine(str(path), n_threads=1, max_sessions=1) as e:
        assert e.info.warnings == ("tensor blk.0.attn_q.input_scale and 1 more (which llama.cpp loads and does not "
                                   "apply for qwen2 either) are not used by llmd",)
    assert logits_after(path) == logits_after(build_tiny_llama(arch="qwen2").write(tmp_path / "plain.gguf"))


def test_scales_llama_cpp_does_not_know_or_of_the_wrong_shape_are_refused(tmp_path):
    w = build_tiny_llama()
    w.add_tensor("blk.0.attn_norm.scale", [1], GGML_F32, encode_f32([2.0]))
    assert "model has tensor blk.0.attn_norm.scale, which the llama architecture does not use" in open_error(
        w.write(tmp_path / "a.gguf"))
    w = build_tiny_llama()
    w.add_tensor("blk.0.attn_q.scale", [2], GGML_F32, encode_f32([2.0, 2.0]))
    assert "tensor blk.0.attn_q.scale should be F32 of 1 elements" in open_error(w.write(tmp_path / "b.gguf"))


# ---- sessions through HTTP on every family ------------------------------------------------

@pytest.fixture(scope="module", params=["qwen2", "qwen3", "smollm3", "phi3_long", "qwen3moe"])
def family_server(request, models):
    """llmd serving the tiny model of one family: 3 named slots + scratch."""
    with running_llmd("--model", str(models[request.param]), "--max-sessions", "4", "--ctx", "128",
                      "--session-eviction", "none") as url:
        yield model_client(url)


def chat(client: Client, messages: list[dict], session: str | None = None) -> dict:
    headers = {"X-Session-ID": session} if session else None
    body = client.chat_body(messages, max_tokens=6, logit_bias={})
    return client.request("POST", "/chat/completions", body, headers).json()


def model_client(url: str) -> Client:
    """A client of the llmd at url, asking for the one model it serves."""
    client = Client(url + "/v1")
    client.model = client.get_json("/models").json()["data"][0]["id"]
    return client


def test_warm_resume_answers_as_a_cold_request_on_every_family(family_server):
    # The reply in the history is given text, not the random model's bytes: a cold
    # request tokenizes it exactly as the warm one does.
    turn = [{"role": "user", "content": "the quick brown fox"}]
    first = chat(family_server, turn, "warm")
    history = turn + [{"role": "assistant", "content": "jumps over the lazy dog"},
                      {"role": "user", "content": "hello there"}]
    warm = chat(family_server, history, "warm")
    cold = chat(family_server, history)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
    assert warm["session_reset_reason"] in ("exact_prefix", "common_prefix")
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]


def assert_sessions_are_isolated_under_concurrency(client: Client) -> None:
    """Two named sessions asked at once answer as each prompt does alone."""
    prompts = {"iso1": "once upon a time", "iso2": "the lazy dog"}
    solo = {sid: chat(client, [{"role": "user", "content": text}]) for sid, text in prompts.items()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {sid: pool.submit(chat, client, [{"role": "user", "content": text}], sid)
                   for sid, text in prompts.items()}
        together = {sid: f.result() for sid, f in futures.items()}
    for sid in prompts:
        assert together[sid]["choices"][0]["message"] == solo[sid]["choices"][0]["message"]


def test_sessions_are_isolated_under_concurrency_on_every_family(family_server):
    assert_sessions_are_isolated_under_concurrency(family_server)


# ---- engine checks the other architecture modules make on their own models ---------------

def assert_prefill_does_not_depend_on_chunks(engine: Engine, ids: list[int], chunk: int = 37) -> None:
    """One prefill of ids, prefills of `chunk` tokens, and one token at a time leave
    bit-identical logits."""
    with engine.new_session() as whole, engine.new_session() as chunks, engine.new_session() as single:
        whole.prefill(ids)
        for i in range(0, len(ids), chunk):
            chunks.prefill(ids[i:i + chunk])
        for token in ids:
            single.prefill([token])
        assert chunks.logits() == whole.logits() == single.logits()


def assert_decode_batch_equals_decode_one(engine: Engine, prompts: list[list[int]], steps: int = 10) -> None:
    """Sessions decoded together by decode_batch give each the greedy ids it gives alone."""
    alone = []
    for prompt in prompts:
        with engine.new_session() as s:
            s.prefill(prompt)
            alone.append([s.decode_one().id for _ in range(steps)])
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(engine.new_session()) for _ in prompts]
        for s, prompt in zip(sessions, prompts):
            s.prefill(prompt)
        together = [engine.decode_batch(sessions) for _ in range(steps)]
    assert [[step[i].id for step in together] for i in range(len(prompts))] == alone
