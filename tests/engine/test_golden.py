"""The default model against reference vectors produced by llama.cpp for the same GGUF
(tests/data/, copied from the project's golden set)."""
import json
import pathlib

import pytest

from llmd.engine.native import Sampling

DATA = pathlib.Path(__file__).parents[1] / "data"
MARGIN = 0.3  # below this top-1/top-2 log-prob margin a step is a near-tie: stop comparing there

TOKENIZER_CASES = json.loads((DATA / "smollm2_tokenizer.json").read_text())["cases"]
GREEDY_CASES = json.loads((DATA / "smollm2_greedy.json").read_text())["cases"]


@pytest.mark.parametrize("case", TOKENIZER_CASES, ids=lambda c: repr(c["text"][:24]))
def test_tokenizer_matches_reference_with_control_tokens_as_text(default_engine, case):
    assert default_engine.tokenize(case["text"]) == case["ids"]


@pytest.mark.parametrize("case", TOKENIZER_CASES, ids=lambda c: repr(c["text"][:24]))
def test_tokenizer_matches_reference_with_control_tokens_parsed(default_engine, case):
    assert default_engine.tokenize(case["text"], special=True) == case["ids_parse_special"]


def test_detokenize_round_trips_reference_texts(default_engine):
    for case in TOKENIZER_CASES:
        assert default_engine.detokenize(case["ids"]).decode() == case["text"]


@pytest.mark.parametrize("case", GREEDY_CASES, ids=lambda c: repr(c["prompt"][:24]))
def test_greedy_ids_match_reference_until_first_near_tie(default_engine, case):
    assert default_engine.tokenize(case["prompt"], special=True) == case["prompt_ids"]
    compare = next((i for i, s in enumerate(case["steps"]) if s["margin"] < MARGIN), len(case["steps"]))
    with default_engine.new_session() as session:
        session.prefill(case["prompt_ids"])
        session.set_sampling(Sampling())
        ids = [session.decode_one().id for _ in range(compare)]
    assert ids == case["greedy_ids"][:compare]


def test_interleaved_sessions_decode_exactly_as_alone(default_engine):
    prompts = [c["prompt_ids"] for c in GREEDY_CASES[:3]]

    def alone(prompt):
        with default_engine.new_session() as s:
            s.prefill(prompt)
            s.set_sampling(Sampling())
            return [s.decode_one().id for _ in range(24)]

    expected = [alone(p) for p in prompts]
    sessions = [default_engine.new_session() for _ in prompts]
    try:
        for s, p in zip(sessions, prompts):
            s.prefill(p)
            s.set_sampling(Sampling())
        got = [[] for _ in prompts]
        for step in range(24):
            if step % 2:  # alternate single steps and one batched step over all sessions
                for i, s in enumerate(sessions):
                    got[i].append(s.decode_one().id)
            else:
                for i, tok in enumerate(default_engine.decode_batch(sessions)):
                    got[i].append(tok.id)
    finally:
        for s in sessions:
            s.close()
    assert got == expected


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024


def test_a_session_costs_its_kv_cache_not_the_weights(default_engine):
    ids = [c["prompt_ids"] for c in GREEDY_CASES][0] * 60  # a few hundred tokens
    kv_bytes = len(ids) * default_engine.info.kv_bytes_per_token
    sessions = []
    try:
        before = _rss_bytes()
        for _ in range(4):
            sessions.append(default_engine.new_session())
            sessions[-1].prefill(ids)
        per_session = (_rss_bytes() - before) / 4
    finally:
        for s in sessions:
            s.close()
    assert per_session < kv_bytes * 1.5 + (1 << 20)  # its KV cache and small buffers
    assert per_session < default_engine.info.weight_bytes / 4  # never another copy of the weights
