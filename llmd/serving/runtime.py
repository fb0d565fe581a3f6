"""The runtime: one executor thread makes every engine call, and a scheduler
runs generations in steps rather than whole requests.

Theory of operation. A request's handler builds a Generation (its slot, prompt
ids, sampling, token budget) and submits it. The scheduler loop, a task on the
event loop, repeats: run one prefill chunk for one generation that is still
prefilling (round robin), then decode steps for every generation that is
decoding, each step batched into a single engine call so the weights are read
once per step. A prefill chunk is one call on the executor thread; decode steps
run back to back on it, up to BURST of them while no prompt waits, handing each
step's tokens to the event loop without waiting for it, so the engine never idles
on a thread handoff. A submit, a cancel or any other call for the executor (a new
request's tokenization) ends the burst after the step in flight, and while a
prompt is being prefilled each burst is one step: a long prompt never holds up
other streams longer than one chunk, nor they it longer than one step.
Tokens go back to the handler through the generation's queue as events:
("token", Token), ("end", finish_reason) or ("error", exception), and, when asked
for, ("progress", prompt_progress) before and after each prefill chunk. A generation
whose reader has fallen READ_AHEAD tokens behind (a client that stopped reading
its stream) is not decoded until the reader takes events again through
`next_event`, so a stalled client costs no compute while its write times out. A
fork (one of a request's choices run beside the first, llmd.api.reply) is the one
exception: its reader reads the choices before it first, so it runs to its end,
and its request's end cancels it.

A generation holds its session's lease (llmd.serving.sessions.Lease) and gives it back the
moment it ends, whichever way it ends: finished, cancelled, failed, or ended by
`end_all` at shutdown. The handler that started it only cancels it; it never has to
wait for the end, so a handler interrupted at any await cannot leave a session held.

Speculative decoding (llmd.serving.speculative). While no prompt is being prefilled,
each step of the decoding generations may verify proposals of their drafters (prompt
lookup; a draft model: llmd.serving.draft_model, whose engine this thread runs too; or
the model's own prediction block: llmd.serving.mtp) in the step's one engine call
(Engine.decode_drafts): a pass over every generation's pending token and drafts, which
reads the weights once for all, as a batched step does. For each generation the call
returns one token or several, exactly those plain steps would give, and each goes
through `_deliver` one by one as a plain step's token does, so streams, stops,
logprobs, grammars and cancellation see no difference. The runtime times each proposal
and each pass (Costs, shared by its generations); from them the drafters' pacing
decides, one generation after another, whether to propose and how far, so that each
proposal raises the tokens per second of the whole pass (Pass): a busy batch, whose
plain step already yields a token per generation, takes drafts only where they pay
there. A generation whose drafter pauses takes plain steps in the pass. While a prompt
is being prefilled, a verification, dearer than a step, would hold it up for tokens
that a batched step makes at little cost once it decodes too, so the generations
decode plainly.

Bookkeeping of the KV cache (slot.resident) is updated on the event loop after
each step until the generation ends, whether or not it was cancelled meanwhile, so
`resident` is always a prefix of what the cache holds (the next prefill truncates
the cache to what it reuses of it).
"""
from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from llmd.engine import fetch
from llmd.engine.native import Engine, Sampling, Token
from llmd.serving.draft_model import ModelDrafter, vocab_difference
from llmd.serving.metrics import ServerMetrics
from llmd.serving.mtp import MtpDrafter
from llmd.serving.prefill import PrefillPlan, plan_prefill, with_cached
from llmd.serving.sessions import Lease, SessionTable, Slot
from llmd.serving.speculative import MODES, Costs, DraftLimits, NgramDrafter, Pass

PREFILL_CHUNK = 256   # tokens per prefill step
MAX_DECODE_BATCH = 64  # sessions per batched decode step
READ_AHEAD = 64        # tokens a generation may run ahead of its reader
BURST = 16             # decode steps run back to back while nothing else waits


