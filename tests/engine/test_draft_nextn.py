"""llmd_session_draft_nextn: drafts from a Qwen3.5 or GLM-4.5 file's multi-token-prediction block.

An engine opened with draft_nextn runs the block beside the model on every token a
session takes (prefill, plain and verified steps, scoring), each token paired with the
model's final-normed state of the position before it, so the block's keys and values
follow the session; a draft chains the block's greedy guesses after the pending token.
Checked against llama.cpp's MTP drafting on tiny random models (GOLDEN), and for what
llama.cpp cannot show: drafts that do not depend on how the tokens entered the session
(chunks, plain steps, accepted drafts), outputs that the block never changes, and
sessions whose caches are cut, exported and freed with nothing left over.

Golden drafts: `python -m tests.support.make_mtp_golden LLAMA_DIR` (llama.cpp of the
llama-cpp-python 0.3.36 sdist) on exactly the models nextn_model() writes: per round,
the target's greedy token, the block's 3 drafts after it with the gaps between its top
two logits, and the drafts accepted. A draft is compared up to the first gap under
NEAR_TIE in its round (a near tie may fall either way between kernel variants).
"""
from __future__ import annotations

import pytest

from llmd.engine.native import Engine, EngineError, Sampling, UnsupportedError
from tests.engine.test_arch import N_CTX, PROMPT_TOKENS, TEXT
from tests.engine.test_arch_qwen35 import CONFIGS
from tests.support.gguf_writer import build_tiny_glm4, build_tiny_qwen35

DRAFTS = 3
NEAR_TIE = 0.02
# name -> per round (target token, drafts, their top-1 minus top-2 logit gaps, drafts accepted)
GOLDEN = {
    "qwen35": [(211, [71, 34, 51], [0.01, 0.226, 0.775], 0), (201, [113, 288, 133], [0.394, 0.032, 0.408], 0),
               (282, [255, 276, 212], [0.485, 0.421, 1.661], 0), (145, [32, 73, 285], [0.256, 0.057, 0.573], 0)],
    "qwen35moe": [(277, [170, 256, 156], [0.065, 1.419, 0.061], 0), (47, [273, 66, 154], [0.225, 0.295, 0.071], 0),
                  (175, [225, 23, 8], [1.045, 0.241, 0.344], 0), (201, [37, 129, 195], [0.139, 0.137, 0.957], 0)],
    "glm4moe": [(184, [22, 243, 236], [0.03, 0.724, 0.164], 0), (230, [40, 22, 243], [0.505, 0.063, 0.617], 0),
                (205, [40, 86, 243], [0.466, 0.029, 0.31], 1), (157, [40, 22, 243], [0.35, 0.103, 0.841], 0)],
}
FAMILIES = list(GOLDEN)
# name -> the builder of its model and the options beside a block
MODELS = {"qwen35": (build_tiny_qwen35, CONFIGS["qwen35"]), "qwen35moe": (build_tiny_qwen35, CONFIGS["qwen35moe"]),
          "glm4moe": (build_tiny_glm4, dict(arch="glm4moe", qk_norm=True, seed=2))}


def nextn_model(name: str):
    builder, options = MODELS[name]
    return builder(n_ctx=N_CTX, nextn=1, **options)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("nextn")
    return {name: nextn_model(name).write(root / f"{name}.gguf") for name in FAMILIES}


@pytest.fixture(scope="module")
def engines(paths):
    opened = {name: Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=4, draft_nextn=True)
              for name, path in paths.items()}
    yield opened
    for e in opened.values():
        e.close()


def prompt_of(engine: Engine) -> list[int]:
    return engine.tokenize(TEXT)[:PROMPT_TOKENS]


def rounds(engine: Engine, n: int, prompt: list[int]) -> list[tuple[int, list[int], int]]:
    """n rounds of greedy speculative decoding with the block's drafts, as the golden
    program runs them: (pending token, drafts, accepted) each."""
    out = []
    with engine.new_session() as s:
        s.prefill(prompt)
        token = s.decode_one().id
        for _ in range(n):
            draft = s.draft_nextn(DRAFTS)
            steps = engine.decode_drafts([s], [draft])[0]
            out.append((token, draft, len(steps) - 1))
            token = steps[-1].id
    return out


