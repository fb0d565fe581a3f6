"""arch/cohere2.cpp on tiny random models (tests/support/gguf_writer.py:
build_tiny_cohere2): LayerNorms without bias, attention and the FFN in parallel on the
same normed input, three layers of four over a 16-position window with RoPE (the
128-token context wraps their rings), the fourth global without RoPE, the output head
the embeddings', logits scaled by logit_scale. Checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 128 -b 128) and a greedy
continuation through libllama (n_ctx 128, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden --tests
tests.engine.test_arch_cohere2 LLAMA_DIR` printed them with the llama.cpp of the
llama-cpp-python 0.3.36 sdist.
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.engine.test_arch import (
    GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, QUANTIZED_TOLERANCE, TEXT,
    assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks, open_error,
)
from tests.support.gguf_writer import GGML_Q8_0, build_tiny_cohere2
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "cohere2": dict(),
    "cohere2_biases": dict(biases=True, logit_scale=0.5),
    "cohere2_q8_0": dict(weight_type=GGML_Q8_0, n_embd=128),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "cohere2": (459.3894,
                [63, 63, 63, 63, 287, 287, 287, 287, 287, 287, 287, 287],
                [0.67, 1.415, 0.799, 0.395, 1.003, 1.213, 1.424, 1.251, 0.823, 0.547, 0.379, 0.075]),
    "cohere2_biases": (2054.962,
                       [263, 263, 165, 252, 252, 252, 252, 252, 252, 252, 252, 252],
                       [0.24, 0.925, 0.056, 0.308, 2.983, 2.131, 1.875, 1.283, 2.001, 1.766, 1.571, 1.553]),
    "cohere2_q8_0": (434.9631,
                     [47, 47, 47, 47, 47, 47, 47, 50, 50, 50, 50, 50],
                     [0.361, 0.914, 1.009, 1.168, 1.055, 0.773, 0.053, 0.024, 0.649, 0.396, 0.687, 1.106]),
}


def build(name: str):
    return build_tiny_cohere2(n_ctx=N_CTX, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, QUANTIZED_TOLERANCE)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_do_not_depend_on_chunks_or_decode_steps(models, name):
    """Past the rings' wrap."""
    with Engine(str(models[name]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        ids = engine.tokenize(TEXT)
        assert_prefill_does_not_depend_on_chunks(engine, ids[:100])
        assert_decode_batch_equals_decode_one(engine, [ids[:60], ids[3:30]])


def test_a_file_without_its_norm_epsilon_is_refused(tmp_path):
    w = build_tiny_cohere2()
    w.kvs = [kv for kv in w.kvs if kv.key != "cohere2.attention.layer_norm_epsilon"]
    assert "lacks cohere2.attention.layer_norm_epsilon" in open_error(w.write(tmp_path / "eps.gguf"))
