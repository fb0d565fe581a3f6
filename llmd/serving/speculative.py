"""Prompt lookup: drafts for speculative decoding from a generation's own tokens.

A generation that copies from its context (a code edit reprinting a file, an answer
quoting a passage, a JSON rewrite) continues, token for token, some run of tokens it
has seen before. The drafter finds the longest recent n-gram (NGRAM_MAX down to
NGRAM_MIN tokens) that ends its tokens and occurred earlier, and proposes the tokens
that followed that earlier occurrence (the most recent one). The engine verifies
the proposal in one forward pass (Session.decode_draft) and keeps what its own
sampling agrees with, so a proposal never changes the output, only its speed.

How many tokens a proposal holds (k) is paced by what the engine accepted and by
what speculation costs here (Costs, timed by the runtime on its executor thread: a
pass of k tokens beyond the first, a proposal of k drafts, in seconds). A proposal
joins a pass that may hold other generations' tokens and proposals (Pass): it is made
only if it raises the whole pass's tokens per second, which for a generation alone
means beating a plain step.

Prompt lookup (CopyPace). A copy goes on or breaks: its drafts are accepted in runs,
not one by one. Where the copied tokens occurred twice before, the copy is expected to
go on as far as their two continuations agree (a reply that repeats a pattern breaks
where the pattern changes), and one token more is proposed. Otherwise Runs records how
long the generation's copies ran (over the runtime's record of all its generations as
a prior): the chance S(j) that the first j drafts are accepted, and so the tokens a
verification of k drafts yields, 1 + S(1) + ... + S(k). CopyPace proposes the k that
gives the pass the most tokens per second (drafting is free), and nothing while no k
beats the pass without it, except one in PROBE_EVERY declined matches in a row,
to learn whether copying came back, where a copy accepted whole would pay (in a pass
busy enough that none would, a probe learns nothing worth its verification). Until
the costs are timed, it proposes as much as it may.

A draft model (Pace, llmd.serving.draft_model), whose drafts cost steps of its own and
are accepted one by one. The longest proposal allowed doubles after a proposal
accepted whole and falls to one past what was accepted otherwise, within [n_min,
n_max]. Within it, Pace proposes the k that gives the pass the most tokens per second,
expected_tokens(k, acceptance) over the drafting and the pass's verification, at the
generation's recent per-draft acceptance; when no k beats the pass without it, it
does not propose and pauses. Proposals rejected outright MISSES times in a row pause
proposing too. A pause lasts a number of generated tokens (however they were decoded:
the runtime decodes a paused generation plainly) that doubles with each pause, up to
MAX_PAUSE, and starts over once a proposal that paid is accepted; after a pause (and
for a generation's first proposal) one proposal is made whatever the costs say, to
probe the acceptance again, in the first pass where it would pay if accepted whole.
So a draft model that costs more than it saves pays at most one wasted verification
every MAX_PAUSE tokens. Until a verification has been
timed, the allowed length is proposed as is. A draft model must first catch up with
the tokens (at a new prompt or after a pause): it proposes, a probe included, only if
that costs less than speculating could save over the tokens left, at the recent
acceptance of all the runtime's generations.

A proposal shorter than n_min is not made.

No I/O, no engine: plain ids in, a proposal out (tests/serving/test_speculative.py).
"""
from __future__ import annotations

from dataclasses import dataclass

MODES = ("off", "ngram", "draft", "mtp")  # the drafters there are (--speculative)
MAX_DRAFT = 32       # the engine's bound on a proposal (LLMD_MAX_DRAFT)
NGRAM_MAX = 4        # the longest n-gram looked up: longer ones pick the right copy among several
NGRAM_MIN = 3        # shorter matches guess wrong too often to pay for their verification (docs/speculative.md)
FIRST_K = 4          # the longest a generation's first proposal may be, before it has a record
N_MAX = MAX_DRAFT    # default cap on k (the pacing chooses less where it pays less)
MISSES = 2           # proposals rejected outright in a row before proposing pauses
FIRST_PAUSE = 8      # tokens of the first pause
MAX_PAUSE = 256      # longest pause, in tokens
COST_WEIGHT = 0.2    # a new timing's weight in its running mean (Costs)
RECENT = 0.95        # the weight of the older record of acceptance at each draft verified (Pace)
RECENT_RUNS = 0.95   # the weight of the older record of copies at each proposal verified (CopyPace)
RUN_PRIOR = 2.0      # pseudo-proposals of the runtime's record of copies in a generation's, per draft position
PROBE_EVERY = 16     # matches declined in a row before one is proposed anyway (CopyPace)


