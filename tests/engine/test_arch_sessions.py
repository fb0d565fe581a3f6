"""Session behaviour on every architecture beyond llama (tests/engine/test_engine.py covers
llama): decode batching, isolation of interleaved sessions and warm resume by
truncation, each on one tiny model per family (a gemma3 and an olmo2 whose rings wrap),
the families first checked on llama.cpp's writer's files on those (tests/llama_archs.py).
The hybrid families' sessions are tested in test_session_state.py and test_prefix_cache.py."""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine
from tests.support.gguf_writer import (GGML_MXFP4, GGML_Q8_0, build_tiny_gemma3, build_tiny_gpt_oss, build_tiny_llama,
                                      build_tiny_qwen3moe)
from tests.engine.test_arch_gemma3 import TEXT
from tests.llama_archs import writer_model

N_CTX = 384
FAMILIES = {
    "gemma3": lambda: build_tiny_gemma3(n_ctx=N_CTX, window=32),
    "phi3": lambda: build_tiny_llama(n_ctx=N_CTX, arch="phi3"),
    "qwen3moe": lambda: build_tiny_qwen3moe(n_ctx=N_CTX),
    "qwen2moe": lambda: build_tiny_qwen3moe(n_ctx=N_CTX, arch="qwen2moe"),  # with a shared expert
    "mixtral": lambda: build_tiny_llama(n_ctx=N_CTX, experts=True, weight_type=GGML_Q8_0),
    "olmo2": lambda: writer_model("olmo2-dense", N_CTX),  # layer 0 in a window of 32
    "exaone4": lambda: writer_model("exaone4-dense", N_CTX),
    "ernie4_5": lambda: writer_model("ernie4_5-moe", N_CTX),
    "ernie4_5-moe": lambda: writer_model("ernie4_5-moe-moe", N_CTX),
    "smallthinker": lambda: writer_model("smallthinker-moe", N_CTX),
    "mistral3": lambda: writer_model("mistral3-moe", N_CTX),
    # sinks, even layers in a window of 32, MXFP4 experts
    "gpt-oss": lambda: build_tiny_gpt_oss(n_ctx=N_CTX, weight_type=GGML_Q8_0, expert_type=GGML_MXFP4),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def engine(request, tmp_path_factory):
    path = FAMILIES[request.param]().write(tmp_path_factory.mktemp(request.param) / "m.gguf")
    with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=4) as e:
        e.ids = e.tokenize(TEXT) * 2  # 340 ids at least, whatever the vocabulary
        yield e


def greedy(engine, prefix, steps=8):
    with engine.new_session() as s:
        s.prefill(prefix)
        return [s.decode_one().id for _ in range(steps)]


def test_decode_batch_equals_decode_one(engine):
    ids = engine.ids
    with engine.new_session() as a, engine.new_session() as b:
        a.prefill(ids[:320])
        b.prefill(ids[3:40])
        batched = [[t.id for t in engine.decode_batch([a, b])] for _ in range(8)]
    assert [row[0] for row in batched] == greedy(engine, ids[:320])
    assert [row[1] for row in batched] == greedy(engine, ids[3:40])


def test_interleaved_sessions_are_isolated(engine):
    ids = engine.ids
    with engine.new_session() as a, engine.new_session() as b:
        a.prefill(ids[:300])
        b.prefill(ids[100:130])
        got_a, got_b = [], []
        for _ in range(8):
            got_a.append(a.decode_one().id)
            got_b.append(b.decode_one().id)
    assert got_a == greedy(engine, ids[:300])
    assert got_b == greedy(engine, ids[100:130])


def test_warm_resume_by_truncation_continues_as_a_fresh_session(engine):
    ids = engine.ids
    with engine.new_session() as s:
        s.prefill(ids[:330])
        keep = max(s.resume_floor, 300)  # the floor is 0 unless a ring has wrapped
        s.truncate(keep)
        s.prefill(ids[keep:340])
        resumed = [s.decode_one().id for _ in range(8)]
    assert resumed == greedy(engine, ids[:340])
