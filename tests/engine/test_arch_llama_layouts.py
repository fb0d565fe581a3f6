"""The families first checked on llama.cpp's own writer's files (ernie4_5, ernie4_5-moe,
exaone4, lfm2moe, olmo2, smallthinker; tests/engine/test_llama_archs.py holds their
perplexity to llama.cpp's): what those two-expert files cannot show. The forms of
their metadata the writer does not write, against llama.cpp (GOLDEN): each gating of
expert_gating_func over four experts, the sliding-window layers' own RoPE base, YaRN
with a sliding window. An expert bias chooses experts and never weighs them; a bias
llama.cpp loads and leaves out is left out; the forms of metadata llama.cpp does not
run are refused with their reason, and tensors a family does not have are refused by
name.

Golden numbers: `python -m tests.support.make_arch_golden --tests
tests.engine.test_arch_llama_layouts LLAMA_DIR` (llama-perplexity -c 128 -b 128 over
TEXT with the log-probability of each token of its first chunk, and a greedy
continuation through libllama with the top-2 log-prob margins) on exactly the models
build() writes, with the llama.cpp of the llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import copy
import re
import struct

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import PPL_TOLERANCE, QUANTIZED_TOLERANCE, logits_after, open_error
from tests.llama_archs import MODELS, TEXT, load_layout, regenerate, writer_model
from tests.reference_data import require
from tests.support.gguf_writer import ARRAY, F32, STRING, U32, GGML_F32, build_tiny_qwen3moe, encode_f32
from tests.engine.test_llama_archs import TOKEN_TOLERANCE
from tests.support.llama_cpp_golden import golden_tests, scored_chunks

EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
N_CTX = 128
PROMPT_TOKENS = 24
GREEDY_STEPS = 12


def with_experts(name: str, n_expert: int, n_used: int):
    """The writer's model `name` with n_expert experts in each MoE layer, n_used a token:
    its layout's router, expert stacks, their scales and the expert bias widened, each
    drawn as regenerate() draws the writer's own."""
    arch, vocab = MODELS[name]
    layout = copy.deepcopy(load_layout(name))
    counts = {f"{arch}.expert_count": n_expert, f"{arch}.expert_used_count": n_used}
    for entry in layout["metadata"]:
        if entry[0] in counts:
            entry[2] = struct.pack("<I", counts[entry[0]]).hex()
    for tensor_name, shape, _ in layout["tensors"]:
        if "_exps." in tensor_name or ".ffn_gate_inp." in tensor_name or ".exp_probs_b." in tensor_name:
            shape[-1] = n_expert
    return regenerate(layout, require(f"models/ggml-vocab-{vocab}.gguf"))


_YARN = {"rope.scaling.type": (STRING, "yarn"), "rope.scaling.factor": (F32, 4.0),
         "rope.scaling.original_context_length": (U32, 32)}
