"""How the architecture tests compare llmd with golden numbers llama.cpp computed on
the same tiny models: the perplexity llama-perplexity reports (chunks of n_ctx
tokens, the second half of each scored), and a greedy continuation compared up to
the first near-tie (a top-1/top-2 log-prob margin below NEAR_TIE, where a rounding
difference may legitimately pick the other token)."""
from __future__ import annotations

import math
from typing import Callable

import pytest

from llmd.engine.native import Engine
from tests.support.gguf_writer import GGML_F32, GGUFWriter

NEAR_TIE = 0.05


def scored_chunks(path, text: str, n_ctx: int, n_top: int = 0) -> list[list[tuple[float, tuple]]]:
    """What llmd gives each token llama-perplexity -c n_ctx -b n_ctx scores, chunk by chunk:
    its log-probability and the n_top most likely (id, log-probability) at its position
    (Session.score_top). The chunks are as llama-perplexity makes them: where the
    vocabulary adds BOS, the text starts with it and so does every chunk (its first token
    replaced); the second half of each chunk is scored."""
    with Engine(str(path), n_threads=2, n_ctx=n_ctx, max_sessions=2) as engine:
        bos = [engine.info.bos_id] if engine.info.add_bos else []
        ids = bos + engine.tokenize(text)
        chunks = []
        for start in range(0, len(ids) - n_ctx + 1, n_ctx):
            with engine.new_session() as s:
                chunks.append(s.score_top(bos + ids[start + len(bos):start + n_ctx], n_ctx // 2, n_top))
    return chunks


def perplexity_of(chunks: list[list[tuple[float, tuple]]]) -> float:
    """The perplexity of scored_chunks' tokens."""
    log_probs = [lp for chunk in chunks for lp, _ in chunk]
    return math.exp(-sum(log_probs) / len(log_probs))


def perplexity(path, text: str, n_ctx: int) -> float:
    """llmd's perplexity over text as llama-perplexity -c n_ctx -b n_ctx computes it."""
    return perplexity_of(scored_chunks(path, text, n_ctx))


def assert_greedy_matches(path, text: str, n_ctx: int, prompt_tokens: int, expected: list[int],
                          margins: list[float]) -> None:
    """Greedy ids after text's first prompt_tokens tokens equal expected up to a near-tie."""
    with Engine(str(path), n_threads=2, n_ctx=n_ctx, max_sessions=2) as engine, engine.new_session() as s:
        s.prefill(engine.tokenize(text)[:prompt_tokens])
        got = [s.decode_one().id for _ in range(len(expected))]
    for step, (a, b, margin) in enumerate(zip(got, expected, margins)):
        if margin < NEAR_TIE:
            break
        assert a == b, f"step {step}: llmd {got}, llama.cpp {expected}"


def golden_tests(build: Callable[[str], GGUFWriter], configs: dict[str, dict], golden: dict[str, tuple],
                 text: str, n_ctx: int, prompt_tokens: int, greedy_steps: int,
                 tolerance: float, quantized_tolerance: float):
    """The checks every architecture test module makes against its GOLDEN table, for the
    module to bind under these names: a module-scoped `models` fixture (config name ->
    the GGUF file build(name) wrote), then per config llmd's perplexity over text within
    `tolerance` of llama.cpp's (`quantized_tolerance` where the config's weight_type is
    quantized) and its greedy ids equal to llama.cpp's up to the first near-tie."""
    @pytest.fixture(scope="module")
    def models(tmp_path_factory):
        directory = tmp_path_factory.mktemp("golden")
        return {name: build(name).write(directory / f"{name}.gguf") for name in configs}

    @pytest.mark.parametrize("name", list(configs))
    def test_perplexity_matches_llama_cpp(models, name):
        quantized = configs[name].get("weight_type", GGML_F32) != GGML_F32
        assert perplexity(models[name], text, n_ctx) == pytest.approx(
            golden[name][0], rel=quantized_tolerance if quantized else tolerance)

    @pytest.mark.parametrize("name", list(configs))
    def test_greedy_tokens_match_llama_cpp_up_to_a_near_tie(models, name):
        _, expected, margins = golden[name]
        assert_greedy_matches(models[name], text, n_ctx, prompt_tokens, expected[:greedy_steps], margins)

    return models, test_perplexity_matches_llama_cpp, test_greedy_tokens_match_llama_cpp_up_to_a_near_tie
