"""The families first checked on llama.cpp's own writer's files (ernie4_5, ernie4_5-moe,
exaone4, lfm2moe, olmo2, smallthinker; tests/engine/test_llama_archs.py holds their
perplexity to llama.cpp's): what those two-expert files cannot show. An expert bias
chooses experts and never weighs them; a bias llama.cpp loads and leaves out is left
out; the forms of metadata llmd does not run are refused with their reason, and
tensors a family does not have are refused by name."""
from __future__ import annotations

import re

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import logits_after, open_error
from tests.llama_archs import TEXT, writer_model
from tests.support.gguf_writer import ARRAY, F32, STRING, U32, GGML_F32, build_tiny_qwen3moe, encode_f32

EXPERTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")


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


def test_routing_forms_llmd_does_not_run_are_refused_with_their_reason(tmp_path):
    w = writer_model("smallthinker-moe")
    w.remove("smallthinker.expert_gating_func")  # llama.cpp has no gating to run without it
    assert open_error(w.write(tmp_path / "none.gguf")) == "model metadata lacks smallthinker.expert_gating_func"
    w = writer_model("lfm2moe-moe")
    w.set("lfm2moe.expert_gating_func", U32, 4)
    assert open_error(w.write(tmp_path / "softplus.gguf")) == (
        "model metadata lfm2moe.expert_gating_func = 4 is a gating llmd does not run (1: softmax, 2: sigmoid)")
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


def test_rope_forms_of_sliding_window_layers_llmd_does_not_run_are_refused(tmp_path):
    w = writer_model("olmo2-dense")  # a window in layer 0
    w.set("olmo2.rope.scaling.type", STRING, "yarn")
    w.set("olmo2.rope.scaling.factor", F32, 4.0)
    assert open_error(w.write(tmp_path / "yarn.gguf")) == (
        "olmo2 files with a sliding window and a RoPE magnitude correction (YaRN, attn_factor) are not run by llmd")
    w = writer_model("smallthinker-moe")
    w.set("smallthinker.rope.freq_base_swa", F32, 5e5)
    assert open_error(w.write(tmp_path / "base.gguf")) == (
        "smallthinker files whose sliding-window layers have a RoPE base of their own are not run by llmd")


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
