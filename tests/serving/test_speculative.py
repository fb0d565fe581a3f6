"""llmd/serving/speculative.py: the prompt-lookup drafter, on plain ids, and the pacing of
proposals by acceptance and by cost (fake timings): a draft model's (Pace), and prompt
lookup's by how long copies hold (CopyPace)."""
from __future__ import annotations

import random

import pytest

from llmd.serving.speculative import (FIRST_K, FIRST_PAUSE, MAX_PAUSE, MISSES, N_MAX, PROBE_EVERY, Costs, CopyPace,
                                     DraftLimits, NgramDrafter, Pace, Pass, expected_tokens)


def test_the_continuation_of_the_longest_matching_ngram_is_proposed():
    d = NgramDrafter([1, 2, 3, 4, 5, 6, 9, 2, 3, 7, 8, 0, 1, 2, 3], DraftLimits(n_max=4))
    assert d.propose(10) == [4, 5, 6, 9]
    # "1 2 3" last occurred before 7, but "9 1 2 3" matches the start: the 4-gram decides.
    d = NgramDrafter([9, 1, 2, 3, 4, 5, 6, 8, 1, 2, 3, 7, 7, 9, 1, 2, 3], DraftLimits(n_max=4))
    assert d.propose(10) == [4, 5, 6, 8]


def test_the_most_recent_occurrence_wins():
    d = NgramDrafter([5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 7])
    assert d.propose(1) == [2]


def test_no_match_and_single_tokens_propose_nothing():
    assert NgramDrafter([1, 2, 3, 4]).propose(8) == []
    assert NgramDrafter([7, 8, 1, 2, 7, 8]).propose(8) == []  # a bigram match is not enough
    assert NgramDrafter([]).propose(8) == []


def test_a_proposal_is_cut_at_the_limit_and_at_the_end_of_the_tokens():
    d = NgramDrafter([1, 2, 3, 4, 5, 1, 2, 3], DraftLimits(n_max=16))
    assert d.propose(2) == [4, 5]
    assert d.propose(16) == [4, 5, 1, 2, 3]
    assert d.propose(0) == []


def test_extend_indexes_new_tokens():
    d = NgramDrafter([1, 2, 3])
    assert d.propose(4) == []
    d.extend([9, 1, 2, 3])
    assert d.propose(4) == [9, 1, 2, 3]


def test_k_doubles_on_full_acceptance_and_falls_past_the_accepted_prefix():
    pace = Pace(DraftLimits(n_max=10))
    assert pace.k == 4
    pace.record(4, 4)
    assert pace.k == 8
    pace.record(8, 8)
    assert pace.k == 10  # n_max
    pace.record(10, 2)
    assert pace.k == 3
    pace.record(3, 0)
    assert pace.k == 1


def test_n_min_refuses_short_proposals_and_bounds_k():
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=2))
    assert d.propose(1) == []  # the limit leaves room for less than n_min
    pace = Pace(DraftLimits(n_max=8, n_min=2))
    pace.record(4, 0)
    assert pace.k == 2
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=4))
    assert d.propose(8) == [4, 1, 2, 3]  # as long as n_min
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=5))
    assert d.propose(8) == []  # [4, 1, 2, 3] is shorter than n_min


def pause_length(pace: Pace) -> int:
    """Tokens generated (one a step) before the pace proposes again."""
    n = 0
    while not pace.length(4):
        n += 1
        pace.tick(1)
    return n


def test_rejected_proposals_pause_proposing_for_longer_and_longer():
    pace = Pace(DraftLimits())
    pauses = []
    for _ in range(7):
        for _ in range(MISSES):
            assert pace.length(4)
            pace.record(1, 0)
        pauses.append(pause_length(pace))
    assert pauses == [min(MAX_PAUSE, FIRST_PAUSE << i) for i in range(7)]


def test_a_pause_counts_tokens_however_they_were_decoded():
    pace = Pace(DraftLimits())
    for _ in range(MISSES):
        pace.record(2, 0)
    assert pace.pause == FIRST_PAUSE and pace.length(4) == 0
    pace.tick(FIRST_PAUSE - 1)  # a burst of plain steps
    assert pace.pause == 1 and pace.length(4) == 0
    pace.tick(3)
    assert pace.pause == 0 and pace.length(4) == 1  # a probe, one past what was accepted


