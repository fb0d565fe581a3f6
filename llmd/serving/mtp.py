"""Multi-token prediction: speculative proposals from the model's own prediction block.

`--speculative mtp` opens the model with its first multi-token-prediction block
running beside it (Engine(draft_nextn=True); Qwen3.5 and GLM-4.5 files with nextn_predict_layers),
so every session also keeps the block's keys and values for its tokens, at the cost of
one more block per token in every pass. A proposal is the block's greedy guess after
the pending token, chained up to k tokens (Session.draft_nextn): each draft costs a
pass of the block and of the output head, on the generation's own session, and there
is nothing to catch up. k adapts, and proposing pauses after rejections, as for a
draft model (llmd.serving.speculative.Pace). Every method runs on the executor thread
except the constructor, which makes no engine call.
"""
from __future__ import annotations

from llmd.engine.native import Session
from llmd.serving.speculative import Costs, DraftLimits, Pace, Pass


class MtpDrafter:
    """One generation's drafter on its own session."""

    name = "mtp"  # as /metrics labels its counts

    def __init__(self, session: Session, limits: DraftLimits = DraftLimits(), costs: Costs | None = None):
        self.pace = Pace(limits, costs)
        self.session = session

    def extend(self, ids: list[int]) -> None:
        """Append ids to the generation's tokens (each generated token, in order)."""
        self.pace.tick(len(ids))

    def propose(self, limit: int, plan: Pass | None = None) -> list[int]:
        """Up to min(k, limit) ids the prediction block guesses after the pending token,
        or [] (a pause, or room for less than n_min). plan: the pass the proposal would
        join (default: alone)."""
        k = self.pace.length(limit, plan=plan)
        if k == 0:
            return []
        draft = self.session.draft_nextn(k)
        return draft if len(draft) >= self.pace.n_min else []

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self.pace.record(drafted, accepted)
