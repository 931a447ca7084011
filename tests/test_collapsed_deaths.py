"""One death per shard incarnation: a report for a shard already absent is counted.

One SIGKILL of a serving actor fails every rollout in flight on it, and each of them
reported the death: 5–8 ``actor_death_confirmed`` rows per kill, each with Ray's
kilobyte of text, all but the first folded as no-ops. ``Ledger.actor_died`` now records
the first and counts the rest (``collapsed_deaths``, and a Prometheus counter); a death
of a later incarnation (a replacement that died) is a new fact and is recorded. All on
a real SQLite ledger.
"""

from __future__ import annotations

import io
import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from fleetledger.controller.ledger import Ledger
from fleetledger.controller.metrics import FleetMetrics
from fleetledger.events.models import ActorDeathConfirmed
from fleetledger.logs import configure_logging
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

_runs = itertools.count()
RAY_TEXT = "ActorDiedError: The actor died unexpectedly before finishing this task. " * 14


@pytest.fixture
def log(sqlite_url: str):
    with EventLog.open(sqlite_url) as opened:
        yield opened


def deaths(log: EventLog, run: str = "r") -> list[ActorDeathConfirmed]:
    return [r.event for r in log.read(run) if isinstance(r.event, ActorDeathConfirmed)]


def test_several_reports_of_one_incarnations_death_append_one_event(log: EventLog) -> None:
    ledger = Ledger.start(log, "r", fleet_config(3))
    first = ledger.actor_died(1, RAY_TEXT, incarnation=0)
    assert [(t.shard, t.after) for t in first] == [(1, ShardState.DEAD)]
    head = ledger.view.seq
    for _ in range(7):  # the other rollouts that were in flight on it
        assert ledger.actor_died(1, RAY_TEXT, incarnation=0) == []
    assert len(deaths(log)) == 1
    assert ledger.view.seq == head
    assert ledger.collapsed_deaths == {1: 7}
    assert ledger.membership.collapsed_deaths == (0, 7, 0)
    assert ledger.view == fold(log.read("r"))


def test_a_report_without_an_incarnation_is_collapsed_too(log: EventLog) -> None:
    ledger = Ledger.start(log, "r", fleet_config(2))
    ledger.actor_died(0, "gone")
    assert ledger.actor_died(0, "gone") == []
    assert ledger.actor_died(0, "engine gone", what="engine") == []
    assert len(deaths(log)) == 1 and ledger.collapsed_deaths == {0: 2}


@pytest.mark.parametrize("absent", ["DEAD", "RESTARTING", "RETIRED"])
def test_a_death_reported_while_the_shard_is_absent_is_counted_not_recorded(
    log: EventLog, absent: str
) -> None:
    ledger = Ledger.start(log, "r", fleet_config(2))
    if absent == "DEAD":  # taken out by a judgement, not a death: a death still adds nothing
        ledger.condemn_silent_participant(1, "lone suspect")
    elif absent == "RESTARTING":  # the replacement died while it loaded
        ledger.actor_died(1, "gone")
        ledger.restart_requested(1)
    else:
        ledger.retire(1, "operator")
    assert ledger.view.shards[1].state.value == absent
    head = ledger.view.seq
    incarnation = ledger.view.shards[1].restart_attempts
    assert ledger.actor_died(1, "late report", incarnation=incarnation) == []
    assert ledger.view.seq == head
    assert ledger.collapsed_deaths == {1: 1}
    assert [r.seq for r in log.read("r")][-1] == head


def test_the_death_of_a_new_incarnation_after_a_restart_is_recorded(log: EventLog) -> None:
    ledger = Ledger.start(log, "r", fleet_config(3))
    ledger.actor_died(2, RAY_TEXT, incarnation=0)
    ledger.actor_died(2, RAY_TEXT, incarnation=0)  # collapsed
    ledger.restart_requested(2)
    ledger.replacement_loaded(2)
    assert ledger.view.state_of(2) is ShardState.STALE
    assert ledger.actor_died(2, RAY_TEXT, incarnation=0) == []  # the old actor's: stale
    moved = ledger.actor_died(2, "ActorDiedError: the replacement died", incarnation=1)
    assert [(t.before, t.after) for t in moved] == [(ShardState.STALE, ShardState.DEAD)]
    assert [d.cause.raw for d in deaths(log) if d.cause] == [
        RAY_TEXT,
        "ActorDiedError: the replacement died",
    ]
    assert ledger.actor_died(2, "again", incarnation=1) == []
    assert ledger.collapsed_deaths == {2: 2}  # the stale report is dropped, not counted