def test_an_accepted_proposal_ends_the_backoff():
    pace = Pace(DraftLimits())
    for _ in range(MISSES):
        pace.record(2, 0)
    assert pause_length(pace) == FIRST_PAUSE
    pace.record(2, 0)
    pace.record(2, 1)  # an acceptance: misses and the pause length start over
    for _ in range(MISSES):
        pace.record(2, 0)
    assert pause_length(pace) == FIRST_PAUSE


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        NgramDrafter([], DraftLimits(n_max=2, n_min=3))


def costs(plain: float, verify: dict[int, float], draft_per_token: float = 0.0) -> Costs:
    """Costs as if the runtime had timed a plain step, verifications of the given k and
    proposals of those k at draft_per_token seconds a draft."""
    c = Costs()
    c.verified(0, plain)
    for k, seconds in verify.items():
        c.verified(k, seconds)
        c.drafted(k, draft_per_token * k)
    return c


def test_costs_are_running_means_and_untimed_k_are_estimated_on_a_line():
    c = Costs()
    assert c.verify(0) is None and c.verify(2) is None and c.draft(2) is None
    c.verified(0, 10.0)
    assert c.verify(0) == 10.0 and c.verify(2) is None  # one point is no line
    c.verified(4, 20.0)
    assert c.verify(2) == pytest.approx(15.0) and c.verify(8) == pytest.approx(30.0)
    c.verified(4, 30.0)  # a running mean, not the last timing
    assert c.verify(4) == pytest.approx(22.0)
    c.drafted(2, 6.0)
    assert c.draft(1) == pytest.approx(3.0) and c.draft(4) == pytest.approx(12.0)


def test_expected_tokens():
    assert expected_tokens(4, 1.0) == 5
    assert expected_tokens(4, 0.0) == 1
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)


def drive(pace: Pace, accept, steps: int) -> list[int]:
    """The proposal lengths of `steps` steps, accept(k) drafts of a proposal of k accepted."""
    lengths = []
    for _ in range(steps):
        k = pace.length(32)
        lengths.append(k)
        accepted = accept(k) if k else 0
        if k:
            pace.record(k, accepted)
        pace.tick(accepted + 1)
    return lengths


def test_a_drafter_that_costs_more_than_it_saves_stops_proposing_and_probes_ever_less():
    # A draft model whose step costs 0.6 of the model's, verification 1 + 0.2 k steps: at
    # 60 % acceptance no k beats a plain step (the draft model's 135M at Q4_0 for its Q8_0).
    pace = Pace(DraftLimits(), costs(1.0, {1: 1.2, 8: 2.6}, draft_per_token=0.6))
    lengths = drive(pace, lambda k: int(0.6 * k), 600)
    probes = [i for i, k in enumerate(lengths) if k]
    assert len(probes) <= 8  # the first proposal, then one a pause, each pause twice as long
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] >= MAX_PAUSE
    assert all(k == 1 for k in lengths[probes[1]:] if k)  # a probe costs least at k = 1


def test_acceptance_alone_would_have_kept_proposing():
    pace = Pace(DraftLimits())  # no costs: acceptance alone paces
    assert all(drive(pace, lambda k: k, 50))