@dataclass(frozen=True)
class DraftLimits:
    """A generation's bounds on its proposals' length (llama.cpp's speculative.n_max
    and speculative.n_min)."""

    n_max: int = N_MAX
    n_min: int = 0


@dataclass
class Pass:
    """A verification pass as its proposals are made, one generation's after another:
    the tokens it runs beyond the first (a token for each generation in it, and the
    drafts proposed so far), the tokens it is expected to yield, and the seconds its
    proposals took to make. A generation alone starts from Pass(): one token, yielding
    one. Each proposal is weighed against the pass without it: its drafts must raise the
    tokens per second of the whole pass, whatever the others proposed."""

    extra: int = 0
    expected: float = 1.0
    drafting: float = 0.0

    def add(self, k: int, expected: float, drafting: float) -> None:
        """A proposal of k drafts, expected to yield `expected` tokens (its generation's
        own token included), made in `drafting` seconds."""
        self.extra += k
        self.expected += expected - 1.0
        self.drafting += drafting

    def rate(self, costs: Costs, k: int = 0, expected: float = 1.0, drafting: float = 0.0) -> float | None:
        """Tokens per second of the pass with a proposal of k drafts more, expected to
        yield `expected` tokens and made in `drafting` seconds (by default, of the pass
        as it is); None while its cost is not known."""
        verify = costs.verify(self.extra + k)
        if verify is None:
            return None
        return (self.expected - 1.0 + expected) / max(self.drafting + drafting + verify, 1e-9)

    def worth_probing(self, costs: Costs, ks: range, drafting=lambda k: 0.0) -> bool:
        """Whether a proposal of some k in ks, accepted whole and made in drafting(k)
        seconds, would raise the pass's tokens per second (True while that is not known).
        Where none would, no acceptance can make a proposal pay in this pass, and a
        probe of the acceptance costs a verification to learn nothing."""
        now = self.rate(costs)
        if now is None:
            return True
        for k in ks:
            seconds = drafting(k)
            whole = None if seconds is None else self.rate(costs, k, k + 1.0, seconds)
            if whole is None or whole > now:
                return True
        return False


class Acceptance:
    """A record of drafts accepted and of rejections (proposals not accepted whole), in
    which each verified draft weighs the older record by RECENT."""

    def __init__(self, accepted: float = 0.0, rejected: float = 0.0):
        self.accepted, self.rejected = accepted, rejected

    def add(self, drafted: int, accepted: int) -> None:
        older = RECENT ** drafted
        self.accepted = older * self.accepted + accepted
        self.rejected = older * self.rejected + (accepted < drafted)

    @property
    def rate(self) -> float | None:
        """The recent probability that a draft is accepted once those before it are,
        None with no record."""
        total = self.accepted + self.rejected
        return self.accepted / total if total else None


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens a verification of k drafts yields on average when each draft is accepted
    with probability `acceptance` once those before it are: 1 + a + a^2 + ... + a^k."""
    return float(k + 1) if acceptance >= 1.0 else (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


class Runs:
    """A record of how long prompt-lookup copies ran: for each draft position j, the
    proposals whose j-th draft was accepted and those that broke there, each proposal
    weighing the older record by RECENT_RUNS. A copy goes on or breaks, so the chance
    that a draft is accepted depends on its position in the run, not on one rate for
    every draft (Acceptance): long copies and copies that break at once mix in one
    record as they come."""

    def __init__(self):
        self.accepted = [0.0] * (MAX_DRAFT + 1)  # [j]: proposals whose draft j was accepted (j >= 1)
        self.broke = [0.0] * (MAX_DRAFT + 1)     # [j]: proposals whose draft j was the first rejected

    def add(self, drafted: int, accepted: int) -> None:
        self.accepted = [RECENT_RUNS * n for n in self.accepted]
        self.broke = [RECENT_RUNS * n for n in self.broke]
        for j in range(1, accepted + 1):
            self.accepted[j] += 1.0
        if accepted < drafted:
            self.broke[accepted + 1] += 1.0

    def survival(self, top: int, prior: Runs | None = None) -> list[float]:
        """S(0) = 1, ..., S(top): the chance that the first j drafts of a copy are
        accepted. Each position's chance that the run goes on is this record's, with
        RUN_PRIOR pseudo-proposals at `prior`'s (where it has none, the position
        before's; an even chance to begin with)."""
        out, survive, rate = [1.0], 1.0, 0.5
        for j in range(1, top + 1):
            base = rate  # past the prior's record, the position before's chance
            if prior is not None and (seen := prior.accepted[j] + prior.broke[j]) > 0:
                base = prior.accepted[j] / seen
            rate = (self.accepted[j] + RUN_PRIOR * base) / (self.accepted[j] + self.broke[j] + RUN_PRIOR)
            survive *= rate
            out.append(survive)
        return out


