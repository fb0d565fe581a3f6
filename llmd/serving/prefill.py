"""Warm-resume prefill planning: how much of a session's KV cache a new prompt reuses.

A session's KV cache holds `resident` tokens. For the next request's `prompt`, the
runtime keeps the first `keep` resident tokens (truncating the cache to `keep`) and
prefills `prompt[keep:]`. `keep` is the longest common prefix of resident and prompt,
capped at len(prompt) - 1: at least one prompt token must go through the model so that
its logits (for the first generated token) exist.

Rules, in order of precedence:

    enabled is False              -> keep 0, reason "disabled"   (--no-warm-resume)
    dirty is True                 -> keep 0, reason "dirty"      (cache not trustworthy)
    resident empty                -> keep 0, reason "new"
    lcp == 0                      -> keep 0, reason "mismatch"
    lcp == len(resident) < len(prompt)
                                  -> keep lcp, reason "exact_prefix" (append-only resume)
    prompt == resident            -> keep len(prompt) - 1, reason "equal"
    otherwise (0 < lcp, and the resident continues past lcp; this includes a prompt
    that is a strict prefix of resident)
                                  -> keep min(lcp, len(prompt) - 1), reason "common_prefix"
    and then, if points is given and 0 < keep is not one of them
                                  -> keep the largest point below keep, reason "checkpoint",
                                     or keep 0, reason "no_checkpoint" if none is
    and then, if 0 < keep < floor -> keep 0, reason "window"

`points` are where a model with recurrent layers can resume (Session.resume_points):
its state cannot be cut back, only restored from a checkpoint (taken at the end of
every prefill, and at the end of a reply that a prefill continues) or kept where it
is. So a conversation that appends a turn resumes from the live state, and one whose
last turn changed (a template that rewrites the previous reply) from the newest
checkpoint before the change. None (a model of attention layers only) allows any.

The prefix cache (llmd_session_share_prefix) may then offer more: `with_cached`
turns a plan into one that reuses `cached` tokens, reason "prefix_cache", when
that is more than the plan keeps of the session's own cache (for a model with
recurrent layers, a whole number of blocks ending where the engine kept a snapshot
of the recurrent state).

`floor` is the session's resume floor (Session.resume_floor): a model with
sliding-window layers keeps only their recent positions in a ring, so once the ring
has wrapped, the cache can be cut back to 0 or to `floor` and later, never between.

The reason names the relation between resident and prompt, so for a one-token prompt
"equal" and "common_prefix" may come with keep 0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Sequence

REASONS = ("new", "exact_prefix", "common_prefix", "equal", "mismatch", "dirty", "disabled", "window",
           "checkpoint", "no_checkpoint", "prefix_cache")
SCOPES = ("off", "key", "global")  # --prefix-cache


@dataclass(frozen=True)
class PrefillPlan:
    keep: int       # resident tokens reused (usage.prompt_tokens_details.cached_tokens)
    prefill: int    # prompt tokens to run through the model: len(prompt) - keep, >= 1
    discard: int    # resident tokens dropped by truncating the cache to `keep`
    reason: str     # one of REASONS


def plan_prefill(resident: Sequence[int], prompt: Sequence[int], dirty: bool,
                 enabled: bool = True, floor: int = 0, points: Sequence[int] | None = None) -> PrefillPlan:
    """Plan a warm resume by the rules in the module docstring.

    Raises ValueError for an empty prompt (there would be nothing to compute logits from).
    """
    n_prompt, n_resident = len(prompt), len(resident)
    if n_prompt == 0:
        raise ValueError("plan_prefill: the prompt is empty")

    def plan(keep: int, reason: str) -> PrefillPlan:
        if points is not None and 0 < keep and keep not in points:
            below = [p for p in points if 0 < p < keep]
            keep, reason = (max(below), "checkpoint") if below else (0, "no_checkpoint")
        if 0 < keep < floor:
            keep, reason = 0, "window"
        return PrefillPlan(keep, n_prompt - keep, n_resident - keep, reason)

    if not enabled:
        return plan(0, "disabled")
    if dirty:
        return plan(0, "dirty")
    if n_resident == 0:
        return plan(0, "new")
    lcp = common_prefix_length(resident, prompt)
    if lcp == 0:
        return plan(0, "mismatch")
    if lcp == n_resident < n_prompt:
        return plan(lcp, "exact_prefix")
    if lcp == n_resident == n_prompt:
        return plan(n_prompt - 1, "equal")
    return plan(min(lcp, n_prompt - 1), "common_prefix")


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual append-only case, compared at C speed
        return n
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def with_cached(plan: PrefillPlan, cached: int) -> PrefillPlan:
    """The plan when the prefix cache holds the prompt's first `cached` tokens: those
    are reused instead of the session's own when they are more (the whole resident
    cache is replaced, so all of it counts as discarded)."""
    if cached <= plan.keep:
        return plan
    n_prompt = plan.keep + plan.prefill
    if cached >= n_prompt:
        raise ValueError("with_cached: at least one prompt token must be prefilled")
    return PrefillPlan(cached, n_prompt - cached, plan.keep + plan.discard, "prefix_cache")


def cache_scope(mode: str, principal: str, salt: str | None) -> str | None:
    """Who a request shares cached prefixes with (--prefix-cache), as the scope the
    engine compares; None when it shares with nobody. "key": requests made with the
    same API key (`principal`, "" when the server has none: then all requests);
    "global": all requests. A `cache_salt` narrows either to the requests that send
    the same salt."""
    if mode == "off":
        return None
    if mode not in SCOPES:
        raise ValueError(f"cache_scope: unknown mode {mode!r}")
    owner = principal if mode == "key" else ""
    return json.dumps([owner, salt])
