"""tests/random_model.py: the k256 shape loads, with every matrix row a whole number of
256-element super-blocks and the vocabulary padded to its declared size; --output-norm scales
its logits."""
from __future__ import annotations

from llmd.engine.native import Engine
from tests.support.gguf_writer import GGML_F16
from tests.random_model import SHAPES, random_f16, scale_output_norm


def test_k256_model_loads_with_whole_super_block_rows(tmp_path):
    builder, shape, _ = SHAPES["k256"]
    w = builder(**shape, weight_type=GGML_F16, random_matrix=random_f16)
    assert all(t.ne[0] % 256 == 0 for t in w.tensors if len(t.ne) == 2)
    assert len(w.get("tokenizer.ggml.tokens").value[1]) == shape["n_vocab"]
    with Engine(w.write(tmp_path / "k256.gguf"), n_threads=1, max_sessions=1) as engine:
        assert engine.info.n_vocab == shape["n_vocab"] and engine.info.n_embd == shape["n_embd"]
        with engine.new_session() as s:
            s.prefill(engine.tokenize("hello world"))
            assert len(set(s.logits())) > 100


def test_random_f16_magnitudes_sit_around_std():
    import random
    import struct
    data = random_f16(64, 64, 0.02, random.Random(1))
    values = [abs(v) for (v,) in struct.iter_unpack("<e", data)]
    assert all(0.02 / 8 <= v < 0.04 for v in values)


def test_scaling_the_output_norm_scales_every_logit(tmp_path):
    builder, shape, _ = SHAPES["k256"]
    logits = []
    for factor in (1.0, 0.5):
        w = builder(**shape, weight_type=GGML_F16, random_matrix=random_f16)
        scale_output_norm(w, factor)
        with Engine(w.write(tmp_path / f"k256-{factor}.gguf"), n_threads=1, max_sessions=1) as engine, \
                engine.new_session() as s:
            s.prefill(engine.tokenize("hello world"))
            logits.append(s.logits())
    spread = max(abs(v) for v in logits[0])
    assert spread > 1 and all(abs(a / 2 - b) <= 1e-3 * spread for a, b in zip(*logits))
