"""arch/gemma.cpp's gemma (Gemma 1, CodeGemma) on tiny random gemma models
(tests/support/gguf_writer.py: build_tiny_gemma): heads of 256, one KV head shared by
the 2B model's query heads or one each as the 7B model has them, the output head the
embeddings', checked against llama.cpp.

Golden numbers: llama.cpp's llama-perplexity (-c 384 -b 384) and a greedy
continuation through libllama (n_ctx 384, top-2 log-prob margins) on exactly the
models build() writes, as `python -m tests.support.make_arch_golden LLAMA_DIR --tests
tests.engine.test_arch_gemma` printed them with the llama.cpp of the llama-cpp-python
0.3.36 sdist. Perplexity must agree within PPL_TOLERANCE; greedy ids until the first
near-tie.
"""
from __future__ import annotations

from llmd.engine.native import Engine
from tests.engine.test_arch import assert_decode_batch_equals_decode_one, assert_prefill_does_not_depend_on_chunks
from tests.engine.test_arch_gemma3 import GREEDY_STEPS, N_CTX, PPL_TOLERANCE, PROMPT_TOKENS, TEXT
from tests.support.gguf_writer import GGML_Q8_0, build_tiny_gemma
from tests.support.llama_cpp_golden import golden_tests

CONFIGS = {
    "gemma": dict(),                                        # 2 query heads over 1 KV head, as the 2B model
    "gemma_mha": dict(n_head=4, n_head_kv=4),               # a KV head per query head, as the 7B model
    "gemma_q8_0": dict(weight_type=GGML_Q8_0, n_embd=128, n_head=4, n_head_kv=2),
}

# name -> (llama.cpp perplexity over TEXT, greedy ids, top-1 minus top-2 log-prob per step)
GOLDEN = {
    "gemma": (580.3435,
              [22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22, 22],
              [0.329, 0.258, 0.234, 0.273, 0.326, 0.36, 0.415, 0.518, 0.595, 0.607, 0.562, 0.505]),
    "gemma_mha": (459.9706,
                  [117, 117, 117, 117, 117, 197, 197, 197, 197, 197, 197, 197],
                  [0.58, 0.456, 0.346, 0.207, 0.078, 0.024, 0.742, 0.721, 0.73, 0.74, 0.732, 0.717]),
    "gemma_q8_0": (407.3008,
                   [117, 117, 117, 117, 117, 117, 117, 117, 117, 117, 117, 117],
                   [0.733, 0.738, 0.773, 0.784, 0.765, 0.834, 0.86, 0.892, 0.918, 0.954, 0.886, 0.85]),
}


def build(name: str):
    return build_tiny_gemma("gemma", n_ctx=N_CTX, window=0, tied=True, **CONFIGS[name])


models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie = golden_tests(
    build, CONFIGS, GOLDEN, TEXT, N_CTX, PROMPT_TOKENS, GREEDY_STEPS, PPL_TOLERANCE, PPL_TOLERANCE)


def test_every_layer_keeps_every_position(models):
    with Engine(str(models["gemma"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as e:
        assert e.info.kv_bytes_per_token == 6 * 2 * 256 * 2  # 6 layers' keys and values of one head of 256, f16
        assert e.info.kv_ring_bytes == 0


def test_logits_do_not_depend_on_chunks_or_decode_steps(models):
    """One prefill, odd chunks, and token-by-token steps give bit-identical logits at
    the last position; decode_batch = decode_one."""
    with Engine(str(models["gemma_mha"]), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
        ids = engine.tokenize(TEXT)
        assert_prefill_does_not_depend_on_chunks(engine, ids[:340])
        assert_decode_batch_equals_decode_one(engine, [ids[:330], ids[5:40]])
