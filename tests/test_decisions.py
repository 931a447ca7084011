"""The controller's pure decisions: each verdict, its reason and its evidence.

Every decision reads a view folded from events built here (no database, no Ray), so a
test states the fleet, asks, and asserts on what was decided and why — the reason is
the text the controller records, so it is asserted word for word. The property tests
pin each rule's invariant over random fleets, and the restart verdict against the fold
itself: the decision and the fold must never disagree about a retirement.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.projections.decisions import (
    CondemnationVerdict,
    Exhaustion,
    ExhaustionVerdict,
    RefitFailureKind,
    RefitFailureVerdict,
    RestartVerdict,
    decide_condemnation,
    decide_exhaustion,
    decide_refit_failure,
    decide_restart,
    refit_failure_kind,
)
from fleetledger.projections.shard_states import ShardState
from tests.projection_builders import Fleet, put_in

H, S, D, R, ST, RT = (
    ShardState.HEALTHY,
    ShardState.SUSPECT,
    ShardState.DEAD,
    ShardState.RESTARTING,
    ShardState.STALE,
    ShardState.RETIRED,
)
FAILURE = "RefitTimedOut: refit v2 did not come back within 4s"


def _aborted(fleet: Fleet, version: int = 2) -> int:
    """Abort refit ``version`` and mark the weights partial, as the recovery does; returns
    the abort's seq."""
    fleet.refit_started(version, [r.index for r in fleet.view.shards if not r.absent])
    fleet.refit_aborted(version, FAILURE)
    abort_seq = fleet.last_seq
    fleet.weights_partial(version)
    return abort_seq


# ── condemnation ───────────────────────────────────────────────────────────────


def test_the_lone_suspect_is_condemned_with_the_abort_and_its_streak_as_evidence():
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(1)
    failed_probe = fleet.last_seq
    abort = _aborted(fleet)
    partial = fleet.last_seq

    decision = decide_condemnation(fleet.view, named=(), version=2, failure=FAILURE)

    assert decision.verdict is CondemnationVerdict.CONDEMN
    assert decision.shard == 1 and decision.suspected == (1,)
    assert decision.reason == (
        f"refit v2 aborted with nothing absent and shard 1 the only suspect: {FAILURE}"
    )
    # The failed probe made it suspect, the abort prompted the judgement, and the
    # partial marking is the transition it is in now (STALE, suspect before).
    assert decision.evidence == (failed_probe, abort, partial)
    assert decision.end_cause == ""


def test_the_lone_suspect_among_the_shards_the_transport_named_is_condemned():
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(2)
    _aborted(fleet)
    decision = decide_condemnation(fleet.view, named=(0, 2), version=2, failure=FAILURE)
    assert (decision.verdict, decision.shard) == (CondemnationVerdict.CONDEMN, 2)


def test_no_suspect_is_a_refusal_that_says_so():
    fleet = Fleet(shard_count=3)
    abort = _aborted(fleet)
    decision = decide_condemnation(fleet.view, named=(), version=2, failure=FAILURE)
    assert decision.verdict is CondemnationVerdict.REFUSE
    assert decision.shard is None and decision.suspected == ()
    assert decision.reason == (
        "refit v2 aborted with nothing absent and no shard is suspected: condemning one "
        "would be a guess"
    )
    assert decision.end_cause == (
        "refit v2 aborted and no silent participant could be named: no shard is suspected "
        f"({FAILURE})"
    )
    assert decision.evidence == (abort,)


def test_several_suspects_are_a_refusal_that_names_every_one():
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(0)
    fleet.probe_failed(2)
    _aborted(fleet)
    decision = decide_condemnation(fleet.view, named=(), version=2, failure=FAILURE)
    assert decision.verdict is CondemnationVerdict.REFUSE
    assert decision.suspected == (0, 2) and decision.shard is None
    assert decision.reason == (
        "refit v2 aborted with nothing absent and shards [0, 2] are suspected: condemning "
        "one would be a guess"
    )
    assert decision.end_cause == (
        "refit v2 aborted and no silent participant could be named: shards [0, 2] are "
        f"suspected ({FAILURE})"
    )


