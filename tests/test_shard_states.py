"""Every rule of docs/reference.md §1, as examples folded through ``FleetView``.

Deliberate deviations from the reference (documented in ``shard_states.py``) are pinned
here too: a completed refit does not resurrect absent shards and leaves serving shards'
state alone; marking weights partial twice keeps the state from before the first abort;
only "infra" failures of an outcome window count toward the reported streak.
"""

from __future__ import annotations

import copy

import pytest

from fleetledger.projections.fleet_view import Exhaustion, fold, fold_with_transitions
from fleetledger.projections.rank_layout import rank_layout
from fleetledger.projections.shard_states import Input, ShardState, Transition
from tests.projection_builders import (
    Fleet,
    at_us_of,
    every_event_naming,
    outcome,
    put_in,
)

H, S, D, R, ST, RT = (
    ShardState.HEALTHY,
    ShardState.SUSPECT,
    ShardState.DEAD,
    ShardState.RESTARTING,
    ShardState.STALE,
    ShardState.RETIRED,
)
ABSENT_STATES = (D, R, RT)
NOT_SERVING = (D, R, ST, RT)


def only(transitions: list[Transition]) -> Transition:
    assert len(transitions) == 1, transitions
    return transitions[0]


# ── the starting point ─────────────────────────────────────────────────────────


def test_a_run_starts_with_every_shard_healthy_serving_and_epoch_zero():
    fleet = Fleet(shard_count=3)
    view = fleet.view
    assert [r.state for r in view.shards] == [H, H, H]
    assert view.serving == (0, 1, 2)
    assert view.absent == ()
    assert view.suspected == ()
    assert view.epoch == 0
    assert view.seq == 1
    assert [r.base_url for r in view.shards] == list(fleet.config.base_urls)
    for r in view.shards:
        assert (r.probe_failures, r.probe_successes, r.reported_failures) == (0, 0, 0)
        assert r.restart_attempts == 0
        assert r.weight_version == 0


def test_fold_of_the_records_equals_the_live_view_and_lists_the_same_transitions():
    fleet = Fleet(shard_count=2)
    fleet.probe_failed(0, times=3)
    fleet.restart_requested(0)
    fleet.replacement_loaded(0, "http://new.test:1")
    fleet.reported_failure(1)
    fleet.refit_completed(4)
    view, transitions = fold_with_transitions(fleet.records)
    assert view == fleet.view
    assert transitions == fleet.transitions
    assert fold(fleet.records) == fleet.view


# ── probe ok ───────────────────────────────────────────────────────────────────


def test_a_successful_probe_on_a_healthy_shard_counts_and_stamps_the_time():
    fleet = Fleet()
    assert fleet.probe_ok(0, times=2) == []
    r = fleet.shard(0)
    assert r.state is H
    assert r.probe_successes == 2
    assert r.last_ok_at_us == at_us_of(fleet.last_seq)


def test_a_suspect_shard_returns_to_healthy_at_healthy_threshold_successes_and_not_before():
    fleet = Fleet(healthy_threshold=3)
    fleet.probe_failed(0)
    assert fleet.state(0) is S
    assert fleet.probe_ok(0, times=2) == []
    assert fleet.state(0) is S
    assert fleet.shard(0).probe_successes == 2
    t = only(fleet.probe_ok(0))
    assert (t.before, t.after, t.input) == (S, H, Input.PROBE_OK)
    assert t.rule == "3 consecutive successful probes ≥ healthy_threshold 3"
    assert t.evidence == (fleet.last_seq,)
    assert t.seq == fleet.last_seq
    assert t.shard == 0


def test_a_successful_probe_clears_the_probe_failure_streak():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.probe_failed(0, times=2)
    fleet.probe_ok(0)
    r = fleet.shard(0)
    assert r.probe_failures == 0
    assert r.probe_evidence == ()
    assert r.probe_successes == 1