# name -> the writer's model, the (experts, used a token) to widen it to, the metadata set on it
CONFIGS = {
    # expert_gating_func 3: experts chosen by raw score, weighted by the softmax of the
    # chosen ones' (renormalised: both families renormalise); 4: by √softplus(score).
    # Without a selection bias, 3 computes what 1 does (a softmax renormalised over the
    # chosen is their softmax): SmallThinker's shows it runs, lfm2moe's exp_probs_b
    # (choosing by score plus bias, not probability plus bias) tells them apart.
    "smallthinker_softmax_weight": dict(model="smallthinker-moe", experts=(4, 2),
                                        metadata={"expert_gating_func": (U32, 3)}),
    "smallthinker_sqrt_softplus": dict(model="smallthinker-moe", experts=(4, 2),
                                       metadata={"expert_gating_func": (U32, 4)}),
    "lfm2moe_softmax_weight": dict(model="lfm2moe-moe", experts=(4, 2),  # chosen with exp_probs_b
                                   metadata={"expert_gating_func": (U32, 3)}),
    "lfm2moe_sqrt_softplus": dict(model="lfm2moe-moe", experts=(4, 2), metadata={"expert_gating_func": (U32, 4)}),
    # layer 1, the one local layer (of 4096 positions), turned by a base of its own,
    # YaRN-scaled as llama.cpp scales SmallThinker's local layers (its global layer 0 has
    # no RoPE)
    "smallthinker_swa_base_yarn": dict(model="smallthinker-moe",
                                       metadata={"rope.freq_base_swa": (F32, 500000.0), **_YARN}),
    # OLMo 3's long-context form: YaRN and attn_factor on the global layer 1, neither on
    # the local layer 0 (a window of 32)
    "olmo3_yarn": dict(model="olmo2-dense", metadata={**_YARN, "rope.scaling.attn_factor": (F32, 1.25)}),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "smallthinker_softmax_weight": (321370.4919,
        [26777, 52647, 129725, 26010, 78654, 51743, 87988, 62644, 81668, 43574, 149284, 36356],
        [0.124, 0.39, 0.055, 0.067, 0.73, 0.031, 0.167, 0.418, 0.29, 0.014, 0.116, 0.538]),
    "smallthinker_sqrt_softplus": (324364.9541,
        [26777, 128452, 65298, 93699, 13746, 37427, 42399, 30193, 112557, 42258, 124421, 57473],
        [0.035, 0.321, 0.202, 0.275, 0.115, 0.219, 0.049, 0.119, 0.154, 0.005, 0.196, 0.318]),
    "lfm2moe_softmax_weight": (230378.0688,
        [13236, 112100, 2093, 106983, 60652, 36929, 114255, 48207, 127668, 96717, 77125, 81440],
        [0.303, 0.068, 0.381, 0.211, 0.104, 0.212, 0.068, 0.354, 0.148, 0.3, 0.086, 0.289]),
    "lfm2moe_sqrt_softplus": (231769.09,
        [13236, 112100, 2093, 123308, 73641, 21186, 113878, 34087, 73241, 86190, 77049, 79096],
        [0.278, 0.028, 0.393, 0.104, 0.678, 0.077, 0.255, 0.033, 0.505, 0.283, 0.156, 0.144]),
    "smallthinker_swa_base_yarn": (331777.5037,
        [151077, 138437, 107540, 99445, 106832, 92323, 40084, 53115, 52990, 63376, 101625, 13053],
        [0.13, 0.105, 0.369, 0.212, 0.934, 0.25, 0.6, 0.446, 0.037, 0.234, 0.101, 0.078]),
    "olmo3_yarn": (214948.1192,
        [46921, 36532, 1558, 47891, 100423, 81306, 8270, 105190, 79072, 49431, 26737, 99645],
        [0.062, 0.322, 0.392, 0.113, 0.049, 0.346, 0.018, 0.495, 0.04, 0.207, 0.026, 0.222]),
}

