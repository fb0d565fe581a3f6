"""llmd_session_decode_drafts: speculative verification is exact.

A verification step runs the pending token and drafted ids of each of its sessions
through one forward pass and samples each position as decode_one would, so whatever
the drafts (right, wrong, long, short) and whatever else shares the pass, the tokens,
their logprobs and the session after it equal plain decoding's, bit for bit, greedy
or sampled with a seed, on an attention-only model and on hybrid recurrent ones
(whose rejected drafts are rolled back to the states the pass kept after its first
positions, the accepted tokens after those run again).
"""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from llmd._native import lib
from llmd.engine.native import Engine, EngineError, Sampling
from tests.engine.test_engine_grammar import PERSON, schema_grammar
from tests.support.gguf_writer import build_tiny_granitehybrid, build_tiny_lfm2, build_tiny_qwen35

N_CTX = 256
STEPS = 60


@pytest.fixture(scope="module")
def engines(tiny_llama_factory, tmp_path_factory):
    """name -> an engine: a llama, and the hybrid qwen35 (Gated DeltaNet), lfm2 (short
    convolution) and granitehybrid (Mamba-2)."""
    paths = {"llama": tiny_llama_factory(n_ctx=N_CTX).path}
    for name, build in (("qwen35", build_tiny_qwen35), ("lfm2", build_tiny_lfm2),
                        ("granitehybrid", build_tiny_granitehybrid)):
        paths[name] = tmp_path_factory.mktemp("spec") / f"{name}.gguf"
        build(n_ctx=N_CTX).write(paths[name])
    opened = {name: Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=4) for name, path in paths.items()}
    yield opened
    for e in opened.values():
        e.close()


ARCHS = ["llama", "qwen35", "lfm2", "granitehybrid"]
SAMPLINGS = {
    "greedy": Sampling(),
    "sampled": Sampling(temperature=1.3, top_k=40, seed=7, presence_penalty=0.3, repeat_penalty=1.1,
                        logit_bias={5: 2.0}),
}


def prompt_of(engine: Engine, text: str = "the quick brown fox jumps over the lazy dog, and then the quick brown fox"
              ) -> list[int]:
    return engine.tokenize(text)[:40]


def plain(engine: Engine, sampling: Sampling, steps: int, prompt: list[int] | None = None
          ) -> list[tuple[int, float, tuple]]:
    """decode_one steps: (id, logprob, top 3) of each."""
    with engine.new_session() as s:
        s.prefill(prompt or prompt_of(engine))
        s.set_sampling(sampling)
        out = []
        for _ in range(steps):
            t = s.decode_one()
            out.append((t.id, *s.token_logprobs(3)))
        return out


def speculative(engine: Engine, sampling: Sampling, steps: int, drafts) -> tuple[list, list[int]]:
    """The same steps with decode_draft, each drafting drafts(step index) ids; and the
    session's tokens at the end (the KV cache's ids: every token but the pending one)."""
    with engine.new_session() as s:
        s.prefill(prompt_of(engine))
        s.set_sampling(sampling)
        out = [(t.id, t.logprob, t.top) for t in s.decode_draft([], logprobs=3)]
        while len(out) < steps:
            draft = drafts(len(out))[:steps - len(out) - 1]
            out += [(t.id, t.logprob, t.top) for t in s.decode_draft(draft, logprobs=3)]
        return out, s.tokens()


def mostly_right(ids: list[int], n_vocab: int, longest: int):
    """drafts(i) for speculative(): the ids from step i on, up to `longest` of them (a
    seeded random length, 0 included), half the time with one of them wrong."""
    rng = random.Random(3)

    def drafts(i: int) -> list[int]:
        draft = ids[i:i + rng.randint(0, longest)]
        if draft and rng.random() < 0.5:
            wrong = rng.randrange(len(draft))
            draft[wrong] = (draft[wrong] + 1) % n_vocab
        return draft

    return drafts