def room(g: Generation) -> int:
    """Tokens g may make before its reader takes more of them (see the module doc)."""
    return g.max_tokens - g.generated if g.fork else READ_AHEAD - g.events.qsize()


def speculates(g: Generation) -> bool:
    """Whether g's drafter may propose now (it has one, and it does not pause)."""
    return g.drafter is not None and not g.drafter.pace.pause


@dataclass(eq=False)
class Generation:
    slot: Slot
    prompt: list[int]
    sampling: Sampling
    max_tokens: int
    reuse: bool = True  # may reuse the slot's cache (else start from an empty cache)
    cache_scope: str | None = None  # shares cached prefixes in this scope (llmd.serving.prefill.cache_scope)
    grammar: str | None = None     # constrained decoding (llmd.structured.constrain), None: free
    logprobs: int | None = None    # tokens carry their logprob and this many top ones
    prompt_logprobs: int | None = None  # score the prompt (with this many top ones): no reuse
    progress: bool = False         # ("progress", prompt_progress()) events as the prompt is processed
    speculative: DraftLimits | None = DraftLimits()  # None: never speculate
    prompt_scores: list = field(default_factory=list)  # (logprob, top) of prompt[1:]
    lease: Lease | None = None     # released when the generation ends
    fork: bool = False             # a choice run beside its request's first: not queued, not held back
    plan: PrefillPlan | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    next_prefill: int = 0          # index in prompt of the next token to prefill
    decoding: bool = False
    pending: int | None = None     # sampled, not yet in the KV cache
    generated: int = 0
    forced: bool = False           # the grammar closed the output early to fit max_tokens
    drafter: NgramDrafter | ModelDrafter | MtpDrafter | None = None  # from the first decode step on, if it speculates
    drafted: int = 0               # drafted ids verified
    accepted: int = 0              # of those, ids accepted
    cancelled: bool = False
    finished: bool = False
    t_submit: float = field(default_factory=time.perf_counter)
    t_prefill_start: float = 0.0
    t_prefill_end: float = 0.0
    t_first_token: float = 0.0
    t_last_token: float = 0.0
    t_end: float = 0.0

    def first_token_ms(self) -> float:
        """Milliseconds from submission to the first generated token (0 if none)."""
        return (self.t_first_token - self.t_submit) * 1000 if self.t_first_token else 0.0

    def prompt_progress(self) -> dict[str, Any]:
        """How far the prompt is processed, as llama.cpp's `prompt_progress`: tokens in
        all, reused from the cache, in the cache now, and milliseconds since it began."""
        return {"total": len(self.prompt), "cache": self.plan.keep, "processed": self.next_prefill,
                "time_ms": round((time.perf_counter() - self.t_prefill_start) * 1000)}

    def timings(self) -> dict[str, Any]:
        """The llama.cpp-style `timings` extension of a response."""
        end = self.t_end or time.perf_counter()
        prompt_ms = (self.t_prefill_end - self.t_prefill_start) * 1000 if self.t_prefill_end else 0.0
        predicted_ms = (end - self.t_prefill_end) * 1000 if self.t_prefill_end else 0.0
        prompt_n = self.plan.prefill if self.plan else 0
        return {
            "prompt_n": prompt_n,
            "cache_n": self.plan.keep if self.plan else 0,
            "prompt_ms": round(prompt_ms, 3),
            "prompt_per_token_ms": round(prompt_ms / prompt_n, 3) if prompt_n else 0.0,
            "prompt_per_second": round(prompt_n / prompt_ms * 1000, 2) if prompt_ms > 0 else 0.0,
            "predicted_n": self.generated,
            "predicted_ms": round(predicted_ms, 3),
            "predicted_per_token_ms": round(predicted_ms / self.generated, 3) if self.generated else 0.0,
            "predicted_per_second": round(self.generated / predicted_ms * 1000, 2) if predicted_ms > 0 else 0.0,
            "draft_n": self.drafted,
            "draft_n_accepted": self.accepted,
        }