# name -> llama.cpp's log-probability of each token its first chunk scores (of TEXT)
FIRST_CHUNK = {
    "smallthinker_softmax_weight": [
        -12.3011, -12.9803, -14.2835, -11.8841, -15.5198, -12.7926, -13.4871, -11.6855, -12.6131, -12.5197, -12.256,
        -11.9501, -12.7704, -12.5045, -12.7561, -10.4878, -15.1191, -12.9713, -12.4083, -10.9071, -12.2891,
        -11.5988, -11.5931, -12.0903, -11.5437, -13.221, -11.4726, -9.657, -13.4824, -11.7094, -12.879, -12.9514,
        -14.387, -11.2921, -13.0942, -11.758, -14.3335, -13.5728, -13.0652, -12.506, -13.2559, -12.9838, -13.1952,
        -13.0865, -13.1921, -14.5305, -13.4509, -12.9049, -11.9233, -11.5964, -12.7636, -14.2942, -11.7349,
        -12.5773, -15.3961, -12.1067, -13.5029, -12.8464, -13.5291, -12.0684, -12.9888, -12.0936, -13.0561],
    "smallthinker_sqrt_softplus": [
        -11.653, -12.6572, -14.4135, -11.4786, -14.1132, -12.5244, -13.0396, -11.6448, -12.8064, -13.024, -11.8727,
        -12.2105, -13.8848, -12.6106, -14.1113, -10.3732, -14.3283, -13.1492, -13.4785, -10.6546, -12.0704,
        -11.8175, -11.8225, -12.0907, -11.8391, -13.2424, -11.3003, -9.8518, -13.6352, -11.5697, -13.1874, -13.1767,
        -14.993, -12.9127, -13.4314, -12.4879, -14.5983, -13.2826, -12.7126, -12.3695, -13.4789, -12.8415, -13.9036,
        -13.3479, -13.2794, -14.0626, -12.9551, -12.4009, -12.0792, -11.3535, -12.2384, -14.5075, -11.8562,
        -12.5692, -15.065, -12.2715, -13.3082, -11.5818, -13.0489, -12.1578, -13.5616, -12.0091, -13.3864],
    "lfm2moe_softmax_weight": [
        -12.7212, -12.2169, -11.3898, -14.416, -11.3577, -12.9247, -11.3016, -10.8011, -13.9515, -13.2122, -12.3643,
        -11.8726, -11.6506, -12.0726, -11.4973, -13.4281, -11.7131, -12.0541, -12.7595, -13.5984, -11.9105,
        -11.6135, -12.3326, -11.5053, -12.6294, -12.3302, -12.3888, -11.078, -12.717, -12.2567, -12.7322, -12.6248,
        -12.0168, -12.5732, -13.8408, -13.6134, -13.1907, -10.5706, -12.5976, -13.2593, -12.3153, -13.0, -13.0285,
        -12.5333, -11.7931, -13.4836, -11.2691, -12.854, -12.4784, -13.1555, -11.77, -11.8485, -10.4138, -9.9341,
        -12.5766, -14.1406, -9.3136, -13.7738, -12.4459, -13.7894, -11.1103, -11.0831, -11.8523],
    "lfm2moe_sqrt_softplus": [
        -12.679, -12.4625, -11.3958, -14.3349, -12.7351, -12.9081, -12.0353, -10.5862, -13.6742, -13.237, -12.4343,
        -11.3783, -12.0444, -11.9335, -11.1536, -13.3106, -11.5207, -12.0767, -12.7593, -13.9112, -11.8705,
        -11.6739, -12.1933, -11.4554, -12.6424, -12.344, -12.4452, -11.1493, -12.7773, -12.3167, -12.9287, -12.8054,
        -11.6319, -12.5607, -13.6978, -14.0422, -13.2035, -10.5728, -12.5343, -13.263, -12.4225, -13.2341, -13.0461,
        -12.4059, -11.5756, -13.5319, -11.2394, -12.7237, -12.4325, -12.9215, -11.9242, -11.7084, -10.435, -10.0924,
        -12.5542, -14.2789, -9.4932, -13.7977, -12.3282, -12.8374, -11.0675, -10.7056, -11.6946],
    "smallthinker_swa_base_yarn": [
        -12.8128, -12.9559, -14.1657, -12.5167, -12.6665, -11.7129, -13.2637, -10.4402, -13.2543, -13.7474,
        -12.9424, -12.765, -12.5613, -11.3797, -14.1903, -11.2431, -13.4293, -12.5765, -12.6952, -13.5124, -12.7452,
        -10.0236, -14.6506, -12.6726, -9.8656, -12.6164, -13.9449, -10.9272, -13.7275, -11.3771, -13.8633, -12.974,
        -13.7465, -12.1862, -11.5763, -12.714, -14.757, -12.5423, -12.3552, -11.1457, -14.4813, -12.076, -10.6506,
        -13.151, -13.5817, -13.4971, -14.2397, -12.4335, -12.1087, -13.2607, -12.5549, -14.5596, -12.2383, -13.3147,
        -12.2765, -14.8887, -10.5886, -10.8574, -13.7021, -12.3815, -12.9995, -13.5092, -14.1036],
    "olmo3_yarn": [
        -12.1254, -13.8382, -12.6205, -13.4856, -13.757, -12.4329, -12.7328, -12.4466, -11.8552, -12.1208, -12.0264,
        -11.3684, -12.3173, -11.744, -11.4368, -13.6536, -13.3459, -10.7184, -12.5915, -12.8956, -12.2928, -11.4554,
        -14.47, -11.2402, -12.5571, -11.8366, -12.2383, -11.2254, -12.2071, -13.6541, -12.5149, -11.4069, -13.7954,
        -10.461, -12.4773, -12.0176, -11.7507, -11.708, -12.8196, -11.8683, -12.7068, -11.9015, -13.7017, -12.3517,
        -11.0167, -13.4735, -10.3747, -11.8972, -12.4374, -12.82, -12.9749, -13.392, -12.8392, -9.9503, -10.7263,
        -13.4591, -10.35, -10.6767, -12.8916, -12.1396, -11.7923, -12.4057, -13.1683],
}


