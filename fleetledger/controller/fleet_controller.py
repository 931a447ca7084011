"""The live controller of one run: probe pump, stall watchdog, restarts, metrics.

Everything it decides goes through the :class:`Ledger` before it acts, because a
decision that is not in the log cannot be explained by a replay: a restart is
``restart_requested`` before the actor is replaced, a replacement is
``replacement_loaded`` (STALE — it holds start-up weights) only once it answers, an
abandoned run is ``run_ended`` with its cause. Its threads are daemons and every loop
survives a ledger error (logged), because a pump that dies silently leaves exactly the
wedged, unexplained run this project exists to remove.

A controller that dies is started again on the same database with
:meth:`Ledger.resume` and the same fleet: the states and epoch come from the log, and
probing carries on from there.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import structlog

from fleetledger.config import ControllerConfig
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.metrics import FleetMetrics, ProgressSample
from fleetledger.controller.probe_pump import ProbePump, Prober, ProbeRoundReport
from fleetledger.controller.stall_watchdog import StallWatchdog, TickDecision
from fleetledger.events.errors import LedgerError
from fleetledger.events.models import RunProgress, clip_text
from fleetledger.projections.decisions import RestartVerdict, decide_exhaustion, decide_restart
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.errors import RunAlreadyEnded

__all__ = ["FleetController", "RestartableFleet", "TrainingProgress"]

_log = structlog.get_logger("fleetledger.controller")

_RESTARTABLE = (ShardState.DEAD.value, ShardState.RESTARTING.value)


@dataclass(frozen=True, slots=True)
class TrainingProgress:
    """What the training loop reports to the watchdog on each tick."""

    committed_groups: int
    train_steps: int
    in_flight: int
    work_remains: bool


class RestartableFleet(Prober, Protocol):
    def restart(self, shard: int, *, ready_timeout_s: float) -> str | None:
        """Replace the shard's actor and wait until it answers; return the replacement's
        base URL (``None``: it kept the one recorded). Counts the shard's incarnation
        on by one (``RayShardFleet.incarnation``), as ``restart_requested`` counts the
        ledger's restart attempts."""
        ...


