"""Chaos with real Ray actors on CPU: processes SIGKILLed and SIGSTOPped for real.

What each test asserts is structural (which probe round saw what, which events the log
holds, what the fold concluded), never a wall-clock duration: the durations are in
bench/bench_controller.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from fleetledger.adapters.deadlines import RolloutDeadlines
from fleetledger.adapters.failure_taxonomy import (
    DeadlineExpired,
    GenerationUnavailable,
)
from fleetledger.adapters.outcome_reporter import OutcomeReporter
from fleetledger.adapters.retry_policy import RetryPolicy, RolloutCounters, run_rollout
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger
from fleetledger.events.models import MAX_TEXT, RecordedEvent
from fleetledger.projections.fleet_view import fold_with_transitions
from fleetledger.projections.membership import membership_document
from fleetledger.projections.shard_states import ShardState
from fleetledger.queries import RunReader, load_view
from fleetledger.shards.contract import (
    Generation,
    GenerationRequest,
    RolloutDataFailure,
)
from fleetledger.simulate import (
    Chaos,
    SimulationResult,
    SimulationSpec,
    run_simulation,
    simulation_config,
)
from fleetledger.store.log import EventLog

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
from fleetledger.controller.ray_fleet import (  # noqa: E402 - needs Ray
    GenerationReports,
    RayShardFleet,
)
from fleetledger.controller.refit_recovery import RefitCoordinator  # noqa: E402
from fleetledger.controller.runtime_deaths import (  # noqa: E402 - needs Ray
    ShardActorDied,
    actor_death_of,
    death_text,
)
from fleetledger.engines.simulated import (  # noqa: E402 - needs Ray
    SimulatedRefitShard,
    SimulatedShard,
    simulated_shard_factory,
)
from fleetledger.events.causes import read_cause  # noqa: E402
from fleetledger.transports.ray_members import TrainerRank  # noqa: E402 - needs torch
from fleetledger.transports.restartable import RestartAwareSynchronizer  # noqa: E402
from tests.probe_facts import ShardFact, deaths, probes, shard_facts  # noqa: E402


@pytest.fixture
def log(sqlite_url: str, ray_cluster: str) -> Iterator[EventLog]:
    log = EventLog.open(sqlite_url)
    yield log
    log.close()


@pytest.fixture
def fleet(ray_cluster: str, request: pytest.FixtureRequest) -> Iterator[RayShardFleet]:
    prefix = f"t-{request.node.name[:40]}-{os.getpid()}"
    fleet = RayShardFleet.spawn(3, simulated_shard_factory(prefix, generation_s=0.01))
    pids = fleet.pids()
    yield fleet
    for pid in pids.values():  # a frozen actor must be thawed before it can be killed
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    fleet.shutdown()


def _controller(
    log: EventLog, fleet: RayShardFleet, *, probe_interval_s: float = 2.0, **health: object
) -> FleetController:
    # A generous probe timeout: on a loaded 2-core machine a healthy actor can take a few
    # hundred ms to answer, and these tests count rounds exactly.
    config = simulation_config(probe_interval_s=probe_interval_s, probe_timeout_s=1.0)
    config = config.model_copy(
        update={"fleet_health": config.fleet_health.model_copy(update=health)}
    )
    ledger = Ledger.start(
        log,
        f"chaos-{time.time_ns()}",
        config.fleet_config(
            shard_count=3, train_world_size=1, base_urls=[f"ray://{i}" for i in range(3)]
        ),
    )
    return FleetController(ledger, fleet, config, progress=lambda: TrainingProgress(0, 0, 0, True))


def _events(log: EventLog, run: str) -> list[RecordedEvent]:
    return list(log.read(run, 0))


def _wait_for(predicate, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        time.sleep(0.02)


# ── probes against real processes ──────────────────────────────────────────────


def test_sigkill_of_an_idle_shard_is_dead_on_the_next_probe_round(log, fleet):
    controller = _controller(log, fleet)
    ledger = controller.ledger
    assert controller.pump.probe_round().results[1].kind == "ok"
    os.kill(fleet.pids()[1], signal.SIGKILL)
    probe_round = controller.pump.probe_round()
    assert probe_round.results[1].kind == "died"
    assert "ActorDiedError" in probe_round.results[1].error
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert ledger.view.shards[1].since_rule.startswith("actor death confirmed")
    assert ledger.view.epoch == 1 and ledger.view.serving == (0, 2)


def test_sigkill_with_the_pump_running_records_death_before_any_later_success(log, fleet):
    """'Within one probe interval': no probe after the kill ever saw shard 1 alive."""
    controller = _controller(log, fleet, probe_interval_s=1.5)
    ledger = controller.ledger
    controller.start()
    try:
        _wait_for(lambda: controller.pump.rounds >= 2)
        os.kill(fleet.pids()[1], signal.SIGKILL)
        _wait_for(lambda: ledger.membership.states[1] == "DEAD")
    finally:
        controller.stop()
    about_1 = [f.kind for f in shard_facts(_events(log, ledger.run)) if f.shard == 1]
    # The round after the last one that saw it alive recorded the death: no failed or
    # timed-out probe in between, no counting.
    assert about_1[-1] == "died"
    assert set(about_1[:-1]) == {"ok"}


def test_sigstop_is_dead_after_threshold_rounds_and_sigcont_does_not_revive(log, fleet):
    controller = _controller(log, fleet)  # unhealthy_threshold 3
    ledger = controller.ledger
    pid = fleet.pids()[2]
    os.kill(pid, signal.SIGSTOP)
    seen = []
    for _ in range(3):
        probe_round = controller.pump.probe_round()
        seen.append((probe_round.results[2].kind, ledger.view.state_of(2)))
    assert seen == [
        ("timeout", ShardState.SUSPECT),
        ("timeout", ShardState.SUSPECT),
        ("timeout", ShardState.DEAD),
    ]
    # The others answered in the same bounded rounds.
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    os.kill(pid, signal.SIGCONT)
    assert fleet.probe([2], 30.0)[2].kind == "ok"  # the process answers again …
    for _ in range(3):
        controller.pump.probe_round()
    assert ledger.view.state_of(2) is ShardState.DEAD  # … and stays DEAD: not re-admitted
    ledger.record_probes({2: fleet.probe([2], 30.0)[2]})  # even an explicit success
    assert ledger.view.state_of(2) is ShardState.DEAD


def test_restart_replaces_the_actor_stale_until_refit_then_budget_retires(log, fleet):
    controller = _controller(log, fleet, max_restart_attempts_per_shard=1)
    ledger = controller.ledger
    old_pid = fleet.pids()[0]
    os.kill(old_pid, signal.SIGKILL)
    controller.pump.probe_round()
    assert fleet.incarnation(0) == 0
    assert controller.restart(0) == "STALE"
    assert fleet.incarnation(0) == 1  # what a transport checks before the next build
    new_pid = fleet.pids()[0]
    assert new_pid != old_pid
    assert fleet.probe([0], 30.0)[0].kind == "ok"
    ledger.refit_started(1)
    assert fleet.set_weight_version([0, 1, 2], 1, 30.0) == {
        s: fleet.probe([s], 30.0)[s] for s in (0, 1, 2)
    }
    ledger.refit_completed(1)
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    assert ray.get(fleet.handle(0).weight_version.remote(), timeout=30) == 1
    # Second death: the budget of one restart is spent, so the shard is retired and its
    # (dead) actor is not replaced.
    os.kill(new_pid, signal.SIGKILL)
    controller.pump.probe_round()
    assert controller.restart(0) == "RETIRED"
    assert fleet.probe([0], 30.0)[0].kind == "died"
    assert "restart attempts exhausted" in ledger.view.shards[0].since_rule


def test_a_wedged_engine_answers_probes_and_the_adapters_reports_condemn_it(log, fleet, sqlite_url):
    """The adapter reports through its own handle on the database, as another process
    would; the controller learns of the condemnation by folding the log's tail."""
    controller = _controller(log, fleet)
    ledger = controller.ledger
    ray.get(fleet.handle(0).set_fault.remote("hang"), timeout=30)
    deadlines = RolloutDeadlines(generation_s=0.3)
    request = GenerationRequest(prompt_id="p", group_id="g", prompt="2+2=")

    async def one_attempt() -> BaseException:
        try:
            async with deadlines.generation():
                await fleet.generate(0, request)
        except Exception as exc:
            return exc
        raise AssertionError("a wedged shard answered a generation")

    with OutcomeReporter(sqlite_url, ledger.run, "router", window_s=3600) as reporter:
        for attempt in range(3):
            exc = asyncio.run(one_attempt())
            assert isinstance(exc, DeadlineExpired)
            assert reporter.failure(0, exc).reason == "deadline:generation"
            reporter.flush()
            probe_round = controller.pump.probe_round()  # folds the adapter's window first
            if attempt < 2:
                assert probe_round.results[0].kind == "ok"  # it still answers probes …
                # … and the probes' successes never clear the reported streak.
                assert ledger.view.shards[0].reported_failures == attempt + 1
                assert ledger.view.shards[0].serving
    assert ledger.view.state_of(0) is ShardState.DEAD
    assert "3 consecutive reported failures" in ledger.view.shards[0].since_rule
    assert fleet.probe([0], 30.0)[0].kind == "ok"  # alive to Ray, condemned by the ledger


