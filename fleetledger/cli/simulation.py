"""``fleetledger simulate``: an asynchronous RL loop on a local Ray cluster, with chaos.

A trainer actor steps; N simulated generation shards serve rollouts through the
least-outstanding selector under the retry policy; after every step the trainer's
parameters (a few MB of tensors) are broadcast to every shard that is not absent over
a gloo communicator rebuilt whenever the membership changes, with the recovery of
REFERENCE §4 when a push fails; the live controller probes, watches for stalls and
(optionally) restarts dead shards. Everything lands in the ledger, so the run can be
replayed and explained afterwards like any real one.

This module is a composition root (like the rest of the CLI): it wires the controller
to a transport, which the controller itself never imports.

Chaos: ``kill`` SIGKILLs a shard's process and ``freeze`` SIGSTOPs it while the given
step's rollouts are in flight (halfway through one generation time), so a kill lands on
a shard that is serving; ``wedge`` and ``blip`` are faults inside the engine.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import ray
import structlog

from fleetledger.controller.config import ControllerConfig
from fleetledger.controller.deadlines import RolloutDeadlines
from fleetledger.controller.failure_taxonomy import FailureKind, classify_exception
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.generation_shard import Generation, GenerationRequest, SimulatedShard
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.outcome_reporter import OutcomeWindow
from fleetledger.controller.ray_fleet import (
    RayShardFleet,
    actor_death_of,
    local_ray,
    simulated_shard_factory,
)
from fleetledger.controller.refit_recovery import RefitCoordinator, RunFailed
from fleetledger.controller.retry_policy import (
    Attempt,
    PromptSkipped,
    RetryPolicy,
    RolloutAbandoned,
    RolloutCounters,
    gather_cancelling_siblings,
    run_rollout,
)
from fleetledger.controller.shard_selector import ShardSelector
from fleetledger.events.errors import LedgerError
from fleetledger.events.log import EventLog
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.ray_members import CommunicatorActor, TrainerRank
from fleetledger.transports.weight_sync import ReconcileOutcome

__all__ = ["Chaos", "SimulationResult", "SimulationSpec", "parse_chaos", "run_simulation"]

ADAPTER = "simulate.rollouts"

_log = structlog.get_logger("fleetledger.simulate")


ChaosAction = Literal["kill", "freeze", "wedge", "blip"]
CHAOS_ACTIONS: tuple[ChaosAction, ...] = ("kill", "freeze", "wedge", "blip")


@dataclass(frozen=True, slots=True)
class Chaos:
    """One fault to inject: ``action`` on ``shard`` during ``step`` (1-based).

    ``kill`` SIGKILLs the shard's process, ``freeze`` SIGSTOPs it, ``wedge`` makes every
    later generation hang while probes still answer, ``blip`` fails its next generation
    once with a transport error.
    """

    action: ChaosAction
    shard: int
    step: int


_CHAOS = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*$")


def parse_chaos(action: ChaosAction, spec: str) -> Chaos:
    """Parse ``SHARD@STEP`` (e.g. ``2@5``: shard 2 during step 5)."""
    match = _CHAOS.match(spec)
    if match is None:
        raise ValueError(f"--{action} {spec!r}: expected SHARD@STEP, e.g. 2@5")
    return Chaos(action, int(match.group(1)), int(match.group(2)))


def simulation_config(
    *,
    probe_interval_s: float = 0.5,
    probe_timeout_s: float = 0.25,
    restart_dead_shards: bool = False,
    generation_timeout_s: float | None = 5.0,
    min_healthy_shards: int = 1,
    stall_timeout_s: float = 60.0,
    stall_action: Literal["warn", "abort"] = "warn",
) -> ControllerConfig:
    """The controller configuration of a simulated run: fleet health on, short clocks."""
    return ControllerConfig.model_validate(
        {
            "fleet_health": {
                "enabled": True,
                "probe_interval_s": probe_interval_s,
                "probe_timeout_s": probe_timeout_s,
                "restart_dead_shards": restart_dead_shards,
                "min_healthy_shards": min_healthy_shards,
            },
            "rollout_failure": {"backoff_base_s": 0.05, "max_backoff_s": 1.0},
            "timeouts": {"generation_timeout_s": generation_timeout_s},
            "watchdog": {
                "interval_s": 0.5,
                "stall_timeout_s": stall_timeout_s,
                "stall_action": stall_action,
            },
            "refit": {"refit_timeout_s": 2.0, "grace_s": 1.0},
        }
    )


@dataclass(frozen=True)
class SimulationSpec:
    shards: int = 4
    steps: int = 5
    groups_per_step: int = 4
    group_size: int = 4
    generation_s: float = 0.05
    train_s: float = 0.05
    chaos: tuple[Chaos, ...] = ()
    config: ControllerConfig = field(default_factory=simulation_config)
    run: str | None = None
    metrics_port: int | None = None
    weights_bytes: int = 4_000_000

    def __post_init__(self) -> None:
        for name in ("shards", "steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("generation_s", "train_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.weights_bytes < 1024:
            raise ValueError(f"weights must be at least 1 KB, got {self.weights_bytes} bytes")
        for c in self.chaos:
            if not 0 <= c.shard < self.shards:
                raise ValueError(
                    f"--{c.action} {c.shard}@{c.step}: shard {c.shard} does not exist "
                    f"(shards 0..{self.shards - 1})"
                )
            if not 1 <= c.step <= self.steps:
                raise ValueError(
                    f"--{c.action} {c.shard}@{c.step}: step {c.step} is outside 1..{self.steps}"
                )


@dataclass(frozen=True)
class SimulationResult:
    run: str
    outcome: str
    cause: str
    steps_done: int
    counters: dict[str, object]


class SimulatedTrainer(TrainerRank):
    """The trainer actor (rank 0 of the refit communicator): one step per batch of rows,
    which changes its parameters; the weight version is the step count."""

    def __init__(self, total_bytes: int, train_s: float) -> None:
        super().__init__(total_bytes)
        self._train_s = train_s
        self._version = 0

    async def step(self, rewards: Sequence[float]) -> int:
        if not rewards:
            raise ValueError("a train step needs at least one rollout row")
        await asyncio.sleep(self._train_s)
        self._version += 1
        await self.train_step(self._version)
        return self._version


class FleetSynchronizer(GlooBroadcastSynchronizer):
    """The broadcast transport over a fleet whose shard actors may be restarted.

    Before each build, a shard restarted since its worker joined is a new process: it
    allocates its receive buffers and replaces the old worker, so the rebuild takes it
    back into the communicator (the layout grows again). Done inside ``reconcile`` so
    it sees the same absent set the build uses, however the restarter races the refit.
    """

    def __init__(
        self,
        fleet: RayShardFleet,
        trainer: ray.actor.ActorHandle,
        weights_spec: dict[str, tuple[tuple[int, ...], str]],
        **bounds: float,
    ) -> None:
        super().__init__([trainer], {s: [fleet.handle(s)] for s in fleet.shards}, **bounds)
        self._fleet = fleet
        self._spec = weights_spec
        self._joined = {s: fleet.incarnation(s) for s in fleet.shards}

    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> ReconcileOutcome:
        absent = frozenset(absent)
        for shard, joined in self._joined.items():
            current = self._fleet.incarnation(shard)
            if shard not in absent and current != joined:
                handle = self._fleet.handle(shard)
                ray.get(handle.refit_allocate.remote(self._spec), timeout=60)
                self.replace_shard(shard, [handle])
                self._joined[shard] = current
                force = True  # same absent set, different process: the group is stale
        return super().reconcile(absent, force=force)


class SimulatedRefitShard(SimulatedShard, CommunicatorActor):
    """A simulated engine that is also a member of the refit communicator: killing its
    process takes its rank with it, as with a real engine's weight-sync worker."""

    async def refit_broadcast(self, version: int) -> dict[str, Any]:
        received = await super().refit_broadcast(version)
        await self.set_weight_version(version)  # it now serves from these weights
        return received