@pytest.mark.parametrize("name", FAMILIES)
def test_drafts_match_llama_cpp_up_to_a_near_tie(engines, name):
    engine = engines[name]
    for got, (token, drafts, gaps, accepted) in zip(rounds(engine, len(GOLDEN[name]), prompt_of(engine)),
                                                    GOLDEN[name], strict=True):
        assert got[0] == token and got[2] == accepted
        sure = next((i for i, gap in enumerate(gaps) if gap < NEAR_TIE), len(gaps))
        assert got[1][:sure] == drafts[:sure], (got, drafts)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_block_leaves_the_model_s_tokens_and_logprobs_as_they_are(engines, paths, name):
    prompt = prompt_of(engines[name])
    with Engine(str(paths[name]), n_threads=2, n_ctx=N_CTX, max_sessions=1) as plain, plain.new_session() as s:
        s.prefill(prompt)
        want = [s.decode_one() for _ in range(12)]
    with engines[name].new_session() as s:
        s.prefill(prompt)
        got = [s.decode_one() for _ in range(12)]
    assert got == want


def drafts_after(engine: Engine, prompt: list[int], feed) -> list[int]:
    """The drafts after a session took prompt, then whatever feed(session) does."""
    with engine.new_session() as s:
        feed(s, prompt)
        return s.draft_nextn(DRAFTS)


@pytest.mark.parametrize("name", FAMILIES)
def test_drafts_do_not_depend_on_how_the_tokens_entered_the_session(engines, name):
    """The block's memory after a prefill in one chunk or two, plain steps, or verified
    drafts (all accepted, or some) is the same, and so are the drafts that follow."""
    engine = engines[name]
    prompt = prompt_of(engine)
    with engine.new_session() as s:
        s.prefill(prompt)
        greedy = [s.decode_one().id for _ in range(6)]  # the 6th is pending

    def plain_steps(s, p):
        s.prefill(p)
        for _ in range(6):
            s.decode_one()

    def in_two_chunks(s, p):
        s.prefill(p[:10])
        s.prefill(p[10:])
        for _ in range(6):
            s.decode_one()

    def verified(drafts_per_step):
        def feed(s, p):
            s.prefill(p)
            s.decode_one()
            for draft in drafts_per_step:
                engine.decode_drafts([s], [draft])
        return feed

    want = drafts_after(engine, prompt, plain_steps)
    assert drafts_after(engine, prompt, in_two_chunks) == want
    assert drafts_after(engine, prompt, verified([greedy[1:5]])) == want  # all 4 accepted
    wrong = (greedy[3] + 1) % engine.info.n_vocab
    assert drafts_after(engine, prompt, verified([[greedy[1], greedy[2], wrong], [greedy[4]]])) == want


def test_sessions_drafting_side_by_side_each_get_their_own_drafts(engines):
    engine = engines["qwen35"]
    prompts = [prompt_of(engine), prompt_of(engine)[5:]]
    alone = [drafts_after(engine, p, lambda s, q: (s.prefill(q), s.decode_one())) for p in prompts]
    sessions = [engine.new_session() for _ in prompts]
    try:
        for s, p in zip(sessions, prompts):
            s.prefill(p)
        engine.decode_batch(sessions)
        assert [s.draft_nextn(DRAFTS) for s in sessions] == alone
        engine.decode_drafts(sessions, [s.draft_nextn(2) for s in sessions])  # one pass for both
        after = [s.draft_nextn(DRAFTS) for s in sessions]
    finally:
        for s in sessions:
            s.close()
    for s_prompt, got in zip(prompts, after):
        def two_steps(s, q):
            s.prefill(q)
            s.decode_one()
            engine.decode_drafts([s], [s.draft_nextn(2)])
        assert drafts_after(engine, s_prompt, two_steps) == got