# ── the simulated training loop ────────────────────────────────────────────────


def _simulate(log: EventLog, **spec: object) -> tuple[SimulationResult, list[str]]:
    lines: list[str] = []
    config = spec.pop("config", None) or simulation_config(
        probe_interval_s=1.0, probe_timeout_s=0.5, generation_timeout_s=1.0
    )
    result = run_simulation(
        log,
        SimulationSpec(run=f"sim-{time.time_ns()}", config=config, **spec),  # type: ignore[arg-type]
        lines.append,
    )
    return result, lines


def _transitions(log: EventLog, run: str, shard: int) -> list[tuple[int, str]]:
    """(seq, new state) of every state change of ``shard``, from a fresh fold."""
    _, transitions = fold_with_transitions(log.read(run, 0))
    return [(t.seq, t.after.value) for t in transitions if t.shard == shard]


def _death_seq(log: EventLog, run: str, shard: int) -> int:
    return next(seq for seq, state in _transitions(log, run, shard) if state == "DEAD")


def test_kill_while_serving_redispatches_and_the_run_completes(log):
    result, lines = _simulate(
        log, shards=3, steps=4, generation_s=0.2, chaos=(Chaos("kill", 1, 2),)
    )
    assert result.outcome == "completed", result.cause
    assert result.steps_done == 4
    assert result.counters["redispatched"].get("actor_died", 0) >= 1  # type: ignore[union-attr]
    events = _events(log, result.run)
    death = _death_seq(log, result.run, 1)
    # Traffic moved to the survivors: no success from shard 1 after its death.
    for r in events:
        if r.seq > death and r.event.type == "outcome_window_reported":
            assert all(o.shard != 1 or o.successes == 0 for o in r.event.outcomes)
    # Every later refit left it out.
    refits = [r.event for r in events if r.seq > death and r.event.type == "refit_completed"]
    assert refits and all(1 not in e.shards for e in refits)
    assert any("chaos: kill shard 1" in line for line in lines)


