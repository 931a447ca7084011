"""A chaos campaign: many short runs of a real fleet, faults at random moments, one oracle.

A fault test that passes at the moment it chose proves little; the moments where this
project's bugs lived (a kill as a refit starts: the recovery condemned both healthy
survivors) were found by a user, not by the tests. So each trial runs a real simulated
fleet (Ray actor processes, a gloo communicator, the live controller) for a few steps,
draws one scenario from its seed — which fault kinds, on which shards, in which phase of
which step, after how long — and injects it with real signals as the phase is seen to
begin: in the ledger (a refit started, a probe round recorded, a restart requested, a
refit that re-admits a replacement) or in the engine's own stage (receiving the bytes,
loading them; the simulated engine writes its stage and pid to files, so nothing but a
file read stands between the phase and the signal).

The oracle (:mod:`fleetledger.simulate.oracle`) then reads only the ledger and the
trial's fault log. A seed replays the same scenario (the moments within a phase are
drawn from it; the machine decides the rest).

The controller's own death is a trial of its own: the run is driven by a child process
connected to the campaign's Ray cluster, SIGKILLed in its phase; the run's membership is
read back from the ledger, and the fleet it owned must be gone with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from fleetledger.events.errors import LedgerError
from fleetledger.events.models import RecordedEvent
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.shard_states import ShardState
from fleetledger.queries.tail import Tail
from fleetledger.shards.naming import actor_prefix, shard_actor_name
from fleetledger.simulate.account import RoutedWait, Tally
from fleetledger.simulate.chaos_plan import DEFAULT_SETTINGS, Fault, TrialPlan, TrialSettings
from fleetledger.simulate.spec import SimulationResult, SimulationSpec
from fleetledger.store.errors import UnknownRun
from fleetledger.store.log import EventLog

__all__ = [
    "Injection",
    "TrialOutcome",
    "controller_main",
    "processes_left",
    "run_trial",
]

# ── injecting ──────────────────────────────────────────────────────────────


@dataclass
class Injection:
    """What the campaign did: the fault, when (µs since the epoch), to which process and
    incarnation; ``skipped``: why it was not injected (its phase never came). A pause
    also says how long the process was really held (``held_s``: SIGSTOP to SIGCONT, as
    measured around the two signals), which the oracle holds against the plan."""

    fault: Fault
    at_us: int = 0
    pid: int | None = None
    incarnation: int | None = None
    skipped: str = ""
    held_s: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "fault": asdict(self.fault),
            "at_us": self.at_us,
            "pid": self.pid,
            "incarnation": self.incarnation,
            "skipped": self.skipped,
            "held_s": self.held_s,
        }


class _Follower:
    """The trial's run as the campaign sees it: the ledger's tail folded into a view,
    and each engine's refit stage and processes — from the simulated engine's files, or
    asked of a vLLM engine's actor (``refit_stage``, ``pid``, ``engine_pid``)."""

    def __init__(self, db_url: str, run: str, stage_dir: str, engine: str = "sim") -> None:
        self.db_url = db_url
        self.log: EventLog | None = None  # opened by the first poll (a failed open is retried)
        self.run = run
        self.stage_dir = stage_dir
        self.engine = engine
        self.view: FleetView | None = None
        self._tail: Tail | None = None
        self.events: list[RecordedEvent] = []
        self.read_errors = 0
        self.last_read_error = ""

    def poll(self) -> list[RecordedEvent]:
        """New events since the last poll (none before the run exists). A read that
        fails is counted and said (``read_errors``), never taken for a run not started:
        a phase missed because the ledger could not be read is not "the run ended"."""
        new: list[RecordedEvent] = []
        try:
            if self.log is None:
                self.log = EventLog.open(self.db_url, mode="read")
            if self._tail is None:
                try:
                    new = list(self.log.read(self.run, 0, 1))
                except UnknownRun:
                    return []  # not started yet
                if not new:
                    return []
                self.view = fold(new)
                self._tail = Tail(self.log, self.run, self.view)
            for recorded in self._tail.new():
                self._tail.view.apply(recorded)
                new.append(recorded)
        except LedgerError as exc:  # what was folded counts, the rest comes next poll
            self.read_errors += 1
            self.last_read_error = str(exc)
        self.events += new
        return new

    def read(self, shard: int, what: str) -> str | None:
        if self.engine == "vllm" and what == "pid":
            pid = self._actor_pid(shard)
            return None if pid is None else str(pid)
        if self.engine == "vllm":
            method = {"stage": "refit_stage", "pid": "pid", "engine_pid": "engine_pid"}[what]
            answer = self._ask(shard, method)
            return None if answer is None else str(answer)
        try:
            with open(os.path.join(self.stage_dir, f"shard-{shard}.{what}")) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    def _actor_pid(self, shard: int) -> int | None:
        """The shard's current actor's process, read from Ray's actor table — never a call
        to the actor: a vLLM replacement answers no call while its engine starts (the
        engine's constructor holds its event loop for ~20 s), which is exactly when a
        ``kill_replacement`` fault is aimed at it. The table knows the process from the
        moment Ray placed the actor (``PENDING_CREATION`` included)."""
        import ray
        from ray._private.state import state  # Ray's GCS client: no public read of a pid

        try:
            handle = ray.get_actor(shard_actor_name(actor_prefix(self.run), shard))
            entry = state.actor_table(handle._actor_id.hex())
        except Exception:
            return None
        pid = entry.get("Pid") if isinstance(entry, dict) else None
        alive = isinstance(entry, dict) and entry.get("State") in ("PENDING_CREATION", "ALIVE")
        return int(pid) if alive and pid else None

    def _ask(self, shard: int, method: str) -> Any:
        """One call on the shard's current actor (found by its name), or None."""
        import ray

        try:
            handle = ray.get_actor(shard_actor_name(actor_prefix(self.run), shard))
            return ray.get(getattr(handle, method).remote(), timeout=2.0)
        except Exception:
            return None

    def pid(self, shard: int, what: str = "pid") -> int | None:
        text = self.read(shard, what)
        return int(text) if text else None

    def close(self) -> None:
        if self.log is not None:
            self.log.close()