def test_drafts_stop_where_the_context_would_not_hold_them(engines):
    engine = engines["qwen35"]
    with engine.new_session() as s:
        s.prefill(prompt_of(engine) * (N_CTX // PROMPT_TOKENS))  # N_CTX - N_CTX % PROMPT_TOKENS tokens
        s.prefill([5] * (N_CTX - s.position - 2))
        s.decode_one()  # pending at N_CTX - 2: one draft fits
        assert len(s.draft_nextn(DRAFTS)) == 1
        assert s.draft_nextn(0) == []


def test_drafting_is_refused_clearly(engines, paths, tiny_llama_factory):
    engine = engines["qwen35"]
    with engine.new_session() as s:
        with pytest.raises(EngineError, match="drafts follow a pending token"):
            s.draft_nextn(DRAFTS)
        s.prefill(prompt_of(engine))
        s.decode_one()
        with pytest.raises(EngineError, match="k 33 is more than 32"):
            s.draft_nextn(33)
    with Engine(str(paths["qwen35"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as plain, plain.new_session() as s:
        assert plain.info.n_layer_nextn == 1 and not plain.info.draft_nextn
        s.prefill(prompt_of(plain))
        s.decode_one()
        with pytest.raises(EngineError, match="opened without draft_nextn"):
            s.draft_nextn(DRAFTS)
    with pytest.raises(UnsupportedError, match="no multi-token-prediction block to draft with"):
        Engine(tiny_llama_factory(n_ctx=N_CTX).path, n_threads=1, max_sessions=1, draft_nextn=True)


def test_the_block_s_memory_is_counted_and_freed_with_its_sessions(engines, paths):
    engine = engines["qwen35moe"]
    with Engine(str(paths["qwen35moe"]), n_threads=1, n_ctx=N_CTX, max_sessions=1) as plain:
        # one more attention block's keys and values a position, and its input state
        assert engine.info.kv_bytes_per_token > plain.info.kv_bytes_per_token
        assert engine.info.bytes_per_session > plain.info.bytes_per_session
    with engine.new_session() as s:
        s.prefill(prompt_of(engine))
        s.decode_one()
        engine.decode_drafts([s], [s.draft_nextn(DRAFTS)])
        assert engine.kv_stats().blocks_live > 0
    assert engine.kv_stats().blocks_live == 0 and engine.live_sessions() == 0


@pytest.mark.parametrize("name", FAMILIES)
def test_a_session_cut_or_restored_drafts_on(engines, name):
    """Where the state before the next position is not kept (a cut to a checkpoint, an
    imported state, which holds none of the block's memory), the block starts from
    zeros as at position 0: drafts go on (as proposals only), and the outputs stay the
    plain ones."""
    engine = engines[name]
    prompt = prompt_of(engine)
    with engine.new_session() as s:
        s.prefill(prompt)
        s.prefill([7, 8, 9])
        want = [s.decode_one().id for _ in range(4)]
        state = s.export_state(len(prompt) + 3)
        s.truncate(len(prompt))  # the checkpoint where the second prefill started
        s.prefill([7, 8, 9])
        s.decode_one()
        assert len(s.draft_nextn(DRAFTS)) == DRAFTS
        assert [t.id for t in engine.decode_drafts([s], [s.draft_nextn(DRAFTS)])[0]][0] == want[1]
    with engine.new_session() as s:
        s.import_state(state)
        s.prefill([want[0]])
        got = [s.decode_one().id]
        draft = s.draft_nextn(DRAFTS)
        assert len(draft) == DRAFTS and all(0 <= i < engine.info.n_vocab for i in draft)
        got += [t.id for t in engine.decode_drafts([s], [draft])[0]]
    assert got[:2] == want[1:3]


def test_drafts_never_hold_an_id_the_request_bans(engines):
    engine = engines["qwen35"]
    with engine.new_session() as s:
        s.prefill(prompt_of(engine))
        s.decode_one()
        first = s.draft_nextn(DRAFTS)
        s.set_sampling(Sampling(logit_bias={first[0]: float("-inf")}))
        assert s.draft_nextn(DRAFTS)[0] != first[0]
        s.set_sampling(Sampling(logit_bias={7: 100.0}))
        assert s.draft_nextn(DRAFTS) == [7] * DRAFTS
