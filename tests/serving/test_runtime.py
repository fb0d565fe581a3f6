"""The scheduler on the default model: generations advance in steps (a prefill chunk
or one batched decode step), so streams share the executor fairly, a long prompt
is prefilled between other streams' tokens, and a cancel takes effect at the next
step; speculative decoding changes no token of any of it. Assertions are on the
order of events and on tokens, never on times."""
import asyncio

import pytest
import pytest_asyncio

from llmd.engine import fetch
from llmd.engine.native import Sampling
from llmd.serving.draft_model import open_draft_session
from llmd.serving.metrics import ServerMetrics
from llmd.serving.runtime import PREFILL_CHUNK, Generation, Runtime
from llmd.serving.sessions import Slot
from llmd.serving.speculative import Costs
from tests.engine.test_engine import ambiguous_grammar
from tests.support.gguf_writer import GGML_Q4_0, build_tiny_llama, build_tiny_qwen35

FILLER = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep. "


@pytest_asyncio.fixture
async def runtime():
    rt = Runtime(ServerMetrics())
    await rt.load(str(fetch.default_model(fetch=False)), n_ctx=2048, max_sessions=6, n_threads=2)
    yield rt
    await rt.close()


async def start(rt: Runtime, name: str, prompt: str, max_tokens: int, log: list,
                grammar: str | None = None) -> tuple[Generation, asyncio.Task]:
    """Submit a greedy generation that never ends by itself; a task logs its events."""
    slot = Slot(name, await rt.call(rt.engine.new_session))
    ids = await rt.call(rt.engine.tokenize, prompt)
    never_end = Sampling(logit_bias={i: float("-inf") for i in rt.engine.info.eog_ids})
    g = Generation(slot, ids, never_end, max_tokens, grammar=grammar)
    rt.submit(g)

    async def read() -> None:
        while True:
            kind, value = await rt.next_event(g)
            log.append((name, kind, value if kind != "token" else None))
            if kind != "token":
                return

    return g, asyncio.create_task(read())


async def test_streams_get_a_token_each_per_decode_step(runtime):
    # Each decode step's tokens reach the loop in one _deliver call: record, per step,
    # how many tokens each stream of its batch has. (Readers may take several queued
    # tokens at once, so the order of their logs says nothing about steps.)
    steps: list[dict] = []
    deliver = runtime._deliver

    def record(batch, tokens):
        deliver(batch, tokens)
        steps.append({g.slot.id: g.generated for g in batch})

    runtime._deliver = record
    runtime.speculative = "off"  # plain steps: a speculative one may give a stream several tokens
    log: list = []
    readers = [(await start(runtime, name, f"{name}: " + FILLER, 24, log))[1] for name in "abc"]
    await asyncio.gather(*readers)
    tokens = [name for name, kind, _ in log if kind == "token"]
    assert sorted(tokens) == sorted("abc" * 24)
    # Once all three decode, every step is one batch of the three, each a token further,
    # until the first of them is done; the others finish without it.
    first = next(i for i, step in enumerate(steps) if len(step) == 3)
    assert min(steps[first].values()) == 1  # the last to start joins at its first token
    for before, after in zip(steps[first:], steps[first + 1:]):
        if len(after) < 3:
            assert max(before.values()) == 24
            break
        assert all(after[name] == before[name] + 1 for name in "abc"), (before, after)
    else:
        raise AssertionError("no stream finished while the three decoded together")