POLL_S = 0.005


def _step_of(version: int) -> int:
    return version  # the refit of step N pushes weight version N


class _PidWatcher:
    """Every process the trial's fleet ever had, collected on a thread of its own: none
    may outlive the trial.

    Apart from the driver because asking a vLLM engine's actor for its pids is a Ray call
    that a stopped actor never answers (bounded at 2 s each). Story: the driver used to
    collect pids between its waits, the sleep of a pause included, so a pause planned at
    0.38 s held the engine 2.6-3.0 s — past the condemnation bound — and the campaign
    reported the condemnations it had caused as false deaths of the controller.
    """

    def __init__(self, follower: _Follower, settings: TrialSettings) -> None:
        self.follower = follower
        self.settings = settings
        self.seen: set[int] = set()
        self._lock = threading.Lock()

    def add(self, pid: int) -> None:
        with self._lock:
            self.seen.add(pid)

    def pids(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self.seen))

    def run(self, done: threading.Event) -> None:
        vllm = self.settings.engine == "vllm"
        every = 0.5 if vllm else POLL_S  # an actor call per shard is dear: twice a second
        whats = ("pid", "engine_pid") if vllm else ("pid",)
        while not done.is_set():
            self.collect(whats)
            done.wait(every)
        self.collect(whats)  # the last fleet's, as the trial ends

    def collect(self, whats: tuple[str, ...]) -> None:
        for shard in range(self.settings.shards):
            for what in whats:
                pid = self.follower.pid(shard, what)
                if pid is not None:
                    self.add(pid)