def test_a_death_recorded_by_another_process_collapses_this_ones_report(
    log: EventLog, sqlite_url: str
) -> None:
    ledger = Ledger.start(log, "r", fleet_config(2))
    with EventLog.open(sqlite_url) as other_log:
        Ledger.resume(other_log, "r").actor_died(0, "seen by a rollout in another process")
    assert ledger.view.state_of(0) is ShardState.HEALTHY  # not caught up yet
    assert ledger.actor_died(0, "seen here too") == []
    assert ledger.view.state_of(0) is ShardState.DEAD
    assert [d.cause.raw for d in deaths(log) if d.cause] == ["seen by a rollout in another process"]


def test_a_collapsed_death_logs_one_debug_line(log: EventLog) -> None:
    ledger = Ledger.start(log, "r", fleet_config(2))
    ledger.actor_died(1, "gone", incarnation=0)
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    try:
        ledger.actor_died(1, "gone", incarnation=0)
    finally:
        configure_logging("warning")
    (line,) = [json.loads(text) for text in stream.getvalue().splitlines()]
    assert line["event"] == "death not recorded: the shard is already absent"
    assert line["level"] == "debug"
    assert (line["shard"], line["state"], line["collapsed"], line["what"]) == (
        1,
        "DEAD",
        1,
        "actor",
    )


def test_collapsed_deaths_are_a_prometheus_counter_per_shard(log: EventLog) -> None:
    ledger = Ledger.start(log, "r", fleet_config(3))
    metrics = FleetMetrics("r", lambda: ledger.membership)
    ledger.actor_died(2, "gone")
    for _ in range(3):
        ledger.actor_died(2, "gone")
    samples = {
        (s.name, s.labels.get("shard")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
        if s.name == "fleetledger_shard_deaths_collapsed_total"
    }
    assert samples == {
        ("fleetledger_shard_deaths_collapsed_total", "0"): 0.0,
        ("fleetledger_shard_deaths_collapsed_total", "1"): 0.0,
        ("fleetledger_shard_deaths_collapsed_total", "2"): 3.0,
    }
    ledger.report_progress(committed_groups=1, train_steps=0, in_flight=0)
    assert ledger.membership.collapsed_deaths == (0, 0, 3)  # kept across a fold


@settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    reports=st.lists(
        st.tuples(
            st.integers(0, 2),  # shard
            st.sampled_from(["death", "restart", "loaded"]),
        ),
        max_size=25,
    )
)
def test_at_most_one_death_is_recorded_per_incarnation(sqlite_url: str, reports) -> None:
    """Whatever the order of deaths, restarts and loads, the log holds at most one death
    per (shard, incarnation), every report not recorded and not stale is counted, and the
    live view is the fold of the log."""
    with EventLog.open(sqlite_url) as log:
        run = f"p{next(_runs)}"
        ledger = Ledger.start(log, run, fleet_config(3, max_restart_attempts_per_shard=9))
        reported = 0
        for shard, kind in reports:
            if kind == "death":
                reported += 1
                ledger.actor_died(
                    shard, "gone", incarnation=ledger.view.shards[shard].restart_attempts
                )
            elif kind == "restart":
                ledger.restart_requested(shard)
            elif ledger.view.state_of(shard) is ShardState.RESTARTING:
                ledger.replacement_loaded(shard)  # as a controller does: after a restart
        events = [r.event for r in log.read(run)]
        incarnation = [0, 0, 0]
        seen: set[tuple[int, int]] = set()
        for event in events:
            if event.type == "restart_requested":
                incarnation[event.shard] += 1  # type: ignore[attr-defined]
            elif isinstance(event, ActorDeathConfirmed):
                key = (event.shard, incarnation[event.shard])
                assert key not in seen, key
                seen.add(key)
        recorded = sum(isinstance(e, ActorDeathConfirmed) for e in events)
        assert recorded + sum(ledger.collapsed_deaths.values()) == reported
        assert ledger.view == fold(log.read(run))


def test_reports_through_a_replaced_actor_are_warned_of_once_and_counted(log: EventLog) -> None:
    """One SIGKILL fails every rollout in flight on the actor; each reports the death
    after the restart. One warning per replaced actor, the rest at debug, all counted."""
    ledger = Ledger.start(log, "r", fleet_config(3))
    ledger.actor_died(1, RAY_TEXT, incarnation=0)
    ledger.restart_requested(1)
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    try:
        for _ in range(5):
            assert ledger.actor_died(1, RAY_TEXT, incarnation=0) == []
    finally:
        configure_logging("warning")
    lines = [json.loads(text) for text in stream.getvalue().splitlines()]
    dropped = [x for x in lines if x["event"].startswith("stale report dropped")]
    assert [x["level"] for x in dropped] == ["warning"] + ["debug"] * 4
    assert [x["dropped"] for x in dropped] == [1, 2, 3, 4, 5]
    assert ledger.stale_dropped == {(1, 0): 5}
