"""A draft model: speculative proposals from a smaller model of the same vocabulary.

`--speculative draft --draft-model PATH` opens a second engine on PATH, on the one
executor thread that makes every engine call. Its vocabulary must be the target's,
the same size and the same text for every id (vocab_difference), or the server does
not start: a drafted id is verified as the target's id, so any other vocabulary would
only guess wrong.

Every slot of the session table has a draft session beside its engine session
(DraftSession: opened and freed with it by llmd.serving.sessions, so evicting or
deleting a session frees its draft session too), which mirrors the target's tokens.
Before each proposal the drafter cuts the draft session back to the longest prefix it
shares with the generation's tokens (prompt and reply so far, the pending token
included) and prefills the rest, planned as the target's warm resume is
(llmd.serving.prefill: a recurrent draft model rewinds to its checkpoints); then the
draft model decodes greedily up to k tokens, under the request's logit_bias (a token
the request bans is never worth drafting). k adapts, and proposing pauses after
rejections, exactly as for prompt lookup (llmd.serving.speculative.Pace). A
generation starts with no more of the draft session's cache than the target reused
(its own cache's or the prefix cache's: Generation.plan.keep), so the draft cache never
shows, through timing, what the target's would not.

A proposal costs one short prefill and k - 1 single-token steps of the draft model,
so a draft model pays only where its step is much cheaper than the target's
(docs/speculative.md). Every method runs on the executor thread (the runtime calls the
drafter there), except the constructor, which makes no engine call.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from llmd.engine.native import Engine, Sampling, Session, TokenError
from llmd.serving.prefill import plan_prefill
from llmd.serving.speculative import Costs, DraftLimits, Pace, Pass

CATCH_UP = 256  # tokens a draft session prefills per step at most, as a prefill chunk (runtime.PREFILL_CHUNK)
CATCH_UP_TIMED = 8  # a catch-up of this many tokens or more is timed (Costs.caught_up); a step's 1 or 2 are drafting


def vocab_difference(target: Engine, draft: Engine) -> str | None:
    """Why `draft` cannot draft for `target`, or None if it can: the vocabularies must
    have the same size and the same bytes for every id, control tokens included."""
    n, m = target.info.n_vocab, draft.info.n_vocab
    if n != m:
        return f"its vocabulary has {m} tokens, the model's {n}"
    for i in range(n):
        mine, theirs = _text(target, i), _text(draft, i)
        if mine != theirs:
            return f"token {i} is {mine!r} in the model and {theirs!r} in the draft model"
    return None


def _text(engine: Engine, token_id: int) -> bytes | None:
    """A token's bytes, control tokens' text included; None for an id of the model's
    output that the vocabulary does not list (a padded vocab_size)."""
    try:
        return engine.piece(token_id, special=True)
    except TokenError:
        return None


@dataclass(eq=False)
class DraftSession:
    """A slot's session on the draft model, and the ids its KV cache holds (those
    written by the drafter only; [] when they are not known)."""

    session: Session
    n_ctx: int
    resident: list[int] = field(default_factory=list)


def open_draft_session(engine: Engine) -> DraftSession:
    """A new session of the draft model (on the executor thread)."""
    return DraftSession(engine.new_session(), engine.info.n_ctx)


class ModelDrafter:
    """One generation's drafter on its slot's draft session."""

    name = "draft"  # as /metrics labels its counts

    def __init__(self, draft: DraftSession, tokens: list[int], keep: int, limits: DraftLimits = DraftLimits(),
                 logit_bias: dict[int, float] | None = None, costs: Costs | None = None):
        """tokens: the prompt; keep: the prompt tokens the target session reused (the
        draft session's cache is cut to that at the first proposal); logit_bias: the
        request's; costs: the runtime's timings, which pace the proposals."""
        self.pace = Pace(limits, costs)
        self.draft = draft
        self.tokens = list(tokens)
        self._keep: int | None = keep
        self._sampling = Sampling(logit_bias=logit_bias or {})  # greedy

    def extend(self, ids: list[int]) -> None:
        """Append ids to the generation's tokens (each generated token, in order)."""
        self.tokens += ids
        self.pace.tick(len(ids))

    def propose(self, limit: int, plan: Pass | None = None) -> list[int]:
        """Up to min(k, limit) ids the draft model decodes greedily after the tokens, or
        [] (a pause, room for less than n_min, or a step spent catching up with a long
        prompt: CATCH_UP tokens per step). plan: the pass the proposal would join
        (default: alone)."""
        d, t = self.draft, self.tokens
        if self._keep is not None:  # the generation's first call
            del d.resident[self._keep:]
            d.session.set_sampling(self._sampling)
            self._keep = None
        session = d.session
        catch_up = plan_prefill(d.resident, t, False, floor=session.resume_floor, points=session.resume_points)
        # The draft session holds the tokens and k - 1 drafts after them.
        k = self.pace.length(min(limit, d.n_ctx + 1 - len(t)), behind=max(catch_up.prefill - 1, 0), plan=plan)
        if k == 0:
            return []
        d.resident = []  # until the calls below succeed, nothing of the cache is trusted
        session.truncate(catch_up.keep)
        chunk = t[catch_up.keep:catch_up.keep + CATCH_UP]
        start = time.perf_counter()
        session.prefill(chunk)
        if len(chunk) >= CATCH_UP_TIMED and self.pace.costs is not None:
            self.pace.costs.caught_up(len(chunk), time.perf_counter() - start)
        if catch_up.prefill > CATCH_UP:
            d.resident = t[:catch_up.keep + CATCH_UP]
            return []
        draft: list[int] = []
        while len(draft) < k:
            token = session.decode_one()
            draft.append(token.id)
            if token.is_terminal:  # nothing follows an end of generation
                break
        d.resident = t + draft[:-1]  # the last draft is pending, not in the cache
        return draft if len(draft) >= self.pace.n_min else []

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self.pace.record(drafted, accepted)