def test_a_lone_suspect_the_transport_did_not_name_is_refused():
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(0)
    _aborted(fleet)
    decision = decide_condemnation(fleet.view, named=(2, 1), version=2, failure=FAILURE)
    found = "the only suspect, shard 0, is not among the shards the transport named ([1, 2])"
    assert decision.verdict is CondemnationVerdict.REFUSE
    assert decision.shard is None and decision.suspected == (0,)
    assert decision.reason == f"refit v2: {found}"
    assert decision.end_cause == (
        f"refit v2 aborted and no silent participant could be named: {found}"
    )


def test_a_long_failure_is_cut_to_what_an_event_holds():
    fleet = Fleet(shard_count=2)
    fleet.probe_failed(0)
    _aborted(fleet)
    decision = decide_condemnation(fleet.view, named=(), version=2, failure="x" * 10_000)
    assert decision.verdict is CondemnationVerdict.CONDEMN and len(decision.reason) == 4096


STATES = st.sampled_from([H, S, D, R, ST, RT])


@given(
    states=st.lists(STATES, min_size=1, max_size=6),
    named=st.sets(st.integers(0, 5), max_size=3),
)
def test_condemnation_names_a_shard_only_when_it_is_the_one_suspect(states, named):
    fleet = Fleet(shard_count=len(states))
    for shard, state in enumerate(states):
        put_in(fleet, shard, state)
    abort = _aborted(fleet)
    suspected = fleet.view.suspected

    decision = decide_condemnation(fleet.view, named=named, version=2, failure=FAILURE)

    lone = len(suspected) == 1 and (not named or suspected[0] in named)
    assert (decision.verdict is CondemnationVerdict.CONDEMN) == lone
    assert decision.suspected == suspected
    if lone:
        assert decision.shard == suspected[0]
        assert f"shard {suspected[0]} the only suspect" in decision.reason
        assert decision.end_cause == ""
    else:
        assert decision.shard is None
        assert decision.end_cause.startswith("refit v2 aborted and no silent participant")
        if len(suspected) > 1:
            assert f"shards {list(suspected)} are suspected" in decision.reason
    assert abort in decision.evidence
    assert all(1 <= seq <= fleet.view.seq for seq in decision.evidence)
    assert list(decision.evidence) == sorted(set(decision.evidence))


# ── restart ────────────────────────────────────────────────────────────────────


def test_a_dead_shard_with_budget_left_is_restarted():
    fleet = Fleet(shard_count=2, max_restart_attempts_per_shard=2)
    fleet.actor_died(1)
    died = fleet.last_seq
    decision = decide_restart(fleet.view, 1)
    assert decision.verdict is RestartVerdict.RESTART
    assert decision.reason == "restart requested (attempt 1 of 2)"
    assert (decision.evidence, decision.shard, decision.attempt) == ((died,), 1, 1)


def test_a_dead_shard_past_its_budget_is_retired():
    fleet = Fleet(shard_count=2, max_restart_attempts_per_shard=1)
    fleet.actor_died(0)
    fleet.restart_requested(0)
    fleet.restart_failed(0)
    failed = fleet.last_seq
    decision = decide_restart(fleet.view, 0)
    assert decision.verdict is RestartVerdict.RETIRE
    assert decision.reason == "restart attempts exhausted (2 > max_restart_attempts_per_shard 1)"
    assert decision.evidence == (failed,)


def test_a_budget_of_zero_retires_at_the_first_request():
    fleet = Fleet(shard_count=2, max_restart_attempts_per_shard=0)
    fleet.actor_died(0)
    assert decide_restart(fleet.view, 0).verdict is RestartVerdict.RETIRE


def test_an_interrupted_restart_is_re_driven():
    fleet = Fleet(shard_count=2)
    put_in(fleet, 1, R)
    decision = decide_restart(fleet.view, 1)
    assert decision.verdict is RestartVerdict.REDRIVE
    assert decision.reason == "the restart in progress was interrupted (no controller drove it)"
    assert decision.evidence == (fleet.last_seq,)


@pytest.mark.parametrize("state", [H, S, ST, RT])
def test_a_shard_that_is_not_dead_needs_no_restart(state):
    fleet = Fleet(shard_count=2)
    put_in(fleet, 0, state)
    decision = decide_restart(fleet.view, 0)
    assert decision.verdict is RestartVerdict.NOTHING
    assert decision.reason == f"shard 0 is {state.value}, not DEAD: nothing to restart"
    assert decision.evidence == (fleet.shard(0).since_seq,)


