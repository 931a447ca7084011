"""The stall watchdog's tick, against a real Ledger on a SQLite file and a hand-driven clock.

The clock is the watchdog's one injected dependency: each test advances it by hand, so no
test sleeps and every idle time is exact. What the watchdog decided is checked twice: in
the returned decision and in the events read back from the log, because the log is what
explains a wedged run afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleetledger.config import WatchdogConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.stall_watchdog import StallWatchdog
from fleetledger.events.models import Event
from fleetledger.projections.decisions import decide_exhaustion
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

RUN = "watchdog"
TIMEOUT = 600.0
DIED = ProbeResult("died", "ActorDiedError: The actor died unexpectedly")


class FakeClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def log(sqlite_url: str) -> Iterator[EventLog]:
    with EventLog.open(sqlite_url) as opened:
        yield opened


@pytest.fixture
def ledger(log: EventLog) -> Ledger:
    led = Ledger.start(log, RUN, fleet_config(3, min_healthy_shards=2))
    led.refit_started(1)  # shards serve once a refit has loaded weights into them
    led.refit_completed(1)
    return led


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def watchdog(ledger: Ledger, clock: FakeClock, action: str = "warn") -> StallWatchdog:
    config = WatchdogConfig(interval_s=30.0, stall_timeout_s=TIMEOUT, stall_action=action)
    return StallWatchdog(ledger, config, now=clock)


def tick(dog: StallWatchdog, groups: int = 0, steps: int = 0, **kw: Any) -> Any:
    kw.setdefault("in_flight", 0)
    kw.setdefault("work_remains", True)
    return dog.tick(committed_groups=groups, train_steps=steps, **kw)


def watchdog_events(log: EventLog) -> list[Event]:
    """The watchdog's own events, read back from the log, in order."""
    kinds = {"progress_reported", "stall_detected", "fleet_exhausted", "run_ended"}
    return [r.event for r in log.read(RUN) if r.event.type in kinds]


def kinds(log: EventLog) -> list[str]:
    return [e.type for e in watchdog_events(log)]


def test_no_stall_before_the_timeout(ledger: Ledger, clock: FakeClock, log: EventLog) -> None:
    dog = watchdog(ledger, clock)
    assert tick(dog).action == "none"
    clock.advance(TIMEOUT - 0.001)
    decision = tick(dog)
    assert decision.action == "none"
    assert not decision.stalled
    assert kinds(log) == ["progress_reported"]  # the baseline only: nothing changed


def test_stall_at_the_timeout_with_nothing_in_flight(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=4, steps=2)
    clock.advance(TIMEOUT)
    decision = tick(dog, groups=4, steps=2, in_flight=0)
    assert decision.action == "warn"
    assert decision.stall_recorded
    assert decision.idle_s == TIMEOUT
    (stall,) = [e for e in watchdog_events(log) if e.type == "stall_detected"]
    assert (stall.committed_groups, stall.train_steps, stall.in_flight) == (4, 2, 0)
    assert (stall.idle_s, stall.action) == (TIMEOUT, "warn")
    assert ledger.view.stalls == 1


def test_a_run_that_never_progresses_stalls_from_the_start(
    ledger: Ledger, clock: FakeClock
) -> None:
    dog = watchdog(ledger, clock)
    clock.advance(TIMEOUT)
    assert tick(dog).stall_recorded


def test_stall_recorded_once_per_episode(ledger: Ledger, clock: FakeClock, log: EventLog) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=1)
    decisions = []
    for _ in range(5):
        clock.advance(TIMEOUT)
        decisions.append(tick(dog, groups=1, in_flight=3))
    assert all(d.action == "warn" for d in decisions)  # still stalled on every tick...
    assert [d.stall_recorded for d in decisions] == [True, False, False, False, False]
    assert kinds(log) == ["progress_reported", "stall_detected"]  # ...but recorded once


def test_progress_ends_the_episode_and_the_next_stall_is_new(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=1)
    clock.advance(TIMEOUT)
    assert tick(dog, groups=1).stall_recorded

    clock.advance(5)
    moved = tick(dog, groups=1, steps=1)  # a train step alone is progress
    assert moved.action == "none"
    assert moved.idle_s == 0
    clock.advance(TIMEOUT - 1)
    assert tick(dog, groups=1, steps=1).action == "none"  # the idle clock restarted
    clock.advance(1)
    again = tick(dog, groups=1, steps=1)
    assert again.stall_recorded

    assert kinds(log) == [
        "progress_reported",
        "stall_detected",
        "progress_reported",
        "stall_detected",
    ]
    stalls = [e for e in watchdog_events(log) if e.type == "stall_detected"]
    assert [(s.committed_groups, s.train_steps) for s in stalls] == [(1, 0), (1, 1)]
    assert ledger.view.stalls == 2