class Costs:
    """What a runtime's speculative steps cost, in seconds: running means (each new
    timing weighs COST_WEIGHT) of a pass of k tokens beyond the first for each k timed
    (a verification of k drafts, or a step of k + 1 generations, or a mix of both;
    k = 0 is a plain step of one), and of a proposal of k drafts. A k not timed is
    estimated from the timed ones around it, on the line through the nearest two (a
    pass) or through 0 at k = 0 and the nearest one (a proposal). A pass of several
    generations reads their contexts as a verification reads one; at long contexts it
    costs more than a verification of as many tokens, which the running means blur."""

    def __init__(self):
        self._verify: dict[int, float] = {}
        self._draft: dict[int, float] = {}
        self._catch_up: float | None = None  # seconds per token a drafter prefills to catch up
        self._record = Acceptance()  # every generation's, as Pace keeps one's
        self.runs = Runs()  # every prompt-lookup generation's, as CopyPace keeps one's

    def caught_up(self, tokens: int, seconds: float) -> None:
        """A drafter took `seconds` to catch up with `tokens` tokens (a draft model's
        session prefilling what the generation added while it did not propose)."""
        per_token = seconds / tokens
        old = self._catch_up
        self._catch_up = per_token if old is None else old + COST_WEIGHT * (per_token - old)

    def catch_up(self, tokens: int) -> float | None:
        """Seconds to catch up with `tokens` tokens, None until a catch-up is timed."""
        return None if self._catch_up is None else self._catch_up * tokens

    def record(self, drafted: int, accepted: int) -> None:
        """Some generation had `accepted` of `drafted` ids accepted."""
        self._record.add(drafted, accepted)

    @property
    def acceptance(self) -> float | None:
        """The recent per-draft acceptance of all generations, None before any proposal."""
        return self._record.rate

    def verified(self, k: int, seconds: float) -> None:
        """A pass of k tokens beyond the first (0: a plain step of one) took `seconds`."""
        _update(self._verify, k, seconds)

    def drafted(self, k: int, seconds: float) -> None:
        """A proposal of k drafts took `seconds` to make."""
        _update(self._draft, k, seconds)

    def verify(self, k: int) -> float | None:
        """A pass of k tokens beyond the first's seconds, None until it can be estimated
        (k timed, or two passes)."""
        return _estimate(self._verify, k)

    def draft(self, k: int) -> float | None:
        """A proposal of k drafts' seconds, None until one is timed."""
        return _estimate({0: 0.0, **self._draft}, k)


def _update(means: dict[int, float], k: int, seconds: float) -> None:
    old = means.get(k)
    means[k] = seconds if old is None else old + COST_WEIGHT * (seconds - old)


def _estimate(means: dict[int, float], k: int) -> float | None:
    if k in means:
        return means[k]
    below = [j for j in means if j < k]
    above = [j for j in means if j > k]
    if below and above:  # between the nearest two
        a, b = max(below), min(above)
    elif len(below) >= 2:  # past the last two
        a, b = sorted(below)[-2:]
    elif len(above) >= 2:  # before the first two
        a, b = sorted(above)[:2]
    else:
        return None
    return max(0.0, means[a] + (means[b] - means[a]) * (k - a) / (b - a))