def _reward(generation: Generation) -> float:
    return (sum(map(ord, generation.text)) % 97) / 96.0


class _Simulation:
    def __init__(self, spec: SimulationSpec, echo: Callable[[str], None]) -> None:
        self.spec = spec
        self.echo = echo
        self.counters = RolloutCounters()
        self.policy = RetryPolicy.from_config(spec.config.rollout_failure)
        t = spec.config.timeouts
        self.deadlines = RolloutDeadlines(
            stream_s=t.rollout_timeout_s,
            generation_s=t.generation_timeout_s,
            environment_s=t.env_timeout_s,
        )
        self.window = OutcomeWindow()
        self.train_steps = 0
        self.committed_groups = 0
        self.halted = threading.Event()
        self.step_task: asyncio.Future[None] | None = None
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.frozen: list[int] = []
        # Set up by run() once the ledger and the cluster exist.
        self.ledger: Ledger
        self.fleet: RayShardFleet
        self.pids: dict[int, tuple[int, int]]  # shard -> (restart attempts, pid)
        self.trainer: ray.actor.ActorHandle
        self.selector: ShardSelector
        self.controller: FleetController
        self.sync: FleetSynchronizer
        self.coordinator: RefitCoordinator
        self.weights_spec: dict[str, tuple[tuple[int, ...], str]]

    # ── the rollout path ───────────────────────────────────────────────────

    async def generate(self, attempt: Attempt[int]) -> Generation:
        request = GenerationRequest(
            prompt_id=str(attempt.prompt_id), group_id=attempt.group_id, prompt="2+2="
        )
        incarnation = self.ledger.membership.restart_attempts[attempt.shard]
        try:
            async with self.deadlines.generation():
                result = await self.fleet.generate(attempt.shard, request)
        except Exception as exc:
            try:
                if self.ledger.membership.restart_attempts[attempt.shard] == incarnation:
                    self.report_failure(attempt.shard, exc)
                # else: the actor that failed was replaced meanwhile; reporting its
                # failure now would condemn the replacement.
            except LedgerError as problem:
                # The rollout's own failure must keep its classification (infra): a
                # ledger hiccup raised from here would be classified as data instead.
                _log.error(
                    "rollout failure not recorded", shard=attempt.shard, problem=str(problem)
                )
            raise
        self.window.success(attempt.shard)
        return result

    def report_failure(self, shard: int, exc: BaseException) -> None:
        """Record what this attempt learned before the retry re-selects a shard.

        Story: with an idle fleet the least-outstanding selector re-picks the same
        lowest-index shard; only once the failure is in the ledger can selection avoid it.
        """
        death = actor_death_of(exc)
        if death is not None:
            self.flush_window()
            self.ledger.actor_died(shard, death)
            return
        if classify_exception(exc).kind is FailureKind.INFRA:
            self.window.failure(shard, exc)
            self.flush_window()

    def flush_window(self) -> None:
        outcomes = self.window.take()
        if outcomes:
            self.ledger.report_outcomes(ADAPTER, outcomes)

    async def group(self, step: int, index: int) -> list[float]:
        prompts = [f"s{step}-g{index}-p{k}" for k in range(self.spec.group_size)]
        generations = await gather_cancelling_siblings(
            *(
                run_rollout(
                    self.generate,
                    select_shard=self.selector.acquire,
                    policy=self.policy,
                    counters=self.counters,
                    prompt_id=prompt,
                )
                for prompt in prompts
            )
        )
        self.committed_groups += 1
        return [_reward(g) for g in generations]

    # ── one step ───────────────────────────────────────────────────────────

    def pid_of(self, shard: int) -> int:
        """The shard's current process: looked up again after a restart replaced it."""
        attempts = self.ledger.membership.restart_attempts[shard]
        known_at, pid = self.pids[shard]
        if known_at != attempts:
            pid = self.fleet.call(shard, "pid", timeout_s=5.0)
            self.pids[shard] = (attempts, pid)
        return pid

    def inject(self, chaos: Chaos) -> None:
        try:
            self._inject(chaos)
        except Exception as exc:  # a callback's exception would vanish into asyncio's log
            self.echo(
                f"  chaos: {chaos.action} shard {chaos.shard} during step {chaos.step} not "
                f"done: {type(exc).__name__}: {exc}"
            )

    def _inject(self, chaos: Chaos) -> None:
        pid = self.pid_of(chaos.shard)
        if chaos.action == "kill":
            os.kill(pid, signal.SIGKILL)
        elif chaos.action == "freeze":
            os.kill(pid, signal.SIGSTOP)
            self.frozen.append(pid)
        else:
            fault, times = ("hang", None) if chaos.action == "wedge" else ("fail", 1)
            # Told without waiting: the event loop must not block on an actor call.
            self.fleet.handle(chaos.shard).set_fault.remote(fault, times)
        self.echo(
            f"  chaos: {chaos.action} shard {chaos.shard} (pid {pid}) during step {chaos.step}"
        )

    async def step(self, step: int) -> None:
        loop = asyncio.get_running_loop()
        for chaos in self.spec.chaos:
            if chaos.step == step:
                loop.call_later(self.spec.generation_s / 2, self.inject, chaos)
        rows: list[float] = []
        for result in await asyncio.gather(
            *(self.group(step, g) for g in range(self.spec.groups_per_step)),
            return_exceptions=True,
        ):
            if isinstance(result, PromptSkipped):
                continue
            if isinstance(result, BaseException):
                raise result
            rows += result
        self.flush_window()
        version: int = await self.trainer.step.remote(rows)
        self.train_steps += 1
        await asyncio.to_thread(self.refit, version)

    def refit(self, version: int) -> None:
        """Push the trainer's weights to every shard that is not absent (REFERENCE §4)."""
        self.coordinator.refit(version)

    # ── the whole run ──────────────────────────────────────────────────────

    def progress(self) -> TrainingProgress:
        return TrainingProgress(
            committed_groups=self.committed_groups,
            train_steps=self.train_steps,
            in_flight=self.selector.total_in_flight,
            work_remains=self.train_steps < self.spec.steps,
        )

    def halt(self, _cause: str) -> None:
        """The controller ended the run (stall abort, exhaustion): stop the step now.

        Called from the watchdog's thread; a step parked on hung generations would
        otherwise never look at the flag. Cancelling drains the step's rollouts.
        """
        self.halted.set()
        task, loop = self.step_task, self.event_loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    async def loop(self) -> tuple[str, str]:
        self.event_loop = asyncio.get_running_loop()
        for step in range(1, self.spec.steps + 1):
            if self.halted.is_set():
                break
            self.step_task = asyncio.ensure_future(self.step(step))
            try:
                await self.step_task
            except RolloutAbandoned as exc:
                return "failed", self.controller.end_run_failed(str(exc))
            except RunFailed as exc:  # the refit could not be recovered; the run is ended
                return "failed", str(exc)
            except asyncio.CancelledError:
                if not self.halted.is_set():
                    raise
                break
            finally:
                self.step_task = None
            m = self.ledger.membership
            snapshot = self.counters.snapshot()
            redispatched = sum(snapshot["redispatched"].values())  # type: ignore[union-attr]
            self.echo(
                f"step {step}/{self.spec.steps}  weights v{self.train_steps}  "
                f"serving {list(m.serving)}  absent {list(m.absent)}  epoch {m.epoch}  "
                f"groups {self.committed_groups}  re-dispatched {redispatched}"
            )
        self.ledger.catch_up()
        ended = self.ledger.view.ended
        if ended is not None:
            return ended.outcome, ended.cause
        self.ledger.end_run("completed", f"{self.train_steps} of {self.spec.steps} steps done")
        return "completed", f"{self.train_steps} of {self.spec.steps} steps done"

    def _end_if_open(self, outcome: Literal["failed", "aborted"], cause: str) -> None:
        with self.ledger.lock:
            self.ledger.catch_up()
            if self.ledger.view.ended is None:
                self.ledger.end_run(outcome, cause[:4096])

    def run(self, log: EventLog) -> SimulationResult:
        spec = self.spec
        run = spec.run or (
            f"sim-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        )
        prefix = f"fleetledger-{run}"
        fleet_config = spec.config.fleet_config(
            shard_count=spec.shards,
            train_world_size=1,
            base_urls=[f"ray://{prefix}-shard-{i}" for i in range(spec.shards)],
        )
        with local_ray():
            # The fleet comes up before the run is recorded: a cluster that cannot start
            # leaves no half-begun run behind.
            self.fleet = RayShardFleet.spawn(
                spec.shards,
                simulated_shard_factory(
                    prefix, generation_s=spec.generation_s, shard_class=SimulatedRefitShard
                ),
            )
            try:
                self.ledger = Ledger.start(log, run, fleet_config)
            except BaseException:
                self.fleet.shutdown()
                raise
            self.echo(
                f"run {run}: {spec.shards} shards, {spec.steps} steps → {log.database.display_url}"
            )
            # From here on the run is recorded: every way out ends it with a cause.
            server = None
            controller: FleetController | None = None
            trainer = None
            try:
                self.pids = {shard: (0, pid) for shard, pid in self.fleet.pids().items()}
                trainer = self.trainer = (
                    ray.remote(SimulatedTrainer)
                    .options(num_cpus=0)
                    .remote(spec.weights_bytes, spec.train_s)
                )
                self.weights_spec = ray.get(trainer.spec.remote(), timeout=120)
                ray.get(
                    [
                        self.fleet.handle(s).refit_allocate.remote(self.weights_spec)
                        for s in range(spec.shards)
                    ],
                    timeout=120,
                )
                refit = spec.config.refit
                refit_timeout_s = refit.refit_timeout_s or 30.0
                self.sync = FleetSynchronizer(
                    self.fleet,
                    trainer,
                    self.weights_spec,
                    refit_timeout_s=refit_timeout_s,
                    grace_s=refit.grace_s,
                    settle_s=refit_timeout_s + refit.grace_s,
                )
                self.selector = ShardSelector.for_ledger(self.ledger)
                controller = self.controller = FleetController(
                    self.ledger,
                    self.fleet,
                    spec.config,
                    progress=self.progress,
                    rollouts=self.counters.snapshot,
                    on_halt=self.halt,
                )
                if spec.metrics_port is not None:
                    server, _ = controller.metrics.serve(spec.metrics_port)
                    self.echo(f"metrics on http://127.0.0.1:{server.server_port}/metrics")
                self.coordinator = RefitCoordinator(
                    self.ledger,
                    self.sync,
                    self.fleet,
                    refit_timeout_s=refit_timeout_s,
                    grace_s=refit.grace_s,
                    probe_timeout_s=spec.config.fleet_health.probe_timeout_s,
                    recovering=controller.watchdog.recovering,
                )
                controller.start()
                outcome, cause = asyncio.run(self.loop())
            except KeyboardInterrupt:
                self._end_if_open("aborted", "interrupted (SIGINT) during the simulation")
                raise
            except Exception as exc:
                self._end_if_open("failed", f"simulation failed: {type(exc).__name__}: {exc}")
                raise
            finally:
                if controller is not None:
                    controller.stop()
                if server is not None:
                    server.shutdown()
                    server.server_close()
                for pid in self.frozen:
                    try:
                        os.kill(pid, signal.SIGCONT)
                    except ProcessLookupError:
                        pass
                self.fleet.shutdown()
                if trainer is not None:
                    ray.kill(trainer)
        return SimulationResult(run, outcome, cause, self.train_steps, self.counters.snapshot())


def run_simulation(
    log: EventLog, spec: SimulationSpec, echo: Callable[[str], None] = print
) -> SimulationResult:
    """Run the simulated training loop of ``spec``, recording everything in ``log``."""
    started = time.monotonic()
    result = _Simulation(spec, echo).run(log)
    echo(
        f"run {result.run} {result.outcome} after {time.monotonic() - started:.1f}s: {result.cause}"
    )
    return result