class Runtime:
    """Owns the executor thread and schedules generations on it."""

    def __init__(self, metrics: ServerMetrics, *, warm_resume: bool = True, speculative: str = "ngram"):
        if speculative not in MODES:
            raise ValueError(f"speculative must be one of {', '.join(MODES)}")
        self.engine: Engine | None = None
        self.draft_engine: Engine | None = None  # the draft model ("draft" speculation)
        # Session slots, scratch included: the engine's, or with a draft model as many as
        # fit the KV budget with a draft session beside each (_open_draft).
        self.capacity = 0
        self.metrics = metrics
        self.warm_resume = warm_resume
        self.speculative = speculative
        self.costs = Costs()  # what speculative steps cost here, timed on the executor thread
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llmd-engine")
        self._active: list[Generation] = []
        self._wake = asyncio.Event()
        self._interrupt = False  # ends a decode burst: read on the executor thread
        self._task: asyncio.Task | None = None
        self._turn = itertools.count()
        self._ending: BaseException | None = None  # set by end_all: new generations end with it

    def call(self, fn: Callable, *args) -> asyncio.Future:
        """Queue fn(*args) on the engine's executor thread now, in order with every other
        engine call; await the result for its value. A decode burst running there yields
        the thread after the step in flight."""
        self._interrupt = True
        return asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def load(self, path: str, draft_path: str | None = None, **options) -> Engine:
        """Open the model (and with "draft" speculation the draft model at draft_path)
        on the executor thread and start scheduling. fetch.ModelError when the draft
        model's vocabulary is not the model's."""
        if (self.speculative == "draft") != (draft_path is not None):
            raise ValueError("a draft model is needed by, and only by, \"draft\" speculation")
        nextn = {"draft_nextn": True} if self.speculative == "mtp" else {}  # the prediction block runs beside
        self.engine = await self.call(lambda: Engine(path, **options, **nextn))
        self.capacity = self.engine.info.max_sessions
        if draft_path is not None:
            self.draft_engine = await self.call(self._open_draft, draft_path, options)
        self._task = asyncio.create_task(self._schedule(), name="llmd-scheduler")
        return self.engine

    def _open_draft(self, path: str, options: dict) -> Engine:
        """The draft model, with the model's context and room for a session beside each
        of the model's (on the executor thread). Unless --max-sessions sets the slots,
        the KV budget holds both sessions of each slot: the capacity is what fits."""
        info = self.engine.info
        draft = Engine(path, n_threads=options.get("n_threads", 0), n_ctx=info.n_ctx, max_sessions=info.max_sessions)
        if (why := vocab_difference(self.engine, draft)) is not None:
            draft.close()
            raise fetch.ModelError(f"the draft model {path} cannot draft for the model: {why} "
                                   "(a draft model needs the model's vocabulary)")
        if not options.get("max_sessions"):
            snapshots = self.engine.kv_stats().snapshot_budget
            # Without --kv-budget, the engine's default share of memory: at least what its slots take.
            budget = options.get("kv_budget_bytes") or info.max_sessions * info.bytes_per_session + snapshots
            budget -= snapshots + draft.kv_stats().snapshot_budget
            self.capacity = min(info.max_sessions, max(budget, 0) // (info.bytes_per_session
                                                                      + draft.info.bytes_per_session))
            if self.capacity < 1:
                draft.close()
                raise fetch.ModelError(f"the KV budget does not fit one session of {info.n_ctx} tokens with its "
                                       "draft session")
        return draft

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.end_all(RuntimeError("the server is shutting down"))
        for engine in (self.engine, self.draft_engine):
            if engine is not None:
                await self.call(engine.close)
        self.executor.shutdown(wait=True)

    def end_all(self, exc: BaseException) -> None:
        """End every generation with the error `exc`, now and for any submitted later
        (the server is shutting down)."""
        self._ending = exc
        for g in list(self._active):
            self._finish(g, "error", exc)

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def queued(self) -> int:
        """Generations of requests submitted whose first prefill step has not run yet."""
        return sum(1 for g in self._active if not g.t_prefill_start and not g.fork)

    async def next_event(self, g: Generation) -> tuple[str, Any]:
        """g's next event; taking it lets g run again if it waited for its reader."""
        event = await g.events.get()
        self._wake.set()
        return event

    def submit(self, g: Generation) -> None:
        """Plan the prefill against the slot's cache and queue the generation."""
        if g.reuse and g.prompt_logprobs is None:
            session = g.slot.session
            g.plan = plan_prefill(g.slot.resident, g.prompt, g.slot.dirty, enabled=self.warm_resume,
                                  floor=session.resume_floor, points=session.resume_points)
        else:
            g.plan = PrefillPlan(keep=0, prefill=len(g.prompt), discard=len(g.slot.resident), reason="new")
        g.next_prefill = g.plan.keep
        if self._ending is not None:
            self._finish(g, "error", self._ending)
            return
        self.metrics.prompt_tokens.inc(len(g.prompt))
        self._active.append(g)
        self._interrupt = True
        self._wake.set()

    def cancel(self, g: Generation) -> None:
        """Stop g at the next step boundary (client gone, stop string found, ...)."""
        g.cancelled = True
        self._interrupt = True
        self._wake.set()

    def _finish(self, g: Generation, kind: str, value: Any) -> None:
        if not g.finished:
            g.finished = True
            g.t_end = time.perf_counter()
            g.events.put_nowait((kind, value))
        if g in self._active:
            self._active.remove(g)
        if g.lease is not None:
            g.lease.release()

    async def _schedule(self) -> None:
        while True:
            for g in [g for g in self._active if g.cancelled]:
                self._finish(g, "end", "cancelled")
            if not self._active:
                self._wake.clear()
                await self._wake.wait()
                continue
            prefilling = [g for g in self._active if not g.decoding]
            if prefilling:
                await self._prefill_step(prefilling[next(self._turn) % len(prefilling)])
            decoding = [g for g in self._active if g.decoding and not g.cancelled and room(g) > 0]
            if not prefilling and not decoding:  # every generation waits for its reader
                self._wake.clear()
                await self._wake.wait()
                continue
            if decoding:
                batch = decoding[:MAX_DECODE_BATCH]
                # No speculation while a prompt is being prefilled: a verification costs more
                # than a step, which would hold that prompt up (docs/speculative.md).
                waiting = any(not g.decoding for g in self._active)
                if not waiting and any(speculates(g) for g in batch):
                    await self._speculative_steps(batch, BURST)
                else:  # paused drafters' generations decode plainly, as long as the shortest pause
                    pauses = [g.drafter.pace.pause for g in batch if g.drafter is not None and g.drafter.pace.pause]
                    await self._decode_steps(batch, 1 if waiting else min([BURST, *pauses]))
                # Rotate so that more than MAX_DECODE_BATCH streams all advance.
                for g in batch:
                    if g in self._active:
                        self._active.remove(g)
                        self._active.append(g)

    async def _prefill_step(self, g: Generation) -> None:
        slot, first = g.slot, not g.t_prefill_start
        scope = g.cache_scope if self.warm_resume else None
        # A scored prompt reuses nothing (every position is scored), but it still joins
        # its scope, so that what it computes is offered there and nowhere else.
        reusable = g.plan.keep if g.prompt_logprobs is None else len(g.prompt)

        def claim() -> int:
            """Readies the session for g's prompt: the prompt tokens the prefix cache supplied."""
            cached = 0
            if scope is not None:  # replaces the cache with a longer shared prefix, if any
                if g.plan.reason == "dirty":  # nothing of its own is trusted, not even as a tail
                    slot.session.truncate(0)
                cached = slot.session.share_prefix(scope, g.prompt, reusable)
            if not cached:
                slot.session.truncate(g.plan.keep)  # keep 0 also clears a dirty cache
            slot.session.set_sampling(g.sampling)
            slot.session.set_grammar(g.grammar, g.max_tokens)
            return cached

        def run() -> int:
            """Prefills the next chunk: the tokens prefilled."""
            start = g.next_prefill
            # A scored prompt goes in one call, as `llmd perplexity` scores a window: the
            # engine's logits may differ in the last bits with how a prompt is split.
            end = len(g.prompt) if g.prompt_logprobs is not None else start + PREFILL_CHUNK
            chunk = g.prompt[start:end]
            if g.prompt_logprobs is None or len(chunk) < 2:
                slot.session.prefill(chunk)
            else:  # scoring leaves the next-token logits as a prefill does
                g.prompt_scores = slot.session.score_top(chunk, 0, g.prompt_logprobs)
            return len(chunk)

        try:
            if first:
                g.t_prefill_start = time.perf_counter()
                slot.resident = slot.resident[:g.plan.keep]
                slot.dirty = False  # the truncate clears it; a reset from now on sets it again
                cached = await self.call(claim)
                if g.finished:  # ended meanwhile (end_all): the slot may already serve another
                    return
                if scope is not None and g.prompt_logprobs is None:
                    (self.metrics.prefix_cache_hits if cached else self.metrics.prefix_cache_misses).inc()
                g.plan = with_cached(g.plan, cached)
                g.next_prefill = g.plan.keep
                self.metrics.cached_tokens.inc(g.plan.keep)
                if g.progress:
                    g.events.put_nowait(("progress", g.prompt_progress()))
            n = await self.call(run)
        except Exception as exc:
            slot.dirty = True
            self._finish(g, "error", exc)
            return
        if g.finished:  # ended meanwhile (end_all): the slot may already serve another
            return
        g.next_prefill += n
        slot.resident = g.prompt[:g.next_prefill]
        if g.progress:
            g.events.put_nowait(("progress", g.prompt_progress()))
        if g.next_prefill == len(g.prompt):
            g.decoding = True
            if g.speculative is not None and g.speculative.n_max > 0:
                if self.speculative == "ngram":
                    g.drafter = NgramDrafter(g.prompt, g.speculative, self.costs)
                elif self.speculative == "draft" and slot.draft is not None:
                    g.drafter = ModelDrafter(slot.draft, g.prompt, g.plan.keep, g.speculative, g.sampling.logit_bias,
                                             self.costs)
                elif self.speculative == "mtp":
                    g.drafter = MtpDrafter(slot.session, g.speculative, self.costs)
            g.t_prefill_end = time.perf_counter()
            if g.max_tokens == 0:  # the prompt's logprobs were all that was asked for
                self._finish(g, "end", "length")

    async def _decode_steps(self, batch: list[Generation], most: int) -> None:
        """Up to `most` decode steps for the batch, fewer when a generation would reach
        its token budget or get as far ahead of its reader as it may (room), or one ends."""
        loop = asyncio.get_running_loop()
        sessions = [g.slot.session for g in batch]
        logprobs = [g.logprobs for g in batch] if any(g.logprobs is not None for g in batch) else None
        steps = min(most, *(min(g.max_tokens - g.generated, room(g)) for g in batch))
        self._interrupt = False

        def run() -> None:
            for _ in range(steps):
                start = time.perf_counter()
                tokens = self.engine.decode_batch(sessions, logprobs)
                self.costs.verified(len(batch) - 1, time.perf_counter() - start)
                for g, tok in zip(batch, tokens):  # a drafter sees every token, on this thread
                    if g.drafter is not None and not tok.stopped and tok.error is None:
                        g.drafter.extend([tok.id])
                loop.call_soon_threadsafe(self._deliver, batch, tokens)
                if self._interrupt or any(t.stopped or t.is_terminal or t.error for t in tokens):
                    return

        try:
            # Each step's _deliver is queued before the call's result, so it runs first.
            await loop.run_in_executor(self.executor, run)
        except Exception as exc:
            for g in batch:
                g.slot.dirty = True
                self._finish(g, "error", exc)

    async def _speculative_steps(self, batch: list[Generation], most: int) -> None:
        """Up to `most` steps of the batch, each one pass that verifies the proposals
        its generations' drafters make (a generation without one takes a plain step in
        it), fewer when a generation would reach its token budget or go as far ahead
        of its reader as it may (room), or one ends, or no drafter proposes any more (a
        pause)."""
        loop = asyncio.get_running_loop()
        sessions, costs = [g.slot.session for g in batch], self.costs
        logprobs = [g.logprobs for g in batch] if any(g.logprobs is not None for g in batch) else None
        left = [min(g.max_tokens - g.generated, room(g)) for g in batch]
        # The first step of a reply has no pending token for a proposal to follow.
        started = [g.generated > 0 for g in batch]
        # The last step proposed too: this proposal catches up with nothing (a draft
        # model's), so its time is drafting's alone.
        steady = [False] * len(batch)
        self._interrupt = False

        def run() -> None:
            for _ in range(most):
                if min(left) <= 0:
                    return
                plan = Pass(len(batch) - 1, float(len(batch)))  # a token for each, before any proposal
                drafts = []
                for i, g in enumerate(batch):
                    t0 = time.perf_counter()
                    draft = g.drafter.propose(left[i] - 1, plan) if started[i] and speculates(g) else []
                    made = time.perf_counter() - t0
                    if draft:
                        plan.add(len(draft), g.drafter.pace.yield_of(len(draft)), made)
                        if steady[i]:
                            costs.drafted(len(draft), made)
                    steady[i] = bool(draft)
                    drafts.append(draft)
                t1 = time.perf_counter()
                steps = self.engine.decode_drafts(sessions, drafts, logprobs)
                costs.verified(plan.extra, time.perf_counter() - t1)
                accepted = []
                for i, (g, draft, tokens) in enumerate(zip(batch, drafts, steps)):
                    started[i] = True
                    n = 0
                    while n < min(len(draft), len(tokens)) and tokens[n].error is None and tokens[n].id == draft[n]:
                        n += 1
                    accepted.append(n)
                    if draft:
                        g.drafter.record(len(draft), n)
                    if g.drafter is not None:  # a drafter sees every token, on this thread
                        g.drafter.extend([t.id for t in tokens if not t.stopped and t.error is None])
                    left[i] -= len(tokens)
                loop.call_soon_threadsafe(self._deliver_drafts, batch, steps, drafts, accepted)
                if self._interrupt or not any(speculates(g) for g in batch) \
                        or any(t.stopped or t.is_terminal or t.error for tokens in steps for t in tokens):
                    return  # (paused drafters' generations go on in plain steps)

        try:
            await loop.run_in_executor(self.executor, run)
        except Exception as exc:
            for g in batch:
                g.slot.dirty = True
                self._finish(g, "error", exc)

    def _deliver_drafts(self, batch: list[Generation], steps: list[list[Token]], drafts: list[list[int]],
                        accepted: list[int]) -> None:
        """A speculative step's tokens, on the event loop: each as a plain step's."""
        for g, tokens, draft, n in zip(batch, steps, drafts, accepted):
            if draft:
                g.drafted += len(draft)
                g.accepted += n
                self.metrics.draft_tokens.inc(len(draft), drafter=g.drafter.name)
                self.metrics.draft_accepted.inc(n, drafter=g.drafter.name)
            for tok in tokens:
                self._deliver([g], [tok])

    def _deliver(self, batch: list[Generation], tokens: list[Token]) -> None:
        """One decode step's tokens, on the event loop."""
        for g, tok in zip(batch, tokens):
            if g.finished:  # its lease is released: the slot may serve another request now;
                continue    # `resident` stays a prefix of the cache, which is all it promises
            if tok.stopped:
                self._finish(g, "end", "cancelled")
                continue
            if tok.error is not None:  # this generation's step failed; the others' went on
                g.slot.dirty = True
                self._finish(g, "error", tok.error)
                continue
            if g.pending is not None:
                g.slot.resident.append(g.pending)  # fed to the cache at the start of this step
            g.pending = tok.id
            if g.cancelled:
                self._finish(g, "end", "cancelled")
                continue
            now = time.perf_counter()
            g.generated += 1
            self.metrics.generated_tokens.inc()
            if g.generated == 1:
                g.t_first_token = now
                self.metrics.first_token.observe(now - g.t_submit)
            else:
                self.metrics.inter_token.observe(now - g.t_last_token)
            g.t_last_token = now
            g.forced = g.forced or tok.forced
            g.events.put_nowait(("token", tok))
            if tok.is_terminal:
                self._finish(g, "end", "length" if g.forced else "stop")
            elif g.generated >= g.max_tokens:
                self._finish(g, "end", "length")


