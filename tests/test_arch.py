"""Architectures (native/src/arch/): each family binds all of its tensors and computes
with every one of them, on tiny random models.

Numerics against llama.cpp are in the golden tests; these check the seams: an
optional tensor changes the result exactly as much as it should (a zero bias not at
all, a random one visibly), and what a family does not use is refused.
"""
from __future__ import annotations

import pytest

from llmd.engine import Engine
from tests.gguf_writer import GGML_F32, GGML_Q8_0, build_tiny_llama, encode_f32

PROMPT = "once upon a time there was a little server"


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