def test_in_flight_changes_alone_are_neither_progress_nor_recorded(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=2, in_flight=0)
    clock.advance(TIMEOUT / 2)
    tick(dog, groups=2, in_flight=8)
    clock.advance(TIMEOUT / 2)
    assert tick(dog, groups=2, in_flight=1).stall_recorded
    assert kinds(log) == ["progress_reported", "stall_detected"]


@pytest.mark.parametrize("action", ["warn", "abort"])
def test_stall_action_comes_from_the_config(
    ledger: Ledger, clock: FakeClock, log: EventLog, action: str
) -> None:
    dog = watchdog(ledger, clock, action)
    tick(dog)
    clock.advance(TIMEOUT)
    decision = tick(dog)
    assert decision.action == action
    assert "no progress for 600s" in decision.cause
    (stall,) = [e for e in watchdog_events(log) if e.type == "stall_detected"]
    assert stall.action == action
    assert ledger.view.ended is None  # aborting is the caller's job, not the tick's


def test_finished_work_never_stalls(ledger: Ledger, clock: FakeClock, log: EventLog) -> None:
    dog = watchdog(ledger, clock, "abort")
    tick(dog, groups=10, steps=5, work_remains=False)
    for _ in range(3):
        clock.advance(TIMEOUT * 10)
        assert tick(dog, groups=10, steps=5, work_remains=False).action == "none"
    assert kinds(log) == ["progress_reported"]


def kill(ledger: Ledger, *shards: int) -> None:
    ledger.record_probes(dict.fromkeys(shards, DIED))


def test_exhaustion_ends_the_run_with_its_cause(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=1)
    kill(ledger, 1, 2)  # 1 serving < min_healthy_shards=2
    decision = tick(dog, groups=1)
    assert decision.action == "exhausted"
    assert "below min_healthy_shards=2" in decision.cause
    assert decision.cause == decide_exhaustion(ledger.view).reason  # recorded as decided

    assert kinds(log) == ["progress_reported", "fleet_exhausted", "run_ended"]
    exhausted, ended = watchdog_events(log)[1:]
    assert (exhausted.serving, exhausted.min_healthy_shards) == (1, 2)
    assert (ended.outcome, ended.cause) == ("failed", decision.cause)

    clock.advance(TIMEOUT)
    after = tick(dog, groups=1)  # the run is over: nothing more is recorded
    assert (after.action, after.cause) == ("ended", decision.cause)
    assert kinds(log) == ["progress_reported", "fleet_exhausted", "run_ended"]


def test_exhaustion_is_suspended_while_recovering(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog, groups=1)
    with dog.recovering():
        kill(ledger, 1, 2)
        assert decide_exhaustion(ledger.view).exhausted
        with dog.recovering():  # nested windows: only the outermost exit reopens the check
            assert tick(dog, groups=1).action == "none"
        assert dog.is_recovering
        assert tick(dog, groups=1).action == "none"
    assert not dog.is_recovering
    assert kinds(log) == ["progress_reported"]  # not a word of exhaustion inside the window

    assert tick(dog, groups=1).action == "exhausted"  # the fleet never came back
    assert kinds(log) == ["progress_reported", "fleet_exhausted", "run_ended"]


def test_a_recovery_that_brings_the_fleet_back_is_never_exhaustion(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    with dog.recovering():
        kill(ledger, 2)
        ledger.restart_requested(2)
        ledger.replacement_loaded(2)  # STALE: alive, but serving only after a refit
        kill(ledger, 1)
        assert decide_exhaustion(ledger.view).exhausted  # for a moment, only shard 0 serves
        assert tick(dog).action == "none"
        ledger.refit_started(2)
        ledger.refit_completed(2)
    assert not decide_exhaustion(ledger.view).exhausted
    assert tick(dog).action == "none"
    assert "fleet_exhausted" not in kinds(log)


def test_stalls_are_still_reported_while_recovering(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    dog = watchdog(ledger, clock)
    tick(dog)
    with dog.recovering():  # a hung refit is exactly the stall the watchdog is for
        clock.advance(TIMEOUT)
        assert tick(dog).stall_recorded
    assert kinds(log) == ["progress_reported", "stall_detected"]


def test_a_restarted_controller_does_not_record_unchanged_progress_again(
    ledger: Ledger, clock: FakeClock, log: EventLog
) -> None:
    tick(watchdog(ledger, clock), groups=3, steps=1)
    resumed = Ledger.resume(log, RUN)
    dog = watchdog(resumed, clock)
    assert not tick(dog, groups=3, steps=1).progress_recorded
    clock.advance(TIMEOUT)
    assert tick(dog, groups=3, steps=1).stall_recorded
    assert kinds(log) == ["progress_reported", "stall_detected"]