def build(name: str):
    config = CONFIGS[name]
    model = config["model"]
    w = with_experts(model, *config["experts"]) if "experts" in config else writer_model(model)
    for key, (vtype, value) in config["metadata"].items():
        w.set(f"{MODELS[model][0]}.{key}", vtype, value)
    return w


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_each_token_of_the_first_chunk_gets_llama_cpp_s_log_probability(models, name):
    """Where the greedy continuation meets a near-tie within a few steps (the writer's
    vocabularies are large and its logits flat), every scored token still counts."""
    ours = scored_chunks(models[name], TEXT, N_CTX)[0]
    for position, ((log_prob, _), theirs) in enumerate(zip(ours, FIRST_CHUNK[name], strict=True)):
        assert log_prob == pytest.approx(theirs, abs=TOKEN_TOLERANCE), f"position {position}"


def with_expert_bias(bias: list[float], used: int, same_experts: bool = False):
    """lfm2moe's writer model (layer 1: a sigmoid-routed mixture of two experts), routing
    each token to `used` experts with exp_probs_b = bias; with same_experts, expert 1 a
    copy of expert 0."""
    w = writer_model("lfm2moe-moe")
    w.set("lfm2moe.expert_used_count", U32, used)
    w.tensor("blk.1.exp_probs_b.bias").data = encode_f32(bias)
    if same_experts:
        for name in EXPERTS:
            t = w.tensor(f"blk.1.{name}.weight")
            half = len(t.data) // 2
            t.data = t.data[:half] + t.data[:half]
    return w


def test_an_expert_bias_chooses_the_experts(tmp_path):
    # With one expert a token and its weight renormalised to 1, a bias of 10 on expert 0
    # routes every token there: as if both experts were expert 0 (the unbiased router
    # picks expert 1 for the last token).
    biased = logits_after(with_expert_bias([10.0, 0.0], 1).write(tmp_path / "biased.gguf"))
    same = logits_after(with_expert_bias([0.0, 0.0], 1, same_experts=True).write(tmp_path / "same.gguf"))
    unbiased = logits_after(with_expert_bias([0.0, 0.0], 1).write(tmp_path / "plain.gguf"))
    assert biased == same != unbiased


def test_an_expert_bias_does_not_weigh_the_experts(tmp_path):
    # Both experts chosen whatever the bias: their weights are the probabilities alone.
    biased = logits_after(with_expert_bias([0.7, -0.4], 2).write(tmp_path / "biased.gguf"))
    assert biased == logits_after(with_expert_bias([0.0, 0.0], 2).write(tmp_path / "plain.gguf"))


def unused_count(path) -> int:
    """How many tensors the engine's one warning of unapplied tensors counts."""
    with Engine(str(path), n_threads=1, max_sessions=1) as e:
        (warning,) = [w for w in e.info.warnings if "llama.cpp loads and does not apply" in w]
    return 1 + int(re.search(r" and (\d+) more", warning).group(1))


@pytest.mark.parametrize("name", ["ernie4_5-moe", "ernie4_5-moe-moe"])
def test_ernie_s_attention_output_bias_is_left_out_as_llama_cpp_leaves_it(tmp_path, name):
    w, plain = writer_model(name), writer_model(name)
    for l in range(2):
        plain.remove_tensor(f"blk.{l}.attn_output.bias")
    w.tensor("blk.0.attn_output.bias").data = encode_f32([5.0] * 256)  # that would show
    with_bias, without = w.write(tmp_path / "bias.gguf"), plain.write(tmp_path / "plain.gguf")
    assert logits_after(with_bias) == logits_after(without)
    assert unused_count(with_bias) == unused_count(without) + 2  # named among the unapplied