class Pace:
    """How long a generation's next proposal is, whatever drafts it: the k that yields
    the most tokens per second at its recent acceptance, within a length that adapts
    to what the engine accepted of the last proposals, and none (a pause) while no k
    beats a plain step or after rejections (the module doc). costs: the runtime's
    timings, None to pace by acceptance alone."""

    def __init__(self, limits: DraftLimits, costs: Costs | None = None):
        if not 0 <= limits.n_min <= limits.n_max:
            raise ValueError("need 0 <= n_min <= n_max")
        self.n_max, self.n_min = limits.n_max, limits.n_min
        self.costs = costs
        self.k = max(self.n_min, min(FIRST_K, self.n_max))  # the longest next proposal allowed
        self._record = Acceptance(0.5, 0.5)  # before any proposal, an even chance
        self._misses = 0
        self._pause = 0      # steps left without proposing
        self._pause_len = FIRST_PAUSE
        self._probe = True   # the next proposal is made whatever the costs say (until one is recorded)
        self._paid = True    # the last proposal was expected to pay

    @property
    def acceptance(self) -> float:
        """The recent probability that a draft is accepted once those before it are."""
        return self._record.rate

    @property
    def pause(self) -> int:
        """Tokens left to generate before proposing again (0: not pausing)."""
        return self._pause

    def tick(self, n: int) -> None:
        """n tokens generated: a pause lasts a number of tokens, however they were decoded."""
        self._pause = max(0, self._pause - n)

    def length(self, limit: int, behind: int = 0, plan: Pass | None = None) -> int:
        """The length of the proposal to make now, at most `limit`, or 0 for none (a
        pause, room for less than n_min, or no length that pays, which starts a pause).
        behind: tokens the drafter must catch up with before it can propose (a draft
        model's session after a pause); a proposal (a probe too) is made only if their
        cost is less than speculation could save over the `limit` tokens left, at the
        acceptance of every generation's recent proposals. While it pauses it returns 0;
        the pause counts down the tokens generated (tick). plan: the pass the proposal
        would join (default: this generation's alone)."""
        if self._pause > 0:
            return 0
        top = min(self.k, limit)
        if top <= 0 or top < self.n_min:
            return 0
        plan = plan if plan is not None else Pass()
        k, pays = self.best(top, plan)
        self._paid = pays
        if not pays and self._probe and self.costs is not None \
                and not plan.worth_probing(self.costs, range(max(self.n_min, 1), top + 1), self.costs.draft):
            return 0  # the probe waits for a pass where it could pay
        if (pays or self._probe) and self._worth_catching_up(behind, limit):
            return k
        self._start_pause()
        return 0

    def best(self, top: int, plan: Pass) -> tuple[int, bool]:
        """The k in [max(n_min, 1), top] that gives the pass `plan` the most tokens per
        second, and whether that beats the pass without it; (top, True) while the costs
        are not known."""
        found = self._best_rate(top, self.acceptance, plan)
        if found is None:
            return top, True
        rate, k = found
        return k, rate > plan.rate(self.costs)

    def yield_of(self, k: int) -> float:
        """Tokens a verification of k drafts is expected to yield."""
        return expected_tokens(k, self.acceptance)

    def _best_rate(self, top: int, acceptance: float, plan: Pass) -> tuple[float, int] | None:
        """(tokens per second of the pass, k) of the best k in [max(n_min, 1), top] at
        `acceptance`; None while the costs are not known."""
        costs, first = self.costs, max(self.n_min, 1)
        if costs is None or plan.rate(costs) is None or costs.verify(plan.extra + first) is None \
                or costs.draft(first) is None:
            return None
        return max((plan.rate(costs, k, expected_tokens(k, acceptance), costs.draft(k)), k)
                   for k in range(first, max(first, top) + 1))

    def _worth_catching_up(self, behind: int, limit: int) -> bool:
        """Whether catching up with `behind` tokens costs less than speculating could
        save over `limit` tokens; True while either is not known."""
        costs = self.costs
        cost = costs.catch_up(behind) if costs is not None and behind else None
        found = self._best_rate(min(self.k, limit), costs.acceptance, Pass()) \
            if cost is not None and costs.acceptance is not None else None
        return found is None or limit * (costs.verify(0) - 1.0 / found[0]) > cost

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self._probe = False
        if self.costs is not None:
            self.costs.record(drafted, accepted)
        self._record.add(drafted, accepted)
        if accepted == drafted:
            self.k = min(self.n_max, 2 * self.k)
        else:
            self.k = max(self.n_min, min(self.n_max, accepted + 1), 1)
        if accepted > 0:
            self._misses = 0
            if self._paid:
                self._pause_len = FIRST_PAUSE
            return
        self._misses += 1
        if self._misses >= MISSES:
            self._misses = 0
            self._start_pause()

    def _start_pause(self) -> None:
        self._pause = self._pause_len
        self._pause_len = min(MAX_PAUSE, 2 * self._pause_len)
        self._probe = True