def test_the_same_drafter_pays_at_high_acceptance_with_short_drafts():
    # 92 % of drafts accepted: k = 1 yields 1.92 tokens for 1.8 steps, k = 8 about 7 for 8.4.
    pace = Pace(DraftLimits(), costs(1.0, {1: 1.2, 8: 2.6}, draft_per_token=0.6))
    rng = random.Random(1)

    def accept(k: int) -> int:
        return next((i for i in range(k) if rng.random() >= 0.92), k)

    lengths = drive(pace, accept, 400)
    proposals = [k for k in lengths if k]
    assert len(proposals) > 300  # mostly worth proposing ...
    assert sorted(proposals)[len(proposals) // 2] <= 2  # ... short drafts, though acceptance alone doubles k


def test_k_grows_while_long_drafts_pay():
    # Drafting free, verification 1 + 0.25 k steps; drafts accepted whole.
    pace = Pace(DraftLimits(n_max=16), costs(1.0, {2: 1.5, 16: 5.0}))
    lengths = drive(pace, lambda k: k, 6)
    # Cautious at first (an even chance of acceptance), then up to n_max.
    assert lengths == sorted(lengths) and lengths[0] < FIRST_K and lengths[-2:] == [16, 16]
    # The copy ends: drafts are rejected outright, proposing pauses.
    lengths = drive(pace, lambda k: 0, 40)
    assert lengths[:2] != [0, 0] and lengths.count(0) >= 30


def test_a_probe_after_a_pause_resumes_proposing_when_acceptance_came_back():
    pace = Pace(DraftLimits(), costs(1.0, {2: 1.5, 16: 5.0}))
    drive(pace, lambda k: 0, 3)  # rejected: paused
    lengths = drive(pace, lambda k: k, FIRST_PAUSE + 10)
    first = next(i for i, k in enumerate(lengths) if k)
    assert 0 < first <= FIRST_PAUSE + 1  # the probe after the pause
    assert all(lengths[first:])  # accepted: it pays again, no more pauses


def test_no_costs_timed_yet_proposes_the_allowed_length():
    c = Costs()
    c.verified(0, 1.0)  # a plain step timed, no verification yet
    pace = Pace(DraftLimits(), c)
    assert pace.length(32) == FIRST_K


def test_a_probe_stays_due_until_a_proposal_is_made():
    pace = Pace(DraftLimits(), costs(1.0, {1: 1.2, 8: 2.6}, draft_per_token=0.6))
    for _ in range(5):  # nothing to propose (no n-gram match): the first proposal is still a probe
        assert pace.length(32) == 1
    pace.record(1, 0)
    assert pace.length(32) == 0  # recorded: now the costs decide


def busy_costs() -> Costs:
    """4 generations decode in 1.3 plain steps, a draft more makes it 2.0 and each further
    one adds 0.5 (the 1B shape's passes with the avx2 kernels: 33-37 ms plain, 47-69 ms
    with drafts)."""
    return costs(1.0, {3: 1.3, 4: 2.0, 16: 8.0})


def test_in_a_pass_no_acceptance_could_pay_for_a_probe_waits_for_one_it_could():
    busy = Pass(extra=3, expected=4.0)  # even drafts accepted whole yield fewer tokens a second
    assert not busy.worth_probing(busy_costs(), range(1, 33)) and Pass().worth_probing(busy_costs(), range(1, 33))
    pace = Pace(DraftLimits(), busy_costs())
    assert [pace.length(32, plan=busy) for _ in range(3)] == [0, 0, 0] and pace.pause == 0  # no pause begins
    assert pace.length(32) > 0  # alone, the probe is made


def test_a_catch_up_is_made_only_when_speculating_could_save_more():
    # A draft model 0.3 of a step a draft, verification 1 + 0.2 k steps, 95 % accepted
    # of late: speculating saves about 0.2 s of a plain 1 s step.
    c = costs(1.0, {1: 1.2, 8: 2.6}, draft_per_token=0.3)
    for _ in range(20):
        c.record(1, 1)
    c.record(1, 0)
    c.caught_up(100, 10.0)  # 0.1 s a token
    pace = Pace(DraftLimits(), c)
    assert pace.length(32, behind=0) > 0
    pace = Pace(DraftLimits(), c)
    assert pace.length(1000, behind=500) > 0  # 50 s to catch up, 1,000 tokens to save more on
    assert Pace(DraftLimits(), c).length(32, behind=500) == 0  # 32 tokens left: not worth it
    # Acceptance alone (no costs) and costs not timed yet catch up whatever it costs.
    assert Pace(DraftLimits()).length(32, behind=500) > 0
    assert Pace(DraftLimits(), costs(1.0, {1: 1.2, 8: 2.6}, draft_per_token=0.3)).length(32, behind=500) > 0


# ---- prompt lookup: copies go on or break ---------------------------------------------

def lookup_costs() -> Costs:
    """Prompt lookup's: drafting free, a verification of k drafts 1 + 0.2 k plain steps."""
    return costs(1.0, {1: 1.2, 16: 4.2})


def test_a_pattern_seen_twice_is_proposed_as_far_as_it_repeated():
    # "0 1 2 3" was followed by "4 5 6 7" and then by "4 5 6 8": a third copy likely goes
    # as far as the two agree, so "4 5 6" and one more, whatever the costs say.
    tokens = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 8, 9, 0, 1, 2, 3]
    d = NgramDrafter(tokens, DraftLimits(), lookup_costs())
    assert d.propose(32) == [4, 5, 6, 8]
    assert d.propose(2) == [4, 5]  # within the limit
    # Unless even a whole acceptance would not pay for its verification.
    assert NgramDrafter(tokens, DraftLimits(), costs(1.0, {1: 100.0, 8: 800.0})).propose(32) == []
    once = NgramDrafter([1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3], DraftLimits())
    assert once.propose(32) == [4, 5, 6, 7, 0, 1, 2, 3]  # seen once, no costs known: all it offers


