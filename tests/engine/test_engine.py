"""Sessions, sampling and the tokenizer through llmd.engine.native, on tiny random models.

The models are random, so the tests check the engine against itself: the same
inputs give the same ids, a batched step equals single steps, a truncated
session equals a fresh one, and every misuse is an exception with a message.
"""
from __future__ import annotations

import math
import random
import struct

import pytest

from llmd._native import ffi, lib
from llmd.engine.native import (
    CapacityError, ContextFullError, Engine, EngineError, Sampling, Session, TokenError,
)
from tests.support.gguf_writer import (
    GGML_BF16, GGML_F16, GGML_F32, GGML_IQ4_NL, GGML_IQ4_XS, GGML_MXFP4, GGML_Q2_K, GGML_Q3_K, GGML_Q4_0,
    GGML_Q4_1, GGML_Q4_K, GGML_Q5_0, GGML_Q5_1, GGML_Q5_K, GGML_Q6_K, GGML_Q8_0, TYPE_NAMES, U32,
    build_tiny_llama, build_tiny_qwen3moe,
)

ALL_TYPES = [GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1]
TYPE_IDS = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"]

PROMPT = "once upon a time there was a little server"
OTHER_PROMPT = "the quick brown fox jumps over the lazy dog. hello"


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model.path, n_threads=2, max_sessions=16) as e:
        yield e


# One tiny model of each architecture besides llama (4 layers: SmolLM3's 4th has no RoPE).
FAMILIES = {"qwen2": dict(arch="qwen2"), "qwen3": dict(arch="qwen3", head_dim=32),
            "smollm3": dict(arch="smollm3", n_layer=4), "phi3": dict(arch="phi3"),
            "qwen3moe": dict(arch="qwen3moe", weight_type=GGML_Q8_0)}
# Session behaviour must hold for every weight type and every architecture.
MODELS = [*ALL_TYPES, *FAMILIES]
MODEL_IDS = [*TYPE_IDS, *FAMILIES]


@pytest.fixture(scope="module")
def engines(tiny_llama_factory):
    """weight type or family name -> an open engine on the tiny model of that type
    (llama) or family (F32), all of the same seed."""
    options = {**{t: dict(weight_type=t) for t in ALL_TYPES}, **FAMILIES}
    opened = {key: Engine(tiny_llama_factory(**o).path, n_threads=2, max_sessions=8) for key, o in options.items()}
    yield opened
    for e in opened.values():
        e.close()


@pytest.fixture
def session(engine):
    with engine.new_session() as s:
        yield s


def decode(session: Session, n: int) -> list[int]:
    return [session.decode_one().id for _ in range(n)]


def run(engine: Engine, prompt: list[int], n: int, sampling: Sampling | None = None) -> list[int]:
    """Ids a fresh session generates after prompt."""
    with engine.new_session() as s:
        if sampling is not None:
            s.set_sampling(sampling)
        s.prefill(prompt)
        return decode(s, n)


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=lambda i: (values[i], -i))


def log_softmax(logits: list[float], i: int) -> float:
    top = max(logits)
    return logits[i] - top - math.log(sum(math.exp(v - top) for v in logits))


# ---- prefill and decode ------------------------------------------------------------------

def test_prefill_yields_finite_logits_over_the_vocabulary(engine, session, tiny_model):
    ids = engine.tokenize(PROMPT)
    session.prefill(ids)
    logits = session.logits()
    assert len(logits) == tiny_model.n_vocab
    assert all(math.isfinite(v) for v in logits)
    assert max(logits) > min(logits)
    assert session.position == len(ids)