def test_killing_the_last_shards_ends_the_run_with_the_exhaustion_cause(log):
    result, _ = _simulate(
        log,
        shards=2,
        steps=4,
        generation_s=0.2,
        chaos=(Chaos("kill", 0, 2), Chaos("kill", 1, 2)),
    )
    assert result.outcome == "failed"
    assert result.cause.startswith("only 0 generation shard(s) serving, below min_healthy")
    types = [r.event.type for r in _events(log, result.run)]
    assert types[-2:] == ["fleet_exhausted", "run_ended"]
    assert result.steps_done == 1


def test_a_wedged_shard_is_condemned_by_the_reported_streak_only(log):
    result, _ = _simulate(log, shards=3, steps=4, generation_s=0.05, chaos=(Chaos("wedge", 0, 1),))
    assert result.outcome == "completed", result.cause
    events = _events(log, result.run)
    view = load_view(log, result.run)
    assert view.state_of(0) is ShardState.DEAD
    assert "consecutive reported failures" in view.shards[0].since_rule
    assert not [r for r in events if r.event.type == "actor_death_confirmed"]
    redispatched = result.counters["redispatched"]
    assert sum(redispatched.values()) >= 3, redispatched  # type: ignore[union-attr]


def test_three_blips_among_many_successes_never_condemn(log):
    result, _ = _simulate(
        log,
        shards=2,
        steps=6,
        generation_s=0.02,
        chaos=(Chaos("blip", 0, 1), Chaos("blip", 0, 3), Chaos("blip", 0, 5)),
    )
    assert result.outcome == "completed", result.cause
    assert sum(result.counters["redispatched"].values()) == 3  # type: ignore[union-attr]
    assert "DEAD" not in [state for _, state in _transitions(log, result.run, 0)]
    assert load_view(log, result.run).state_of(0) in (ShardState.HEALTHY, ShardState.SUSPECT)
    windows = [
        r.event for r in _events(log, result.run) if r.event.type == "outcome_window_reported"
    ]
    failures = sum(o.infra_failures for w in windows for o in w.outcomes if o.shard == 0)
    successes = sum(o.successes for w in windows for o in w.outcomes if o.shard == 0)
    assert failures == 3 and successes > 3 * 3