class _Driver:
    """Waits for each fault's phase, then injects it: one thread per trial.

    The driver itself never calls an actor while it holds a shard stopped: the length of
    a pause is the plan's, measured (``Injection.held_s``), not whatever a blocked call
    adds to it.
    """

    def __init__(
        self,
        plan: TrialPlan,
        follower: _Follower,
        settings: TrialSettings,
        done: threading.Event,
        controller_pid: Callable[[], int | None] = lambda: None,
    ) -> None:
        self.plan = plan
        self.follower = follower
        self.settings = settings
        self.done = done
        self.controller_pid = controller_pid
        self.injections = [Injection(f) for f in plan.faults]
        self.frozen: list[int] = []
        self.pid_watcher = _PidWatcher(follower, settings)
        self.error: BaseException | None = None
        self._replacement_pid: int | None = None

    def run(self) -> None:
        watcher = threading.Thread(
            target=self.pid_watcher.run, args=(self.done,), name="chaos-pids", daemon=True
        )
        watcher.start()
        try:
            previous: Fault | None = None
            for injection in self.injections:
                fault = injection.fault
                # A fault in the phase its predecessor hit follows it (two shards close
                # together): its delay counts from the first, not from the next phase.
                follows = previous is not None and (previous.phase, previous.step) == (
                    fault.phase,
                    fault.step,
                )
                previous = fault
                if not follows and not self._await_phase(injection):
                    continue
                self._sleep(fault.delay_s)
                self._inject(injection)
            while not self.done.is_set():  # the ledger followed to the end
                self._poll()
                self.done.wait(0.05)
        except BaseException as exc:  # reported as the trial's own error
            self.error = exc
        finally:
            self.thaw()
            watcher.join(10)

    @property
    def pids_seen(self) -> tuple[int, ...]:
        return self.pid_watcher.pids()

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._poll()
            time.sleep(min(left, POLL_S))

    def _poll(self) -> list[RecordedEvent]:
        """The ledger's new events: a read of the ledger, never a call to an actor."""
        return self.follower.poll()

    def _ended(self) -> bool:
        view = self.follower.view
        return self.done.is_set() or (view is not None and view.ended is not None)

    def _await_phase(self, injection: Injection) -> bool:
        fault = injection.fault
        seen = self._phase_seen(fault)
        while True:
            new = self._poll()
            if seen(new):
                return True
            if self._ended():
                injection.skipped = f"the run ended before {fault.phase} of step {fault.step}"
                if self.follower.read_errors:
                    injection.skipped += (
                        f" as the campaign read it ({self.follower.read_errors} reads of the "
                        f"ledger failed, the last: {self.follower.last_read_error})"
                    )
                return False
            time.sleep(POLL_S)

    def _phase_seen(self, fault: Fault) -> Callable[[list[RecordedEvent]], bool]:
        """A predicate over each poll's new events (and the stage files) that is true
        once ``fault``'s phase has begun."""
        f = self.follower
        step = fault.step
        if fault.phase == "rollouts":
            # Step N's rollouts start as step N-1's refit ends, or (N = 1) as the
            # controller starts: its first probe round is recorded as the loop begins.
            def rollouts(new: list[RecordedEvent]) -> bool:
                return any(
                    (r.event.type == "probe_round" and step == 1)
                    or (
                        r.event.type == "refit_completed"
                        and _step_of(r.event.weight_version) == step - 1
                    )
                    for r in new
                )

            return rollouts
        if fault.phase in ("refit_start", "mid_broadcast", "reload"):
            stage = {"mid_broadcast": "receiving", "reload": "loading"}.get(fault.phase)
            started = [False]

            def refit(new: list[RecordedEvent]) -> bool:
                if not started[0]:
                    started[0] = any(
                        r.event.type == "refit_started" and _step_of(r.event.weight_version) >= step
                        for r in new
                    )
                    if not started[0]:
                        return False
                if stage is None:
                    return True
                return f.read(fault.shard or 0, "stage") == stage

            return refit
        if fault.phase == "after_probe":
            begun = [False]

            def probe(new: list[RecordedEvent]) -> bool:
                for r in new:
                    if r.event.type == "refit_completed" and _step_of(r.event.weight_version) >= (
                        step - 1
                    ):
                        begun[0] = True
                    if step == 1 and r.event.type == "run_started":
                        begun[0] = True
                    if begun[0] and r.event.type == "probe_round":
                        return True
                return False

            return probe
        if fault.phase == "restart":
            if fault.kind == "kill_replacement":
                # The replacement writes its pid as it starts: it is loading from then on.
                first = self.injections[0]

                def replacement(_new: list[RecordedEvent]) -> bool:
                    pid = f.pid(fault.shard or 0)
                    if pid is None or first.pid is None or pid == first.pid:
                        return False
                    self._replacement_pid = pid
                    return True

                return replacement

            def restarting(new: list[RecordedEvent]) -> bool:
                return any(r.event.type == "restart_requested" for r in new)

            return restarting

        # readmit: a refit whose participants include a STALE (re-loaded) shard.
        def readmit(new: list[RecordedEvent]) -> bool:
            view = f.view
            for r in new:
                if r.event.type == "refit_started" and view is not None:
                    if any(
                        view.shards[s].state is ShardState.STALE
                        and view.shards[s].restart_attempts > 0
                        for s in r.event.shards
                    ):
                        return True
            return False

        return readmit

    def _inject(self, injection: Injection) -> None:
        fault = injection.fault
        if fault.kind == "kill_controller":
            pid = self.controller_pid()
        else:
            if fault.shard is None:
                raise ValueError(f"a {fault.kind} fault names no shard: {fault}")
            pid = self.follower.pid(
                fault.shard, "engine_pid" if fault.kind == "kill_engine" else "pid"
            )
            if pid is None and fault.kind == "kill_replacement":
                # The process its phase was seen by, should Ray's actor table have lost
                # it since (the actor died in between).
                pid = self._replacement_pid
            view = self.follower.view
            if view is not None:
                injection.incarnation = view.shards[fault.shard].restart_attempts
        if pid is None:
            injection.skipped = "no process to signal"
            return
        injection.pid = pid
        self.pid_watcher.add(pid)
        injection.at_us = time.time_ns() // 1000
        try:
            if fault.kind in ("kill", "kill_engine", "kill_replacement", "kill_controller"):
                os.kill(pid, signal.SIGKILL)
            elif fault.kind == "freeze":
                os.kill(pid, signal.SIGSTOP)
                self.frozen.append(pid)
            else:  # pause: thawed before it could be condemned
                os.kill(pid, signal.SIGSTOP)
                stopped = time.monotonic()
                self.frozen.append(pid)
                self._sleep(fault.pause_s)
                os.kill(pid, signal.SIGCONT)
                injection.held_s = time.monotonic() - stopped
                self.frozen.remove(pid)
        except ProcessLookupError:
            injection.skipped = f"process {pid} was already gone"

    def thaw(self) -> None:
        for pid in self.frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.frozen.clear()


