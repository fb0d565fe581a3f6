"""Prompt lookup: drafts for speculative decoding from a generation's own tokens.

A generation that copies from its context (a code edit reprinting a file, an answer
quoting a passage, a JSON rewrite) continues, token for token, some run of tokens it
has seen before. The drafter finds the longest recent n-gram (NGRAM_MAX down to
NGRAM_MIN tokens) that ends its tokens and occurred earlier, and proposes the tokens
that followed that earlier occurrence (the most recent one). The engine verifies
the proposal in one forward pass (Session.decode_draft) and keeps what its own
sampling agrees with, so a proposal never changes the output, only its speed.

How many tokens it proposes (k) adapts to what the engine accepts (Pace, which the
draft model's drafter, llmd.serving.draft_model, shares): k doubles after a
proposal accepted whole and falls to one past what was accepted otherwise, within
[n_min, n_max]. A proposal shorter than n_min is not made. A generation whose
proposals keep being rejected outright (MISSES in a row) pauses proposing for a
number of steps that doubles with each pause, up to MAX_PAUSE, and resets once a
proposal is accepted: a reply that copies nothing pays at most one wasted
verification every MAX_PAUSE steps.

No I/O, no engine: plain ids in, a proposal out (tests/serving/test_speculative.py).
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "ngram", "draft")  # the drafters there are (--speculative); MTP heads are not built yet
MAX_DRAFT = 32       # the engine's bound on a proposal (LLMD_MAX_DRAFT)
NGRAM_MAX = 4        # the longest n-gram looked up: longer ones pick the right copy among several
NGRAM_MIN = 3        # shorter matches guess wrong too often to pay for their verification (docs/speculative.md)
FIRST_K = 4          # a generation's first proposal's length, before it has a record
N_MAX = 16           # default cap on k (a verification of 16 drafts still costs about one step)
MISSES = 2           # proposals rejected outright in a row before proposing pauses
FIRST_PAUSE = 8      # steps of the first pause
MAX_PAUSE = 256      # longest pause


@dataclass(frozen=True)
class DraftLimits:
    """A generation's bounds on its proposals' length (llama.cpp's speculative.n_max
    and speculative.n_min)."""

    n_max: int = N_MAX
    n_min: int = 0


class Pace:
    """How long a generation's next proposal may be, whatever drafts it: k adapts to
    what the engine accepted of the last ones, and proposing pauses after rejections
    (the module doc)."""

    def __init__(self, limits: DraftLimits):
        if not 0 <= limits.n_min <= limits.n_max:
            raise ValueError("need 0 <= n_min <= n_max")
        self.n_max, self.n_min = limits.n_max, limits.n_min
        self.k = max(self.n_min, min(FIRST_K, self.n_max))  # the next proposal's length
        self._misses = 0
        self._pause = 0      # steps left without proposing
        self._pause_len = FIRST_PAUSE

    def length(self, limit: int) -> int:
        """The length of the proposal to make now: min(k, limit), or 0 for none (a
        pause, or room for less than n_min). A call that returns 0 while pausing
        counts as one step of the pause."""
        if self._pause > 0:
            self._pause -= 1
            return 0
        k = min(self.k, limit)
        return k if k > 0 and k >= self.n_min else 0

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        if accepted == drafted:
            self.k = min(self.n_max, 2 * self.k)
        else:
            self.k = max(self.n_min, min(self.n_max, accepted + 1), 1)
        if accepted > 0:
            self._misses, self._pause_len = 0, FIRST_PAUSE
            return
        self._misses += 1
        if self._misses >= MISSES:
            self._misses = 0
            self._pause = self._pause_len
            self._pause_len = min(MAX_PAUSE, 2 * self._pause_len)


class NgramDrafter:
    """One generation's prompt-lookup drafter over its tokens (prompt, then generated)."""

    name = "ngram"  # as /metrics labels its counts

    def __init__(self, tokens: list[int], limits: DraftLimits = DraftLimits()):
        self.pace = Pace(limits)
        self.tokens: list[int] = []
        # n-gram -> index in tokens of what followed its most recent occurrence
        self._next: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, ids: list[int]) -> None:
        """Append ids to the tokens the drafter looks in (each generated token, in order)."""
        t = self.tokens
        for tok in ids:
            end = len(t)  # the n-grams ending just before tok are now followed by it
            for n in range(NGRAM_MIN, min(NGRAM_MAX, end) + 1):
                self._next[tuple(t[end - n:end])] = end
            t.append(tok)

    def propose(self, limit: int) -> list[int]:
        """Up to min(k, limit) ids to follow the tokens, or [] (no match, a proposal
        shorter than n_min, or a pause: Pace.length)."""
        k = self.pace.length(limit)
        if k == 0:
            return []
        t = self.tokens
        for n in range(min(NGRAM_MAX, len(t)), NGRAM_MIN - 1, -1):
            start = self._next.get(tuple(t[len(t) - n:]))
            if start is not None:
                draft = t[start:start + k]
                return draft if len(draft) >= max(self.pace.n_min, 1) else []
        return []

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self.pace.record(drafted, accepted)
