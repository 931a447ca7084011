"""What each fault cost, from the ledger alone: hand-built runs whose answer is known
(each event one second after the last), old windows that said nothing (unknown, never
zero), and a property over random runs (no shard's failure is ever counted twice)."""

from __future__ import annotations

from hypothesis import given

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    FailureCount,
    OutcomeWindowReported,
    ProbeFailure,
    ProbeRound,
    RecordedEvent,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
    RolloutFates,
    ShardOutcomes,
    StallDetected,
    VersionCount,
    WeightsMarkedPartial,
)
from fleetledger.projections.fault_cost import FaultCost, FaultCosts, fault_costs
from fleetledger.projections.history import History
from tests.projection_builders import fleet_config, record_run
from tests.test_fold_properties import runs


def _costs(records: list[RecordedEvent]) -> tuple[FaultCost, ...]:
    """Through the replay's page path (as ``explain`` reads a log); and one event at a
    time (``fault_costs``) gives the same."""
    costs = FaultCosts()
    history, _ = History.start(records[0], costs.observe)
    history.feed_page(records[1:])
    paged = costs.finish(history.view)
    assert fault_costs(records) == paged
    return paged


def _failed(shard: int, n: int, fates: RolloutFates | None) -> OutcomeWindowReported:
    failures = (FailureCount(category="infra", reason="actor_died", count=n),)
    return OutcomeWindowReported(
        adapter="loop", outcomes=(ShardOutcomes(shard=shard, failures=failures, fates=fates),)
    )


def _silent(shard: int) -> ProbeRound:
    others = tuple(s for s in range(3) if s != shard)
    return ProbeRound(ok=others, failed=(ProbeFailure(shard=shard, kind="timeout"),))


def _readmitted(shard: int, version: int) -> list[Event]:
    return [
        RestartRequested(shard=shard),
        ReplacementLoaded(shard=shard),
        RefitStarted(weight_version=version, shards=(0, 1, 2)),
        RefitCompleted(weight_version=version, shards=(0, 1, 2)),
    ]


def test_a_death_costs_what_was_in_flight_on_it_until_it_serves_again():
    events: list[Event] = [
        ProbeRound(ok=(0, 1, 2)),  # seq 2: shard 1's last sign of life
        ProbeRound(ok=(0, 2)),  # seq 3
        ActorDeathConfirmed(shard=1, error="killed"),  # seq 4: 2 s after its last ok
        _failed(1, 3, RolloutFates(redispatched=2, dropped=1)),  # seq 5
        *_readmitted(1, 1),  # seq 6..9: serving again at seq 9, 5 s after the death
    ]
    (death,) = _costs(record_run(fleet_config(3), events))
    assert (death.seq, death.kind, death.shards) == (4, "death", (1,))
    assert death.detection_s == 2.0
    assert (death.readmitted_s, death.out_of_service_s) == (5.0, 5.0)
    assert (death.in_flight, death.redispatched, death.dropped, death.ended_run) == (3, 2, 1, 0)
    assert death.failures_seen == 3
    assert "3 in flight (2 re-dispatched, 1 dropped)" in death.line
    assert "re-admitted after 5.0 s" in death.line


def test_failures_whose_fate_nobody_said_are_unknown_never_zero():
    events: list[Event] = [
        ActorDeathConfirmed(shard=0, error="killed"),
        _failed(0, 2, None),  # an older adapter: failures, no fates
    ]
    (death,) = _costs(record_run(fleet_config(3), events))
    assert death.in_flight is None and death.redispatched is None
    assert death.failures_seen == 2
    assert death.readmitted_s is None and death.out_of_service_s == 1.0  # to the last event
    assert "in flight unknown (≥ 2 failed)" in death.line and "not re-admitted" in death.line


def test_a_condemnation_by_reported_streak_counts_the_streak_that_made_it():
    fates = RolloutFates(redispatched=1)
    events: list[Event] = [_failed(2, 1, fates) for _ in range(3)]  # threshold 3: seq 2..4
    (condemned,) = _costs(record_run(fleet_config(3), events))
    assert (condemned.seq, condemned.kind, condemned.shards) == (4, "condemned", (2,))
    assert (condemned.in_flight, condemned.redispatched, condemned.failures_seen) == (3, 3, 3)


