"""The simulation's trainer and its side of the refit: a trainer rank that steps, and
the broadcast transport over a fleet whose shard actors may be restarted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence

import ray

from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.transports.ray_members import TrainerRank
from fleetledger.weight_sync import ReconcileOutcome

WeightsSpec = dict[str, tuple[tuple[int, ...], str]]


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
        weights_spec: WeightsSpec,
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