def test_exaone4_s_prediction_blocks_are_held_and_change_nothing(tmp_path):
    """A file with a multi-token-prediction block (block_count counts it) loads, as
    llama.cpp loads it, and computes the logits of the same file without it."""
    w = writer_model("exaone4-dense")
    w.set("exaone4.block_count", U32, 3)
    w.set("exaone4.nextn_predict_layers", U32, 1)
    for t in [t for t in w.tensors if t.name.startswith("blk.0.")]:
        w.add_tensor(t.name.replace("blk.0.", "blk.2.", 1), t.ne, t.ggml_type, t.data)
    for name, ne in (("eh_proj.weight", [512, 256]), ("enorm.weight", [256]), ("hnorm.weight", [256])):
        w.add_tensor(f"blk.2.nextn.{name}", ne, GGML_F32, encode_f32([0.5] * (ne[0] * (ne[1] if len(ne) > 1 else 1))))
    assert logits_after(w.write(tmp_path / "nextn.gguf")) == logits_after(
        writer_model("exaone4-dense").write(tmp_path / "plain.gguf"))


def test_routing_forms_llama_cpp_does_not_run_are_refused_with_their_reason(tmp_path):
    w = writer_model("smallthinker-moe")
    w.remove("smallthinker.expert_gating_func")  # llama.cpp has no gating to run without it
    assert open_error(w.write(tmp_path / "none.gguf")) == "model metadata lacks smallthinker.expert_gating_func"
    for func in (0, 5):  # llama.cpp aborts on either
        w = writer_model("lfm2moe-moe")
        w.set("lfm2moe.expert_gating_func", U32, func)
        assert open_error(w.write(tmp_path / "gating.gguf")) == (
            f"model metadata lfm2moe.expert_gating_func = {func} is a gating llmd does not run "
            "(1: softmax, 2: sigmoid, 3: softmax of the chosen, 4: sqrt of softplus)")
    w = writer_model("lfm2moe-moe")
    w.remove_tensor("blk.1.exp_probs_b.bias")  # required in lfm2moe, as llama.cpp requires it
    assert open_error(w.write(tmp_path / "nobias.gguf")) == "model lacks tensor blk.1.exp_probs_b.bias"


def test_expert_widths_per_layer_are_read_where_llama_cpp_reads_them(tmp_path):
    w = writer_model("lfm2moe-moe")
    w.set("lfm2moe.expert_feed_forward_length", ARRAY, (U32, [384, 384]))
    assert logits_after(w.write(tmp_path / "array.gguf")) == logits_after(
        writer_model("lfm2moe-moe").write(tmp_path / "scalar.gguf"))
    q = build_tiny_qwen3moe()  # llama.cpp reads qwen3moe's width as one integer only
    q.set("qwen3moe.expert_feed_forward_length", ARRAY, (U32, [32, 32]))
    assert "qwen3moe.expert_feed_forward_length" in open_error(q.write(tmp_path / "qwen3moe.gguf"))


def test_an_expert_bias_of_a_family_without_one_is_refused_by_name(tmp_path):
    w = build_tiny_qwen3moe()
    w.add_tensor("blk.0.exp_probs_b.bias", [8], GGML_F32, encode_f32([0.0] * 8))
    assert open_error(w.write(tmp_path / "m.gguf")) == (
        "model has tensor blk.0.exp_probs_b.bias, which the qwen3moe architecture does not use")


def test_a_sliding_window_pattern_is_read_as_llama_cpp_reads_it(tmp_path):
    """olmo2's writer file flags layer 0 local (a window of 32): an array of uint32. The
    same layers as a period (2: one local layer, then one global) compute the same
    logits past the window; a period of 1 (every layer global) does not."""
    text = TEXT[:400]  # some 90 tokens
    flags = logits_after(writer_model("olmo2-dense").write(tmp_path / "flags.gguf"), text)
    for period, same in ((2, True), (1, False)):
        w = writer_model("olmo2-dense")
        w.set("olmo2.attention.sliding_window_pattern", U32, period)
        assert (logits_after(w.write(tmp_path / f"{period}.gguf"), text) == flags) == same