def test_a_freeze_condemned_by_probes_counts_the_failures_that_led_into_it():
    """The attempts a freeze broke are reported before its probe streak condemns it:
    they are its cost; a failure followed by a window of successes alone was a blip."""
    fates = RolloutFates(redispatched=1)
    ok = OutcomeWindowReported(adapter="loop", outcomes=(ShardOutcomes(shard=1, successes=2),))
    events: list[Event] = [
        _failed(1, 1, fates),  # seq 2: a blip...
        ok,  # seq 3: ...then successes: not the freeze's
        _failed(1, 1, fates),  # seq 4: the freeze's first broken attempt
        *(_silent(1) for _ in range(3)),  # seq 5..7: condemned at 7
        _failed(1, 1, RolloutFates(dropped=1)),  # seq 8: one more, after the verdict
    ]
    (condemned,) = _costs(record_run(fleet_config(3), events))
    assert (condemned.seq, condemned.kind, condemned.shards) == (7, "condemned", (1,))
    assert (condemned.in_flight, condemned.redispatched, condemned.dropped) == (2, 1, 1)
    assert condemned.failures_seen == 2


def test_a_refit_abort_costs_the_partial_shards_time_and_what_partial_weights_served():
    served = OutcomeWindowReported(
        adapter="router",
        outcomes=(
            ShardOutcomes(
                shard=0, successes=4, versions=(VersionCount(version=1, count=3),), partial=2
            ),
        ),
    )
    events: list[Event] = [
        RefitStarted(weight_version=2, shards=(0, 1, 2)),  # seq 2
        RefitStarted(weight_version=2, shards=(0, 1, 2)),  # seq 3: retried
        RefitAborted(weight_version=2, reason="a peer died"),  # seq 4: 1 s after the start
        WeightsMarkedPartial(weight_version=2, shards=(0, 2)),  # seq 5: 0 and 2 STALE
        served,  # seq 6: answers from shard 0 while it was STALE
        RefitStarted(weight_version=2, shards=(0, 1, 2)),  # seq 7
        RefitCompleted(weight_version=2, shards=(0, 1, 2)),  # seq 8: both serve again
    ]
    (abort,) = _costs(record_run(fleet_config(3), events))
    assert (abort.kind, abort.shards, abort.detection_s) == ("refit_abort", (0, 2), 1.0)
    assert abort.out_of_service_s == 6.0  # two shards, each 3 s (seq 5 to seq 8)
    assert abort.readmitted_s == 4.0  # from the abort (seq 4) to the last back (seq 8)
    assert (abort.partial_served, abort.unattested) == (2, 1)
    assert abort.in_flight == 0  # nothing failed on them: nothing was in flight


def test_a_stall_says_what_it_declared_in_flight_and_an_abort_ends_them_with_the_run():
    stall = StallDetected(
        committed_groups=3, train_steps=1, idle_s=61.0, in_flight=5, action="abort"
    )
    (cost,) = _costs(record_run(fleet_config(3), [stall]))
    assert (cost.kind, cost.shards, cost.detection_s) == ("stall", (), 61.0)
    assert (cost.in_flight, cost.ended_run, cost.out_of_service_s) == (5, 5, 0.0)


@given(runs())
def test_no_failure_is_counted_for_two_faults_and_nothing_is_negative(records):
    faults = _costs(records) if len(records) > 1 else ()
    reported = sum(
        o.infra_failures
        for r in records
        if isinstance(r.event, OutcomeWindowReported)
        for o in r.event.outcomes
    )
    assert sum(f.failures_seen for f in faults) <= reported
    assert [f.seq for f in faults] == sorted(f.seq for f in faults)
    for f in faults:
        assert f.out_of_service_s >= 0 and (f.detection_s is None or f.detection_s >= 0)
        assert f.readmitted_s is None or f.readmitted_s >= 0
        if f.in_flight is not None and f.kind != "stall":
            assert f.in_flight == f.redispatched + f.dropped + f.ended_run
        assert f.line.startswith(f"seq {f.seq} ")
