"""Real refit fleets for the transport and recovery tests: a trainer rank and one
generation worker per shard, each a Ray actor process with torch, plus the synchronizer."""

from __future__ import annotations

import os
import signal

import ray

from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.ray_members import GenerationWorker, TrainerRank

SHARDS = 3


class Fleet:
    def __init__(self, total_bytes: int, refit_timeout_s: float) -> None:
        self.trainer = ray.remote(TrainerRank).options(num_cpus=0).remote(total_bytes)
        self.workers = [
            ray.remote(GenerationWorker).options(num_cpus=0).remote() for _ in range(SHARDS)
        ]
        spec = ray.get(self.trainer.spec.remote(), timeout=60)
        ray.get([w.refit_allocate.remote(spec) for w in self.workers], timeout=60)
        self.pids = ray.get([w.pid.remote() for w in self.workers], timeout=60)
        self.sync = GlooBroadcastSynchronizer(
            [self.trainer],
            {s: [w] for s, w in enumerate(self.workers)},
            refit_timeout_s=refit_timeout_s,
            grace_s=1.0,
            settle_s=refit_timeout_s + 2.0,
        )

    def new_worker(self, shard: int) -> None:
        """Replace ``shard``'s worker with a fresh process (a restart)."""
        spec = ray.get(self.trainer.spec.remote(), timeout=60)
        worker = ray.remote(GenerationWorker).options(num_cpus=0).remote()
        ray.get(worker.refit_allocate.remote(spec), timeout=60)
        self.workers[shard] = worker
        self.pids[shard] = ray.get(worker.pid.remote(), timeout=60)
        self.sync.replace_shard(shard, [worker])

    def prober(self) -> RayShardFleet:
        """Probes the shards' worker processes (they answer ``is_alive``)."""
        return RayShardFleet(dict(enumerate(self.workers)))

    def step(self, version: int) -> str:
        return ray.get(self.trainer.train_step.remote(version), timeout=60)

    def close(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for actor in [self.trainer, *self.workers]:
            ray.kill(actor, no_restart=True)