# ── the controller itself dies ─────────────────────────────────────────────────


def _start_controller(url: str, run: str, address: str, prefix: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "FLEETLEDGER_LOG": "warning"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.controller_process",
            url,
            run,
            address,
            NAMESPACE,
            prefix,
            "3",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )


NAMESPACE = "fleetledger-tests"


def _first_line(process: subprocess.Popen[str], timeout_s: float = 120.0) -> dict[str, object]:
    """The controller's first line (its resumed membership), without hanging the suite."""
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    if not ready:
        raise AssertionError(f"the controller process printed nothing in {timeout_s}s")
    line = process.stdout.readline()  # type: ignore[union-attr]
    if not line:
        raise AssertionError(
            f"the controller process exited ({process.wait(30)}) before it started"
        )
    return json.loads(line)


def test_a_killed_controller_resumes_with_the_same_states_and_epoch(sqlite_url, ray_cluster):
    prefix = f"restart-{time.time_ns()}"
    fleet = RayShardFleet.spawn(
        3, simulated_shard_factory(prefix, generation_s=0.01, namespace=NAMESPACE)
    )
    pids = fleet.pids()
    log = EventLog.open(sqlite_url)
    config = simulation_config(probe_interval_s=0.3, probe_timeout_s=0.2)
    run = f"restart-{time.time_ns()}"
    Ledger.start(
        log,
        run,
        config.fleet_config(
            shard_count=3, train_world_size=1, base_urls=[f"ray://{i}" for i in range(3)]
        ),
    )

    def probes_after(seq: int) -> list[ShardFact]:
        return probes(log.read(run, seq))

    first = _start_controller(sqlite_url, run, ray_cluster, prefix)
    try:
        _first_line(first)
        _wait_for(lambda: len(probes_after(1)) >= 6)  # it probes
        os.kill(pids[1], signal.SIGKILL)
        _wait_for(lambda: load_view(log, run).state_of(1) is ShardState.DEAD)
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        first.kill()
        first.wait(30)
    before = load_view(log, run)
    head = log.head(run)

    second = _start_controller(sqlite_url, run, ray_cluster, prefix)
    try:
        resumed = _first_line(second)
        assert resumed["epoch"] == before.epoch == 1
        assert resumed["seq"] == head
        assert {int(s): d["state"] for s, d in resumed["shards"].items()} == {
            r.index: r.state.value for r in before.shards
        }
        # It carries on probing: the survivors, not the dead shard.
        _wait_for(lambda: len(probes_after(head)) >= 4)
        assert {f.shard for f in probes_after(head)} == {0, 2}
        after = load_view(log, run)
        assert after.epoch == before.epoch and after.serving == (0, 2)
    finally:
        second.kill()
        second.wait(30)
        fleet.shutdown()
        log.close()