def test_nothing_is_restarted_once_the_run_has_ended():
    fleet = Fleet(shard_count=2)
    fleet.actor_died(0)
    fleet.run_ended("failed", "the trainer crashed")
    decision = decide_restart(fleet.view, 0)
    assert decision.verdict is RestartVerdict.NOTHING
    assert decision.reason == f"the run ended at seq {fleet.last_seq}: nothing to restart"
    assert decision.evidence == (fleet.last_seq,)


@given(budget=st.integers(0, 30), attempts=st.integers(0, 40))
def test_the_restart_verdict_retires_exactly_when_the_fold_would(budget, attempts):
    """For any count and budget: "retire" iff folding restart_requested yields RETIRED,
    and the decision's reason is the rule text the fold records."""
    fleet = Fleet(shard_count=1, max_restart_attempts_per_shard=budget)
    fleet.actor_died(0)
    fleet.shard(0).restart_attempts = attempts  # any count, reachable by a log or not

    decision = decide_restart(fleet.view, 0)
    (transition,) = fleet.restart_requested(0)

    assert (decision.verdict is RestartVerdict.RETIRE) == (transition.after is RT)
    assert decision.verdict in (RestartVerdict.RESTART, RestartVerdict.RETIRE)
    assert (decision.verdict is RestartVerdict.RETIRE) == (attempts + 1 > budget)
    assert decision.reason == transition.rule
    assert decision.attempt == fleet.shard(0).restart_attempts


@given(budget=st.integers(0, 4), cycles=st.integers(0, 4))
def test_the_restart_verdict_agrees_with_the_fold_along_a_logged_history(budget, cycles):
    """The same agreement, reached only by events: restart, fail, restart again…"""
    fleet = Fleet(shard_count=1, max_restart_attempts_per_shard=budget)
    fleet.actor_died(0)
    for _ in range(cycles):
        decision = decide_restart(fleet.view, 0)
        (transition,) = fleet.restart_requested(0)
        assert (decision.verdict is RestartVerdict.RETIRE) == (transition.after is RT)
        assert decision.reason == transition.rule
        if transition.after is RT:
            assert decide_restart(fleet.view, 0).verdict is RestartVerdict.NOTHING
            return
        fleet.restart_failed(0)


# ── exhaustion ─────────────────────────────────────────────────────────────────


def test_below_the_floor_is_exhausted_with_the_counts_as_the_reason():
    fleet = Fleet(shard_count=4, min_healthy_shards=2)
    fleet.actor_died(0)
    died = fleet.last_seq
    put_in(fleet, 1, ST)
    stale = fleet.last_seq
    fleet.retired(3)
    retired = fleet.last_seq
    decision = decide_exhaustion(fleet.view)
    assert decision.verdict is ExhaustionVerdict.EXHAUSTED and decision.exhausted
    assert decision.reason == (
        "only 1 generation shard(s) serving, below min_healthy_shards=2; "
        "fleet: HEALTHY 1, DEAD 1, STALE 1, RETIRED 1"
    )
    assert decision.exhaustion == Exhaustion(
        serving=1,
        min_healthy_shards=2,
        counts={"HEALTHY": 1, "SUSPECT": 0, "DEAD": 1, "RESTARTING": 0, "STALE": 1, "RETIRED": 1},
    )
    assert decision.evidence == (died, stale, retired)  # why each one does not serve
    assert fleet.view.exhaustion() == decision.exhaustion  # the view's shortcut agrees


def test_at_the_floor_is_enough():
    fleet = Fleet(shard_count=3, min_healthy_shards=2)
    fleet.actor_died(0)
    decision = decide_exhaustion(fleet.view)
    assert decision.verdict is ExhaustionVerdict.ENOUGH and not decision.exhausted
    assert decision.reason == "2 shards serve, not below min_healthy_shards=2"
    assert decision.evidence == (1,)  # shards 1 and 2 serve since the run started
    assert fleet.view.exhaustion() is None


