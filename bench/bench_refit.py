"""Hand-run benchmark of the gloo broadcast transport and refit recovery (CPU).

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_refit.py [--repeat 5]

1. rebuild time after the decision, for worlds of 4 and 8 (1 trainer + 3 / 7 shards):
   ``reconcile(absent, force=True)`` from call to return (membership told, store bound,
   every rank joined);
2. refit of a 40 MB state over 3 receivers: ``push`` from call to every checksum back;
3. recovery time from a SIGKILL in the middle of a push to the next successful refit
   (``RefitCoordinator.refit``: bounded push fails, probe, partial, forced rebuild,
   retry), with refit_timeout_s 2 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ray

from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import RayShardFleet, local_ray
from fleetledger.controller.refit_recovery import RefitCoordinator
from fleetledger.events.log import EventLog
from fleetledger.events.models import FleetConfig
from fleetledger.logs import configure_logging
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.ray_members import GenerationWorker, TrainerRank


def _line(name: str, value: str, note: str = "") -> None:
    print(f"{name:<60} {value:>22}  {note}")


class _World:
    def __init__(self, shards: int, total_bytes: int, refit_timeout_s: float = 5.0) -> None:
        self.trainer = ray.remote(TrainerRank).options(num_cpus=0).remote(total_bytes)
        self.workers = [
            ray.remote(GenerationWorker).options(num_cpus=0).remote() for _ in range(shards)
        ]
        spec = ray.get(self.trainer.spec.remote())
        ray.get([w.refit_allocate.remote(spec) for w in self.workers])
        self.pids = ray.get([w.pid.remote() for w in self.workers])
        self.sync = GlooBroadcastSynchronizer(
            [self.trainer],
            {s: [w] for s, w in enumerate(self.workers)},
            refit_timeout_s=refit_timeout_s,
            grace_s=1.0,
            settle_s=refit_timeout_s + 1.0,
        )

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    configure_logging("error")
    with local_ray(), tempfile.TemporaryDirectory(prefix="fl-bench-") as tmp:
        bench_rebuild(args.repeat)
        bench_push(args.repeat)
        bench_recovery(args.repeat, Path(tmp))


if __name__ == "__main__":
    main()
