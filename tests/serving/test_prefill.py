import pytest

from llmd.serving.prefill import PrefillPlan, cache_scope, common_prefix_length, plan_prefill, with_cached


def test_empty_resident_is_new_and_prefills_everything():
    assert plan_prefill([], [1, 2, 3], dirty=False) == PrefillPlan(0, 3, 0, "new")


def test_resident_strict_prefix_of_prompt_is_exact_prefix():
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4, 5], dirty=False) == PrefillPlan(3, 2, 0, "exact_prefix")


def test_exact_prefix_one_token_longer_prefills_one():
    assert plan_prefill([1, 2], [1, 2, 9], dirty=False) == PrefillPlan(2, 1, 0, "exact_prefix")


def test_equal_prompt_keeps_all_but_the_last_token():
    assert plan_prefill([1, 2, 3, 4], [1, 2, 3, 4], dirty=False) == PrefillPlan(3, 1, 1, "equal")


def test_partial_overlap_is_common_prefix_and_truncates_the_rest():
    assert plan_prefill([1, 2, 3, 4, 5], [1, 2, 9, 9], dirty=False) == PrefillPlan(2, 2, 3, "common_prefix")


def test_prompt_that_is_a_prefix_of_resident_keeps_all_but_its_last_token():
    # Regeneration: the client dropped the last answer and asks again.
    assert plan_prefill([1, 2, 3, 4, 5], [1, 2, 3], dirty=False) == PrefillPlan(2, 1, 3, "common_prefix")


def test_no_overlap_is_mismatch():
    assert plan_prefill([7, 8, 9], [1, 2, 3], dirty=False) == PrefillPlan(0, 3, 3, "mismatch")


def test_dirty_cache_is_never_reused():
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4], dirty=True) == PrefillPlan(0, 4, 3, "dirty")


def test_disabled_never_reuses_and_takes_precedence_over_dirty():
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4], dirty=False, enabled=False) == PrefillPlan(0, 4, 3, "disabled")
    assert plan_prefill([1, 2], [1, 2, 3], dirty=True, enabled=False).reason == "disabled"


def test_dirty_takes_precedence_over_new():
    assert plan_prefill([], [1], dirty=True) == PrefillPlan(0, 1, 0, "dirty")


def test_one_token_prompt_always_prefills_that_token():
    assert plan_prefill([5], [5], dirty=False) == PrefillPlan(0, 1, 1, "equal")
    assert plan_prefill([5, 6], [5], dirty=False) == PrefillPlan(0, 1, 2, "common_prefix")
    assert plan_prefill([6], [5], dirty=False) == PrefillPlan(0, 1, 1, "mismatch")


def test_keep_below_a_sliding_window_floor_reprefills_everything():
    # The rings no longer hold the window that position 2 would attend.
    assert plan_prefill([1, 2, 3, 4, 5], [1, 2, 9, 9], dirty=False, floor=3) == PrefillPlan(0, 4, 5, "window")


def test_keep_at_the_floor_is_reused():
    assert plan_prefill([1, 2, 3, 4, 5], [1, 2, 3, 9], dirty=False, floor=3) == PrefillPlan(3, 1, 2, "common_prefix")


def test_append_only_resume_is_never_below_the_floor():
    # The floor never passes the resident length, so appending always reuses it all.
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4], dirty=False, floor=3) == PrefillPlan(3, 1, 0, "exact_prefix")


def test_a_floor_leaves_keep_zero_plans_alone():
    assert plan_prefill([1, 2, 3], [7, 8], dirty=False, floor=2) == PrefillPlan(0, 2, 3, "mismatch")


def test_empty_prompt_is_a_value_error():
    with pytest.raises(ValueError):
        plan_prefill([1, 2], [], dirty=False)


def test_accepts_any_sequences_including_mixed_kinds():
    assert plan_prefill((1, 2, 3), [1, 2, 3, 4], dirty=False) == PrefillPlan(3, 1, 0, "exact_prefix")
    assert plan_prefill(range(100), list(range(50)) + [0], dirty=False).keep == 50


@pytest.mark.parametrize("resident, prompt", [
    ([], [1]), ([1], [1]), ([1, 2], [1]), ([1, 2], [2, 1]), (list(range(10)), list(range(20))),
    (list(range(20)), list(range(10))), ([1, 2, 3], [1, 2, 4, 5, 6]), ([3], [1, 2])])