def test_long_runs_are_proposed_long_and_copies_that_break_at_once_are_not_proposed():
    pace = CopyPace(DraftLimits(), lookup_costs())
    for _ in range(20):  # half the copies break at once, half run past 24 drafts
        pace.record(32, 0)
        pace.record(32, 28)
    assert pace.length(32) >= 24
    broken = CopyPace(DraftLimits(), lookup_costs())
    for _ in range(20):
        broken.record(8, 1)  # copies that hold one token
    assert broken.length(32) in (0, 1)


def test_a_match_that_does_not_pay_is_declined_and_probed_now_and_then():
    pace = CopyPace(DraftLimits(), lookup_costs())
    for _ in range(30):
        pace.record(4, 0)  # copies break at once
    lengths = [pace.length(32) for _ in range(2 * (PROBE_EVERY + 1))]
    assert [i for i, k in enumerate(lengths) if k] == [PROBE_EVERY, 2 * PROBE_EVERY + 1]
    assert pace.pause == 0  # drafting is free: nothing to pause


def test_a_match_is_not_probed_in_a_pass_where_no_copy_could_pay():
    pace = CopyPace(DraftLimits(), busy_costs())
    busy = Pass(extra=3, expected=4.0)
    assert not any(pace.length(32, plan=busy) for _ in range(3 * (PROBE_EVERY + 1)))
    assert not any(pace.length(32, agree=32, plan=busy) for _ in range(3 * (PROBE_EVERY + 1)))
    assert pace.length(32) > 0  # alone a copy pays


def test_a_new_generation_starts_from_the_runtimes_record_of_runs():
    c = lookup_costs()
    first = CopyPace(DraftLimits(), c)
    for _ in range(40):
        first.record(24, 24)
    assert CopyPace(DraftLimits(), c).length(32) >= 24
    assert CopyPace(DraftLimits(), lookup_costs()).length(32) < 8  # no record: an even chance each draft


def test_in_a_busy_pass_a_proposal_must_raise_the_tokens_per_second_of_the_whole_pass():
    # A plain pass of 8 generations yields 8 tokens for 2.4 plain steps (3.3 a step). A copy
    # with no record (an even chance each draft) pays alone, not there; one expected whole
    # (its two earlier continuations agree for 8 tokens) pays there too.
    busy = Pass(extra=7, expected=8.0)
    assert busy.rate(lookup_costs()) == pytest.approx(8 / 2.4)
    assert CopyPace(DraftLimits(), lookup_costs()).length(8) > 0
    assert CopyPace(DraftLimits(), lookup_costs()).length(8, plan=busy) == 0
    whole = CopyPace(DraftLimits(), lookup_costs())
    assert whole.length(16, agree=8, plan=busy) == 9 and whole.yield_of(9) == 10
    busy.add(9, whole.yield_of(9), 0.0)  # the pass the next generation's proposal would join
    assert (busy.extra, busy.expected) == (16, 17.0) and busy.rate(lookup_costs()) == pytest.approx(17 / 4.2)


def test_until_the_costs_are_timed_prompt_lookup_proposes_what_it_may():
    assert CopyPace(DraftLimits()).length(10) == 10
    assert CopyPace(DraftLimits(n_max=6)).length(10) == 6
    assert CopyPace(DraftLimits(n_min=3)).length(2) == 0
    assert CopyPace(DraftLimits(n_min=3), lookup_costs()).length(8, agree=0) == 3  # at least n_min
