"""llmd.bench on a tiny model whose chat template llmd does not recognise: the HTTP
figures fall back to plain completions instead of failing."""
from __future__ import annotations

from llmd import bench
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