def test_plan_invariants(resident, prompt):
    plan = plan_prefill(resident, prompt, dirty=False)
    assert plan.keep + plan.prefill == len(prompt)
    assert plan.keep + plan.discard == len(resident)
    assert plan.prefill >= 1
    assert list(resident[:plan.keep]) == list(prompt[:plan.keep])


def test_common_prefix_length():
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2
    assert common_prefix_length([1, 2, 3], (1, 2, 3)) == 3


# ---- recurrent models: resume only at a checkpoint or the live state ------------------------

def test_an_appended_turn_resumes_from_the_live_recurrent_state():
    resident, prompt = [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7]
    assert plan_prefill(resident, prompt, dirty=False, points=[3, 5]) == PrefillPlan(5, 2, 0, "exact_prefix")


def test_a_mismatch_inside_the_last_turn_falls_back_to_the_checkpoint_before_it():
    # The previous turn's prompt ended at 3 (a checkpoint); its reply 4, 5 was re-rendered.
    plan = plan_prefill([1, 2, 3, 4, 5], [1, 2, 3, 4, 9, 9], dirty=False, points=[2, 3, 5])
    assert plan == PrefillPlan(3, 3, 2, "checkpoint")


def test_a_prefix_before_every_checkpoint_reprefills_everything():
    plan = plan_prefill([1, 2, 3, 4, 5], [1, 9, 9], dirty=False, points=[3, 5])
    assert plan == PrefillPlan(0, 3, 5, "no_checkpoint")


def test_a_common_prefix_that_ends_at_a_checkpoint_keeps_all_of_it():
    plan = plan_prefill([1, 2, 3, 4, 5], [1, 2, 3, 7], dirty=False, points=[3, 5])
    assert plan == PrefillPlan(3, 1, 2, "common_prefix")


def test_a_resent_prompt_on_a_recurrent_model_resumes_before_its_last_token():
    # keep would be 3 (one token must be prefilled): the newest checkpoint below it.
    plan = plan_prefill([1, 2, 3, 4], [1, 2, 3, 4], dirty=False, points=[2, 4])
    assert plan == PrefillPlan(2, 2, 2, "checkpoint")


def test_no_points_means_any_position_as_before():
    assert plan_prefill([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], dirty=False, points=None).keep == 4


def test_checkpoints_do_not_revive_a_dirty_or_disabled_cache():
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4], dirty=True, points=[3]).reason == "dirty"
    assert plan_prefill([1, 2, 3], [1, 2, 3, 4], dirty=False, enabled=False, points=[3]).keep == 0


def test_a_checkpoint_below_the_window_floor_is_no_use():
    plan = plan_prefill([1, 2, 3, 4, 5], [1, 2, 3, 4, 9], dirty=False, floor=3, points=[2, 5])
    assert plan == PrefillPlan(0, 5, 5, "window")


# ---- the prefix cache -------------------------------------------------------------

def test_a_longer_cached_prefix_replaces_the_own_plan():
    own = plan_prefill([1, 2, 9], [1, 2, 3, 4, 5, 6], dirty=False)
    assert own == PrefillPlan(2, 4, 1, "common_prefix")
    assert with_cached(own, 5) == PrefillPlan(5, 1, 3, "prefix_cache")


@pytest.mark.parametrize("cached", [0, 1, 2])
def test_a_cached_prefix_no_longer_than_the_own_keeps_the_plan(cached):
    own = plan_prefill([1, 2, 9], [1, 2, 3, 4], dirty=False)
    assert with_cached(own, cached) is own


def test_a_cached_prefix_must_leave_a_token_to_prefill():
    with pytest.raises(ValueError):
        with_cached(plan_prefill([], [1, 2, 3], dirty=False), 3)


def test_key_scope_separates_api_keys_and_salts():
    assert cache_scope("key", "aa", None) != cache_scope("key", "bb", None)
    assert cache_scope("key", "aa", None) == cache_scope("key", "aa", None)
    assert cache_scope("key", "aa", "s1") != cache_scope("key", "aa", "s2")
    assert cache_scope("key", "aa", "s1") != cache_scope("key", "aa", None)


def test_global_scope_ignores_the_key_but_not_the_salt():
    assert cache_scope("global", "aa", None) == cache_scope("global", "bb", None) == cache_scope("key", "", None)
    assert cache_scope("global", "aa", "s") != cache_scope("global", "aa", None)


def test_off_shares_with_nobody_and_unknown_modes_are_refused():
    assert cache_scope("off", "aa", "s") is None
    with pytest.raises(ValueError):
        cache_scope("everyone", "", None)
