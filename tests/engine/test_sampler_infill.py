"""Sampling.infill: llama.cpp's fill-in-the-middle sampler step (native/src/decode/sampler.h).

The tiny models are random, so most cases steer the first step: logit_bias gives the
tokens a case names exactly the logits it names (log-probabilities) and bans every
other token, and each seed samples that one step again. Greedy requests take the step
too, so a greedy pick shows a case's outcome without any chance in it.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

import pytest

from llmd._native import ffi, lib
from llmd.engine.native import Engine, Sampling
from tests.engine.test_engine_grammar import schema_grammar
from tests.engine.test_speculative import mostly_right, plain, speculative
from tests.support.gguf_writer import build_tiny_llama

PROMPT = [72, 101, 108, 108, 111]  # "Hello"
EOS, ENDOFTEXT = 299, 297          # the tiny model's <|im_end|> (its EOS and EOT) and <|endoftext|>
TOK, TOKEN, IN = 281, 282, 263     # " tok", " token" (which " tok" begins) and "in"
GREEDY = dict(temperature=0.0)
SAMPLED = dict(temperature=1.0)


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model.path, n_threads=2, max_sessions=4) as e:
        assert (e.info.eos_id, sorted(e.info.eog_ids)) == (EOS, [ENDOFTEXT, EOS])
        assert [e.piece(i) for i in (TOK, TOKEN, IN)] == [b" tok", b" token", b"in"]
        yield e


def first_ids(engine: Engine, logits: dict[int, float], seeds=range(1), grammar: str | None = None,
              **sampling) -> list[int]:
    """The first step's id for each seed, sampled with `sampling` (and `grammar`) from
    next-token logits steered to exactly `logits` (id -> logit; every other id banned)."""
    with engine.new_session() as s:
        s.prefill(PROMPT)
        raw = s.logits()
        bias = {i: logits[i] - raw[i] if i in logits else -math.inf for i in range(len(raw))}
        ids = []
        for seed in seeds:
            s.set_grammar(grammar)
            s.set_sampling(Sampling(seed=seed, logit_bias=bias, **sampling))
            ids.append(s.decode_one().id)
            s.truncate(len(PROMPT) - 1)  # back to the prompt's logits
            s.prefill(PROMPT[-1:])
        return ids


def logits_of(probs: dict[int, float]) -> dict[int, float]:
    return {i: math.log(p) for i, p in probs.items()}


# ---- the flag off ----------------------------------------------------------------------------

# Recorded before the infill step existed: the tiny model after "once upon a time there
# was a little server", 24 steps.
BEFORE = [
    (Sampling(temperature=0.9, top_k=40, top_p=0.95, min_p=0.01, seed=7),
     [259, 76, 149, 76, 76, 159, 47, 33, 76, 274, 171, 150, 5, 76, 169, 169, 32, 33, 252, 243, 35, 35, 188, 42]),
    (Sampling(temperature=1.5, seed=3),
     [170, 48, 169, 154, 173, 149, 225, 159, 159, 60, 33, 199, 146, 282, 76, 5, 60, 207, 297, 149, 105, 35, 7, 8]),
]


@pytest.mark.parametrize("sampling, before", BEFORE)
def test_infill_off_samples_as_before_and_on_samples_otherwise(engine, sampling, before):
    def run(s: Sampling) -> list[int]:
        with engine.new_session() as session:
            session.prefill(engine.tokenize("once upon a time there was a little server"))
            session.set_sampling(s)
            return [session.decode_one().id for _ in range(24)]

    assert run(sampling) == before
    assert run(replace(sampling, infill=True)) != before


def test_set_sampling_refuses_an_infill_flag_other_than_0_or_1(engine):
    with engine.new_session() as s:
        raw = ffi.new("llmd_sampling *", {"top_p": 1.0, "repeat_penalty": 1.0, "infill": 2})
        assert lib.llmd_session_set_sampling(s.handle, raw) == lib.LLMD_ERR_INVALID_ARGUMENT
        assert ffi.string(lib.llmd_last_error()) == b"invalid sampling parameter: infill"


# ---- an end likely enough --------------------------------------------------------------------

def test_infill_ends_where_three_times_the_end_mass_per_candidate_outweighs_the_text(engine):
    """EOS at 0.1 among 4 candidates: 3 × 0.1 × 4 = 1.2 > 0.9 of text, so only EOS stays,
    though the text tokens are likelier one by one."""
    case = logits_of({EOS: 0.1, IN: 0.5, TOK: 0.25, 257: 0.15})
    assert first_ids(engine, case, **GREEDY) == [IN]
    assert first_ids(engine, case, infill=True, **GREEDY) == [EOS]
    assert set(first_ids(engine, case, range(40), infill=True, **SAMPLED)) == {EOS}
    assert Counter(first_ids(engine, case, range(40), **SAMPLED))[EOS] < 20


def test_infill_keeps_text_while_the_end_is_below_that_mass(engine):
    """EOS at 0.07: 3 × 0.07 × 4 = 0.84 < 0.93, so the text goes on, and EOS stays a
    candidate beside it ("he" is below 0.2, " tok" below a third of what is left)."""
    case = logits_of({EOS: 0.07, IN: 0.5, TOK: 0.25, 257: 0.18})
    assert first_ids(engine, case, infill=True, **GREEDY) == [IN]
    assert set(first_ids(engine, case, range(60), infill=True, **SAMPLED)) == {IN, EOS}


# ---- the prefix merge and the thresholds -----------------------------------------------------

@pytest.mark.parametrize("probs, winner", [
    ({IN: 0.40, TOK: 0.35, TOKEN: 0.25}, TOK),    # " token" moves into the likelier " tok": 0.60
    ({IN: 0.40, TOKEN: 0.35, TOK: 0.25}, TOKEN),  # and " tok" into the likelier " token"
])
def test_infill_merges_a_token_that_begins_another_into_the_likelier_one(engine, probs, winner):
    assert first_ids(engine, logits_of(probs), **GREEDY) == [IN]
    assert first_ids(engine, logits_of(probs), infill=True, **GREEDY) == [winner]


def test_infill_merge_moves_the_whole_probability_of_the_less_likely_token(engine):
    """" tok" 0.35 and " token" 0.25 become " tok" 0.6 beside "in" 0.4 (both above the
    thresholds): over 600 seeds " token" never comes, " tok" about 360 times."""
    case = logits_of({IN: 0.40, TOK: 0.35, TOKEN: 0.25})
    counts = Counter(first_ids(engine, case, range(600), infill=True, **SAMPLED))
    assert set(counts) == {IN, TOK}
    assert abs(counts[TOK] - 360) < 60  # 5 standard deviations
    assert Counter(first_ids(engine, case, range(100), **SAMPLED))[TOKEN] > 0


def test_infill_drops_text_below_its_two_thresholds(engine):
    """"in" 0.45, "he" 0.25, "er" 0.21, "re" 0.09 (no piece begins another): "re" is below
    0.2; of the three left, "er" is 0.21 / 0.91 < 1/4 of them: only "in" and "he" come."""
    case = logits_of({IN: 0.45, 257: 0.25, 259: 0.21, 262: 0.09})
    assert set(first_ids(engine, case, range(200), infill=True, **SAMPLED)) == {IN, 257}
    assert set(first_ids(engine, case, range(200), **SAMPLED)) == {IN, 257, 259, 262}


# ---- no confident text -----------------------------------------------------------------------

DIGITS = [ord(d) for d in "123456"]  # the byte tokens of the digits 1..6


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_infill_with_no_confident_text_ends_with_eos_unless_eos_is_banned(engine, sampling):
    """Six digits at 1/6 each (below 0.2), <|endoftext|> far behind, EOS cut off by top_k:
    the reply ends, and with EOS, not the end-of-generation candidate. Where logit bias or
    the grammar (an integer, which cannot end yet) bans EOS, the candidates stand."""
    case = {**{d: 0.0 for d in DIGITS}, ENDOFTEXT: -6.0, EOS: -10.0}
    seeds = range(20)
    assert set(first_ids(engine, case, seeds, top_k=7, infill=True, **sampling)) == {EOS}
    assert set(first_ids(engine, case, seeds, top_k=7, **sampling)) <= set(DIGITS) | {ENDOFTEXT}

    banned = {i: v for i, v in case.items() if i != EOS}
    assert set(first_ids(engine, banned, seeds, top_k=7, infill=True, **sampling)) <= set(DIGITS) | {ENDOFTEXT}
    integer = schema_grammar({"type": "integer"})
    assert set(first_ids(engine, case, seeds, integer, top_k=7, infill=True, **sampling)) <= set(DIGITS)


# ---- the whole of a large vocabulary ---------------------------------------------------------

@pytest.fixture(scope="module")
def large(tmp_path_factory):
    path = tmp_path_factory.mktemp("infill") / "large.gguf"
    build_tiny_llama(n_vocab=4096, reserved=16).write(path)
    with Engine(str(path), n_threads=2, max_sessions=2) as e:
        assert e.info.n_vocab == 4096
        yield e


def first_ids_biased(engine: Engine, bias: dict[int, float], seeds, **sampling) -> list[int]:
    """The first step's id for each seed, with the logits the model gives plus bias."""
    with engine.new_session() as s:
        s.prefill(PROMPT)
        ids = []
        for seed in seeds:
            s.set_sampling(Sampling(seed=seed, logit_bias=bias, **sampling))
            ids.append(s.decode_one().id)
            s.truncate(len(PROMPT) - 1)
            s.prefill(PROMPT[-1:])
        return ids