# ── one trial ──────────────────────────────────────────────────────────────


@dataclass
class TrialOutcome:
    """What one trial did and saw; the oracle judges it."""

    plan: TrialPlan
    run: str
    outcome: str  # completed | failed | aborted | killed (the controller) | hung | error
    cause: str
    injections: list[Injection]
    committed_prompts: dict[str, int] = field(default_factory=dict)
    expected_prompts: tuple[str, ...] = ()
    pids_seen: tuple[int, ...] = ()
    elapsed_s: float = 0.0
    condemnation_s: float = 0.0  # the settings' bound a pause must stay under
    routed: bool = False  # the loop's rollouts went through the run's router
    # what the loop itself saw (none where the loop ran in a killed controller's process)
    tallies: tuple[Tally, ...] = ()
    waits: tuple[RoutedWait, ...] = ()


def _expected_prompts(settings: TrialSettings) -> tuple[str, ...]:
    return tuple(
        f"s{step}-g{g}-p{k}"
        for step in range(1, settings.steps + 1)
        for g in range(settings.groups_per_step)
        for k in range(settings.group_size)
    )


def run_trial(
    plan: TrialPlan,
    db_url: str,
    *,
    settings: TrialSettings = DEFAULT_SETTINGS,
    ray_address: str | None = None,
    run_prefix: str = "chaos",
) -> TrialOutcome:
    """Run one trial on the Ray cluster this process is connected to (``ray_address``:
    its address, for the controller's own process when the plan kills it)."""
    run = f"{run_prefix}-{plan.seed}-{time.time_ns() % 10**9}"
    stage_dir = tempfile.mkdtemp(prefix=f"fl-chaos-{plan.seed}-")
    follower = _Follower(db_url, run, stage_dir, settings.engine)
    done = threading.Event()
    started = time.monotonic()
    child: list[subprocess.Popen[bytes]] = []
    driver = _Driver(
        plan,
        follower,
        settings,
        done,
        controller_pid=lambda: child[0].pid if child else None,
    )
    thread = threading.Thread(target=driver.run, name=f"chaos-{plan.seed}", daemon=True)
    outcome = TrialOutcome(plan, run, "error", "", driver.injections)
    try:
        if plan.scenario == "kill_controller":
            if ray_address is None:
                raise ValueError("a controller-kill trial needs the Ray cluster's address")
            child.append(_spawn_controller(db_url, run, stage_dir, ray_address, settings.engine))
            thread.start()
            outcome.outcome, outcome.cause = _await_controller(child[0], settings)
        else:
            thread.start()
            result = _run_here(settings.spec(run, stage_dir), db_url, settings.trial_timeout_s)
            outcome.outcome, outcome.cause = result.outcome, result.cause
            outcome.committed_prompts = dict(result.committed_prompts)
            outcome.tallies, outcome.waits = result.tallies, result.waits
    finally:
        done.set()
        thread.join(30)
        driver.thaw()
        follower.close()
        # An engine of the trial may still be writing its stage as the fleet goes down.
        shutil.rmtree(stage_dir, ignore_errors=True)
    if driver.error is not None:
        outcome.outcome, outcome.cause = "error", f"the fault driver failed: {driver.error!r}"
    outcome.expected_prompts = _expected_prompts(settings)
    outcome.pids_seen = driver.pids_seen
    outcome.condemnation_s = settings.condemnation_s
    outcome.routed = settings.router
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _run_here(spec: SimulationSpec, db_url: str, timeout_s: float) -> SimulationResult:
    """The simulation on a thread of this process; ``hung`` if it is not back in time."""
    from fleetledger.simulate.loop import Simulation  # torch and the transports: per trial

    box: list[Any] = []

    def run() -> None:
        log = EventLog.open(db_url)
        try:
            box.append(Simulation(spec, lambda _line: None).run(log))
        except BaseException as exc:
            box.append(exc)
        finally:
            log.close()

    thread = threading.Thread(target=run, name=f"trial-{spec.run}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    run_id = spec.run or ""
    if thread.is_alive():
        return SimulationResult(run_id, "hung", f"not back within {timeout_s:g}s", 0, {})
    (result,) = box
    if isinstance(result, BaseException):
        return SimulationResult(run_id, "error", f"{type(result).__name__}: {result}", 0, {})
    return cast(SimulationResult, result)


def _spawn_controller(
    db_url: str, run: str, stage_dir: str, ray_address: str, engine: str
) -> subprocess.Popen[bytes]:
    import ray

    code = (
        "import sys; from fleetledger.simulate.campaign import controller_main; "
        "controller_main(sys.argv[1:])"
    )
    # The campaign's own Ray namespace: the fleet the controller starts is then found by
    # its actors' names from here (a vLLM engine's stage and pids are asked of them).
    namespace = ray.get_runtime_context().namespace
    return subprocess.Popen(
        [sys.executable, "-c", code, db_url, run, stage_dir, ray_address, engine, namespace],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _await_controller(child: subprocess.Popen[bytes], settings: TrialSettings) -> tuple[str, str]:
    try:
        status = child.wait(settings.trial_timeout_s)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return "hung", f"the controller was not back within {settings.trial_timeout_s:g}s"
    if status == -signal.SIGKILL:
        return "killed", "the controller's process was SIGKILLed"
    return ("completed" if status == 0 else "failed"), f"the controller exited with {status}"


def controller_main(argv: list[str]) -> None:
    """The controller's own process in a controller-kill trial: the simulation of the
    campaign's settings, driven from here on the campaign's Ray cluster."""
    import ray

    db_url, run, stage_dir, address, engine, *namespace = argv
    ray.init(
        address=address,
        namespace=namespace[0] if namespace else None,
        log_to_driver=False,
        configure_logging=False,
    )
    from fleetledger.simulate.loop import Simulation  # after ray.init: it starts actors

    log = EventLog.open(db_url)
    spec = TrialSettings.for_engine(engine).spec(run, stage_dir)
    result = Simulation(spec, lambda _line: None).run(log)
    log.close()
    raise SystemExit(0 if result.outcome == "completed" else 1)


def processes_left(pids: tuple[int, ...], wait_s: float = 15.0) -> list[int]:
    """The pids that are still running processes after up to ``wait_s`` (zombies count
    as gone: nothing of them runs)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = [pid for pid in pids if _running(pid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def dumps(outcome: TrialOutcome, verdict: Any = None) -> str:
    """One trial as a JSON line: its plan, what was injected, and (given the oracle's
    verdict) its problems and figures, so campaigns run in parts add up."""
    line: dict[str, Any] = {
        "seed": outcome.plan.seed,
        "scenario": outcome.plan.label,
        "run": outcome.run,
        "outcome": outcome.outcome,
        "elapsed_s": round(outcome.elapsed_s, 2),
        "routed": outcome.routed,
        "injections": [i.as_json() for i in outcome.injections],
    }
    if verdict is not None:
        line |= {
            "problems": verdict.problems,
            "false_deaths": verdict.false_deaths,
            "lost_prompts": verdict.lost_prompts,
            "hung": verdict.hung,
            "exhausted_by_faults": verdict.exhausted_by_faults,
            "detection_s": [[*key, value] for key, value in verdict.detection_s.items()],
            "recovery_s": [[*key, value] for key, value in verdict.recovery_s.items()],
            "costs_checked": verdict.costs_checked,
            "left_waits_s": verdict.left_waits_s,
        }
    return json.dumps(line)
