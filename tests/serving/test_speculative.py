"""llmd/serving/speculative.py: the prompt-lookup drafter, on plain ids."""
from __future__ import annotations

import pytest

from llmd.serving.speculative import FIRST_PAUSE, MAX_PAUSE, MISSES, DraftLimits, NgramDrafter


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
    d.pace.k = 16
    assert d.propose(2) == [4, 5]
    assert d.propose(16) == [4, 5, 1, 2, 3]
    assert d.propose(0) == []


def test_extend_indexes_new_tokens():
    d = NgramDrafter([1, 2, 3])
    assert d.propose(4) == []
    d.extend([9, 1, 2, 3])
    assert d.propose(4) == [9, 1, 2, 3]


def test_k_doubles_on_full_acceptance_and_falls_past_the_accepted_prefix():
    d = NgramDrafter([], DraftLimits(n_max=10))
    assert d.pace.k == 4
    d.record(4, 4)
    assert d.pace.k == 8
    d.record(8, 8)
    assert d.pace.k == 10  # n_max
    d.record(10, 2)
    assert d.pace.k == 3
    d.record(3, 0)
    assert d.pace.k == 1


def test_n_min_refuses_short_proposals_and_bounds_k():
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=2))
    assert d.propose(1) == []  # the limit leaves room for less than n_min
    d.record(4, 0)
    assert d.pace.k == 2
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=4))
    d.pace.k = 8
    assert d.propose(8) == [4, 1, 2, 3]  # as long as n_min
    d = NgramDrafter([1, 2, 3, 4, 1, 2, 3], DraftLimits(n_max=8, n_min=5))
    d.pace.k = 8
    assert d.propose(8) == []  # [4, 1, 2, 3] is shorter than n_min


def test_rejected_proposals_pause_proposing_for_longer_and_longer():
    d = NgramDrafter([1, 2, 3, 1, 2, 3])
    pauses = []
    for _ in range(7):
        for _ in range(MISSES):
            assert d.propose(4)
            d.record(1, 0)
        n = 0
        while not d.propose(4):
            n += 1
        pauses.append(n)
    assert pauses == [min(MAX_PAUSE, FIRST_PAUSE << i) for i in range(7)]


def test_an_accepted_proposal_ends_the_backoff():
    d = NgramDrafter([1, 2, 3, 1, 2, 3])
    for _ in range(MISSES):
        d.record(2, 0)
    for _ in range(FIRST_PAUSE):
        assert d.propose(4) == []
    d.record(2, 0)
    d.record(2, 1)  # an acceptance: misses and the pause length start over
    for _ in range(MISSES):
        d.record(2, 0)
    assert sum(1 for _ in range(FIRST_PAUSE) if not d.propose(4)) == FIRST_PAUSE
    assert d.propose(4)


def test_bad_limits_are_refused():
    with pytest.raises(ValueError):
        NgramDrafter([], DraftLimits(n_max=2, n_min=3))
