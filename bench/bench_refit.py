"""Hand-run benchmark of the gloo broadcast transport and refit recovery (CPU).

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_refit.py [--repeat 5]

1. rebuild time after the decision, for worlds of 4 and 8 (1 trainer + 3 / 7 shards):
   ``reconcile(absent, force=True)`` from call to return (membership told, store bound,
   every rank joined);
2. refit of a 40 MB state over 3 receivers: ``push`` from call to every checksum back;
3. recovery time from a SIGKILL in the middle of a push to the next successful refit
   (``RefitCoordinator.refit``: bounded push fails, probe, partial, forced rebuild,
   retry), with refit_timeout_s 2 s;
4. the same at the DEFAULT refit timeout (300 s), the case that matters: shard 1 — an
   interior rank of gloo's broadcast tree, whose death leaves every survivor parked
   without an error — SIGKILLed mid-push, with the probe pump running, from the kill to
   the next successful refit. "before": the ledger watch off (``watch_interval_s=None``),
   i.e. the old path, which waits for the survivors' op timeout; measured at shorter
   timeouts so the bench finishes, and the default's cost extrapolated (300 s plus the
   measured overhead past the timeout). "after": the watch on, at the default 300 s,
   with the pump at the default interval (5 s) and at 0.5 s.

5. a frozen participant at refit: shard 1 SIGSTOPped as every member is inside the push
   (refit timeout 30 s, probes every 0.5 s): the seconds from its DEAD record
   (detection, by the probe streak) to the recovered refit — "before": an abort that
   waits for every member, the frozen one too (up to 5 s); "after": an abort that does
   not wait for a member known gone. The target: within detection + 1 s.

``--case`` runs one part only (``kill-default`` is part 4, ``freeze`` part 5).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

from fleetledger.config import FleetHealthConfig, RefitConfig
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.controller.ray_fleet import RayShardFleet, local_ray
from fleetledger.controller.refit_recovery import DEFAULT_WATCH_INTERVAL_S, RefitCoordinator
from fleetledger.events.models import FleetConfig
from fleetledger.logs import configure_logging
from fleetledger.projections.fleet_view import fold_with_transitions
from fleetledger.store.log import EventLog
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.ray_members import GenerationWorker, TrainerRank
from fleetledger.weight_sync import AbortReport


def _line(name: str, value: str, note: str = "") -> None:
    print(f"{name:<60} {value:>22}  {note}")


class _WaitsForEveryone(GlooBroadcastSynchronizer):
    """The abort as it was: every member waited for, the frozen one included."""

    def abort(self, *, gone: Iterable[int] = ()) -> AbortReport:
        return super().abort()


class _World:
    def __init__(
        self,
        shards: int,
        total_bytes: int,
        refit_timeout_s: float | None = 5.0,
        sync_class: type[GlooBroadcastSynchronizer] = GlooBroadcastSynchronizer,
    ) -> None:
        self.trainer = ray.remote(TrainerRank).options(num_cpus=0).remote(total_bytes)
        self.workers = [
            ray.remote(GenerationWorker).options(num_cpus=0).remote() for _ in range(shards)
        ]
        spec = ray.get(self.trainer.spec.remote())
        ray.get([w.refit_allocate.remote(spec) for w in self.workers])
        self.pids = ray.get([w.pid.remote() for w in self.workers])
        self.sync = sync_class(
            [self.trainer],
            {s: [w] for s, w in enumerate(self.workers)},
            refit_timeout_s=refit_timeout_s,
            grace_s=1.0,  # the settle window follows: refit_timeout_s + 1 s
        )

    def in_flight(self, shards: list[int]) -> list[int]:
        actors = [self.trainer, *(self.workers[s] for s in shards)]
        return ray.get([a.refit_in_flight.remote() for a in actors])

    def close(self) -> None:
        for actor in [self.trainer, *self.workers]:
            ray.kill(actor, no_restart=True)


def bench_rebuild(repeat: int) -> None:
    for world in (4, 8):
        w = _World(world - 1, 1_000_000)
        w.sync.reconcile(())
        times = []
        for _ in range(repeat):
            t = time.perf_counter()
            w.sync.reconcile((), force=True)
            times.append(time.perf_counter() - t)
        _line(
            f"rebuild after the decision, world {world} (median / max)",
            f"{statistics.median(times) * 1000:.1f} / {max(times) * 1000:.1f} ms",
        )
        w.close()


def bench_push(repeat: int) -> None:
    w = _World(3, 40_000_000)
    w.sync.reconcile(())
    times = []
    for version in range(1, repeat + 1):
        ray.get(w.trainer.train_step.remote(version))
        t = time.perf_counter()
        report = w.sync.push(version)
        times.append(time.perf_counter() - t)
    _line(
        f"refit of {report.bytes / 1e6:.0f} MB over 3 receivers (median / max)",
        f"{statistics.median(times) * 1000:.0f} / {max(times) * 1000:.0f} ms",
        f"{report.bytes / statistics.median(times) / 1e6:.0f} MB/s per receiver",
    )
    w.close()


def bench_recovery(repeat: int, db_dir: Path) -> None:
    times = []
    for trial in range(repeat):
        w = _World(3, 40_000_000, refit_timeout_s=2.0)
        log = EventLog.open(f"sqlite:///{db_dir}/recovery-{trial}.db")
        ledger = Ledger.start(
            log,
            "r",
            FleetConfig(shard_count=3, train_world_size=1, base_urls=("a", "b", "c")),
        )
        coordinator = RefitCoordinator(
            ledger,
            w.sync,
            RayShardFleet(dict(enumerate(w.workers))),
            refit_timeout_s=2.0,
            grace_s=1.0,
            probe_timeout_s=0.5,
        )
        coordinator.refit(1)
        ray.get(w.trainer.train_step.remote(2))
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 2)
            time.sleep(0.01)
            t = time.perf_counter()
            os.kill(w.pids[1], signal.SIGKILL)
            outcome = refit.result(timeout=120)
            times.append(time.perf_counter() - t)
        assert outcome.recovered and outcome.participants == (0, 2), outcome
        log.close()
        w.close()
    _line(
        f"recovery: kill mid-push → next successful refit (median / max of {repeat})",
        f"{statistics.median(times) * 1000:.0f} / {max(times) * 1000:.0f} ms",
        "refit_timeout_s 2 s, 40 MB",
    )


def _kill_to_next_refit(
    db: Path, refit_timeout_s: float, watch: bool, probe_interval_s: float
) -> float:
    """One trial of part 4: seconds from the SIGKILL to the next successful refit."""
    victim = 1  # rank 2 of 4: its death leaves every survivor parked without an error
    w = _World(3, 40_000_000, refit_timeout_s=refit_timeout_s)
    log = EventLog.open(f"sqlite:///{db}")
    stop = threading.Event()
    try:
        ledger, fleet = _ledger_and_fleet(log, w)
        coordinator = RefitCoordinator(
            ledger,
            w.sync,
            fleet,
            refit_timeout_s=refit_timeout_s,
            grace_s=RefitConfig().grace_s,
            probe_timeout_s=0.5,
            watch_interval_s=DEFAULT_WATCH_INTERVAL_S if watch else None,
        )
        coordinator.refit(1)
        health = FleetHealthConfig(
            enabled=True, probe_interval_s=probe_interval_s, probe_timeout_s=0.4
        )
        ProbePump(ledger, fleet, health).start(stop)
        ray.get(w.trainer.train_step.remote(2))
        os.kill(w.pids[victim], signal.SIGSTOP)  # the push cannot complete before the kill
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 2)
            while set(w.in_flight([0, 2])) != {1}:  # every survivor inside the collective
                time.sleep(0.01)
            t = time.perf_counter()
            os.kill(w.pids[victim], signal.SIGKILL)
            outcome = refit.result(timeout=refit_timeout_s + 300)
            elapsed = time.perf_counter() - t
        assert outcome.recovered and outcome.participants == (0, 2), outcome
        return elapsed
    finally:
        stop.set()
        log.close()
        w.close()


def bench_kill_at_the_default_timeout(repeat: int, db_dir: Path, old_timeouts: list[float]) -> None:
    default = RefitConfig().refit_timeout_s
    assert default is not None
    trial = iter(range(10_000))

    def db() -> Path:
        return db_dir / f"kill-default-{next(trial)}.db"

    overheads = []
    for timeout in old_timeouts:
        cost = _kill_to_next_refit(db(), timeout, watch=False, probe_interval_s=5.0)
        overheads.append(cost - timeout)
        _line(
            f"before (watch off), refit_timeout_s {timeout:g} s: measured",
            f"{cost:.1f} s",
            f"= timeout + {cost - timeout:.1f} s",
        )
    before = default + statistics.mean(overheads)
    _line(
        f"before (watch off), refit_timeout_s {default:g} s (default): extrapolated",
        f"≈ {before:.1f} s",
        f"= {default:g} s + the mean overhead past the timeout above",
    )
    for interval in (5.0, 0.5):
        times = [
            _kill_to_next_refit(db(), default, watch=True, probe_interval_s=interval)
            for _ in range(repeat)
        ]
        _line(
            f"after (watch on), refit_timeout_s {default:g} s, probe every {interval:g} s "
            f"(median / max of {repeat})",
            f"{statistics.median(times):.2f} / {max(times):.2f} s",
            f"{before / statistics.median(times):.0f}× faster; the kill lands just after a "
            "probe round (the interval's worst case)",
        )


def _ledger_and_fleet(log: EventLog, w: _World) -> tuple[Ledger, RayShardFleet]:
    """A three-shard run's ledger, and its workers as the fleet the probes reach."""
    ledger = Ledger.start(
        log, "r", FleetConfig(shard_count=3, train_world_size=1, base_urls=("a", "b", "c"))
    )
    return ledger, RayShardFleet(dict(enumerate(w.workers)))


