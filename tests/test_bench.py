"""llmd.bench on a tiny model whose chat template llmd does not recognise: the HTTP
figures fall back to plain completions instead of failing."""
from __future__ import annotations

import pytest

from llmd import bench
from llmd.engine import Engine
from tests.gguf_writer import write_tiny_llama


def test_http_figures_use_completions_when_the_chat_template_is_unknown(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512, chat_template="{{ no_such_template }}")
    figures = bench.http_figures(str(model.path), threads=1, runs=1, eog_ids=(model.eos_id,))
    assert figures["http_route"] == "/v1/completions"
    assert figures["http_prompt_tokens"] >= bench.HTTP_PROMPT
    assert figures["http_stream_tok_s"] > 0 and figures["http_ttft_cold_s"] > 0


def test_http_figures_use_chat_when_the_template_renders(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512)
    figures = bench.http_figures(str(model.path), threads=1, runs=1, eog_ids=(model.eos_id,))
    assert figures["http_route"] == "/v1/chat/completions"
    assert figures["http_prompt_tokens"] >= bench.HTTP_PROMPT


def test_bandwidth_figures_state_generation_as_a_share_of_the_memory_limit(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf")
    with Engine(str(model.path), n_threads=1) as engine:
        figures = bench.bandwidth_figures(engine, tg_tok_s=1000.0, runs=1)
    assert figures["bytes_per_token_mb"] == round(model.weight_bytes / 1e6, 1)
    limit = figures["tg128_bandwidth_limit_tok_s"]  # tokens/s = bandwidth / bytes per token
    assert figures["read_bandwidth_gb_s"] == pytest.approx(limit * model.weight_bytes / 1e9, abs=0.051)
    assert figures["tg128_share_of_bandwidth_limit"] == pytest.approx(1000.0 / limit, abs=0.0006, rel=0.001)
