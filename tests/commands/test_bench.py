"""llmd.bench on a tiny model whose chat template llmd does not recognise: the HTTP
figures fall back to plain completions instead of failing."""
from __future__ import annotations

from llmd.commands import bench
from llmd.engine.native import Engine
from tests.support.gguf_writer import FIM_MARKERS, build_tiny_llama, name_last_tokens, write_tiny_llama


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


def test_http_figures_time_the_first_token_of_a_model_that_writes_no_text_by_its_prefill(tmp_path, monkeypatch):
    """A random-weight model's stream carries no content delta: its first token's time
    is then the prefill's in the server's timings, not 0."""
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512)
    real = bench._stream

    def textless(*args, **kwargs):
        _, total, _, usage, timings = real(*args, **kwargs)
        return 0.0, total + 2.0, [], usage, {**timings, "prompt_ms": 1000.0}

    monkeypatch.setattr(bench, "_stream", textless)
    figures = bench.http_figures(str(model.path), threads=1, runs=1, eog_ids=(model.eos_id,))
    assert figures["http_ttft_cold_s"] == figures["http_ttft_warm_s"] == 1.0
    assert 0 < figures["http_stream_tok_s"] < 128


def test_bandwidth_figures_state_each_run_against_the_bandwidth_read_around_it():
    # run 1 streamed 40 tok/s at 80 GB/s, run 2 30 tok/s at 40 GB/s, run 3 45 at 60: at
    # 1 GB per token their limits are 80, 40 and 60 tok/s, their shares 0.5, 0.75, 0.75
    figures = bench.bandwidth_figures(10**9, [(40.0, 80e9), (30.0, 40e9), (45.0, 60e9)])
    assert figures == {"bytes_per_token_mb": 1000.0, "read_bandwidth_gb_s": 60.0,
                       "tg128_bandwidth_limit_tok_s": 60.0, "tg128_share_of_bandwidth_limit": 0.75}


def test_the_probe_counts_every_weight_of_a_dense_model_and_reads_at_a_positive_rate(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf")
    with Engine(str(model.path), n_threads=1) as engine:
        per_token, rate = bench.probe(engine)
    assert per_token == model.weight_bytes and rate > 0


def test_concurrent_figures_count_every_stream_of_distinct_equal_length_prompts(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512)
    figures = bench.concurrent_figures(None, str(model.path), threads=1, runs=2, streams=3, tokens=8, prompt=24)
    assert figures["streams"] == 3
    assert figures["stream_completion_tokens"] == [8]  # end of generation banned: every stream runs to max_tokens
    assert figures["stream_prompt_tokens"] == [24]
    low, high = figures["3_streams_tok_s_range"]
    assert 0 < low <= figures["3_streams_tok_s"] <= high
    assert figures["3_streams_over_one"] > 0


def test_choices_figures_time_every_choice_run_to_its_length(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512)
    figures = bench.choices_figures(str(model.path), threads=1, runs=2, n=3, tokens=8, prompt=24)
    assert figures["choices"] == 3 and figures["choice_tokens"] == 8  # checked: 3 × 8 tokens a request
    low, high = figures["3_choices_s_range"]
    assert 0 < low <= figures["3_choices_s"] <= high
    assert figures["3_choices_over_3_single"] > 0


def test_infill_figures_time_a_file_s_first_request_and_those_as_the_user_types(tmp_path):
    w = build_tiny_llama(n_vocab=320, n_ctx=8192, reserved=len(FIM_MARKERS))  # room for every file
    name_last_tokens(w)
    figures = bench.infill_figures(None, str(w.write(tmp_path / "fim.gguf")), threads=1, runs=2, typed=3, tokens=4)
    assert figures["infill_tokens"] == 4  # checked: every request made them
    low, high = figures["infill_prompt_tokens"]
    assert 0 < low < high  # the cursor line grows
    for kind in ("first_request_s", "typing_request_s"):
        low, high = figures[f"{kind}_range"]
        assert 0 < low <= figures[kind] <= high


def test_stream_prompts_differ_from_the_start_and_fit_the_length(tmp_path):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512)
    with Engine(str(model.path)) as engine:
        texts = bench.stream_prompts(engine, 4, 40, "Run 0")
        lengths = [len(engine.tokenize(t)) for t in texts]
    assert len({t[:8] for t in texts}) == 4
    assert lengths == [40] * 4


def test_held_sessions_each_resume_warm_from_their_files_and_hold_their_own_blocks(tmp_path, monkeypatch):
    model = write_tiny_llama(tmp_path / "m.gguf", n_ctx=512, head_dim=32)
    monkeypatch.setattr(bench.tempfile, "tempdir", str(tmp_path))  # where the session files go
    figures = bench.held_sessions_figures(str(model.path), threads=1, count=3, tokens=128, kv_type="q8_0")
    assert figures["held_warm_from_disk"] == 3 and figures["held_warm_in_memory"] == 3
    assert figures["held_kv_bytes_per_token"] == 2 * 2 * 2 * 34  # layers x (keys, values) x KV heads x a block
    # --prefix-cache off: no block is shared, every session holds its 128 tokens' own
    assert figures["held_kv_cache_bytes"] >= 3 * 128 * figures["held_kv_bytes_per_token"]
    assert not list(tmp_path.glob("llmd-bench-held-*"))  # the files are gone