async def test_a_long_prompt_is_prefilled_between_other_streams_tokens(runtime):
    log: list = []
    running = [await start(runtime, name, FILLER, 400, log) for name in "ab"]
    while sum(kind == "token" for _, kind, _ in log) < 4:
        await asyncio.sleep(0.01)
    long_prompt = FILLER * 60
    chunks = -(-len(await runtime.call(runtime.engine.tokenize, long_prompt)) // PREFILL_CHUNK)
    assert chunks >= 3
    submitted = len(log)
    newcomer, reader = await start(runtime, "long", long_prompt, 2, log)
    await reader
    first = next(i for i, (name, kind, _) in enumerate(log) if name == "long")
    during = log[submitted:first]
    # A decode step of the running streams follows every prefill chunk but the last.
    for name in "ab":
        assert sum(n == name and kind == "token" for n, kind, _ in during) >= chunks - 1
        assert not any(n == name and kind == "end" for n, kind, _ in log)  # still streaming
    for g, task in running:
        runtime.cancel(g)
        await task


@pytest.mark.parametrize("speculative", ["off", "ngram"])  # plain steps, and steps that verify drafts
async def test_a_generation_whose_step_fails_ends_alone_and_the_others_stream_on(runtime, speculative):
    runtime.speculative = speculative
    log: list = []
    running = [await start(runtime, name, FILLER, 400, log) for name in "ab"]
    while sum(kind == "token" for _, kind, _ in log) < 4:
        await asyncio.sleep(0.01)
    failing, reader = await start(runtime, "bad", FILLER, 8, log, grammar=ambiguous_grammar())
    await reader
    assert [(kind, "too ambiguous" in str(value)) for name, kind, value in log if name == "bad"] == [("error", True)]
    assert failing.slot.dirty
    ended = len(log)

    async def streamed_on() -> None:
        while sum(kind == "token" for _, kind, _ in log[ended:]) < 4:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(streamed_on(), 60)
    assert not any(kind != "token" for name, kind, _ in log if name in "ab")
    for g, task in running:
        runtime.cancel(g)
        await task


async def test_a_cancelled_generation_ends_at_the_next_step(runtime):
    log: list = []
    g, reader = await start(runtime, "c", FILLER, 1000, log)
    while len(log) < 5:
        await asyncio.sleep(0.005)
    runtime.cancel(g)
    delivered = g.generated  # tokens handed to the reader (some maybe not yet logged)
    await reader
    assert log[-1] == ("c", "end", "cancelled")
    # No token after the cancel, however many steps a loaded machine let the executor
    # finish before the event loop took their tokens.
    assert [kind for _, kind, _ in log] == ["token"] * delivered + ["end"]


async def test_an_engine_call_waits_for_the_step_in_flight_only(runtime, monkeypatch):
    """Decode steps run in bursts on the executor; a call queued there (a new request's
    tokenization) ends the burst, so it waits for the step in flight, not the burst."""
    steps = [0]  # decode steps the executor has finished, counted on the executor
    for name in ("decode_batch", "decode_drafts"):  # plain steps and speculative ones
        def counted(*args, real=getattr(runtime.engine, name)):
            tokens = real(*args)
            steps[0] += 1
            return tokens
        monkeypatch.setattr(runtime.engine, name, counted)
    log: list = []
    g, reader = await start(runtime, "d", FILLER, 1000, log)
    while len(log) < 3:
        await asyncio.sleep(0.005)
    for _ in range(5):
        before = steps[0]
        at_call = await runtime.call(lambda: steps[0])  # read when the call runs, not when the loop wakes
        # The step in flight, and one that could end between the two reads above.
        assert at_call - before <= 2
        await asyncio.sleep(0.01)
    assert steps[0] >= 2  # the tokens after the first came from the counted steps
    runtime.cancel(g)
    await reader


async def test_a_scored_prompt_gives_what_one_score_call_gives(runtime):
    ids = await runtime.call(runtime.engine.tokenize, FILLER * 36)
    assert len(ids) > 2 * PREFILL_CHUNK  # scored in one call all the same, as the perplexity command does
    slot = Slot("scored", await runtime.call(runtime.engine.new_session))
    g = Generation(slot, ids, Sampling(), 3, prompt_logprobs=2, logprobs=1)
    runtime.submit(g)
    events = [await runtime.next_event(g) for _ in range(4)]
    assert [kind for kind, _ in events] == ["token"] * 3 + ["end"]

    def reference():
        with runtime.engine.new_session() as s:
            return s.score_top(ids, 0, 2)
    assert g.prompt_scores == await runtime.call(reference)
    assert slot.resident == ids + [t.id for _, t in events[:2]]
    for _, token in events[:3]:  # greedy: each token is the top of the logits it was sampled from
        assert token.top[0][0] == token.id and token.top[0][1] == token.logprob


async def test_echo_without_new_tokens_ends_after_the_prompt(runtime):
    ids = await runtime.call(runtime.engine.tokenize, "Hello there")
    slot = Slot("echo", await runtime.call(runtime.engine.new_session))
    g = Generation(slot, ids, Sampling(), 0, prompt_logprobs=0)
    runtime.submit(g)
    assert await runtime.next_event(g) == ("end", "length")
    assert len(g.prompt_scores) == len(ids) - 1 and g.generated == 0


# ---- speculative decoding --------------------------------------------------------------

CODE = "".join(f"    total_{i} = compute(value_{i}, factor={i % 7})\n" for i in range(12))
SPEC_PROMPTS = {
    "copy": "Repeat this code exactly:\n" + CODE + "\nHere it is again:\n",
    "story": FILLER * 2,
    "chat": "Hello! How are you today?",
}


async def new_slot(rt: Runtime, name: str) -> Slot:
    """A slot as the session table opens it: with a draft session when the runtime has
    a draft model."""
    draft = await rt.call(open_draft_session, rt.draft_engine) if rt.draft_engine is not None else None
    return Slot(name, await rt.call(rt.engine.new_session), draft=draft)


async def speculation_scenario(rt: Runtime, narrow: bool, seed: int | None = None) -> tuple[dict, int, int, int]:
    """Generations with logprobs, greedy (or sampled with `seed`): one alone, then three
    at once (so the pass verifies the drafts of one to three as the batch grows and
    shrinks), then a second turn of the first on its warm session. Each generation's
    (id, logprob, top) tokens, the drafted and the accepted ids in all, and the most
    generations whose drafts one pass verified. `narrow` biases the choice towards
    three ids, so that n-grams recur on random weights too."""
    sessions = {name: await new_slot(rt, name) for name in SPEC_PROMPTS}
    together_most = [0]
    decode_drafts = rt.engine.decode_drafts

    def counted(sessions_, drafts, *args):
        together_most[0] = max(together_most[0], sum(bool(d) for d in drafts))
        return decode_drafts(sessions_, drafts, *args)
    rt.engine.decode_drafts = counted
    bias = {i: float("-inf") for i in rt.engine.info.eog_ids} | ({i: 6.0 for i in range(40, 43)} if narrow else {})
    never_end = Sampling(logit_bias=bias) if seed is None else Sampling(temperature=0.8, top_k=20, seed=seed,
                                                                        logit_bias=bias)
    out: dict = {}

    async def run(key: str, slot: Slot, prompt: list[int], max_tokens: int) -> list[int]:
        g = Generation(slot, prompt, never_end, max_tokens, logprobs=2)
        rt.submit(g)
        tokens = []
        while (event := await rt.next_event(g))[0] == "token":
            tokens.append(event[1])
        out[key] = ([(t.id, t.logprob, t.top) for t in tokens], event)
        return [t.id for t in tokens]

    prompts = {name: await rt.call(rt.engine.tokenize, text) for name, text in SPEC_PROMPTS.items()}
    first = await run("alone", sessions["copy"], prompts["copy"], 120)
    together = {**sessions, "copy": await new_slot(rt, "copy2")}
    await asyncio.gather(*(run(name, together[name], prompts[name], 60 + 20 * i)
                           for i, name in enumerate(SPEC_PROMPTS)))
    again = prompts["copy"] + first + await rt.call(rt.engine.tokenize, "\nOnce more:\n" + CODE[:80])
    await run("warm", sessions["copy"], again, 80)
    assert out["warm"][0] and sessions["copy"].resident[:len(prompts["copy"])] == prompts["copy"]
    drafted = rt.metrics.draft_tokens.values.get((rt.speculative,), 0)
    accepted = rt.metrics.draft_accepted.values.get((rt.speculative,), 0)
    return out, drafted, accepted, together_most[0]


class FixedCosts(Costs):
    """Costs that keep the timings they are given and learn none: pacing that does not
    depend on how busy the machine is. None given: no cost is known, so a proposal is as
    long as a draft model's acceptance or prompt lookup's match allows."""

    def __init__(self, plain: float | None = None, verify: dict[int, float] | None = None):
        super().__init__()
        for k, seconds in ({0: plain} if plain is not None else {}).items() | (verify or {}).items():
            super().verified(k, seconds)
            super().drafted(k, 0.0)

    def verified(self, k: int, seconds: float) -> None:
        pass

    def drafted(self, k: int, seconds: float) -> None:
        pass


async def scenario_with(path: str, speculative: str, narrow: bool, draft: str | None = None,
                        seed: int | None = None, costs: Costs | None = None) -> tuple[dict, int, int, int]:
    """The scenario on a new runtime, its speculation paced by `costs` (default: none
    known, so that drafts are accepted and rejected however busy the machine)."""
    rt = Runtime(ServerMetrics(), speculative=speculative)
    rt.costs = costs or FixedCosts()
    await rt.load(path, draft, n_ctx=2048, max_sessions=8, n_threads=2)
    try:
        return await speculation_scenario(rt, narrow, seed)
    finally:
        await rt.close()


async def test_speculation_changes_no_token_or_logprob_of_greedy_generations(tmp_path):
    qwen35 = tmp_path / "qwen35.gguf"
    build_tiny_qwen35(n_ctx=2048).write(qwen35)
    for path, narrow in ((str(fetch.default_model(fetch=False)), False), (str(qwen35), True)):
        plain, drafted_off, _, _ = await scenario_with(path, "off", narrow)
        speculated, drafted, accepted, together = await scenario_with(path, "ngram", narrow)
        assert speculated == plain, path
        assert drafted_off == 0 and 0 < accepted < drafted, (path, drafted, accepted)  # accepts and rejects
        assert together >= 2, path  # several generations' drafts verified in one pass


async def test_a_draft_model_that_does_not_pay_drafts_at_most_its_probes_and_changes_nothing(tmp_path):
    """Costs by which no proposal pays (a verification of k drafts costs 100 k plain
    steps): a draft model (here the model itself) drafts at most its probes, one per
    pause, and the output is the plain one, as it is with the runtime's own timings.
    Prompt lookup, paced by the same costs, proposes only its probes."""
    path = str(fetch.default_model(fetch=False))
    plain, _, _, _ = await scenario_with(path, "off", False)
    never = FixedCosts(1.0, {1: 100.0, 8: 800.0})
    speculated, drafted, _, _ = await scenario_with(path, "draft", False, path, costs=never)
    assert speculated == plain
    # 5 generations of 60 to 120 tokens: a probe at their start and after pauses of 8, 16, 32, 64 steps.
    assert drafted <= 5 * 5 * 4  # probes of at most FIRST_K ids
    timed, _, _, _ = await scenario_with(path, "draft", False, path, costs=Costs())
    assert timed == plain
    lookup, drafted_never, _, _ = await scenario_with(path, "ngram", False, costs=never)
    free, drafted_free, _, _ = await scenario_with(path, "ngram", False)
    assert lookup == free == plain and drafted_never < drafted_free / 4


async def test_a_draft_model_changes_no_token_or_logprob_greedy_or_seeded(tmp_path):
    """A llama and the hybrid qwen35 (Gated DeltaNet), each drafted for by its Q4_0 twin
    (the same random weights, coarser: it agrees often, not always)."""
    paths = {}
    for name, build in (("llama", build_tiny_llama), ("qwen35", build_tiny_qwen35)):
        for weight_type, suffix in ((None, ""), (GGML_Q4_0, "_q4_0")):
            w = build(n_ctx=2048) if weight_type is None else build(n_ctx=2048, weight_type=weight_type)
            paths[name + suffix] = str(w.write(tmp_path / f"{name}{suffix}.gguf"))
    for name in ("llama", "qwen35"):
        for seed in (None, 11):
            plain, drafted_off, _, _ = await scenario_with(paths[name], "off", False, seed=seed)
            speculated, drafted, accepted, together = await scenario_with(paths[name], "draft", False,
                                                                          paths[name + "_q4_0"], seed)
            assert speculated == plain, (name, seed)
            assert drafted_off == 0 and 0 < accepted < drafted, (name, seed, drafted, accepted)
            assert together >= 2, (name, seed)


async def test_drafts_of_the_model_s_prediction_block_change_no_token_or_logprob(tmp_path):
    """The hybrid qwen35 with a multi-token-prediction block, greedy and seeded: the
    output is the plain one, and the block's drafts (under the requests' logit bias,
    which narrows both it and the model to three ids) are accepted and rejected."""
    path = str(build_tiny_qwen35(n_ctx=2048, nextn=1).write(tmp_path / "qwen35_nextn.gguf"))
    for seed in (None, 11):
        plain, _, _, _ = await scenario_with(path, "off", True, seed=seed)
        speculated, drafted, accepted, together = await scenario_with(path, "mtp", True, seed=seed)
        assert speculated == plain, seed
        assert 0 < accepted < drafted and together >= 2, (seed, drafted, accepted, together)