def watch(metrics: ServerMetrics, runtime: Runtime, table: SessionTable, queued: Callable[[], int]) -> None:
    """Sample the state gauges of `metrics` from the runtime and the session table at each
    scrape; `queued` counts the generation requests waiting to start."""
    metrics.generations_active.read = lambda: runtime.active
    metrics.generations_queued.read = lambda: table.waiting
    metrics.sessions_in_use.read = lambda: table.in_use
    metrics.sessions_capacity.read = lambda: table.capacity - 1
    metrics.engine_sessions.read = table.engine.live_sessions
    metrics.table_sessions.read = lambda: table.engine_sessions
    engine, block = table.engine, table.engine.info.kv_block_bytes
    draft = runtime.draft_engine

    def kv_bytes() -> int:
        """The model's blocks and the draft model's, and their rings."""
        held = engine.kv_stats().blocks_live * block + table.ring_bytes
        return held + (draft.kv_stats().blocks_live * draft.info.kv_block_bytes if draft is not None else 0)

    metrics.kv_bytes.read = kv_bytes
    metrics.kv_blocks.read = lambda: engine.kv_stats().blocks_live

    def shared_holds() -> int:
        stats = engine.kv_stats()
        return stats.block_refs - stats.blocks_live

    metrics.blocks_shared.read = shared_holds
    metrics.bytes_saved.read = lambda: shared_holds() * block
    metrics.retired_blocks.read = lambda: engine.kv_stats().blocks_retired
    metrics.retired_bytes.read = lambda: engine.kv_stats().blocks_retired * block
    metrics.snapshots.read = lambda: engine.kv_stats().snapshots
    metrics.snapshot_bytes.read = lambda: engine.kv_stats().snapshot_bytes
    metrics.evictions.read = lambda: table.evictions
    metrics.gateway_queued.read = queued
    metrics.gateway_running.read = lambda: runtime.active - runtime.queued
    per_slot = engine.info.bytes_per_session + (draft.info.bytes_per_session if draft is not None else 0)
    kv_memory = max(table.capacity * per_slot, 1)

    def kv_usage() -> float:
        slots = table.in_use / (table.capacity - 1) if table.capacity > 1 else 0.0
        return min(max(metrics.kv_bytes.read() / kv_memory, slots), 1.0)

    metrics.gateway_kv_usage.read = metrics.gateway_kv_usage_old.read = kv_usage
    if (store := table.store) is not None:
        metrics.session_files_saved.read = lambda: store.saved
        metrics.session_files_loaded.read = lambda: store.loaded
        metrics.session_files_refused.read = lambda: store.refused
        metrics.session_files_failed.read = lambda: store.failed
        metrics.session_files_conflicts.read = lambda: store.conflicts
        metrics.session_dir_bytes.read = lambda: store.bytes_used
