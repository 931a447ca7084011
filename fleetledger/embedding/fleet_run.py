"""The run's lifetime as one construct: started whole, ended with its cause, however it ends.

Story: the documented order — start the controller, build the synchronizer, then
``try:`` — left the run open forever when anything in between raised, and the probe pump
then logged "the ledger was closed; open it again" every interval (the fix was to stop
the controller). :class:`FleetRun` is a context manager (``with`` and ``async with``)
that opens the ledger, starts the run, the fleet's controller and the refit machinery,
and on leaving ends the run with the cause — completed, the exception's one line, an
interrupt — and stops the controller, so there is no "between" a failure can fall into.

Rules of this file:

- Entering is all or nothing: a failure while starting ends the run it began (``failed``,
  the failure's one line) and stops what had started, then raises.
- Leaving never hides an exception: the run's end is recorded and the exception goes on.
  ``RunFailed`` (the coordinator ended the run) and a halt by the controller (a stall
  with ``stall_action = "abort"``, an exhausted fleet) already recorded theirs.
- The cause recorded for an exception is the one line its cause reads as
  (``events/causes.py``): Ray's remote traceback and colour codes never reach the log.
- Nothing blocks an event loop: ``async with`` runs the starting and the ending in a
  worker thread, and :meth:`refit_async` the refit.
- The fleet is the caller's: spawn it before (a cluster that cannot start leaves no
  half-begun run) and shut it down after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ray.actor import ActorHandle

from fleetledger.adapters.retry_policy import RolloutAbandoned, RolloutCounters
from fleetledger.adapters.shard_selector import ShardSelector
from fleetledger.config import ControllerConfig
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import GenerationReports, RayShardFleet
from fleetledger.controller.refit_recovery import RefitCoordinator, RefitOutcome, RunFailed
from fleetledger.events.causes import exception_line
from fleetledger.store.log import EventLog
from fleetledger.transports.restartable import RestartAwareSynchronizer

__all__ = ["FleetRun", "RunPieces", "refit_machinery"]


@dataclass(frozen=True)
class RunPieces:
    """What the block of a :class:`FleetRun` works with, all started."""

    ledger: Ledger
    controller: FleetController
    synchronizer: RestartAwareSynchronizer
    coordinator: RefitCoordinator
    reports: GenerationReports
    selector: ShardSelector


def refit_machinery(
    ledger: Ledger,
    fleet: RayShardFleet,
    trainers: Sequence[ActorHandle],
    config: ControllerConfig,
    controller: FleetController,
    **synchronizer_options: Any,
) -> tuple[RestartAwareSynchronizer, RefitCoordinator]:
    """The refit path of a run, one way for every caller (``FleetRun``, ``simulate``):
    the restart-aware gloo broadcast from ``trainers`` and the coordinator over it, both
    bounded by ``config.refit``; while fleet health is on, a waiting refit probes its
    STALE participants on the probe cadence; the watchdog stands down while it recovers.
    """
    refit = config.refit
    synchronizer = RestartAwareSynchronizer(
        fleet,
        trainers,
        refit_timeout_s=refit.refit_timeout_s,
        grace_s=refit.grace_s,
        **synchronizer_options,
    )
    health = config.fleet_health
    coordinator = RefitCoordinator(
        ledger,
        synchronizer,
        fleet,
        refit_timeout_s=refit.refit_timeout_s,
        grace_s=refit.grace_s,
        probe_timeout_s=health.probe_timeout_s,
        stale_probe_interval_s=health.probe_interval_s if health.enabled else None,
        recovering=controller.watchdog.recovering,
    )
    return synchronizer, coordinator


class FleetRun:
    """One run of ``fleet``, recorded in the ledger at ``db`` as ``run``.

    ``trainers``: the trainer rank actors (``TrainerRank`` subclasses; rank 0 first), the
    refit's broadcast roots. ``max_steps``: the train steps the loop means to do — with
    :meth:`step_done` after each, the watchdog knows whether work remains and the run
    completes as "N of N steps done"; ``progress`` replaces that with your own callable.
    ``workers_per_shard``: ranks per shard (tp × pp; give ``synchronizer_options=
    {"workers": …}`` with it). ``on_halt``: called once, from a controller thread, when
    the controller ends the run (stop your loop). ``synchronizer_options``: more keywords
    for :class:`RestartAwareSynchronizer` (``weights_spec``, ``workers``,
    ``allocate_timeout_s``, ``settle_s``).
    """

    def __init__(
        self,
        db: str,
        run: str,
        config: ControllerConfig,
        fleet: RayShardFleet,
        trainers: Sequence[ActorHandle],
        *,
        max_steps: int | None = None,
        progress: Callable[[], TrainingProgress] | None = None,
        workers_per_shard: int = 1,
        on_halt: Callable[[str], None] | None = None,
        restart_ready_timeout_s: float = 60.0,
        adapter: str = "rollouts",
        synchronizer_options: Mapping[str, Any] | None = None,
    ) -> None:
        if (max_steps is None) == (progress is None):
            raise ValueError("FleetRun: give max_steps= (and call step_done()) or progress=")
        if not trainers:
            raise ValueError("FleetRun: give at least one trainer rank actor (rank 0 first)")
        self.db, self.run, self.config, self.fleet = db, run, config, fleet
        self.trainers = list(trainers)
        self.max_steps = max_steps
        self.steps_done = 0
        self.counters = RolloutCounters()
        self._progress = progress
        self._workers_per_shard = workers_per_shard
        self._on_halt = on_halt
        self._restart_ready_timeout_s = restart_ready_timeout_s
        self._adapter = adapter
        self._sync_options = dict(synchronizer_options or {})
        self._stack = ExitStack()
        self._pieces: RunPieces | None = None

    # ── what the block uses ─────────────────────────────────────────────────

    @property
    def pieces(self) -> RunPieces:
        if self._pieces is None:
            raise RuntimeError(f"run {self.run!r} is not started: use `with FleetRun(...)`")
        return self._pieces

    @property
    def ledger(self) -> Ledger:
        return self.pieces.ledger

    @property
    def controller(self) -> FleetController:
        return self.pieces.controller

    @property
    def reports(self) -> GenerationReports:
        return self.pieces.reports

    @property
    def selector(self) -> ShardSelector:
        return self.pieces.selector

    def step_done(self) -> None:
        """One more train step done (what the watchdog and the completed cause count)."""
        self.steps_done += 1

    def refit(self, version: int) -> RefitOutcome:
        """Push the trainers' weights at ``version`` to every present shard (blocking).
        ``RunFailed``: the run was ended with its cause (leaving the block keeps it)."""
        return self.pieces.coordinator.refit(version)

    async def refit_async(self, version: int) -> RefitOutcome:
        """:meth:`refit` without blocking the event loop."""
        return await asyncio.to_thread(self.refit, version)

    # ── the lifetime ────────────────────────────────────────────────────────

    def _loop_progress(self) -> TrainingProgress:
        if self._progress is not None:
            return self._progress()
        in_flight = 0 if self._pieces is None else self._pieces.selector.total_in_flight
        return TrainingProgress(
            self.counters.committed,
            self.steps_done,
            in_flight,
            self.steps_done < (self.max_steps or 0),
        )

    def _start(self) -> RunPieces:
        stack = self._stack
        try:
            log = stack.enter_context(EventLog.open(self.db))
            fleet_config = self.config.fleet_config(
                shard_count=len(self.fleet.shards),
                train_world_size=len(self.trainers),
                workers_per_shard=self._workers_per_shard,
                base_urls=self.fleet.base_urls(),
            )
            ledger = Ledger.start(log, self.run, fleet_config)  # the run is open from here
        except BaseException:
            stack.close()
            raise
        try:
            return self._start_machinery(ledger)
        except BaseException as exc:
            ledger.end_run_if_open("failed", f"the run could not start: {exception_line(exc)}")
            stack.close()
            raise

    def _start_machinery(self, ledger: Ledger) -> RunPieces:
        config, stack = self.config, self._stack
        controller = FleetController(
            ledger,
            self.fleet,
            config,
            progress=self._loop_progress,
            rollouts=self.counters.snapshot,
            on_halt=self._on_halt,
            restart_ready_timeout_s=self._restart_ready_timeout_s,
        ).start()
        stack.callback(controller.stop)  # before the log closes (stack order)
        synchronizer, coordinator = refit_machinery(
            ledger, self.fleet, self.trainers, config, controller, **self._sync_options
        )
        reports = GenerationReports(ledger, adapter=self._adapter)
        return RunPieces(
            ledger,
            controller,
            synchronizer,
            coordinator,
            reports,
            ShardSelector.for_ledger(ledger),
        )

    def _end(self, exc: BaseException | None) -> None:
        try:
            if self._pieces is not None:
                self._record_end(self._pieces, exc)
        finally:
            self._pieces = None
            self._stack.close()

    def _record_end(self, pieces: RunPieces, exc: BaseException | None) -> None:
        pieces.reports.flush()
        if exc is None:
            done = (
                f"{self.steps_done} of {self.max_steps} steps done"
                if self.max_steps is not None
                else "the training loop finished"
            )
            pieces.ledger.end_run_if_open("completed", done)
        elif isinstance(exc, RunFailed):
            pass  # the coordinator recorded the run's end before it raised
        elif isinstance(exc, RolloutAbandoned):
            pieces.controller.end_run_failed(str(exc))  # the exhausted fleet, when truer
        elif isinstance(exc, KeyboardInterrupt | asyncio.CancelledError | SystemExit):
            pieces.ledger.end_run_if_open("aborted", f"interrupted: {exception_line(exc)}")
        else:
            pieces.ledger.end_run_if_open("failed", exception_line(exc))

    def __enter__(self) -> FleetRun:
        self._pieces = self._start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(exc)

    async def __aenter__(self) -> FleetRun:
        self._pieces = await asyncio.to_thread(self._start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self._end, exc)