def test_simulate_with_restarts_readmits_the_replacement_at_a_refit(log):
    config = simulation_config(
        probe_interval_s=0.6,
        probe_timeout_s=0.4,
        generation_timeout_s=1.0,
        restart_dead_shards=True,
    )
    # The last refit waits for the restart: on a loaded machine the replacement can take
    # longer to load than the steps left take to run.
    result, _ = _simulate(
        log,
        config=config,
        shards=3,
        steps=15,
        generation_s=0.2,
        chaos=(Chaos("kill", 1, 2),),
        await_restarts_s=120.0,
    )
    assert result.outcome == "completed", result.cause
    states = [state for _, state in _transitions(log, result.run, 1)]
    # DEAD → RESTARTING → STALE (it holds start-up weights) → HEALTHY only by a refit
    # (a slow probe on a loaded machine may add a SUSPECT on either side).
    core = [state for state in states if state != "SUSPECT"]
    assert core[:4] == ["DEAD", "RESTARTING", "STALE", "HEALTHY"], states
    events = _events(log, result.run)
    readmitted = next(seq for seq, state in _transitions(log, result.run, 1) if state == "HEALTHY")
    (by,) = [r.event for r in events if r.seq == readmitted]
    assert by.type == "refit_completed" and 1 in by.shards
    view = load_view(log, result.run)
    assert view.state_of(1) is ShardState.HEALTHY and view.shards[1].restart_attempts == 1
    assert view.shards[1].weight_version == 15
    # The epoch moved at the death and again at the re-admitting refit.
    death = _death_seq(log, result.run, 1)
    for seq in (death, readmitted):
        assert (
            load_view(log, result.run, seq).epoch == load_view(log, result.run, seq - 1).epoch + 1
        )


def test_a_stall_is_recorded_and_abort_ends_the_run_with_its_cause(log):
    """Every shard wedged and no generation deadline: nothing fails, nothing moves. Only
    the watchdog can say so; with stall_action=abort it ends the run and the parked
    step is cancelled (its rollouts drained, never committed as rows)."""
    config = simulation_config(
        probe_interval_s=0.5,
        probe_timeout_s=0.25,
        generation_timeout_s=None,
        stall_timeout_s=4.0,
        stall_action="abort",
    )
    result, _ = _simulate(
        log,
        config=config,
        shards=2,
        steps=3,
        generation_s=0.05,
        chaos=(Chaos("wedge", 0, 2), Chaos("wedge", 1, 2)),
    )
    assert result.outcome == "aborted"
    assert result.cause.startswith("no progress for ")
    events = _events(log, result.run)
    (stall,) = [r.event for r in events if r.event.type == "stall_detected"]
    # Generations already running when the wedge lands may finish their step; the step
    # after it cannot.
    assert stall.train_steps == result.steps_done < 3
    assert stall.action == "abort" and stall.idle_s >= 4.0
    assert [r.event.type for r in events][-1] == "run_ended"
    assert result.counters["cancelled"] >= 1
    view = load_view(log, result.run)
    assert view.serving == (0, 1)  # wedged engines answer probes: nobody was condemned


# ── the generation call site: across the boundary, the engine's own errors ───────────


class EngineDeadError(Exception):
    """Stands for vLLM's own: an engine core that died under a live actor."""