class FleetController:
    """Runs the probe pump, the watchdog and the restarter of one run on daemon threads."""

    def __init__(
        self,
        ledger: Ledger,
        fleet: RestartableFleet,
        config: ControllerConfig,
        *,
        progress: Callable[[], TrainingProgress],
        rollouts: Callable[[], Mapping[str, object]] | None = None,
        on_halt: Callable[[str], None] | None = None,
        restart_ready_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ledger = ledger
        self.fleet = fleet
        self.config = config
        self._progress = progress
        ledger.progress_source = self._run_progress  # recorded in run_ended, however it ends
        self._on_halt = on_halt
        self._restart_ready_timeout_s = restart_ready_timeout_s
        self.pump = ProbePump(ledger, fleet, config.fleet_health, after_round=self._after_round)
        self.watchdog = StallWatchdog(ledger, config.watchdog, now=clock)
        self.metrics = FleetMetrics(
            ledger.run, lambda: ledger.membership, rollouts=rollouts, progress=self.progress_sample
        )
        self.halted: str | None = None
        self._last_sample = ProgressSample()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._restarts: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._restarting: set[int] = set()
        self._restart_lock = threading.Lock()

    # ── lifecycle ───────────────────────────────────────────────────────────

    def start(self) -> FleetController:
        health, watchdog = self.config.fleet_health, self.config.watchdog
        if health.enabled:
            self._threads.append(self.pump.start(self._stop))
        if watchdog.enabled:
            self._threads.append(self._spawn(self._watchdog_loop, "watchdog"))
        if health.enabled and health.restart_dead_shards:
            self._threads.append(self._spawn(self._restart_loop, "restarter"))
            self.queue_restarts()  # a resumed controller picks up shards that died meanwhile
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop every loop; a restart in progress is let finish (bounded by its timeout),
        so nobody touches the fleet after this returns."""
        self._stop.set()
        self._restarts.put(None)
        for thread in self._threads:
            thread.join(timeout_s + self._restart_ready_timeout_s)
        self._threads.clear()

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        thread = threading.Thread(target=target, name=f"{name}-{self.ledger.run}", daemon=True)
        thread.start()
        return thread

    # ── ending the run ──────────────────────────────────────────────────────

    def end_run_failed(self, cause: str) -> str:
        """End the run as failed; an exhausted fleet is the cause when it is one.

        A rollout that runs out of shards fails with "no healthy shards"; the truer
        cause — the fleet fell below its floor — is recorded instead when it holds.
        Returns the cause recorded (or the one already recorded if the run had ended).
        """
        with self.ledger.lock:
            self.ledger.catch_up()
            view = self.ledger.view
            if view.ended is not None:
                return view.ended.cause
            exhaustion = decide_exhaustion(view)
            if exhaustion.exhausted and not self.watchdog.is_recovering:
                cause = exhaustion.reason
                self.ledger.declare_exhausted()
            cause = self.ledger.end_run_if_open("failed", cause)
        self._halt(cause)
        return cause

    def _halt(self, cause: str) -> None:
        if self.halted is None:
            self.halted = cause
            _log.error("run halted", run=self.ledger.run, cause=cause)
            if self._on_halt is not None:
                self._on_halt(cause)

    # ── watchdog ────────────────────────────────────────────────────────────

    def _run_progress(self) -> RunProgress:
        p = self._progress()
        return RunProgress(
            committed_groups=p.committed_groups, train_steps=p.train_steps, in_flight=p.in_flight
        )

    def progress_sample(self) -> ProgressSample:
        return self._last_sample

    def tick_watchdog(self) -> TickDecision:
        """One watchdog tick with the training loop's current progress.

        Under the ledger's lock: the tick reads the view and may append twice
        (``fleet_exhausted`` then ``run_ended``), and nothing may end the run in between.
        """
        p = self._progress()
        with self.ledger.lock:
            decision = self.watchdog.tick(
                committed_groups=p.committed_groups,
                train_steps=p.train_steps,
                in_flight=p.in_flight,
                work_remains=p.work_remains,
            )
        if decision.action == "ended":
            return decision  # the last sample stays what it was when the run ended
        self._last_sample = ProgressSample(
            p.committed_groups, p.train_steps, p.in_flight, decision.idle_s
        )
        if decision.action == "exhausted":
            self._halt(decision.cause)
        elif decision.action == "abort" and self.halted is None:
            # Every tick of the episode, not only the one that recorded it: an end that
            # failed to append once is tried again on the next tick.
            with self.ledger.lock:
                if self.ledger.view.ended is None:
                    self.ledger.end_run("aborted", decision.cause)
            self._halt(decision.cause)
        elif decision.action == "warn" and decision.stall_recorded:
            _log.warning("stall", run=self.ledger.run, cause=decision.cause)
        return decision

    def _watchdog_loop(self) -> None:
        interval = self.config.watchdog.interval_s
        while not self._stop.wait(interval):
            try:
                if self.tick_watchdog().action == "ended":
                    return
            except RunAlreadyEnded as ended:
                self.ledger.late_reports.count("watchdog tick", ended)
                return
            except LedgerError as exc:
                _log.error("watchdog tick not recorded", run=self.ledger.run, problem=str(exc))
            except Exception:  # the watchdog must outlive whatever it is watching
                _log.exception("watchdog tick failed", run=self.ledger.run)

    # ── restarts ────────────────────────────────────────────────────────────

    def _after_round(self, _round: ProbeRoundReport) -> None:
        # Every round, not only rounds that condemned someone: a death recorded by a
        # rollout or by another process is folded in at the round's start.
        if self.config.fleet_health.restart_dead_shards:
            self.queue_restarts()

    def queue_restarts(self) -> list[int]:
        """Queue every DEAD shard not already being restarted; returns the ones queued.

        A RESTARTING shard that no restart of this controller is driving is queued too:
        its restart was interrupted (a controller killed mid-restart, an append that
        failed after the actor came up) and would otherwise stay absent forever.
        """
        queued = []
        with self._restart_lock:
            for shard, state in enumerate(self.ledger.membership.states):
                if state in _RESTARTABLE and shard not in self._restarting:
                    self._restarting.add(shard)
                    self._restarts.put(shard)
                    queued.append(shard)
        return queued

    def _restart_loop(self) -> None:
        while True:
            shard = self._restarts.get()
            if shard is None or self._stop.is_set():
                return
            try:
                self.restart(shard)
            except RunAlreadyEnded as ended:
                self.ledger.late_reports.count("restart", ended)
            except LedgerError as exc:
                _log.error(
                    "restart not recorded", run=self.ledger.run, shard=shard, problem=str(exc)
                )
            except Exception:
                _log.exception("restart failed", run=self.ledger.run, shard=shard)
            finally:
                with self._restart_lock:
                    self._restarting.discard(shard)
            if self.ledger.membership.states[shard] in _RESTARTABLE:
                self._stop.wait(self.config.fleet_health.probe_interval_s)  # one try per interval
                self.queue_restarts()

    def restart(self, shard: int) -> str:
        """Restart one DEAD shard, recording each step; returns the state it ends in.

        The restart decision says what to do, and it is recorded as it says:
        ``restart_requested`` first (past the budget the fold retires the shard, as the
        decision said, and no actor is touched) — from then on, whatever is seen through
        the old actor's handle is stale (its incarnation is older than the restart
        count) and the ledger drops it; then the replacement; ``replacement_loaded``,
        with the base URL the replacement reports, puts it in STALE — it serves again
        only once a refit that includes it completes. An interrupted restart is recorded
        as failed, then decided again.
        """
        with self.ledger.lock:
            self.ledger.catch_up()
            decision = decide_restart(self.ledger.view, shard)
            if decision.verdict is RestartVerdict.REDRIVE:
                self.ledger.restart_failed(shard, decision.reason)
                decision = decide_restart(self.ledger.view, shard)
            if decision.verdict not in (RestartVerdict.RESTART, RestartVerdict.RETIRE):
                return self.ledger.view.state_of(shard).value  # nothing (left) to do
            self.ledger.restart_requested(shard)
            # What the fold made of it decides, not the verdict: another writer may have
            # moved the shard meanwhile, and the log is the truth.
            state = self.ledger.view.state_of(shard)
            if state is ShardState.RETIRED:
                _log.warning(
                    "shard retired", run=self.ledger.run, shard=shard, reason=decision.reason
                )
            if state is not ShardState.RESTARTING:
                return state.value
        try:
            base_url = self.fleet.restart(shard, ready_timeout_s=self._restart_ready_timeout_s)
        except Exception as exc:  # any failure to bring it up is recorded, then retried
            self.ledger.restart_failed(shard, clip_text(f"{type(exc).__name__}: {exc}"))
            return self.ledger.membership.states[shard]
        self.ledger.replacement_loaded(shard, base_url or None)
        return self.ledger.membership.states[shard]
