"""llmd/serving/draft_model.py on tiny models: the vocabulary check, and a drafter whose
draft session mirrors the generation's tokens (warm, cut back, caught up in chunks)
and proposes what the draft model decodes greedily."""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine, Sampling
from llmd.serving.draft_model import CATCH_UP, ModelDrafter, open_draft_session, vocab_difference
from llmd.serving.speculative import DraftLimits
from tests.support.gguf_writer import GGML_Q4_0, build_tiny_llama, build_tiny_qwen35

N_CTX = 1024


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """name -> a tiny model file: a llama, its Q4_0 twin (the same random weights,
    quantized), a qwen35 (Gated DeltaNet), a llama with a longer vocabulary and one
    with the same length but other tokens."""
    d = tmp_path_factory.mktemp("draft")
    builds = {"llama": build_tiny_llama(n_ctx=N_CTX), "llama_q4_0": build_tiny_llama(n_ctx=N_CTX, weight_type=GGML_Q4_0),
              "qwen35": build_tiny_qwen35(n_ctx=N_CTX), "longer": build_tiny_llama(n_ctx=N_CTX, n_vocab=320),
              "other": build_tiny_llama(n_ctx=N_CTX, reserved=8)}
    return {name: str(w.write(d / f"{name}.gguf")) for name, w in builds.items()}


@pytest.fixture(scope="module")
def engines(paths):
    opened = {name: Engine(path, n_threads=1, n_ctx=N_CTX, max_sessions=4) for name, path in paths.items()}
    yield opened
    for e in opened.values():
        e.close()


def test_a_vocabulary_of_the_same_tokens_may_draft(engines):
    assert vocab_difference(engines["llama"], engines["llama_q4_0"]) is None
    assert vocab_difference(engines["llama"], engines["qwen35"]) is None  # the same tokenizer, another family


def test_another_vocabulary_is_named_by_what_differs(engines):
    assert vocab_difference(engines["llama"], engines["longer"]) == "its vocabulary has 320 tokens, the model's 300"
    why = vocab_difference(engines["llama"], engines["other"])
    assert why is not None and why.startswith("token ") and "in the model and" in why


def greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    with engine.new_session() as s:
        s.prefill(prompt)
        s.set_sampling(Sampling())
        return [s.decode_one().id for _ in range(n)]


def prompt_of(engine: Engine, text: str = "the quick brown fox jumps over the lazy dog") -> list[int]:
    return engine.tokenize(text)


@pytest.mark.parametrize("draft_name", ["llama", "qwen35"])
def test_proposals_are_the_draft_models_greedy_continuation_and_the_session_mirrors_the_tokens(engines, draft_name):
    """Whatever was accepted, each proposal continues the tokens as the draft model
    would, and the draft session holds exactly the tokens and the proposal but its last
    id (a recurrent draft model rewinds to its checkpoints for it)."""
    target, draft_engine = engines["llama"], engines[draft_name]
    draft = open_draft_session(draft_engine)
    try:
        tokens = prompt_of(target)
        drafter = ModelDrafter(draft, tokens, keep=0, limits=DraftLimits(n_max=6))
        for accepted in (4, 0, 3, 8, 1):  # pretend the target took that many drafts, then its own token
            proposal = drafter.propose(16)
            assert proposal == greedy(draft_engine, drafter.tokens, len(proposal)) and proposal
            assert draft.session.tokens() == draft.resident == drafter.tokens + proposal[:-1]
            taken = proposal[:accepted] + [(proposal[min(accepted, len(proposal) - 1)] + 1) % 300]
            drafter.record(len(proposal), min(accepted, len(proposal)))
            drafter.extend(taken)
    finally:
        draft.session.close()


def test_drafts_never_hold_a_token_the_request_bans(engines):
    draft = open_draft_session(engines["llama"])
    try:
        tokens = prompt_of(engines["llama"])
        favourite = greedy(engines["llama"], tokens, 1)[0]
        proposal = ModelDrafter(draft, tokens, keep=0, logit_bias={favourite: float("-inf")}).propose(4)
        assert proposal and favourite not in proposal
        assert ModelDrafter(draft, tokens, keep=0).propose(4)[0] == favourite  # the next request's bias is its own
    finally:
        draft.session.close()


def test_a_new_generation_reuses_no_more_of_the_draft_cache_than_the_target_kept(engines):
    draft = open_draft_session(engines["llama"])
    prefilled: list[int] = []
    prefill = draft.session.prefill
    draft.session.prefill = lambda ids: (prefilled.append(len(ids)), prefill(ids))
    try:
        tokens = prompt_of(engines["llama"])
        first = ModelDrafter(draft, tokens, keep=0)
        first.propose(4)
        assert prefilled == [len(tokens)]
        again = tokens + [5, 6]
        ModelDrafter(draft, again, keep=len(tokens)).propose(4)  # warm: only what is new
        assert prefilled[1] == len(again) - len(tokens)
        ModelDrafter(draft, again, keep=0).propose(4)  # the target reused nothing: neither does the draft
        assert prefilled[2] == len(again)
    finally:
        draft.session.close()


def test_a_long_prompt_is_caught_up_with_in_chunks_before_drafting(engines):
    draft = open_draft_session(engines["llama"])
    try:
        tokens = (prompt_of(engines["llama"]) * 40)[:CATCH_UP * 2 + 10]
        drafter = ModelDrafter(draft, tokens, keep=0)
        assert drafter.propose(4) == [] and draft.session.position == CATCH_UP
        assert drafter.propose(4) == [] and draft.session.position == 2 * CATCH_UP
        assert drafter.propose(4) == greedy(engines["llama"], tokens, 4)
    finally:
        draft.session.close()


def test_no_proposal_runs_past_the_draft_models_context(engines):
    draft = open_draft_session(engines["llama"])
    try:
        tokens = (prompt_of(engines["llama"]) * 80)[:N_CTX - 2]
        drafter = ModelDrafter(draft, tokens[:CATCH_UP], keep=0, limits=DraftLimits(n_max=8))
        drafter.propose(8)
        drafter.extend(tokens[CATCH_UP:])
        while not (proposal := drafter.propose(8)):  # catching up
            pass
        assert len(proposal) == 3  # 2 fit the cache beside the tokens, the last is pending
        drafter.extend([1, 2, 3])
        assert drafter.propose(8) == []
    finally:
        draft.session.close()