@given(states=st.lists(STATES, min_size=1, max_size=6), data=st.data())
def test_exhausted_iff_fewer_serve_than_the_floor(states, data):
    floor = data.draw(st.integers(1, len(states)), label="min_healthy_shards")
    fleet = Fleet(shard_count=len(states), min_healthy_shards=floor)
    for shard, state in enumerate(states):
        put_in(fleet, shard, state)

    decision = decide_exhaustion(fleet.view)

    serving = sum(state in (H, S) for state in states)
    assert decision.exhausted == (serving < floor)
    assert decision.exhaustion.serving == serving
    assert sum(decision.exhaustion.counts.values()) == len(states)
    if decision.exhausted:
        assert decision.reason == decision.exhaustion.describe()
        rests_on = [r.since_seq for r in fleet.view.shards if not r.serving]
    else:
        assert decision.reason.startswith(f"{serving} shards serve")
        rests_on = [r.since_seq for r in fleet.view.shards if r.serving]
    assert decision.evidence == tuple(sorted(set(rests_on)))
    assert (fleet.view.exhaustion() is not None) == decision.exhausted


# ── a failed refit: recover or fail ────────────────────────────────────────────────

KINDS = st.sampled_from(list(RefitFailureKind))
PUSH_FAILURE = "RefitFailed: refit push failed — failed: shard 1: ValueError: shape (4,) ≠ (8,)"


def _refit_in_flight(fleet: Fleet, version: int = 2) -> int:
    fleet.refit_started(version, [r.index for r in fleet.view.shards if not r.absent])
    return fleet.last_seq


def test_a_deterministic_failure_fails_with_the_error_as_its_reason():
    fleet = Fleet(shard_count=3)
    fleet.probe_failed(0)  # a lone suspect: the recovery would condemn it
    started = _refit_in_flight(fleet)
    decision = decide_refit_failure(
        fleet.view,
        version=2,
        kind=RefitFailureKind.DETERMINISTIC,
        context_lost=False,
        failure=PUSH_FAILURE,
    )
    assert decision.verdict is RefitFailureVerdict.FAIL and not decision.recover
    assert decision.reason == (
        "refit v2 failed deterministically, so it is not retried and no shard is condemned "
        f"for it: {PUSH_FAILURE}"
    )
    assert decision.evidence == (started,)
    assert (decision.kind, decision.context_lost) == (RefitFailureKind.DETERMINISTIC, False)


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        (RefitFailureKind.TIMED_OUT, "timed out"),
        (RefitFailureKind.PEER_LOST, "lost a peer"),
        (RefitFailureKind.ABORTED, "was aborted"),
    ],
)
def test_a_timeout_a_lost_peer_or_an_abort_is_recovered(kind, says):
    fleet = Fleet(shard_count=3)
    started = _refit_in_flight(fleet)
    decision = decide_refit_failure(
        fleet.view, version=2, kind=kind, context_lost=False, failure=FAILURE
    )
    assert decision.verdict is RefitFailureVerdict.RECOVER and decision.recover
    assert decision.reason == f"refit v2 {says}; recovering: {FAILURE}"
    assert decision.evidence == (started,)


@given(kind=KINDS)
def test_a_lost_device_context_fails_whatever_the_kind(kind):
    fleet = Fleet(shard_count=2)
    decision = decide_refit_failure(
        fleet.view, version=3, kind=kind, context_lost=True, failure="CUDA error"
    )
    assert decision.verdict is RefitFailureVerdict.FAIL
    assert decision.reason == "refit v3: the trainer's device context is lost: CUDA error"
    assert decision.evidence == ()  # no refit open: nothing to rest on but the facts


@given(kind=KINDS, context_lost=st.booleans())
def test_recovered_exactly_when_the_fleet_can_have_caused_it(kind, context_lost):
    fleet = Fleet(shard_count=2)
    decision = decide_refit_failure(
        fleet.view, version=1, kind=kind, context_lost=context_lost, failure="x" * 10_000
    )
    assert decision.recover == (kind is not RefitFailureKind.DETERMINISTIC and not context_lost)
    assert len(decision.reason) <= 4096


@given(st.lists(KINDS, max_size=6))
def test_the_kind_of_a_failure_seen_differently_by_its_parties(kinds):
    combined = refit_failure_kind(kinds)
    if not kinds:
        assert combined is None
        return
    assert combined in kinds
    # A bug anywhere makes the whole failure deterministic: the others' timeouts are its
    # consequence. Then a lost peer, then a timeout, then an abort.
    order = [
        RefitFailureKind.DETERMINISTIC,
        RefitFailureKind.PEER_LOST,
        RefitFailureKind.TIMED_OUT,
        RefitFailureKind.ABORTED,
    ]
    assert combined == min(kinds, key=order.index)