def test_infill_over_a_whole_large_vocabulary_ends_once_an_end_is_as_likely_as_the_best(large):
    """top_k off: 4096 candidates. With the end-of-generation ids as likely as the best
    token, 3 × p(end) × 4096 outweighs the text however flat it is."""
    with large.new_session() as s:
        s.prefill(PROMPT)
        raw = s.logits()
    bias = {i: max(raw) - raw[i] for i in large.info.eog_ids}
    ids = first_ids_biased(large, bias, range(20), infill=True, **SAMPLED)
    assert set(ids) <= set(large.info.eog_ids)
    assert not set(first_ids_biased(large, bias, range(20), **SAMPLED)) <= set(large.info.eog_ids)


def test_infill_over_a_whole_large_vocabulary_keeps_the_one_confident_token(large):
    """top_k off, the end-of-generation ids banned, one token as likely as the other 4093
    together: the merge among the most likely runs, and only that token is confident."""
    with large.new_session() as s:
        s.prefill(PROMPT)
        raw = s.logits()
    eog = set(large.info.eog_ids)
    chosen = random.Random(5).choice([i for i in range(4000) if len(large.piece(i)) > 1])
    rest = math.log(sum(math.exp(v) for i, v in enumerate(raw) if i != chosen and i not in eog))
    bias = {**{i: -math.inf for i in eog}, chosen: rest - raw[chosen]}
    for sampling in (SAMPLED, GREEDY):
        ids = first_ids_biased(large, bias, range(20), infill=True, **sampling)
        assert set(ids) == {chosen}
    assert len(set(first_ids_biased(large, bias, range(20), **SAMPLED))) > 1


# ---- speculative decoding --------------------------------------------------------------------

@pytest.mark.parametrize("sampling", [
    Sampling(infill=True),
    Sampling(temperature=1.0, top_k=20, seed=5, infill=True),
    Sampling(temperature=1.0, top_k=20, seed=5, infill=True, logit_bias={EOS: -math.inf, ENDOFTEXT: -math.inf}),
], ids=["greedy", "sampled", "sampled-no-end"])
def test_verified_drafts_with_infill_give_exactly_the_plain_tokens(engine, sampling):
    """Verification samples each position as decode_one does, so the infill step keeps
    speculative decoding exact: the runtime need not treat infill requests apart."""
    reference = plain(engine, sampling, 40)
    assert reference != plain(engine, replace(sampling, infill=False), 40)
    got, _ = speculative(engine, sampling, 40, mostly_right([r[0] for r in reference], engine.info.n_vocab, 6))
    assert got == reference