class DeadEngineShard(SimulatedShard):
    """Shard 0's engine is dead under its live actor: every generation raises."""

    async def generate(self, request: GenerationRequest) -> Generation:
        if self._index == 0:
            raise EngineDeadError("EngineCore encountered an issue")
        return await super().generate(request)


def test_an_engine_error_across_the_boundary_is_redispatched_to_another_shard(ray_cluster, request):
    prefix = f"boundary-{os.getpid()}"
    fleet = RayShardFleet.spawn(
        2, simulated_shard_factory(prefix, generation_s=0.0, shard_class=DeadEngineShard)
    )
    try:
        prompt = GenerationRequest(prompt_id="p", group_id="g", prompt="2+2=")
        with pytest.raises(GenerationUnavailable) as raised:
            asyncio.run(fleet.generate(0, prompt))
        assert raised.value.reason == "remote:EngineDeadError" and raised.value.shard == 0

        order = iter([0, 1])
        counters = RolloutCounters()
        result = asyncio.run(
            run_rollout(
                lambda attempt: fleet.generate(attempt.shard, prompt),
                select_shard=lambda: contextlib.nullcontext(next(order)),
                policy=RetryPolicy(backoff_base_s=0.0, max_backoff_s=0.0),
                counters=counters,
            )
        )
        assert result.shard == 1
        assert counters.redispatched == {"remote:EngineDeadError": 1}

        # An explicit data failure crosses the boundary as data: not re-dispatched.
        ray.get(fleet.handle(1).set_fault.remote("error"), timeout=30)
        with pytest.raises(RolloutDataFailure) as data:
            asyncio.run(fleet.generate(1, prompt))
        assert data.value.reason == "context_length"
    finally:
        fleet.shutdown()


# ── restarts in the library: incarnations, base URLs, whole death causes ────────────


def _death_events(log: EventLog, run: str, shard: int) -> list[ShardFact]:
    """Deaths recorded of ``shard``: by a probe round or by an adapter's report."""
    return deaths(_events(log, run), shard)


def _shards_lost(log: EventLog, run: str) -> list[str]:
    """The run explanation's lost-shard findings (a transition to DEAD or RETIRED)."""
    explanation = RunReader(log, run).explain(None, None)
    return [f.text for f in explanation.findings if f.kind == "shard_lost"]


def test_a_death_seen_through_the_old_handle_is_not_recorded_against_the_replacement(log, fleet):
    """SIGKILL shard 1, restart it, then deliver what the old handle saw (a rollout's
    ActorDiedError and a probe's 'died'): nothing is recorded against the replacement,
    and the explanation holds exactly the one death that happened."""
    controller = _controller(log, fleet, max_restart_attempts_per_shard=2)
    ledger = controller.ledger
    reports = GenerationReports(ledger, "test.rollouts")
    request = GenerationRequest(prompt_id="p", group_id="g", prompt="2+2=")
    os.kill(fleet.pids()[1], signal.SIGKILL)
    with pytest.raises(ShardActorDied) as old_generation:
        asyncio.run(fleet.generate(1, request))  # through incarnation 0's handle
    old_probe = fleet.probe([1], 30.0)[1]
    assert old_probe.kind == "died" and old_probe.incarnation == 0
    death = actor_death_of(old_generation.value)
    assert death is not None and death.incarnation == 0

    reports.failure(1, old_generation.value)  # the rollout reports it: conclusive
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert controller.restart(1) == "STALE"
    assert fleet.incarnation(1) == 1 == ledger.view.shards[1].restart_attempts
    head = log.head(ledger.run)

    # Late deliveries of what the old handle saw: every way in drops them.
    reports.failure(1, old_generation.value)
    assert ledger.actor_died(1, death.text, incarnation=death.incarnation) == []
    assert ledger.record_probes({1: old_probe}) == []
    assert log.head(ledger.run) == head  # nothing appended
    assert ledger.view.state_of(1) is ShardState.STALE
    assert len(_death_events(log, ledger.run, 1)) == 1
    lost = _shards_lost(log, ledger.run)
    assert len(lost) == 1 and lost[0].startswith("shard 1 HEALTHY → DEAD"), lost

    # The guard drops only the stale: the replacement's own death is recorded.
    os.kill(fleet.pids()[1], signal.SIGKILL)
    with pytest.raises(ShardActorDied) as new_generation:
        asyncio.run(fleet.generate(1, request))
    assert actor_death_of(new_generation.value).incarnation == 1  # type: ignore[union-attr]
    reports.failure(1, new_generation.value)
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert len(_death_events(log, ledger.run, 1)) == 2
    assert len(_shards_lost(log, ledger.run)) == 2