def test_decoded_tokens_carry_their_piece_and_end_flags(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    for _ in range(12):
        tok = session.decode_one()
        assert 0 <= tok.id < engine.info.n_vocab
        assert tok.piece == engine.piece(tok.id)
        assert (tok.is_eos, tok.is_terminal, tok.stopped) == (
            tok.id == engine.info.eos_id, tok.id in engine.info.eog_ids, False)


def test_greedy_first_token_is_the_argmax_of_the_logits(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    expected = argmax(session.logits())
    assert session.decode_one().id == expected


@pytest.mark.parametrize("weight_type", ALL_TYPES, ids=TYPE_IDS)
def test_greedy_decoding_is_deterministic(engines, weight_type):
    e = engines[weight_type]
    prompt = e.tokenize(PROMPT)
    first = run(e, prompt, 24)
    assert run(e, prompt, 24) == first
    assert len(set(first)) > 1  # the tiny model does not just repeat one token


def test_position_does_not_count_the_pending_token(engine, session):
    ids = engine.tokenize(PROMPT)
    session.prefill(ids)
    assert session.position == len(ids)
    for k in range(1, 6):
        session.decode_one()
        assert session.position == len(ids) + k - 1


def test_logits_are_unavailable_while_a_token_is_pending(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    session.decode_one()
    with pytest.raises(EngineError, match="no logits") as err:
        session.logits()
    assert err.value.status == lib.LLMD_ERR_STATE


def test_prefill_after_decoding_drops_the_pending_token(engine, session):
    a, b = engine.tokenize(PROMPT), engine.tokenize(" and")
    session.prefill(a)
    decode(session, 3)  # two tokens fed, one pending
    session.prefill(b)
    assert session.position == len(a) + 2 + len(b)


# ---- sampling -------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(engine):
    prompt = engine.tokenize(PROMPT)
    sampling = Sampling(temperature=1.0, seed=1234)
    first = run(engine, prompt, 32, sampling)
    assert run(engine, prompt, 32, sampling) == first
    assert first != run(engine, prompt, 32)  # not simply greedy


def test_different_seeds_sample_different_tokens(engine):
    prompt = engine.tokenize(PROMPT)
    runs = {tuple(run(engine, prompt, 32, Sampling(temperature=1.0, seed=seed))) for seed in (1, 2, 3)}
    assert len(runs) == 3


def test_set_sampling_reseeds_the_generator(engine, session):
    prompt = engine.tokenize(PROMPT)
    sampling = Sampling(temperature=1.0, seed=99)
    expected = run(engine, prompt, 10, sampling)
    session.set_sampling(Sampling(temperature=1.0, seed=5))
    session.prefill(prompt)
    decode(session, 4)
    session.reset()
    session.set_sampling(sampling)
    session.prefill(prompt)
    assert decode(session, 10) == expected


def test_banning_the_greedy_token_picks_the_runner_up(engine, session):
    prompt = engine.tokenize(PROMPT)
    session.prefill(prompt)
    logits = session.logits()
    best = argmax(logits)
    runner_up = argmax([v if i != best else -math.inf for i, v in enumerate(logits)])
    session.set_sampling(Sampling(logit_bias={best: -math.inf}))
    tok = session.decode_one()
    assert tok.id == runner_up != best


@pytest.mark.parametrize("temperature", [1e-30, 1e-38, 1e-45])  # the last a subnormal float
def test_a_vanishing_temperature_samples_the_greedy_tokens(engine, temperature):
    prompt = engine.tokenize(PROMPT)
    assert run(engine, prompt, 16, Sampling(temperature=temperature, seed=3)) == run(engine, prompt, 16)


def test_a_vanishing_repetition_penalty_draws_among_the_ids_it_favours(engine, session):
    # A positive logit of a recent id divided by 1e-40 overflows a float: the ids it
    # favours are held at the largest float and share the draw (an infinity made every
    # weight NaN, and the draw fell through to the last id of the vocabulary).
    prompt = engine.tokenize(PROMPT)
    bias = {prompt[1]: 30.0}  # one recent id surely positive
    session.prefill(prompt)
    logits = session.logits()
    favoured = {t for t in prompt if logits[t] + bias.get(t, 0.0) > 0}
    drawn = set()
    for seed in range(8):
        session.reset()
        session.set_sampling(Sampling(temperature=1.0, seed=seed, repeat_penalty=1e-40, logit_bias=bias))
        session.prefill(prompt)
        drawn.add(session.decode_one().id)
    assert drawn <= favoured and len(drawn) > 1


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_bias_of_minus_inf_on_all_but_one_token_forces_it(engine, tiny_model, temperature):
    forced = tiny_model.endoftext_id
    bias = {i: -math.inf for i in range(tiny_model.n_vocab) if i != forced}
    with engine.new_session() as s:
        s.set_sampling(Sampling(temperature=temperature, seed=7, logit_bias=bias))
        s.prefill(engine.tokenize(PROMPT))
        for _ in range(5):
            tok = s.decode_one()
            # A control token: no piece, ends generation, but is not the EOS id.
            assert (tok.id, tok.piece, tok.is_eos, tok.is_terminal) == (forced, b"", False, True)


def test_forced_eos_is_flagged_as_eos(engine, tiny_model, session):
    eos = tiny_model.im_end_id
    session.set_sampling(Sampling(logit_bias={i: -math.inf for i in range(tiny_model.n_vocab) if i != eos}))
    session.prefill(engine.tokenize(PROMPT))
    tok = session.decode_one()
    assert (tok.id, tok.piece, tok.is_eos, tok.is_terminal) == (eos, b"", True, True)


@pytest.mark.parametrize("sampling, what", [
    (Sampling(logit_bias={0: math.inf}), "logit_bias value"),
    (Sampling(logit_bias={100000: -1.0}), "logit_bias token id out of range"),
    (Sampling(temperature=math.nan), "temperature"),
    (Sampling(top_p=-0.5), "top_p"),
    (Sampling(min_p=2.0), "min_p"),
    (Sampling(repeat_penalty=0.0), "repeat_penalty"),
])
def test_invalid_sampling_parameters_are_rejected(session, sampling, what):
    with pytest.raises(EngineError, match=what) as err:
        session.set_sampling(sampling)
    assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT


# ---- isolation and batching -------------------------------------------------------------------

@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_interleaved_sessions_decode_exactly_as_alone(engines, model):
    e = engines[model]
    pa, pb = e.tokenize(PROMPT), e.tokenize(OTHER_PROMPT)
    sa, sb = Sampling(), Sampling(temperature=1.0, seed=42)
    alone_a, alone_b = run(e, pa, 16, sa), run(e, pb, 16, sb)
    with e.new_session() as a, e.new_session() as b:
        a.set_sampling(sa)
        b.set_sampling(sb)
        a.prefill(pa)
        got_a, got_b = [a.decode_one().id], []
        b.prefill(pb)
        for _ in range(15):
            got_b.append(b.decode_one().id)
            got_a.append(a.decode_one().id)
        got_b.append(b.decode_one().id)
    assert (got_a, got_b) == (alone_a, alone_b)


@pytest.mark.parametrize("model", MODELS, ids=MODEL_IDS)
def test_decode_batch_equals_decode_one_token_for_token(engines, model):
    e = engines[model]
    prompts = [e.tokenize(PROMPT), e.tokenize(OTHER_PROMPT), e.tokenize("hi"), e.tokenize(PROMPT)]
    samplings = [Sampling(), Sampling(temperature=1.0, seed=3), Sampling(), Sampling(temperature=0.8, seed=4)]
    alone = [run(e, p, 12, s) for p, s in zip(prompts, samplings)]
    sessions = [e.new_session() for _ in prompts]
    try:
        for s, p, sampling in zip(sessions, prompts, samplings):
            s.set_sampling(sampling)
            s.prefill(p)
        steps = [e.decode_batch(sessions) for _ in range(12)]
    finally:
        for s in sessions:
            s.close()
    batched = [[step[i].id for step in steps] for i in range(len(prompts))]
    assert batched == alone


def test_decode_batch_reports_a_stopped_session_and_advances_the_others(engine):
    prompt = engine.tokenize(PROMPT)
    expected = run(engine, prompt, 3)
    with engine.new_session() as a, engine.new_session() as b:
        a.prefill(prompt)
        b.prefill(prompt)
        engine.decode_batch([a, b])
        b.stop()
        step = engine.decode_batch([a, b])
        assert step[0].id == expected[1]
        assert (step[1].id, step[1].piece, step[1].stopped) == (0, b"", True)
        assert (a.position, b.position) == (len(prompt) + 1, len(prompt))


def ambiguous_grammar(prefix: bytes = b"", n: int = 1100) -> str:
    """A grammar that reads `prefix`, then has more parses of the next byte than the
    matcher follows at once: a step that gets there fails ("too ambiguous")."""
    at = len(prefix)  # then the state calling rule `at + 1` (byte "a") with n returns, each reading "b"
    reads = [f"{b:02x}>{i + 1}" for i, b in enumerate(prefix)]
    calls = " ".join(f"@{at + 1}>{at + 3 + k}" for k in range(n))
    return "\n".join([f"llmd-grammar 1 {at + n + 3} 0", *reads, calls, f"61>{at + 2}", "$"]
                     + [f"62>{at + 2}"] * n) + "\n"


def test_a_session_whose_step_fails_fails_alone_in_its_batch(engine):
    prompt = engine.tokenize(PROMPT)
    expected = run(engine, prompt, 4)
    with engine.new_session() as a, engine.new_session() as b:
        a.prefill(prompt)
        b.prefill(prompt)
        b.set_grammar(ambiguous_grammar())
        step = engine.decode_batch([a, b])
        assert step[0].id == expected[0] and step[0].error is None
        assert "too ambiguous" in str(step[1].error) and (step[1].id, step[1].piece) == (0, b"")
        with pytest.raises(EngineError, match="too ambiguous"):  # alone, the step's failure is its status
            b.decode_one()
        steps = engine.decode_drafts([a, b], [expected[1:3], []])  # a verifies drafts beside it
        assert [t.id for t in steps[0]] == expected[1:4] and "too ambiguous" in str(steps[1][-1].error)
        b.set_grammar(None)  # left as a failed step leaves it: it decodes on
        assert b.decode_one().id == expected[0]


def test_a_failure_after_accepted_drafts_keeps_them_and_says_so_last(engine):
    prompt = engine.tokenize(PROMPT)
    expected = run(engine, prompt, 4)
    with engine.new_session() as s:
        s.prefill(prompt)
        s.set_grammar(ambiguous_grammar(b"".join(engine.piece(i) for i in expected[:3])))  # fails at the 3rd
        s.decode_one()
        steps = engine.decode_drafts([s], [expected[1:3]], [3])  # the first draft is accepted, then it fails
        assert [t.id for t in steps[0][:-1]] == expected[1:2] and steps[0][0].logprob is not None
        assert "too ambiguous" in str(steps[0][-1].error) and steps[0][-1].logprob is None
        assert s.position == len(prompt) + 2  # the pending token and the accepted draft
        s.set_grammar(None)
        assert s.decode_one().id == expected[2]


def test_logits_that_are_not_finite_are_an_error_not_a_token(tmp_path):
    w = build_tiny_llama()
    norm = w.tensor("output_norm.weight")
    norm.data = struct.pack(f"<{len(norm.data) // 4}f", *[math.nan] * (len(norm.data) // 4))
    with Engine(str(w.write(tmp_path / "nan.gguf")), n_threads=1, max_sessions=2) as e, e.new_session() as s:
        s.prefill([1, 2, 3])
        with pytest.raises(EngineError, match="not all finite"):
            s.decode_one()


def test_decode_batch_rejects_bad_batches(engine, tiny_model):
    with engine.new_session() as a:
        a.prefill([1, 2])
        with pytest.raises(EngineError, match="appears twice"):
            engine.decode_batch([a, a])
        with pytest.raises(EngineError, match="empty batch"):
            engine.decode_batch([])
        with Engine(tiny_model.path, n_threads=1, max_sessions=1) as other, other.new_session() as b:
            b.prefill([1, 2])
            with pytest.raises(EngineError, match="one engine"):
                engine.decode_batch([a, b])


# ---- truncate, reset, stop --------------------------------------------------------------------

@pytest.mark.parametrize("model", [GGML_F32, *FAMILIES], ids=["llama", *FAMILIES])
@pytest.mark.parametrize("keep", [0, 1, 5])
def test_truncate_then_prefill_reproduces_a_fresh_session(engines, model, keep):
    engine = engines[model]
    prompt = engine.tokenize(PROMPT)
    with engine.new_session() as fresh:
        fresh.prefill(prompt)
        fresh_logits = fresh.logits()
        fresh_ids = decode(fresh, 10)
    with engine.new_session() as s:
        s.prefill(prompt if keep else engine.tokenize(OTHER_PROMPT))
        decode(s, 7)
        s.truncate(keep)
        assert s.position == keep
        s.prefill(prompt[keep:])
        assert s.logits() == fresh_logits
        assert decode(s, 10) == fresh_ids


def test_truncate_keeps_the_prefix_after_a_different_continuation(engine):
    prompt, other = engine.tokenize(PROMPT), engine.tokenize(OTHER_PROMPT)
    expected = run(engine, prompt + other, 8)
    with engine.new_session() as s:
        s.prefill(prompt + engine.tokenize(" something else entirely"))
        s.truncate(len(prompt))
        s.prefill(other)
        assert decode(s, 8) == expected


def test_reset_empties_the_session(engine, session):
    prompt = engine.tokenize(PROMPT)
    session.prefill(engine.tokenize(OTHER_PROMPT))
    decode(session, 3)
    session.reset()
    assert session.position == 0
    session.prefill(prompt)
    assert decode(session, 8) == run(engine, prompt, 8)


def test_stop_gives_stopped_steps_until_set_sampling(engine, session):
    prompt = engine.tokenize(PROMPT)
    expected = run(engine, prompt, 6)
    session.prefill(prompt)
    got = decode(session, 3)
    position = session.position
    session.stop()
    for _ in range(2):
        tok = session.decode_one()
        assert (tok.id, tok.piece, tok.stopped, tok.is_eos, tok.is_terminal) == (0, b"", True, False, False)
        assert session.position == position
    session.set_sampling(Sampling())
    got += decode(session, 3)
    assert got == expected  # the stop left the sequence untouched


# ---- errors ---------------------------------------------------------------------------------

def test_token_id_out_of_range_is_a_token_error_and_changes_nothing(engine, session, tiny_model):
    prompt = engine.tokenize(PROMPT)
    session.prefill(prompt)
    logits = session.logits()
    for bad in (tiny_model.n_vocab, -1, 2**31 - 1):
        with pytest.raises(TokenError, match=f"token id {bad} at index 1 is outside the vocabulary"):
            session.prefill([5, bad])
    assert session.position == len(prompt)
    assert session.logits() == logits


def test_prefill_past_n_ctx_is_context_full_and_changes_nothing(engine, session, tiny_model):
    prompt = engine.tokenize(PROMPT)
    session.prefill(prompt)
    logits = session.logits()
    with pytest.raises(ContextFullError, match=f"do not fit the context of {tiny_model.n_ctx}"):
        session.prefill([7] * (tiny_model.n_ctx - len(prompt) + 1))
    assert session.position == len(prompt)
    assert session.logits() == logits
    assert decode(session, 5) == run(engine, prompt, 5)


def test_decoding_past_n_ctx_is_context_full(engine, session, tiny_model):
    session.prefill([7] * (tiny_model.n_ctx - 1))
    session.decode_one()  # samples; nothing fed yet
    session.decode_one()  # feeds the pending token: the context is now full
    assert session.position == tiny_model.n_ctx
    with pytest.raises(ContextFullError, match="the context is full"):
        session.decode_one()


def test_decode_before_prefill_is_a_state_error(session):
    with pytest.raises(EngineError, match="decode needs a prefill first") as err:
        session.decode_one()
    assert err.value.status == lib.LLMD_ERR_STATE


def test_decode_after_truncate_needs_a_prefill(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    session.truncate(3)
    with pytest.raises(EngineError, match="decode needs a prefill first"):
        session.decode_one()


def test_empty_prefill_is_an_invalid_argument(session):
    with pytest.raises(EngineError, match="at least one token") as err:
        session.prefill([])
    assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT


@pytest.mark.parametrize("pos", [-1, 4])
def test_truncate_out_of_range_is_rejected(session, pos):
    session.prefill([1, 2, 3])
    with pytest.raises(EngineError, match=rf"truncate position {pos} is outside 0\.\.3") as err:
        session.truncate(pos)
    assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT
    assert session.position == 3


def test_closed_session_raises_instead_of_crashing(engine):
    s = engine.new_session()
    s.prefill([1, 2])
    s.close()
    s.close()  # idempotent
    for call in (lambda: s.prefill([1]), s.decode_one, lambda: s.position, s.reset, s.logits):
        with pytest.raises(EngineError, match="the session is closed"):
            call()
    s.stop()  # a no-op, never a crash


def test_freed_native_handle_is_refused_not_followed(engine):
    s = engine.new_session()
    handle = s.handle
    s.close()
    ids = ffi.new("int32_t[]", [1, 2])
    assert lib.llmd_session_prefill(handle, ids, 2) == lib.LLMD_ERR_HANDLE
    assert b"freed or invalid" in ffi.string(lib.llmd_last_error())
    pos = ffi.new("int32_t *")
    assert lib.llmd_session_position(handle, pos) == lib.LLMD_ERR_HANDLE
    lib.llmd_session_free(handle)  # a second free is ignored
    lib.llmd_session_stop(handle)


def test_sessions_past_max_sessions_are_a_capacity_error(tiny_model):
    with Engine(tiny_model.path, n_threads=1, max_sessions=2) as e:
        a, b = e.new_session(), e.new_session()
        with pytest.raises(CapacityError, match="all 2 session slots are in use"):
            e.new_session()
        a.close()
        c = e.new_session()  # the freed slot is reusable
        c.prefill([1])
        b.close()
        c.close()


def test_closing_the_engine_frees_its_sessions(tiny_model):
    e = Engine(tiny_model.path, n_threads=1, max_sessions=2)
    s = e.new_session()
    s.prefill([1, 2, 3])
    e.close()
    with pytest.raises(EngineError, match="closed"):
        s.decode_one()
    with pytest.raises(EngineError, match="the engine is closed"):
        e.new_session()
    with pytest.raises(EngineError, match="the engine is closed"):
        e.tokenize("x")
    s.close()
    e.close()  # idempotent


# ---- score ------------------------------------------------------------------------------------

@pytest.mark.parametrize("first", [0, 3])
def test_score_gives_the_log_probs_the_logits_imply(engine, session, first):
    ids = engine.tokenize(PROMPT)
    scores = session.score(ids, first)
    assert len(scores) == len(ids) - 1 - first
    assert all(s <= 0.0 for s in scores)
    assert session.position == len(ids)
    for i in (first, len(ids) - 2):
        with engine.new_session() as s:
            s.prefill(ids[:i + 1])
            expected = log_softmax(s.logits(), ids[i + 1])
        assert scores[i - first] == pytest.approx(expected, abs=1e-4)


def test_score_rejects_bad_ranges(session):
    with pytest.raises(EngineError, match="score needs n >= 2"):
        session.score([1, 2, 3], 2)
    with pytest.raises(EngineError, match="score needs n >= 2"):
        session.score([1], 0)


def top_of(logits: list[float], n: int) -> list[tuple[int, float]]:
    """The n most likely ids (lower id first on ties) with their log-probabilities."""
    order = sorted(range(len(logits)), key=lambda v: (-logits[v], v))[:n]
    return [(v, log_softmax(logits, v)) for v in order]


def test_score_top_lists_each_positions_most_likely_tokens(engine, session):
    ids = engine.tokenize(PROMPT)
    scored = session.score_top(ids, 1, 5)
    assert [lp for lp, _ in scored] == session_scores(engine, ids, 1)
    for i in (1, len(ids) - 2):
        with engine.new_session() as s:
            s.prefill(ids[:i + 1])
            expected = top_of(s.logits(), 5)
        top = scored[i - 1][1]
        assert [v for v, _ in top] == [v for v, _ in expected]
        assert [lp for _, lp in top] == pytest.approx([lp for _, lp in expected], abs=1e-4)


def session_scores(engine, ids, first):
    with engine.new_session() as s:
        return s.score(ids, first)


def test_token_logprobs_are_of_the_raw_logits_whatever_the_sampling(engine, session):
    ids = engine.tokenize(PROMPT)
    session.prefill(ids)
    logits = session.logits()
    session.set_sampling(Sampling(temperature=0.7, top_k=3, seed=5, logit_bias={argmax(logits): -5.0}))
    [tok] = engine.decode_batch([session], [3])
    assert tok.logprob == pytest.approx(log_softmax(logits, tok.id), abs=1e-4)
    assert [v for v, _ in tok.top] == [v for v, _ in top_of(logits, 3)]
    assert [lp for _, lp in tok.top] == pytest.approx([lp for _, lp in top_of(logits, 3)], abs=1e-4)
    [plain] = engine.decode_batch([session])
    assert plain.logprob is None and plain.top == ()


def test_top_logprobs_count_is_bounded(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    session.decode_one()
    with pytest.raises(EngineError, match="n_top must be 0..20"):
        session.token_logprobs(21)
    assert session.token_logprobs(20)[1][0][1] >= session.token_logprobs(20)[1][19][1]


def test_token_logprobs_need_a_sampled_token(engine, session):
    session.prefill(engine.tokenize(PROMPT))
    with pytest.raises(EngineError, match="decode first"):
        session.token_logprobs(0)


# ---- tokenizer --------------------------------------------------------------------------------

def test_control_token_text_is_parsed_only_with_special(engine, tiny_model):
    text = "<|im_start|>user\nhi<|im_end|>"
    with_special = engine.tokenize(text, special=True)
    assert with_special[0] == tiny_model.im_start_id
    assert with_special[-1] == tiny_model.im_end_id
    without = engine.tokenize(text)
    assert not {tiny_model.im_start_id, tiny_model.im_end_id} & set(without)
    assert engine.detokenize(without) == text.encode()
    assert engine.detokenize(with_special, special=True) == text.encode()
    assert engine.detokenize(with_special) == b"user\nhi"


def test_control_token_piece_is_empty_unless_special(engine, tiny_model):
    for token_id, text in ((tiny_model.im_start_id, b"<|im_start|>"), (tiny_model.im_end_id, b"<|im_end|>"),
                           (tiny_model.endoftext_id, b"<|endoftext|>")):
        assert engine.piece(token_id) == b""
        assert engine.piece(token_id, special=True) == text


def test_piece_of_an_unknown_id_is_a_token_error(engine, tiny_model):
    for bad in (-1, tiny_model.n_vocab):
        with pytest.raises(TokenError, match="outside the vocabulary"):
            engine.piece(bad)


def test_merges_join_frequent_pairs(engine, tiny_model):
    # " the" is the most frequent word of the writer's merge text: one token.
    assert engine.tokenize(" the") == [tiny_model.tokens.index("Ġthe")]
    assert engine.piece(tiny_model.tokens.index("Ġthe")) == b" the"


def test_random_bytes_round_trip(engine):
    rng = random.Random(7)
    for n in range(1, 120, 3):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert engine.detokenize(engine.tokenize(data)) == data
        assert engine.detokenize(engine.tokenize(data, special=True), special=True) == data


def test_unicode_text_round_trips(engine):
    text = "héllo wörld — 日本語 🙂 12345 tabs\tand\nnewlines  "
    assert engine.detokenize(engine.tokenize(text)).decode() == text


def test_empty_text_has_no_tokens(engine):
    assert engine.tokenize("") == []
    assert engine.tokenize(b"", special=True) == []


def test_live_sessions_counts_the_engines_own_sessions_until_freed(tiny_model):
    with Engine(tiny_model.path, n_threads=1, max_sessions=4) as engine, \
            Engine(tiny_model.path, n_threads=1, max_sessions=4) as other:
        assert engine.live_sessions() == 0
        first, second = engine.new_session(), engine.new_session()
        other.new_session()  # another engine's sessions are not counted
        assert engine.live_sessions() == 2 and other.live_sessions() == 1
        first.close()
        first.close()  # freeing twice frees once
        assert engine.live_sessions() == 1
        second.close()
        assert engine.live_sessions() == 0
    n = ffi.new("int32_t *")
    assert lib.llmd_engine_live_sessions(ffi.NULL, n) == lib.LLMD_ERR_INVALID_ARGUMENT


# ---- model metadata -------------------------------------------------------------------

@pytest.mark.parametrize("declared, expected", [(None, 0), (1, 1), (3, 3)])
def test_pooling_type_is_what_the_file_declares(tiny_llama_factory, declared, expected):
    extra = [] if declared is None else [("llama.pooling_type", U32, declared)]
    with Engine(str(tiny_llama_factory(extra_metadata=tuple(extra)).path), n_ctx=64, max_sessions=1) as e:
        assert e.pooling_type() == expected


def test_unknown_pooling_type_is_a_format_error(tiny_llama_factory):
    with Engine(str(tiny_llama_factory(extra_metadata=(("llama.pooling_type", U32, 9),)).path), n_ctx=64,
                max_sessions=1) as e:
        with pytest.raises(EngineError, match="pooling_type 9 is unknown"):
            e.pooling_type()


def test_more_threads_than_an_engine_may_start_are_refused(tiny_llama_factory):
    path = str(tiny_llama_factory().path)
    with pytest.raises(EngineError, match="at most 256"):
        Engine(path, n_threads=100_000, n_ctx=64, max_sessions=1)
    with Engine(path, n_threads=256, n_ctx=64, max_sessions=1) as e, e.new_session() as s:
        s.prefill([1, 2, 3])


# ---- every weight type, on a model whose rows are whole K-quant super-blocks ---------

WIDE_TYPES = [GGML_BF16, GGML_Q5_0, GGML_Q5_1, GGML_IQ4_NL, GGML_MXFP4, GGML_Q2_K, GGML_Q3_K, GGML_Q4_K,
              GGML_Q5_K, GGML_Q6_K, GGML_IQ4_XS]


@pytest.mark.parametrize("weight_type", WIDE_TYPES, ids=[TYPE_NAMES[t] for t in WIDE_TYPES])
def test_every_weight_type_runs_and_prefill_equals_token_by_token(tiny_llama_factory, weight_type):
    """All matrices (the tied embedding too) of the type: the logits after a prompt are
    bit-identical whether it was prefilled in one batch or one token at a time."""
    model = tiny_llama_factory(weight_type=weight_type, n_embd=256, n_ff=512, n_head=4, n_head_kv=2)
    with Engine(model.path, n_threads=2, max_sessions=4) as e:
        ids = e.tokenize(PROMPT)
        with e.new_session() as whole, e.new_session() as single:
            whole.prefill(ids)
            for token in ids:
                single.prefill([token])
            logits = whole.logits()
            assert all(math.isfinite(v) for v in logits)
            assert logits == single.logits()
            assert len(set(logits)) > 100  # the weights were read, not zeros
            assert decode(whole, 4) == decode(single, 4)


# ---- the bandwidth limit (llmd_engine_bandwidth, native/src/runtime/bandwidth.cpp) ------------

MIB = 1 << 20


def test_bandwidth_counts_every_weight_of_a_tied_model(tiny_llama_factory):
    model = tiny_llama_factory()  # F32: nothing is repacked, so weight_bytes is the file's tensors
    with Engine(model.path, n_threads=2) as e:
        per_token, rate = e.bandwidth(MIB, passes=3)
        assert per_token == e.info.weight_bytes == model.weight_bytes
        assert rate > 0


def test_bandwidth_counts_one_row_of_an_untied_embedding(tiny_llama_factory):
    model = tiny_llama_factory(tied=False)
    with Engine(model.path, n_threads=2) as e:
        per_token, _ = e.bandwidth(MIB, passes=1)
    embedding = model.n_vocab * model.n_embd * 4
    assert per_token == model.weight_bytes - embedding + model.n_embd * 4


def test_bandwidth_counts_only_the_experts_a_token_uses(tmp_path):
    path = build_tiny_qwen3moe(n_expert=8, n_expert_used=2).write(tmp_path / "moe.gguf")
    with Engine(str(path), n_threads=2) as e:
        per_token, _ = e.bandwidth(MIB, passes=1)
        weight_bytes, n_vocab, n_embd, n_layer = e.info.weight_bytes, e.info.n_vocab, e.info.n_embd, e.info.n_layer
    experts = n_layer * 3 * 8 * 32 * n_embd * 4  # gate, up, down: 8 experts of 32 × n_embd F32
    assert per_token == weight_bytes - (n_vocab * n_embd * 4 - n_embd * 4) - experts * 6 // 8


@pytest.mark.parametrize("nbytes, passes, match", [(MIB - 1, 1, "bytes"), ((64 << 30) + 1, 1, "bytes"),
                                                   (MIB, 0, "passes"), (MIB, 101, "passes")])
def test_bandwidth_refuses_bad_arguments(engine, nbytes, passes, match):
    with pytest.raises(EngineError, match=match):
        engine.bandwidth(nbytes, passes)
