"""Real refit fleets for the transport and recovery tests: a trainer rank and one
generation worker per shard, each a Ray actor process with torch, plus the synchronizer."""

from __future__ import annotations

import os
import signal

import ray

from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.gloo_rank import checksum
from fleetledger.transports.ray_members import GenerationWorker, TrainerRank

SHARDS = 3


class FaultyWorker(GenerationWorker):
    """A generation worker with faults to arm: its pushes raise a ``ValueError`` — a bug
    in the transport's receiving side, raised before it joins the collective, so the
    other members are left waiting in it — or receive, then hold different bytes (what
    a receiver that corrupted its copy would answer)."""

    _fault: str | None = None
    _corrupt = False

    async def arm_fault(self, text: str) -> None:
        self._fault = text

    async def arm_corruption(self) -> None:
        self._corrupt = True

    async def refit_broadcast(self, version: int) -> dict:
        if self._fault is not None:
            raise ValueError(self._fault)
        result = await super().refit_broadcast(version)
        if self._corrupt:
            tensors = self._member().tensors
            next(iter(tensors.values()))[0] += 1.0
            result = {**result, "checksum": checksum(tensors)}
        return result


class StagedWorker(GenerationWorker):
    """A worker that receives a push into staging buffers and loads it afterwards, as a
    real engine does: a push cut before the load leaves what it serves whole."""

    _refit_staged = True

    async def refit_broadcast(self, version: int) -> dict:
        received = await super().refit_broadcast(version)
        self.refit_load_begins(version)
        return received


class Fleet:
    """``refit_timeout_s=None``: unbounded; the settle window follows the refit timeout.
    ``staged``: the workers receive into staging buffers (:class:`StagedWorker`)."""

    def __init__(
        self,
        total_bytes: int,
        refit_timeout_s: float | None,
        *,
        faulty: int | None = None,
        staged: bool = False,
    ) -> None:
        self.trainer = ray.remote(TrainerRank).options(num_cpus=0).remote(total_bytes)
        worker_class = StagedWorker if staged else GenerationWorker
        self.workers = [
            ray.remote(FaultyWorker if s == faulty else worker_class).options(num_cpus=0).remote()
            for s in range(SHARDS)
        ]
        spec = ray.get(self.trainer.spec.remote(), timeout=60)
        ray.get([w.refit_allocate.remote(spec) for w in self.workers], timeout=60)
        self.pids = ray.get([w.pid.remote() for w in self.workers], timeout=60)
        self.sync = GlooBroadcastSynchronizer(
            [self.trainer],
            {s: [w] for s, w in enumerate(self.workers)},
            refit_timeout_s=refit_timeout_s,
            grace_s=1.0,
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

    def in_flight(self, shards) -> dict[str, int]:
        """Pushes still inside a collective, per member (the trainer and ``shards``)."""
        members = {"trainer 0": self.trainer, **{f"shard {s}": self.workers[s] for s in shards}}
        return {
            name: ray.get(actor.refit_in_flight.remote(), timeout=60)
            for name, actor in members.items()
        }

    def close(self) -> None:
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for actor in [self.trainer, *self.workers]:
            ray.kill(actor, no_restart=True)