@pytest.mark.parametrize("sampling", SAMPLINGS)
@pytest.mark.parametrize("arch", ARCHS)
def test_verified_drafts_give_exactly_the_tokens_and_logprobs_of_plain_decoding(engines, arch, sampling):
    engine = engines[arch]
    reference = plain(engine, SAMPLINGS[sampling], STEPS)
    ids = [r[0] for r in reference]
    got, tokens = speculative(engine, SAMPLINGS[sampling], STEPS, mostly_right(ids, engine.info.n_vocab, 8))
    assert got == reference  # ids, and logprobs and top lists bit for bit
    assert tokens == prompt_of(engine) + ids[:-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_sessions_verifying_in_one_pass_each_get_their_own_plain_decoding(engines, arch):
    """Three sessions (other prompts and samplings, logprobs of 3, none and 0 top ones)
    start one after another and verify drafts of any length, right or wrong, in one call
    a step (a session's first step samples its prefill's logits in the same call, and a
    session without drafts takes a plain step in it): each gets what plain decoding
    gives it alone."""
    engine = engines[arch]
    texts = ["the quick brown fox jumps over the lazy dog", "one two three four five six seven", "a b a b a b a"]
    samplings = [SAMPLINGS["greedy"], SAMPLINGS["sampled"], Sampling(temperature=0.7, seed=3)]
    tops = [3, None, 0]
    prompts = [prompt_of(engine, t) for t in texts]
    reference = [plain(engine, sampling, STEPS, prompt) for sampling, prompt in zip(samplings, prompts)]
    rng = random.Random(9)
    sessions = [engine.new_session() for _ in texts]
    try:
        out: list[list] = [[] for _ in texts]
        for step in range(3 * STEPS):
            live = [i for i in range(len(texts)) if i <= step and len(out[i]) < STEPS]
            if not live:
                break
            drafts = []
            for i in live:
                if not out[i]:
                    sessions[i].prefill(prompts[i])
                    sessions[i].set_sampling(samplings[i])
                    drafts.append([])
                    continue
                ids = [r[0] for r in reference[i][len(out[i]):len(out[i]) + rng.randint(0, 6)]]
                if ids and rng.random() < 0.4:
                    wrong = rng.randrange(len(ids))
                    ids[wrong] = (ids[wrong] + 1) % engine.info.n_vocab
                drafts.append(ids[:STEPS - len(out[i]) - 1])
            steps = engine.decode_drafts([sessions[i] for i in live], drafts, [tops[i] for i in live])
            for i, tokens in zip(live, steps):
                out[i] += [(t.id, t.logprob, t.top) for t in tokens]
        for i in range(len(texts)):
            if tops[i] == 3:
                assert out[i] == reference[i], i
            else:  # no top list (None: no logprob either); the ids are plain decoding's
                assert [t[0] for t in out[i]] == [r[0] for r in reference[i]], i
                assert all(t[2] == () if tops[i] == 0 else t[1] is None for t in out[i]), i
            assert sessions[i].tokens() == prompts[i] + [r[0] for r in reference[i]][:-1]
    finally:
        for s in sessions:
            s.close()


def test_a_pass_that_is_refused_changes_no_session(engines):
    engine = engines["llama"]
    with engine.new_session() as a, engine.new_session() as b, engine.new_session() as fresh:
        for s in (a, b):
            s.prefill(prompt_of(engine))
            s.decode_one()
        fresh.prefill(prompt_of(engine))  # no pending token: it may not draft yet
        before = (a.tokens(), b.tokens(), fresh.tokens())
        with pytest.raises(EngineError, match="decode one step first"):
            engine.decode_drafts([a, fresh, b], [[1, 2], [3], [4]])
        with pytest.raises(EngineError, match="appears twice"):
            engine.decode_drafts([a, a], [[1], []])
        assert (a.tokens(), b.tokens(), fresh.tokens()) == before


@pytest.mark.parametrize("arch", ARCHS)
def test_a_session_after_a_verification_step_continues_as_after_plain_steps(engines, arch):
    """Wrong drafts only: every step rejects (and a hybrid model rolls back); the
    session still decodes on exactly as plain decoding, and prefill after it works."""
    engine = engines[arch]
    reference = plain(engine, Sampling(), 20)
    ids = [r[0] for r in reference]
    got, _ = speculative(engine, Sampling(), 20, lambda i: [(ids[i] + 1) % engine.info.n_vocab, ids[i]])
    assert [g[0] for g in got] == ids


def test_all_drafts_accepted_is_one_step_of_several_tokens(engines):
    engine = engines["llama"]
    ids = [r[0] for r in plain(engine, Sampling(), 9)]
    with engine.new_session() as s:
        s.prefill(prompt_of(engine))
        first = s.decode_draft([])
        assert [t.id for t in first] == ids[:1]
        position = s.position
        step = s.decode_draft(ids[1:8])
        assert [t.id for t in step] == ids[1:9]  # 7 drafts accepted, and the model's own next token
        assert s.position == position + 8  # the old pending token and the 7 drafts


def test_the_sampled_distribution_is_the_plain_samplers(engines):
    """Many seeds, one position: the first token after a verification whose draft is
    a likely but not certain id is distributed as plain sampling's (chi-square test),
    and each seed gives the very token plain sampling gives."""
    engine = engines["llama"]
    prompt = prompt_of(engine)
    with engine.new_session() as s:
        s.prefill(prompt)
        s.set_sampling(Sampling())
        pending = s.decode_one().id
        s.prefill([pending])
        logits = s.logits()
    tempered = [x / 1.5 for x in logits]
    top = max(tempered)
    weights = [math.exp(x - top) for x in tempered]
    total = sum(weights)
    p = [w / total for w in weights]
    draft = sorted(range(len(p)), key=lambda i: -p[i])[1]  # the second most likely id
    runs, plain_ids, spec_ids = 1500, [], []
    with engine.new_session() as a, engine.new_session() as b:
        for seed in range(runs):
            sampling = Sampling(temperature=1.5, seed=seed)
            for s in (a, b):
                s.truncate(0)
                s.prefill(prompt)
                s.set_sampling(Sampling())
                s.decode_one()  # the greedy pending token above
                s.set_sampling(sampling)
            plain_ids.append(a.decode_one().id)
            spec_ids.append(b.decode_draft([draft])[0].id)
    assert spec_ids == plain_ids  # the same seed, the same token
    counts = Counter(spec_ids)
    expected = {i: runs * q for i, q in enumerate(p) if runs * q >= 5}
    rest = runs - sum(expected.values())
    chi2 = sum((counts.get(i, 0) - e) ** 2 / e for i, e in expected.items())
    observed_rest = runs - sum(counts.get(i, 0) for i in expected)
    if rest >= 5:
        chi2 += (observed_rest - rest) ** 2 / rest
    dof = len(expected) - (0 if rest >= 5 else 1)
    # The 0.999 quantile of chi-square (Wilson-Hilferty): a wrong distribution fails.
    z = 3.09
    bound = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < bound, (chi2, bound, dof)
    assert counts[draft] > 0


def test_bad_drafts_are_refused(engines):
    engine = engines["llama"]
    with engine.new_session() as s:
        s.prefill(prompt_of(engine))
        with pytest.raises(EngineError, match="decode one step first") as err:
            s.decode_draft([1, 2])
        assert err.value.status == lib.LLMD_ERR_STATE
        s.decode_draft([])
        position = s.position
        with pytest.raises(EngineError, match="n_draft 33 is more than 32") as err:
            s.decode_draft([1] * 33)
        assert err.value.status == lib.LLMD_ERR_INVALID_ARGUMENT
        with pytest.raises(EngineError, match="outside the vocabulary") as err:
            s.decode_draft([1, engine.info.n_vocab])
        assert err.value.status == lib.LLMD_ERR_TOKEN
        with pytest.raises(EngineError, match="n_top must be"):
            s.decode_draft([1], logprobs=21)
        assert s.position == position  # nothing changed
        s.stop()
        stopped = s.decode_draft([1, 2, 3])
        assert len(stopped) == 1 and stopped[0].stopped and s.position == position


def test_drafts_past_the_context_are_not_verified(engines):
    engine = engines["llama"]
    with engine.new_session() as s:
        s.prefill(prompt_of(engine)[:1] * (N_CTX - 4))
        s.decode_draft([])
        s.set_sampling(Sampling(logit_bias={1: 100.0}))  # every draft of id 1 is accepted
        step = s.decode_draft([1] * 10)  # room for the pending token and 3 drafts
        assert [t.id for t in step] == [1] * 4 and s.position == N_CTX
        with pytest.raises(EngineError, match="the context is full"):
            s.decode_draft([1])


@pytest.mark.parametrize("arch", ["qwen35", "lfm2"])
def test_a_hybrid_models_prefix_cache_gets_the_snapshots_plain_steps_give(tmp_path, arch):
    """Plain decode steps offer the recurrent state at each block boundary they pass to
    the prefix cache; verification steps that pass one do too, so a later request
    resumes from the same place."""
    path = tmp_path / f"{arch}.gguf"
    (build_tiny_qwen35 if arch == "qwen35" else build_tiny_lfm2)(n_ctx=N_CTX).write(path)
    reused, passed = {}, 0
    for mode in ("plain", "speculative"):
        with Engine(str(path), n_threads=2, n_ctx=N_CTX, max_sessions=4) as engine:
            prompt = prompt_of(engine)
            with engine.new_session() as s:
                s.share_prefix("scope", prompt, 0)
                s.prefill(prompt)
                ids = [s.decode_one().id]
                while len(ids) < 100:
                    if mode == "plain":
                        ids.append(s.decode_one().id)
                    else:  # wrong drafts, then right ones: rollbacks, and whole passes over the boundary
                        right = plain_ids[len(ids):len(ids) + 7]
                        draft = right if len(ids) % 3 else [(right[0] + 1) % engine.info.n_vocab] + right[1:]
                        before = s.position
                        ids += [t.id for t in s.decode_draft(draft[:100 - len(ids) - 1])]
                        passed += before < 128 < s.position
                tokens = s.tokens()
            plain_ids = ids
            with engine.new_session() as other:
                reused[mode] = other.share_prefix("scope", tokens + [1], 0)
            assert engine.kv_stats().snapshots >= 1
    assert passed == 1  # a verification step went past the boundary at 128 in one pass
    assert reused["plain"] == reused["speculative"] == 128  # the newest boundary the reply passed


@pytest.mark.parametrize("sampling", SAMPLINGS)
def test_a_grammar_constrained_generation_verifies_drafts_through_its_mask(engines, sampling):
    """Drafts pass through the grammar as sampled tokens do: the output, the forced
    (budget) flags and the completing terminal token are plain decoding's."""
    engine = engines["llama"]
    grammar = schema_grammar(PERSON)

    def run(drafts) -> list[tuple[int, bool, bool]]:
        with engine.new_session() as s:
            s.set_sampling(SAMPLINGS[sampling])
            s.set_grammar(grammar, 40)
            s.prefill(prompt_of(engine))
            out: list = []
            while not out or not out[-1][2]:
                step = s.decode_draft(drafts(len(out)) if out else [])
                out += [(t.id, t.forced, t.is_terminal) for t in step]
            return out

    reference = run(lambda i: [])
    rng = random.Random(5)

    def drafts(i: int) -> list[int]:
        draft = [r[0] for r in reference[i:i + rng.randint(1, 6)]]
        if draft and rng.random() < 0.4:
            draft[-1] = (draft[-1] + 1) % engine.info.n_vocab  # likely outside the grammar
        return draft

    assert run(drafts) == reference
