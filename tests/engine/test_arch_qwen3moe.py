"""arch/qwen3moe.cpp and arch/qwen2moe.cpp on tiny random models (tests/support/gguf_writer.py:
build_tiny_qwen3moe): 8 experts, 2 per token, checked against llama.cpp (which always
renormalises the chosen experts' weights and never scales them for qwen3moe, as the
converted files assume); the file's expert_weights_norm / _scale keys, which llmd
honours when present, are checked by their effect; then the batch properties that
grouping tokens per expert must keep.

The shared expert (ffn_*_shexp behind a sigmoid gate) is checked against llama.cpp
through qwen2moe, whose files always have one. llama.cpp's qwen3moe loads no shared
expert (its loader refuses the extra tensors), so on qwen3moe, where llmd runs the same
op when a file has one, it is checked by its effect.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy
continuation through libllama (n_ctx 128, top-2 log-prob margins) on exactly the
models build() writes, with the llama.cpp of the llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.support.gguf_writer import GGML_Q8_0, build_tiny_qwen3moe
from tests.support.llama_cpp_golden import golden_tests
from tests.engine.test_arch import assert_decode_batch_equals_decode_one
from tests.engine.test_arch_gemma3 import TEXT

N_CTX = 128
PROMPT_TOKENS = 60
GREEDY_STEPS = 12
PPL_TOLERANCE = 0.005

CONFIGS = {
    "qwen3moe": dict(),
    "qwen3moe_3_of_6": dict(n_expert=6, n_expert_used=3),
    "qwen3moe_q8_0": dict(weight_type=GGML_Q8_0),
    "qwen2moe": dict(arch="qwen2moe"),
    "qwen2moe_4_of_8_shexp_96": dict(arch="qwen2moe", n_expert_used=4, n_ff_shexp=96),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "qwen3moe": (6447.8153,
                 [278, 180, 85, 226, 252, 252, 252, 252, 82, 278, 263, 226],
                 [0.88, 0.872, 0.751, 0.286, 1.622, 0.452, 0.684, 0.254, 0.218, 0.275, 0.081, 0.029]),
    "qwen3moe_3_of_6": (4979.486,
                        [247, 151, 151, 151, 151, 151, 151, 182, 189, 33, 215, 146],
                        [1.64, 0.731, 0.207, 0.326, 0.974, 0.856, 0.063, 0.016, 0.425, 0.303, 1.076, 0.836]),
    "qwen3moe_q8_0": (6541.852,
                      [278, 180, 85, 226, 252, 252, 252, 252, 82, 25, 82, 226],
                      [0.876, 0.837, 1.03, 0.225, 1.589, 0.378, 0.676, 0.263, 0.155, 1.175, 0.758, 0.454]),
    "qwen2moe": (4764.4152,
                 [100, 39, 239, 239, 239, 239, 226, 239, 239, 239, 239, 239],
                 [1.644, 2.041, 1.449, 2.246, 4.341, 3.746, 0.359, 0.597, 1.802, 1.17, 0.698, 0.457]),
    "qwen2moe_4_of_8_shexp_96": (3347.2383,
                                 [107, 206, 153, 108, 153, 153, 153, 153, 153, 153, 153, 153],
                                 [0.4, 0.575, 1.174, 0.195, 0.604, 1.428, 2.014, 2.735, 2.291, 2.0, 2.474, 2.417]),
}


def build(name: str):
    return build_tiny_qwen3moe(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, PPL_TOLERANCE)


def last_logits(path, ids):
    with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=2) as engine, engine.new_session() as s:
        s.prefill(ids)
        return s.logits()


@pytest.fixture(scope="module")
def ids(models):
    with Engine(str(models["qwen3moe"]), max_sessions=2) as engine:
        return engine.tokenize(TEXT)


def test_renormalising_matters_only_when_some_experts_are_left_out(tmp_path, ids):
    def logits(**options):
        return last_logits(build_tiny_qwen3moe(n_ctx=N_CTX, **options).write(tmp_path / "m.gguf"), ids[:30])

    assert logits(norm=True) == logits()  # the default
    assert logits(norm=False) != logits(norm=True)
    # All experts chosen: the softmax already sums to 1 (up to rounding).
    assert logits(norm=False, n_expert=4, n_expert_used=4) == pytest.approx(
        logits(norm=True, n_expert=4, n_expert_used=4), abs=1e-5)
    assert logits(scale=2.0) != logits()


def test_grouping_per_expert_keeps_each_token_independent_of_its_batch(models, ids):
    """One prefill, odd chunks and single steps route every token alike and sum its
    experts in one order: bit-identical logits."""
    with Engine(str(models["qwen3moe"]), n_threads=2, n_ctx=N_CTX, max_sessions=3) as engine:
        with engine.new_session() as whole:
            whole.prefill(ids[:90])
            expected = whole.logits()
        with engine.new_session() as chunked:
            for start in range(0, 90, 37):
                chunked.prefill(ids[start:min(90, start + 37)])
            assert chunked.logits() == expected


def test_decode_batch_equals_decode_one_on_qwen3moe(models, ids):
    with Engine(str(models["qwen3moe"]), n_threads=2, n_ctx=N_CTX, max_sessions=3) as engine:
        assert_decode_batch_equals_decode_one(engine, [ids[:50], ids[7:20]])


def without_shared_expert(w):
    for t in [t for t in w.tensors if "_shexp." in t.name]:
        w.remove_tensor(t.name)
    w.remove("qwen3moe.expert_shared_feed_forward_length")
    return w


def test_qwen3moe_adds_its_shared_expert_when_the_file_has_one(tmp_path, ids):
    def logits(w):
        return last_logits(w.write(tmp_path / "m.gguf"), ids[:30])

    with_shared = build_tiny_qwen3moe(n_ctx=N_CTX, n_ff_shexp=64)
    plain = logits(without_shared_expert(build_tiny_qwen3moe(n_ctx=N_CTX, n_ff_shexp=64)))
    assert logits(with_shared) != plain
    # A shared expert whose output rows are zero adds exactly nothing.
    for t in with_shared.tensors:
        if t.name.endswith("ffn_down_shexp.weight"):
            t.data = bytes(len(t.data))
    assert logits(with_shared) == plain


def test_qwen2moe_without_a_shared_expert_is_refused(tmp_path):
    from llmd.engine.native import EngineError
    w = build_tiny_qwen3moe(n_ctx=N_CTX, arch="qwen2moe")
    for t in [t for t in w.tensors if "_shexp." in t.name]:
        w.remove_tensor(t.name)
    with pytest.raises(EngineError, match="shared expert"):
        Engine(str(w.write(tmp_path / "bad.gguf")), max_sessions=2)


def test_wrong_expert_counts_are_refused(tmp_path):
    from llmd.engine.native import EngineError
    from tests.support.gguf_writer import U32
    w = build_tiny_qwen3moe(n_ctx=N_CTX)
    w.set("qwen3moe.expert_used_count", U32, 9)
    with pytest.raises(EngineError, match="expert counts"):
        Engine(str(w.write(tmp_path / "bad.gguf")), max_sessions=2)