@pytest.mark.parametrize("state", NOT_SERVING)
def test_a_shard_that_is_not_serving_ignores_successful_probes_counters_included(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    epoch = fleet.view.epoch
    assert fleet.probe_ok(0, times=5) == []
    assert fleet.shard(0) == before
    assert fleet.view.epoch == epoch


def test_a_stale_shard_ignores_successful_probes():
    fleet = Fleet(healthy_threshold=1)
    fleet.weights_partial(3)
    assert fleet.probe_ok(0, times=10) == []
    assert fleet.state(0) is ST
    assert fleet.shard(0).probe_successes == 0
    assert 0 not in fleet.view.serving


def test_a_dead_shard_never_returns_to_healthy_by_probes():
    fleet = Fleet(healthy_threshold=1)
    fleet.probe_failed(0, times=3)
    assert fleet.state(0) is D
    fleet.probe_ok(0, times=50)
    assert fleet.state(0) is D
    fleet.restart_requested(0)
    fleet.probe_ok(0, times=50)
    assert fleet.state(0) is R
    fleet.replacement_loaded(0)
    fleet.probe_ok(0, times=50)
    assert fleet.state(0) is ST
    assert all(t.after is not H for t in fleet.transitions)


# ── probe failed ───────────────────────────────────────────────────────────────


def test_one_failed_probe_makes_a_healthy_shard_suspect_and_keeps_it_serving():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.probe_ok(0, times=4)
    t = only(fleet.probe_failed(0))
    assert (t.before, t.after, t.input) == (H, S, Input.PROBE_FAILED)
    assert t.rule == "failed probe: timeout"
    assert t.evidence == (fleet.last_seq,)
    r = fleet.shard(0)
    assert (r.probe_failures, r.probe_successes) == (1, 0)
    assert r.last_error == "timeout"
    assert fleet.view.serving == (0, 1, 2)
    assert fleet.view.suspected == (0,)


def test_unhealthy_threshold_consecutive_failed_probes_make_a_shard_dead_citing_all_three():
    fleet = Fleet(unhealthy_threshold=3)
    first = fleet.probe_failed(0)
    assert only(first).after is S
    assert fleet.probe_failed(0) == []  # SUSPECT stays SUSPECT below the threshold
    t = only(fleet.probe_failed(0, kind="error", error="connection refused"))
    assert (t.before, t.after) == (S, D)
    assert t.rule == (
        "3 consecutive failed probes ≥ unhealthy_threshold 3 (last: error: connection refused)"
    )
    assert t.evidence == (2, 3, 4)
    assert fleet.shard(0).last_error == "error: connection refused"
    assert fleet.view.serving == (1, 2)
    assert fleet.view.absent == (0,)
    assert fleet.shard(0).since_seq == 4
    assert fleet.shard(0).since_rule == t.rule


def test_with_unhealthy_threshold_one_a_failed_probe_goes_straight_to_dead():
    fleet = Fleet(unhealthy_threshold=1)
    t = only(fleet.probe_failed(1))
    assert (t.before, t.after) == (H, D)
    assert t.rule == "1 consecutive failed probes ≥ unhealthy_threshold 1 (last: timeout)"
    assert t.evidence == (2,)


def test_a_successful_probe_between_failures_restarts_the_streak():
    fleet = Fleet(unhealthy_threshold=3, healthy_threshold=5)
    fleet.probe_failed(0, times=2)
    fleet.probe_ok(0)
    fleet.probe_failed(0, times=2)
    assert fleet.state(0) is S
    assert fleet.shard(0).probe_failures == 2
    t = only(fleet.probe_failed(0))
    assert t.after is D
    assert t.evidence == (5, 6, 7)  # the streak after the success, not the two before it


@pytest.mark.parametrize("state", NOT_SERVING)
def test_a_shard_that_is_not_serving_ignores_failed_probes_counters_included(state):
    fleet = Fleet(unhealthy_threshold=1)
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    assert fleet.probe_failed(0, times=4, kind="error", error="boom") == []
    assert fleet.shard(0) == before


# ── actor death ────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("state", [H, S, ST])
def test_a_confirmed_actor_death_kills_a_serving_or_stale_shard_at_once(state):
    fleet = Fleet(unhealthy_threshold=4)
    put_in(fleet, 1, state)
    counters = (fleet.shard(1).probe_failures, fleet.shard(1).reported_failures)
    t = only(fleet.actor_died(1, "ActorDiedError: SIGKILL"))
    assert (t.before, t.after, t.input) == (state, D, Input.ACTOR_DIED)
    assert t.rule == "actor death confirmed by the runtime: actor process ended by SIGKILL"
    assert t.evidence == (fleet.last_seq,)
    r = fleet.shard(1)
    assert (r.probe_failures, r.reported_failures) == counters  # no counting
    assert r.last_error == "actor process ended by SIGKILL"  # the cause read (events/causes.py)
    assert r.state_before_partial is None


def test_an_actor_death_without_detail_says_so_in_the_rule():
    fleet = Fleet()
    assert only(fleet.actor_died(0, "")).rule == "actor death confirmed by the runtime: no detail"


@pytest.mark.parametrize("state", ABSENT_STATES)
def test_an_actor_death_on_an_absent_shard_is_a_no_op(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    assert fleet.actor_died(0, "again") == []
    assert fleet.shard(0) == before


# ── reported failures and successes ────────────────────────────────────────────


def test_reported_failures_make_a_shard_suspect_then_dead_at_unhealthy_threshold():
    fleet = Fleet(unhealthy_threshold=3)
    first = only(fleet.reported_failure(0))
    assert (first.before, first.after, first.input) == (H, S, Input.REPORTED_FAILURE)
    assert first.rule == "reported failure: timeout ×1"
    assert first.evidence == (2,)
    assert fleet.reported_failure(0) == []
    t = only(fleet.reported_failure(0, reason="connection reset"))
    assert (t.before, t.after) == (S, D)
    assert t.rule == (
        "3 consecutive reported failures ≥ unhealthy_threshold 3 (last: connection reset ×1)"
    )
    assert t.evidence == (2, 3, 4)
    assert fleet.shard(0).last_error == "connection reset ×1"


def test_a_window_with_as_many_infra_failures_as_the_threshold_kills_a_healthy_shard():
    fleet = Fleet(unhealthy_threshold=3)
    t = only(fleet.reported_failure(2, count=3))
    assert (t.before, t.after) == (H, D)
    assert t.rule == "3 consecutive reported failures ≥ unhealthy_threshold 3 (last: timeout ×3)"
    assert t.evidence == (2,)


def test_the_reported_streak_and_the_probe_streak_are_kept_apart():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.probe_failed(0, times=2)
    fleet.reported_failure(0)
    fleet.reported_failure(0)
    r = fleet.shard(0)
    assert r.state is S  # 2 + 2 failures, but no single streak reached 3
    assert (r.probe_failures, r.reported_failures) == (2, 2)
    assert r.probe_evidence == (2, 3)
    assert r.reported_evidence == (4, 5)


def test_successful_probes_never_clear_the_reported_streak_of_a_wedged_engine():
    fleet = Fleet(unhealthy_threshold=3, healthy_threshold=2)
    fleet.reported_failure(0)
    fleet.probe_ok(0, times=2)  # the wedged engine still answers probes …
    assert fleet.state(0) is H
    assert fleet.shard(0).reported_failures == 1  # … but its reported streak stays
    fleet.reported_failure(0)
    fleet.probe_ok(0, times=5)
    t = only(fleet.reported_failure(0))
    assert t.after is D
    assert t.evidence == (2, 5, 11)


def test_a_reported_success_clears_the_reported_streak_and_never_changes_state():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(0, count=2)
    assert fleet.state(0) is S
    assert fleet.reported_success(0, count=7) == []
    r = fleet.shard(0)
    assert r.state is S
    assert r.reported_failures == 0
    assert r.reported_evidence == ()
    fleet.reported_failure(0, count=2)
    assert fleet.state(0) is S  # the streak restarted from zero


def test_the_successes_of_a_window_are_applied_before_its_failures():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(0, count=2)
    # If the failure went first the streak would reach 3 and the shard would die.
    assert fleet.outcomes(outcome(0, successes=10, infra=1)) == []
    assert fleet.state(0) is S
    assert fleet.shard(0).reported_failures == 1
    assert fleet.shard(0).reported_evidence == (fleet.last_seq,)


def test_a_window_with_successes_and_failures_for_one_shard_ends_at_the_failure_count():
    fleet = Fleet(unhealthy_threshold=5)
    fleet.reported_failure(1, count=3)
    fleet.outcomes(outcome(1, successes=4, infra=2, infra_reason="502"))
    assert fleet.shard(1).reported_failures == 2


def test_successes_for_every_shard_of_a_window_come_before_any_failure():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(1, count=2)
    # Shard 0's failures are listed first; shard 1's success must still come before them
    # all, and shard 1's own failure after its success.
    ts = fleet.outcomes(outcome(0, infra=1), outcome(1, successes=3, infra=1))
    assert [(t.shard, t.after) for t in ts] == [(0, S)]
    assert fleet.shard(1).reported_failures == 1
    assert fleet.state(1) is S


def test_three_blips_spread_among_many_successes_never_condemn_a_shard():
    fleet = Fleet(unhealthy_threshold=3)
    for window_index in range(300):
        blip = window_index in (17, 140, 299)
        fleet.outcomes(outcome(0, successes=50, infra=1 if blip else 0), outcome(1, successes=50))
    for window_index in range(300):  # blips alone in their window, successes in the next
        if window_index in (3, 150, 297):
            fleet.reported_failure(0)
        else:
            fleet.reported_success(0, 40)
    assert 0 in fleet.view.serving
    assert all(t.after is not D for t in fleet.transitions)
    assert fleet.shard(0).reported_failures <= 1


def test_data_failures_never_change_state_or_the_reported_streak():
    fleet = Fleet(unhealthy_threshold=1)
    before = fleet.copy_of(0)
    assert fleet.outcomes(outcome(0, data=1000)) == []
    assert fleet.shard(0) == before
    fleet.reported_failure(1)  # threshold 1: infra kills at once …
    assert fleet.state(1) is D
    assert fleet.state(0) is H  # … data never does


def test_only_the_infra_failures_of_a_mixed_window_count_and_are_named():
    fleet = Fleet(unhealthy_threshold=3)
    t = only(fleet.outcomes(outcome(0, infra=2, data=5, infra_reason="503")))
    assert t.after is S
    assert t.rule == "reported failure: 503 ×2"
    assert fleet.shard(0).reported_failures == 2


@pytest.mark.parametrize("state", NOT_SERVING)
def test_a_shard_that_is_not_serving_ignores_reported_failures(state):
    fleet = Fleet(unhealthy_threshold=1)
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    assert fleet.reported_failure(0, count=5) == []
    assert fleet.shard(0) == before


@pytest.mark.parametrize("state", [D, R, ST])
def test_a_reported_success_clears_the_streak_whatever_the_state(state):
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(0, count=2)
    fleet.probe_ok(0, times=2)
    assert fleet.state(0) is H
    put_in(fleet, 0, state)
    assert fleet.reported_success(0) == []
    assert fleet.shard(0).reported_failures == 0
    assert fleet.state(0) is state


# ── restarts ───────────────────────────────────────────────────────────────────


def test_a_restart_request_counts_an_attempt_and_puts_the_shard_in_restarting():
    fleet = Fleet(max_restart_attempts_per_shard=5)
    fleet.actor_died(0)
    t = only(fleet.restart_requested(0))
    assert (t.before, t.after, t.input) == (D, R, Input.RESTART_REQUESTED)
    assert t.rule == "restart requested (attempt 1 of 5)"
    assert t.evidence == (fleet.last_seq,)
    assert fleet.shard(0).restart_attempts == 1


def test_a_restart_request_over_the_budget_retires_the_shard():
    fleet = Fleet(max_restart_attempts_per_shard=2)
    fleet.actor_died(0)
    for attempt in (1, 2):
        assert only(fleet.restart_requested(0)).after is R
        assert fleet.shard(0).restart_attempts == attempt
        fleet.restart_failed(0)
    t = only(fleet.restart_requested(0))
    assert (t.before, t.after) == (D, RT)
    assert t.rule == "restart attempts exhausted (3 > max_restart_attempts_per_shard 2)"
    assert "restart attempts exhausted" in fleet.shard(0).since_rule
    assert fleet.shard(0).restart_attempts == 3


def test_a_restart_budget_of_zero_retires_at_the_first_request():
    fleet = Fleet(max_restart_attempts_per_shard=0)
    fleet.actor_died(1)
    t = only(fleet.restart_requested(1))
    assert t.after is RT
    assert t.rule == "restart attempts exhausted (1 > max_restart_attempts_per_shard 0)"


def test_attempts_are_counted_across_successful_restarts_too():
    fleet = Fleet(max_restart_attempts_per_shard=1)
    fleet.actor_died(0)
    fleet.restart_requested(0)
    fleet.replacement_loaded(0)
    fleet.refit_completed(1)
    assert fleet.state(0) is H
    fleet.actor_died(0)
    assert only(fleet.restart_requested(0)).after is RT


def test_a_restart_request_while_restarting_counts_but_moves_nothing():
    fleet = Fleet()
    put_in(fleet, 0, R)
    assert fleet.restart_requested(0) == []
    assert fleet.state(0) is R
    assert fleet.shard(0).restart_attempts == 2


def test_a_restart_request_on_a_retired_shard_is_a_no_op():
    fleet = Fleet(max_restart_attempts_per_shard=0)
    fleet.actor_died(0)
    fleet.restart_requested(0)
    before = fleet.copy_of(0)
    assert fleet.restart_requested(0) == []
    assert fleet.shard(0) == before
    assert fleet.shard(0).restart_attempts == 1


@pytest.mark.parametrize("state", [R, H, S, ST])
def test_a_failed_restart_sends_the_shard_back_to_dead(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    t = only(fleet.restart_failed(0, "CUDA out of memory"))
    assert (t.before, t.after, t.input) == (state, D, Input.RESTART_FAILED)
    assert t.rule == "restart failed: CUDA out of memory"
    assert fleet.shard(0).last_error == "CUDA out of memory"


def test_a_failed_restart_on_a_dead_shard_notes_the_error_without_a_transition():
    fleet = Fleet()
    put_in(fleet, 0, D)
    assert fleet.restart_failed(0, "still broken") == []
    assert fleet.shard(0).last_error == "still broken"


def test_a_failed_restart_leaves_a_retired_shard_retired():
    fleet = Fleet()
    put_in(fleet, 0, RT)
    before = fleet.copy_of(0)
    assert fleet.restart_failed(0) == []
    assert fleet.shard(0) == before


def test_a_loaded_replacement_is_stale_with_cleared_probe_counters_and_its_new_url():
    fleet = Fleet(unhealthy_threshold=3, healthy_threshold=3)
    fleet.probe_ok(0)
    fleet.probe_failed(0, times=3)
    fleet.restart_requested(0)
    assert fleet.shard(0).probe_failures == 3
    t = only(fleet.replacement_loaded(0, "http://gen-0b.test:8001"))
    assert (t.before, t.after, t.input) == (R, ST, Input.REPLACEMENT_LOADED)
    assert t.rule == "replacement loaded; it holds start-up weights until a refit"
    r = fleet.shard(0)
    assert (r.probe_failures, r.probe_successes, r.probe_evidence) == (0, 0, ())
    assert r.base_url == "http://gen-0b.test:8001"
    assert r.state_before_partial is None


def test_a_replacement_loaded_without_a_url_keeps_the_old_one():
    fleet = Fleet()
    put_in(fleet, 1, ST)
    assert fleet.shard(1).base_url == fleet.config.base_urls[1]


@pytest.mark.parametrize("state", [H, S, D])
def test_a_replacement_loaded_makes_any_non_retired_shard_stale(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    assert only(fleet.replacement_loaded(0)).after is ST


def test_a_replacement_loaded_on_a_retired_shard_is_a_no_op():
    fleet = Fleet()
    put_in(fleet, 0, RT)
    assert fleet.replacement_loaded(0, "http://x.test:1") == []
    assert fleet.state(0) is RT
    assert fleet.shard(0).base_url == fleet.config.base_urls[0]


# ── weights partial and refit completed ────────────────────────────────────────


def test_weights_marked_partial_make_every_live_shard_stale_and_remember_its_state():
    fleet = Fleet(shard_count=4)
    fleet.probe_failed(1)
    fleet.actor_died(2)
    put_in(fleet, 3, ST)
    ts = fleet.weights_partial(7)
    assert [(t.shard, t.before, t.after) for t in ts] == [(0, H, ST), (1, S, ST)]
    assert all(t.rule == "weights partial: refit at version 7 aborted" for t in ts)
    assert all(t.input is Input.WEIGHTS_PARTIAL for t in ts)
    assert fleet.shard(0).state_before_partial is H
    assert fleet.shard(1).state_before_partial is S
    assert fleet.state(2) is D
    assert fleet.shard(2).state_before_partial is None
    assert fleet.shard(3).state_before_partial is None  # a fresh engine inherits nothing
    assert fleet.view.serving == ()
    assert fleet.view.suspected == (1,)


@pytest.mark.parametrize("state", ABSENT_STATES)
def test_weights_marked_partial_are_a_no_op_on_absent_shards(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    fleet.weights_partial(3)
    assert fleet.shard(0) == before


def test_weights_marked_partial_twice_keep_the_state_from_before_the_first_abort():
    fleet = Fleet()
    fleet.probe_failed(0)
    fleet.weights_partial(3)
    assert fleet.weights_partial(3) == []
    assert fleet.shard(0).state_before_partial is S
    assert fleet.view.suspected == (0,)
    t = only(fleet.refit_completed(4, [0]))
    assert t.after is S  # the second abort did not launder the suspect into HEALTHY


def test_a_refit_restores_a_stale_shard_that_was_suspect_to_suspect_keeping_its_reported_streak():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(0, count=2)
    fleet.probe_failed(0)
    fleet.weights_partial(7)
    t = only(fleet.refit_completed(8, [0]))
    assert (t.before, t.after, t.input) == (ST, S, Input.REFIT_COMPLETED)
    assert t.rule == (
        "refit completed at weight version 8; it was SUSPECT before the abort, "
        "so it stays suspected"
    )
    assert t.evidence == (fleet.last_seq,)
    r = fleet.shard(0)
    assert r.reported_failures == 2
    assert r.reported_evidence == (2,)
    assert (r.probe_failures, r.probe_successes, r.probe_evidence) == (0, 0, ())
    assert r.weight_version == 8
    assert r.state_before_partial is None
    assert r.last_ok_at_us == at_us_of(fleet.last_seq)
    # The kept streak still counts: one more reported failure condemns it.
    assert only(fleet.reported_failure(0)).after is D


def test_a_refit_restores_a_stale_shard_that_was_healthy_to_healthy_clearing_its_reported_streak():
    fleet = Fleet(unhealthy_threshold=3)
    fleet.reported_failure(0, count=2)
    fleet.probe_ok(0, times=2)
    assert fleet.state(0) is H
    assert fleet.shard(0).reported_failures == 2
    fleet.weights_partial(7)
    t = only(fleet.refit_completed(8, [0]))
    assert (t.before, t.after) == (ST, H)
    assert t.rule == "refit completed at weight version 8"
    r = fleet.shard(0)
    assert (r.reported_failures, r.reported_evidence) == (0, ())
    assert r.weight_version == 8
    assert r.state_before_partial is None


def test_a_refit_promotes_a_loaded_replacement_to_healthy():
    fleet = Fleet(shard_count=2)
    put_in(fleet, 0, ST)
    t = only(fleet.refit_completed(5))
    assert (t.shard, t.before, t.after) == (0, ST, H)
    assert fleet.view.serving == (0, 1)
    assert fleet.view.weight_version == 5
    assert [r.weight_version for r in fleet.view.shards] == [5, 5]


def test_a_refit_promotes_only_the_shards_it_names():
    fleet = Fleet(shard_count=3)
    fleet.weights_partial(1)
    ts = fleet.refit_completed(2, [0, 2])
    assert [t.shard for t in ts] == [0, 2]
    assert fleet.state(1) is ST
    assert fleet.shard(1).weight_version == 0


def test_a_refit_leaves_a_retired_shard_untouched_weight_version_included():
    fleet = Fleet()
    put_in(fleet, 0, RT)
    before = fleet.copy_of(0)
    assert fleet.refit_completed(9) == []
    assert fleet.shard(0) == before
    assert fleet.shard(0).weight_version == 0


@pytest.mark.parametrize("state", [D, R])
def test_a_refit_does_not_resurrect_an_absent_shard(state):
    # Deviation from the reference: an absent shard was not in the communicator.
    fleet = Fleet()
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    assert fleet.refit_completed(9) == []
    assert fleet.shard(0) == before


@pytest.mark.parametrize("state", [H, S])
def test_a_refit_only_records_the_weight_version_of_a_serving_shard(state):
    # Deviation from the reference: the state and the probe counters stay as they are.
    fleet = Fleet(unhealthy_threshold=5)
    put_in(fleet, 0, state)
    fleet.reported_failure(0)
    before = fleet.copy_of(0)
    assert fleet.refit_completed(6) == []
    after = fleet.shard(0)
    assert after.weight_version == 6
    after_without_version = copy.deepcopy(after)
    after_without_version.weight_version = before.weight_version
    assert after_without_version == before


def test_the_trainer_weight_version_never_goes_back():
    fleet = Fleet()
    fleet.refit_completed(5)
    fleet.refit_completed(3)
    assert fleet.view.weight_version == 5
    assert fleet.view.last_refit_seq == fleet.last_seq


# ── judgements ─────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("state", [H, S, ST])
def test_a_condemned_silent_participant_is_dead_with_its_counters_untouched(state):
    fleet = Fleet(unhealthy_threshold=4)
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    t = only(fleet.condemned(0, "lone suspect of refit 7"))
    assert (t.before, t.after, t.input) == (state, D, Input.CONDEMNED)
    assert t.rule == "condemned as the silent participant: lone suspect of refit 7"
    assert t.evidence == (fleet.last_seq,)
    r = fleet.shard(0)
    for name in ("probe_failures", "probe_successes", "reported_failures", "restart_attempts"):
        assert getattr(r, name) == getattr(before, name), name
    assert r.probe_evidence == before.probe_evidence
    assert r.reported_evidence == before.reported_evidence


@pytest.mark.parametrize("state", ABSENT_STATES)
def test_condemning_an_absent_shard_is_a_no_op(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    before = fleet.copy_of(0)
    assert fleet.condemned(0) == []
    assert fleet.shard(0) == before


@pytest.mark.parametrize("state", [H, S, D, R, ST])
def test_any_shard_that_is_not_retired_can_be_retired(state):
    fleet = Fleet()
    put_in(fleet, 0, state)
    t = only(fleet.retired(0, "operator said so"))
    assert (t.before, t.after, t.input) == (state, RT, Input.RETIRE)
    assert t.rule == "retired: operator said so"


@pytest.mark.parametrize("how", ["retired", "restart budget"])
def test_a_retired_shard_is_never_moved_again_by_any_event(how):
    fleet = Fleet(
        shard_count=2, unhealthy_threshold=1, healthy_threshold=1, max_restart_attempts_per_shard=0
    )
    if how == "retired":
        fleet.retired(0)
    else:
        fleet.actor_died(0)
        fleet.restart_requested(0)
    assert fleet.state(0) is RT
    before = fleet.copy_of(0)
    for event in every_event_naming(0, shard_count=2):
        assert [t for t in fleet.apply(event) if t.shard == 0] == [], event
        assert fleet.shard(0) == before, event
    assert 0 in fleet.view.absent


# ── exhaustion ─────────────────────────────────────────────────────────────────


def test_the_fleet_is_not_exhausted_at_or_above_min_healthy_shards():
    fleet = Fleet(shard_count=3, min_healthy_shards=2)
    assert fleet.view.exhaustion() is None
    fleet.actor_died(0)
    assert fleet.view.serving == (1, 2)
    assert fleet.view.exhaustion() is None


def test_the_exhaustion_counts_every_state_and_describes_the_fleet():
    fleet = Fleet(shard_count=4, min_healthy_shards=2)
    fleet.actor_died(0)
    put_in(fleet, 1, ST)
    fleet.probe_failed(3)
    assert fleet.view.serving == (2, 3)  # HEALTHY and SUSPECT: exactly the floor
    assert fleet.view.exhaustion() is None
    fleet.retired(3)
    exhaustion = fleet.view.exhaustion()
    assert exhaustion == Exhaustion(
        serving=1,
        min_healthy_shards=2,
        counts={"HEALTHY": 1, "SUSPECT": 0, "DEAD": 1, "RESTARTING": 0, "STALE": 1, "RETIRED": 1},
    )
    assert exhaustion.describe() == (
        "only 1 generation shard(s) serving, below min_healthy_shards=2; "
        "fleet: HEALTHY 1, DEAD 1, STALE 1, RETIRED 1"
    )


def test_an_empty_serving_set_is_exhausted_at_the_default_floor():
    fleet = Fleet(shard_count=2)
    fleet.weights_partial(1)
    exhaustion = fleet.view.exhaustion()
    assert exhaustion is not None
    assert exhaustion.serving == 0
    assert exhaustion.describe() == (
        "only 0 generation shard(s) serving, below min_healthy_shards=1; fleet: STALE 2"
    )


# ── membership epoch and sets ──────────────────────────────────────────────────


def test_the_epoch_advances_when_a_shard_leaves_the_serving_set():
    fleet = Fleet()
    fleet.actor_died(1)
    assert fleet.view.epoch == 1
    assert fleet.view.last_serving == frozenset({0, 2})


def test_the_epoch_ignores_healthy_suspect_flapping():
    fleet = Fleet(unhealthy_threshold=3, healthy_threshold=1)
    for _ in range(5):
        fleet.probe_failed(0)
        fleet.probe_ok(0)
    fleet.reported_failure(1)
    assert [t.after for t in fleet.transitions].count(S) == 6
    assert fleet.view.epoch == 0


def test_the_epoch_ignores_dead_to_restarting_to_stale():
    fleet = Fleet()
    fleet.actor_died(0)
    assert fleet.view.epoch == 1
    fleet.restart_requested(0)
    fleet.restart_failed(0)
    fleet.restart_requested(0)
    fleet.replacement_loaded(0)
    assert fleet.state(0) is ST
    assert fleet.view.epoch == 1
    fleet.refit_completed(2)
    assert fleet.view.epoch == 2  # back in the serving set


def test_the_epoch_advances_at_most_once_per_event_however_many_shards_move():
    fleet = Fleet(shard_count=4)
    assert len(fleet.weights_partial(1)) == 4
    assert fleet.view.epoch == 1
    assert len(fleet.refit_completed(2)) == 4
    assert fleet.view.epoch == 2
    fleet.outcomes(*(outcome(i, infra=3) for i in range(4)))
    assert fleet.view.absent == (0, 1, 2, 3)
    assert fleet.view.epoch == 3


def test_the_epoch_advances_when_a_serving_shard_is_replaced():
    fleet = Fleet()
    fleet.replacement_loaded(2)
    assert fleet.view.epoch == 1


def test_events_that_move_no_shard_leave_the_epoch_alone():
    fleet = Fleet()
    fleet.refit_started(1)
    fleet.refit_aborted(1)
    fleet.stall()
    fleet.exhausted()
    fleet.outcomes(outcome(0, successes=3, data=2))
    fleet.run_ended()
    assert fleet.transitions == []
    assert fleet.view.epoch == 0


def test_suspected_shards_are_suspect_ones_plus_stale_ones_that_were_suspect():
    fleet = Fleet(shard_count=5)
    fleet.probe_failed(1)
    fleet.reported_failure(3)
    fleet.weights_partial(1)  # 0 H→ST, 1 S→ST, 2 H→ST, 3 S→ST, 4 H→ST
    fleet.refit_completed(2, [3, 4])  # 3 → SUSPECT, 4 → HEALTHY
    fleet.probe_failed(4)  # 4 → SUSPECT
    assert [fleet.state(i) for i in range(5)] == [ST, ST, ST, S, S]
    assert fleet.view.suspected == (1, 3, 4)
    assert fleet.view.serving == (3, 4)
    assert fleet.view.absent == ()


def test_serving_and_absent_are_disjoint_and_stale_is_neither():
    fleet = Fleet(shard_count=6)
    put_in(fleet, 1, S)
    put_in(fleet, 2, D)
    put_in(fleet, 3, R)
    put_in(fleet, 4, ST)
    put_in(fleet, 5, RT)
    assert fleet.view.serving == (0, 1)
    assert fleet.view.absent == (2, 3, 5)
    assert fleet.view.counts() == {
        "HEALTHY": 1,
        "SUSPECT": 1,
        "DEAD": 1,
        "RESTARTING": 1,
        "STALE": 1,
        "RETIRED": 1,
    }
    assert fleet.view.layout() == rank_layout(
        survivors=[0, 1, 4], dp_size=6, total_workers=6, train_world_size=2
    )


# ── run-level events ───────────────────────────────────────────────────────────


def test_run_level_events_are_kept_on_the_view():
    fleet = Fleet()
    fleet.refit_started(3, [0, 2])
    assert fleet.view.open_refit is not None
    assert (fleet.view.open_refit.seq, fleet.view.open_refit.shards) == (2, (0, 2))
    fleet.refit_aborted(3, "refit aborted", context_lost=True)
    assert fleet.view.open_refit is None
    assert fleet.view.last_abort is not None
    assert (fleet.view.last_abort.seq, fleet.view.last_abort.context_lost) == (3, True)
    fleet.stall()
    fleet.stall()
    assert (fleet.view.stalls, fleet.view.last_stall_seq) == (2, 5)
    fleet.exhausted()
    assert fleet.view.exhausted_seq == 6
    fleet.run_ended("failed", "fleet exhausted")
    assert fleet.view.ended is not None
    assert (fleet.view.ended.seq, fleet.view.ended.outcome) == (7, "failed")
    assert fleet.view.seq == 7
    assert fleet.view.at_us == at_us_of(7)


# ── the quiet paths agree with the table ─────────────────────────────────────
# ``healthy_probe_ok``, ``all_healthy_probes_ok``, ``reported_success_quiet`` and the
# inlined copy in ``FleetView.apply_page`` take the bulk of a run without building a
# Signal. They are right only while the table says these inputs never move a shard.


def test_a_probe_ok_of_a_healthy_shard_is_one_unconditional_stay_in_the_table():
    from fleetledger.projections import shard_states as ss

    assert ss.RULES[Input.PROBE_OK][ShardState.HEALTHY] == (ss._stay(),)
    assert ss.EFFECTS[Input.PROBE_OK] is ss._probe_ok


def test_a_reported_success_is_a_stay_in_every_state_but_retired_in_the_table():
    from fleetledger.projections import shard_states as ss

    assert ss.RULES[Input.REPORTED_SUCCESS] == {
        state: (ss._stay(),) for state in ss.ALL_BUT_RETIRED
    }
    assert ShardState.RETIRED not in ss.ALL_BUT_RETIRED
    assert ss.EFFECTS[Input.REPORTED_SUCCESS] is ss._reported_success
