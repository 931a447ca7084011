"""The controller's decisions, each recorded before it acts.

The fleet here is a scripted implementation of the controller's fleet protocol (probe
answers and restart outcomes are the inputs under test); test_chaos_ray.py runs the same
controller against real Ray actors killed and frozen with real signals.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

import pytest

from fleetledger.config import ControllerConfig
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import RunEnded, RunProgress
from fleetledger.projections.shard_states import ShardState
from fleetledger.queries.evidence import explain_from_log
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


class ScriptedFleet:
    def __init__(self) -> None:
        self.dead: set[int] = set()
        self.restart_errors: list[Exception | None] = []
        self.restarted: list[int] = []

    def probe(
        self, shards: Iterable[int], timeout_s: float, *, deep: bool = False
    ) -> Mapping[int, ProbeResult]:
        return {
            s: ProbeResult("died", "gone") if s in self.dead else ProbeResult.ok() for s in shards
        }

    def restart(self, shard: int, *, ready_timeout_s: float) -> None:
        error = self.restart_errors.pop(0) if self.restart_errors else None
        if error is not None:
            raise error
        self.dead.discard(shard)
        self.restarted.append(shard)


def _config(**watchdog: object) -> ControllerConfig:
    return ControllerConfig.model_validate(
        {
            "fleet_health": {
                "enabled": True,
                "probe_interval_s": 0.5,
                "probe_timeout_s": 0.1,
                "restart_dead_shards": True,
            },
            "watchdog": {"interval_s": 1.0, "stall_timeout_s": 5.0, **watchdog},
            "refit": {"refit_timeout_s": 1.0, "grace_s": 1.0},
        }
    )


@pytest.fixture
def log(sqlite_url):
    log = EventLog.open(sqlite_url)
    yield log
    log.close()


def _controller(ledger, fleet, config=None, progress=None, now=None):
    return FleetController(
        ledger,
        fleet,
        config or _config(),
        progress=progress or (lambda: TrainingProgress(0, 0, 0, True)),
        clock=now or (lambda: 0.0),
    )


def test_restart_is_recorded_then_the_replacement_is_stale_until_a_refit(log):
    ledger = Ledger.start(log, "r", fleet_config(3, max_restart_attempts_per_shard=2))
    fleet = ScriptedFleet()
    controller = _controller(ledger, fleet)
    fleet.dead.add(1)
    controller.pump.probe_round()
    assert controller.restart(1) == "STALE"
    types = [r.event.type for r in log.read("r", 1)]
    assert types[-2:] == ["restart_requested", "replacement_loaded"]
    assert fleet.restarted == [1]
    ledger.refit_started(1)
    ledger.refit_completed(1)
    assert ledger.view.state_of(1) is ShardState.HEALTHY
    assert ledger.view.shards[1].weight_version == 1


def test_a_failed_restart_goes_back_to_dead_and_the_budget_retires(log):
    ledger = Ledger.start(log, "r", fleet_config(2, max_restart_attempts_per_shard=1))
    fleet = ScriptedFleet()
    fleet.restart_errors = [RuntimeError("no GPU left on the node")]
    controller = _controller(ledger, fleet)
    ledger.actor_died(0, "gone")
    assert controller.restart(0) == "DEAD"
    (failed,) = [r.event for r in log.read("r", 1) if r.event.type == "restart_failed"]
    assert failed.error == "RuntimeError: no GPU left on the node"
    assert controller.restart(0) == "RETIRED"  # second attempt > budget of 1
    assert fleet.restarted == []  # past the budget no actor is touched
    # The fold retired it by the rule the restart decision applied, in the same words.
    assert ledger.view.shards[0].since_rule == (
        "restart attempts exhausted (2 > max_restart_attempts_per_shard 1)"
    )
    assert controller.restart(0) == "RETIRED"  # and nothing moves it again
    assert [r.event.type for r in log.read("r", 1)].count("restart_requested") == 2


def test_restart_of_a_shard_that_is_not_dead_does_nothing(log):
    ledger = Ledger.start(log, "r", fleet_config(2))
    controller = _controller(ledger, ScriptedFleet())
    head = log.head("r")
    assert controller.restart(0) == "HEALTHY"
    assert log.head("r") == head


def test_restart_after_the_run_ended_records_nothing(log):
    ledger = Ledger.start(log, "r", fleet_config(2))
    fleet = ScriptedFleet()
    controller = _controller(ledger, fleet)
    ledger.actor_died(0, "gone")
    ledger.end_run("failed", "the trainer crashed")
    head = log.head("r")
    assert controller.restart(0) == "DEAD"
    assert log.head("r") == head and fleet.restarted == []


def test_a_resumed_controller_queues_the_shards_that_died_meanwhile(log, sqlite_url):
    Ledger.start(log, "r", fleet_config(3)).actor_died(2, "gone while no controller ran")
    resumed = Ledger.resume(EventLog.open(sqlite_url), "r")
    controller = _controller(resumed, ScriptedFleet())
    assert controller.queue_restarts() == [2]
    assert controller.queue_restarts() == []  # already queued: not twice


def test_end_run_failed_names_exhaustion_when_it_is_the_cause(log):
    ledger = Ledger.start(log, "r", fleet_config(2))
    controller = _controller(ledger, ScriptedFleet())
    ledger.actor_died(0, "gone")
    ledger.actor_died(1, "gone")
    cause = controller.end_run_failed("prompt p1: 5 infrastructure failures (no_healthy_shards)")
    assert cause.startswith("only 0 generation shard(s) serving")
    types = [r.event.type for r in log.read("r", 1)]
    assert types[-2:] == ["fleet_exhausted", "run_ended"]
    assert controller.halted == cause
    # A second failure report does not record another end.
    assert controller.end_run_failed("late") == cause
    assert log.head("r") == len(types) + 1


def test_end_run_failed_keeps_the_rollouts_cause_when_the_fleet_is_fine(log):
    ledger = Ledger.start(log, "r", fleet_config(2))
    controller = _controller(ledger, ScriptedFleet())
    cause = controller.end_run_failed("prompt p1: data failure context_length")
    assert ledger.view.ended.cause == cause == "prompt p1: data failure context_length"


def test_a_stall_with_abort_ends_the_run_aborted(log):
    ledger = Ledger.start(log, "r", fleet_config(2))
    now = [0.0]
    halted: list[str] = []
    controller = FleetController(
        ledger,
        ScriptedFleet(),
        _config(stall_action="abort"),
        progress=lambda: TrainingProgress(4, 1, 0, True),
        on_halt=halted.append,
        clock=lambda: now[0],
    )
    assert controller.tick_watchdog().action == "none"
    now[0] = 6.0
    decision = controller.tick_watchdog()
    assert decision.action == "abort" and decision.stall_recorded
    assert ledger.view.ended.outcome == "aborted"
    assert halted == [decision.cause]
    assert controller.tick_watchdog().action == "ended"
    assert controller.progress_sample().idle_s == 6.0


def test_exhaustion_on_a_watchdog_tick_halts(log):
    ledger = Ledger.start(log, "r", fleet_config(2, min_healthy_shards=2))
    halted: list[str] = []
    controller = FleetController(
        ledger,
        ScriptedFleet(),
        _config(),
        progress=lambda: TrainingProgress(0, 0, 0, True),
        on_halt=halted.append,
        clock=lambda: 0.0,
    )
    ledger.actor_died(1, "gone")
    assert controller.tick_watchdog().action == "exhausted"
    assert halted and halted[0].startswith("only 1 generation shard(s) serving")
    assert ledger.view.ended.outcome == "failed"


def test_a_death_recorded_outside_the_probes_is_queued_for_restart_on_the_next_round(log):
    """Story: a rollout saw ActorDiedError and recorded the death itself; the probe round
    that followed changed nothing, and the dead shard was never restarted."""
    ledger = Ledger.start(log, "r", fleet_config(3))
    controller = _controller(ledger, ScriptedFleet())
    ledger.actor_died(1, "ActorDiedError: seen by a rollout")
    probe_round = controller.pump.probe_round()
    assert probe_round.transitions == ()
    assert controller.queue_restarts() == []  # the round queued it already
    assert controller.restart(1) == "STALE"


def test_the_loops_survive_errors_that_are_not_the_ledgers(log):
    """Story: one RaySystemError in a probe round used to end probing for the rest of
    the run, silently; a failing progress source killed the watchdog the same way."""

    class Flaky(ScriptedFleet):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def probe(self, shards, timeout_s, *, deep=False):
            self.calls += 1
            if self.calls <= 2:
                raise RuntimeError("RaySystemError: the raylet is restarting")
            return super().probe(shards, timeout_s)

    ticks = [0]

    def progress() -> TrainingProgress:
        ticks[0] += 1
        if ticks[0] <= 2:
            raise RuntimeError("the trainer's counters are not there yet")
        return TrainingProgress(ticks[0], 0, 0, True)

    ledger = Ledger.start(log, "r", fleet_config(2))
    config = ControllerConfig.model_validate(
        {
            "fleet_health": {"enabled": True, "probe_interval_s": 0.05, "probe_timeout_s": 0.01},
            "watchdog": {"interval_s": 0.05, "stall_timeout_s": 60.0},
            "refit": {"refit_timeout_s": 1.0, "grace_s": 1.0},
        }
    )
    fleet = Flaky()
    controller = FleetController(ledger, fleet, config, progress=progress).start()
    try:
        deadline = time.monotonic() + 30
        while (controller.pump.rounds < 3 or ticks[0] < 4) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        controller.stop()
    assert fleet.calls > 2 and controller.pump.rounds >= 3
    assert ticks[0] >= 4
    assert ledger.view.progress is not None  # the watchdog recorded progress after all


def test_an_interrupted_restart_is_driven_again(log, sqlite_url):
    """A controller killed between restart_requested and replacement_loaded leaves the
    shard RESTARTING; the next controller records the interruption and restarts it."""
    ledger = Ledger.start(log, "r", fleet_config(3))
    ledger.actor_died(1, "gone")
    ledger.restart_requested(1)  # … and then the controller died
    resumed = Ledger.resume(EventLog.open(sqlite_url), "r")
    fleet = ScriptedFleet()
    controller = _controller(resumed, fleet)
    assert controller.queue_restarts() == [1]
    assert controller.restart(1) == "STALE"
    types = [r.event.type for r in resumed.log.read("r", 1)]
    assert types[-3:] == ["restart_failed", "restart_requested", "replacement_loaded"]
    assert resumed.view.shards[1].restart_attempts == 2
    assert fleet.restarted == [1]


def test_the_runs_end_records_the_loops_progress_however_it_ends(log):
    """Progress is recorded on watchdog ticks only when it changes; the end records where
    the loop stood, so ``explain RUN`` answers with the run's real last progress."""
    ledger = Ledger.start(log, "r", fleet_config(2))
    steps = [0]
    _controller(ledger, ScriptedFleet(), progress=lambda: TrainingProgress(10, steps[0], 2, False))
    steps[0] = 5
    ledger.end_run_if_open("completed", "5 of 5 steps done")  # the loop's own call
    (ended,) = [r for r in log.read("r") if r.event.type == "run_ended"]
    assert ended.event.progress == RunProgress(committed_groups=10, train_steps=5, in_flight=2)
    explanation = explain_from_log(log, "r")
    assert explanation.progress is not None
    assert (explanation.progress.seq, explanation.progress.train_steps) == (ended.seq, 5)
    assert "10 committed groups, 5 train steps, 2 in flight" in explanation.text


def test_a_progress_source_that_fails_does_not_keep_the_run_from_ending(log):
    ledger = Ledger.start(log, "r", fleet_config(2))

    def broken() -> TrainingProgress:
        raise RuntimeError("the loop's counters are gone")

    _controller(ledger, ScriptedFleet(), progress=broken)
    assert ledger.end_run_if_open("failed", "boom") == "boom"
    assert ledger.view.ended is not None
    (ended,) = [r.event for r in log.read("r") if r.event.type == "run_ended"]
    assert ended.progress is None


def test_a_run_ended_without_progress_is_stored_as_an_older_fleetledger_stored_it():
    """The default is left out of the payload: the bytes an older fleetledger wrote (and
    reads, its model forbidding fields it does not know)."""
    plain = RunEnded(outcome="completed", cause="done")
    assert "progress" not in json.loads(plain.model_dump_json())
    with_progress = RunEnded(
        outcome="completed", cause="done", progress=RunProgress(committed_groups=1, train_steps=1)
    )
    assert json.loads(with_progress.model_dump_json())["progress"]["train_steps"] == 1