def test_a_probe_round_through_a_replaced_handle_records_nothing(log, fleet):
    """A probe round that went out to incarnation 0 and came back after the restart: the
    pump records what the fleet returns, and the ledger drops the stale result."""
    controller = _controller(log, fleet)
    ledger = controller.ledger
    os.kill(fleet.pids()[2], signal.SIGKILL)
    stale_round = fleet.probe([0, 1, 2], 30.0)
    assert [stale_round[s].incarnation for s in (0, 1, 2)] == [0, 0, 0]
    ledger.actor_died(2, "seen by a rollout first")
    assert controller.restart(2) == "STALE"
    ledger.record_probes(stale_round)  # arrives late
    assert ledger.view.state_of(2) is ShardState.STALE  # not DEAD again
    assert len(_death_events(log, ledger.run, 2)) == 1
    last = _events(log, ledger.run)[-1].event
    assert last.type == "probe_round" and last.ok == (0, 1)  # shards 0 and 1 of that round
    assert not last.failed and not last.died  # and nothing of the replaced shard 2


def test_actor_death_confirmed_reads_rays_cause_into_facts_and_keeps_it_whole(log, fleet):
    controller = _controller(log, fleet)
    ledger = controller.ledger
    pid = fleet.pids()[2]
    os.kill(pid, signal.SIGKILL)
    controller.pump.probe_round()
    (recorded,) = _death_events(log, ledger.run, 2)
    # What is printed: the process, its node and how it ended, on one line; not Ray's
    # first line ("The actor died unexpectedly …") nor its advice about the OOM killer.
    node = ray.util.get_node_ip_address()
    assert recorded.error == f"actor process {pid} on {node} killed (SIGKILL or a crash)"
    cause = read_cause(recorded.raw)  # the raw text kept in the event's cause
    assert (cause.pid, cause.node, cause.how) == (pid, node, "killed")
    # What Ray said, whole: the actor's class, the exit type and its story.
    raw = recorded.raw
    assert "class_name: SimulatedShard" in raw and "Worker exit type: SYSTEM_ERROR" in raw
    assert "OOM" in raw and len(raw) <= MAX_TEXT
    explanation = RunReader(log, ledger.run).explain(2, None)
    assert recorded.error in explanation.text and "OOM" not in explanation.text
    assert "Worker exit type: SYSTEM_ERROR" in explanation.raw_text  # explain --raw
    # A rollout's view of the same death carries the same whole text.
    with pytest.raises(ShardActorDied) as raised:
        asyncio.run(fleet.generate(2, GenerationRequest(prompt_id="p", group_id="g", prompt="")))
    assert f"pid: {pid}" in actor_death_of(raised.value).text  # type: ignore[union-attr]


def test_a_death_text_past_the_event_limit_is_clipped_with_a_visible_elision():
    long = ray.exceptions.ActorDiedError()
    long.error_msg = "The actor died.\n\tpid: 1\n" + "x" * (2 * MAX_TEXT)
    text = death_text(long)
    assert len(text) == MAX_TEXT and text.endswith("[clipped to the event's limit]")
    assert text.startswith("ActorDiedError: The actor died.\n\tpid: 1\nxxx")