def _freeze_at_refit(db: Path, sync_class: type[GlooBroadcastSynchronizer]) -> tuple[float, float]:
    """One trial of part 5: (detection, total) seconds from a SIGSTOP of shard 1 as every
    member is inside the push to (its DEAD recorded, the recovered refit back)."""
    victim = 1
    w = _World(3, 4_000_000, refit_timeout_s=30.0, sync_class=sync_class)
    log = EventLog.open(f"sqlite:///{db}")
    stop = threading.Event()
    try:
        ledger, fleet = _ledger_and_fleet(log, w)
        coordinator = RefitCoordinator(
            ledger, w.sync, fleet, refit_timeout_s=30.0, grace_s=1.0, probe_timeout_s=0.25
        )
        coordinator.refit(1)
        health = FleetHealthConfig(enabled=True, probe_interval_s=0.5, probe_timeout_s=0.25)
        ProbePump(ledger, fleet, health).start(stop)
        ray.get(w.trainer.train_step.remote(2))
        os.kill(w.pids[victim], signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            refit = pool.submit(coordinator.refit, 2)
            while set(w.in_flight([0, 2])) != {1}:  # every survivor inside the collective
                time.sleep(0.01)
            frozen_at = time.time()
            outcome = refit.result(timeout=120)
            total = time.time() - frozen_at
        deaths = [
            t.at_us
            for t in fold_with_transitions(log.read("r", 0))[1]
            if t.shard == victim and t.after.value == "DEAD"
        ]
        assert outcome.recovered and outcome.participants == (0, 2), outcome
        return deaths[0] / 1e6 - frozen_at, total
    finally:
        stop.set()
        os.kill(w.pids[victim], signal.SIGCONT)
        log.close()
        w.close()


def bench_freeze_at_refit(repeat: int, db_dir: Path) -> None:
    for label, sync_class in (
        ("before (the abort waits for the frozen member too)", _WaitsForEveryone),
        ("after (the abort does not wait for a member known gone)", GlooBroadcastSynchronizer),
    ):
        trials = [
            _freeze_at_refit(db_dir / f"freeze-{sync_class.__name__}-{i}.db", sync_class)
            for i in range(repeat)
        ]
        over = [total - detection for detection, total in trials]
        _line(
            f"frozen participant at refit, {label}",
            f"+{statistics.median(over):.2f} / {max(over):.2f} s",
            f"past detection (median / max of {repeat}); detection median "
            f"{statistics.median(d for d, _ in trials):.2f} s",
        )


CASES = ("rebuild", "push", "recovery", "kill-default", "freeze")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--case", choices=("all", *CASES), default="all")
    parser.add_argument(
        "--old-timeouts",
        type=float,
        nargs="+",
        default=[10.0, 20.0],
        help="refit timeouts (s) at which part 4 measures the old path",
    )
    args = parser.parse_args()
    configure_logging("error")
    run = set(CASES) if args.case == "all" else {args.case}
    with local_ray(), tempfile.TemporaryDirectory(prefix="fl-bench-") as tmp:
        if "rebuild" in run:
            bench_rebuild(args.repeat)
        if "push" in run:
            bench_push(args.repeat)
        if "recovery" in run:
            bench_recovery(args.repeat, Path(tmp))
        if "kill-default" in run:
            bench_kill_at_the_default_timeout(args.repeat, Path(tmp), args.old_timeouts)
        if "freeze" in run:
            bench_freeze_at_refit(args.repeat, Path(tmp))


if __name__ == "__main__":
    main()
