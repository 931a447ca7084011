"""The simulation's trainer: a trainer rank (rank 0 of the refit communicator) that steps.

Its side of the refit — the broadcast transport over a fleet whose shard actors may be
restarted — is the library's :class:`~fleetledger.transports.restartable.
RestartAwareSynchronizer`, the same one an embedder uses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from fleetledger.transports.ray_members import TrainerRank
from fleetledger.transports.restartable import WeightsSpec

__all__ = ["SimulatedTrainer", "WeightsSpec"]


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