class CopyPace:
    """How long a prompt-lookup proposal is. Where the copied tokens occurred twice
    before, the copy is expected to go on as far as those two occurrences agree, and
    one token more (`agree`): that is proposed if it pays when accepted whole.
    Otherwise, the k that yields the most tokens per second: the tokens a verification
    of k drafts yields, 1 + S(1) + ... + S(k), from how the generation's copies ran
    (Runs, over the runtime's record as a prior), over its timed seconds (Costs).
    Drafting is free, so nothing pauses: a match that does not pay is not proposed (a
    plain step), except one in PROBE_EVERY declined in a row, to learn whether copying
    came back. Until the costs are timed, the longest proposal allowed is made."""

    pause = 0  # prompt lookup never pauses (the runtime asks Pace and CopyPace alike)

    def __init__(self, limits: DraftLimits, costs: Costs | None = None):
        if not 0 <= limits.n_min <= limits.n_max:
            raise ValueError("need 0 <= n_min <= n_max")
        self.n_max, self.n_min = limits.n_max, limits.n_min
        self.costs = costs
        self.runs = Runs()
        self._declined = 0
        self._whole = False  # the last proposal's copy was expected to go on whole

    def expected(self, top: int) -> list[float]:
        """Tokens a verification of k = 0 .. top drafts yields on average."""
        survival = self.runs.survival(top, self.costs.runs if self.costs is not None else None)
        out = [1.0]
        for j in range(1, top + 1):
            out.append(out[-1] + survival[j])
        return out

    def length(self, limit: int, agree: int | None = None, plan: Pass | None = None) -> int:
        """The length of a proposal that may hold `limit` drafts (what the match offers
        and the tokens left), or 0 for none. agree: how far the copied tokens' two last
        occurrences went on alike, None when they occurred once. plan: the pass the
        proposal would join (default: this generation's alone)."""
        top = min(self.n_max, limit)
        if top <= 0 or top < self.n_min:
            return 0
        plan = plan if plan is not None else Pass()
        costs, first = self.costs, max(self.n_min, 1)
        if agree is not None:
            top = max(first, min(top, agree + 1))
        self._whole = agree is not None
        now = plan.rate(costs) if costs is not None else None
        if now is None or costs.verify(plan.extra + first) is None:
            return top
        if agree is not None:  # expected to be accepted whole: it pays if that pays
            k, rate = top, plan.rate(costs, top, top + 1.0)
        else:
            tokens = self.expected(top)
            rate, k = max((plan.rate(costs, k, tokens[k]), k) for k in range(first, top + 1))
        if rate > now or (self._declined >= PROBE_EVERY and plan.worth_probing(costs, range(first, top + 1))):
            self._declined = 0
            return k
        self._declined += 1
        return 0

    def yield_of(self, k: int) -> float:
        """Tokens a verification of the last proposal, k drafts, is expected to yield:
        all of them where its copy was expected whole."""
        return float(k + 1) if self._whole else self.expected(k)[k]

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self.runs.add(drafted, accepted)
        if self.costs is not None:
            self.costs.runs.add(drafted, accepted)


class NgramDrafter:
    """One generation's prompt-lookup drafter over its tokens (prompt, then generated)."""

    name = "ngram"  # as /metrics labels its counts

    def __init__(self, tokens: list[int], limits: DraftLimits = DraftLimits(), costs: Costs | None = None):
        self.pace = CopyPace(limits, costs)
        self.tokens: list[int] = []
        # n-gram -> index in tokens of what followed its most recent occurrence, and the one before
        self._next: dict[tuple[int, ...], int] = {}
        self._before: dict[tuple[int, ...], int] = {}
        self.extend(tokens)

    def extend(self, ids: list[int]) -> None:
        """Append ids to the tokens the drafter looks in (each generated token, in order)."""
        t, nxt, before = self.tokens, self._next, self._before
        for tok in ids:
            end = len(t)  # the n-grams ending just before tok are now followed by it
            for n in range(NGRAM_MIN, min(NGRAM_MAX, end) + 1):
                key = tuple(t[end - n:end])
                if (last := nxt.get(key)) is not None:
                    before[key] = last
                nxt[key] = end
            t.append(tok)

    def propose(self, limit: int, plan: Pass | None = None) -> list[int]:
        """Up to `limit` ids to follow the tokens, or [] (no match, or none that pays:
        CopyPace.length). plan: the pass the proposal would join (default: alone)."""
        t = self.tokens
        for n in range(min(NGRAM_MAX, len(t)), NGRAM_MIN - 1, -1):
            key = tuple(t[len(t) - n:])
            if (start := self._next.get(key)) is not None:
                break
        else:
            return []
        offered = min(limit, len(t) - start)
        agree = None
        if (other := self._before.get(key)) is not None:  # how far its two last continuations agree
            agree = 0
            while agree < offered and other + agree < start and t[other + agree] == t[start + agree]:
                agree += 1
        k = self.pace.length(offered, agree, plan)
        return t[start:start + k] if k >= max(self.pace.n_min, 1) else []

    def record(self, drafted: int, accepted: int) -> None:
        """The engine accepted `accepted` of the `drafted` ids last proposed."""
        self.pace.record(drafted, accepted)