class UrlShard(SimulatedShard):
    """An engine reached at a URL of its own process (as an HTTP engine would be)."""

    async def base_url(self) -> str:
        return f"http://127.0.0.1:{8000 + self._index}/v1?pid={os.getpid()}"


def test_a_restart_records_the_replacements_base_url(log, ray_cluster):
    fleet = RayShardFleet.spawn(
        3, simulated_shard_factory(f"url-{os.getpid()}", shard_class=UrlShard)
    )
    try:
        urls = fleet.base_urls()
        assert urls == [
            f"http://127.0.0.1:{8000 + s}/v1?pid={pid}" for s, pid in fleet.pids().items()
        ]
        config = simulation_config(probe_interval_s=2.0, probe_timeout_s=1.0)
        ledger = Ledger.start(
            log,
            f"url-{time.time_ns()}",
            config.fleet_config(shard_count=3, train_world_size=1, base_urls=urls),
        )
        controller = FleetController(
            ledger, fleet, config, progress=lambda: TrainingProgress(0, 0, 0, True)
        )
        os.kill(fleet.pids()[0], signal.SIGKILL)
        controller.pump.probe_round()
        assert controller.restart(0) == "STALE"
        new_url = f"http://127.0.0.1:8000/v1?pid={fleet.pids()[0]}"
        assert new_url != urls[0]
        (loaded,) = [
            r.event for r in _events(log, ledger.run) if r.event.type == "replacement_loaded"
        ]
        assert loaded.base_url == new_url
        assert ledger.view.shards[0].base_url == new_url
        assert membership_document(load_view(log, ledger.run))["shards"]["0"]["base_url"] == new_url
        explained = RunReader(log, ledger.run).explain(0, None).text
        assert f"base URL: {new_url}" in explained
        assert f"a replacement engine loaded at {new_url}" in explained
    finally:
        fleet.shutdown()


def test_the_library_synchronizer_allocates_and_takes_a_restarted_shard_back(log, ray_cluster):
    """RestartAwareSynchronizer, as an embedder builds it: nobody calls refit_allocate;
    a restarted shard (a new process) allocates and rejoins at the next refit."""
    fleet = RayShardFleet.spawn(
        3,
        simulated_shard_factory(f"sync-{os.getpid()}", shard_class=SimulatedRefitShard),
    )
    trainer = ray.remote(TrainerRank).options(num_cpus=0).remote(1 << 16)
    try:
        controller = _controller(log, fleet)
        ledger = controller.ledger
        sync = RestartAwareSynchronizer(fleet, [trainer], refit_timeout_s=10.0, grace_s=2.0)
        coordinator = RefitCoordinator(
            ledger, sync, fleet, refit_timeout_s=10.0, grace_s=2.0, probe_timeout_s=1.0
        )

        def refit(version: int) -> tuple[int, ...]:
            root = ray.get(trainer.train_step.remote(version), timeout=60)
            outcome = coordinator.refit(version)
            sums = {
                s: ray.get(fleet.handle(s).refit_checksum.remote(), timeout=30)
                for s in outcome.participants
            }
            assert set(sums.values()) == {root}, sums
            return outcome.participants

        assert refit(1) == (0, 1, 2)  # the first reconcile allocated every shard
        assert ray.get(fleet.handle(1).weight_version.remote(), timeout=30) == 1
        os.kill(fleet.pids()[1], signal.SIGKILL)
        controller.pump.probe_round()
        assert refit(2) == (0, 2)
        assert controller.restart(1) == "STALE"
        assert sync.joined_incarnation(1) == 0 and fleet.incarnation(1) == 1
        assert refit(3) == (0, 1, 2)  # allocated, replaced, rebuilt: taken back
        assert sync.joined_incarnation(1) == 1 and sync.readmitted == 1
        assert ledger.view.state_of(1) is ShardState.HEALTHY
        assert ray.get(fleet.handle(1).weight_version.remote(), timeout=30) == 3
    finally:
        ray.kill(trainer)
        fleet.shutdown()
