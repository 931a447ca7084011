"""The broadcast transport over a fleet whose shard actors are restarted: the refit path
an embedder gets from the library, not only ``fleetledger simulate``.

A restarted shard is a new process. It has no receive buffers and is not a member of
the communicator the old process joined; the transport must notice, have the new
process allocate its buffers (the spec of what the trainer broadcasts) and take it back
into the next build — which has to be a rebuild even when the absent set looks the same
as at the last build, because the process behind one of its ranks changed.

:class:`RestartAwareSynchronizer` does that inside ``reconcile``, the one call that
sees the same absent set the build uses, however the restarter races the refit: for
every shard that is not absent and whose incarnation differs from the one that joined
(never joined, at the start), it calls ``refit_allocate(spec)`` on the shard's current
workers, replaces the workers, and forces the rebuild. So the first reconcile also
allocates every shard's buffers: nobody calls ``refit_allocate`` by hand.

Typed against :class:`IncarnatedFleet`, a small protocol (``RayShardFleet`` satisfies
it): transports do not import the controller.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ray.actor import ActorHandle

from fleetledger.transports.gloo_broadcast import GlooBroadcastSynchronizer
from fleetledger.weight_sync import Party

__all__ = ["IncarnatedFleet", "RestartAwareSynchronizer", "WeightsSpec"]

WeightsSpec = dict[str, tuple[tuple[int, ...], str]]
"""What the trainer broadcasts: parameter name → (shape, dtype), as ``TrainerRank.spec``."""


class IncarnatedFleet(Protocol):
    """A fleet whose shards' actors may be replaced, each replacement counted."""

    @property
    def shards(self) -> tuple[int, ...]: ...

    def handle(self, shard: int) -> ActorHandle: ...

    def incarnation(self, shard: int) -> int: ...


class RestartAwareSynchronizer(GlooBroadcastSynchronizer):
    """Gloo broadcast from the trainers to the shards of ``fleet``, restarts included.

    ``trainers``: the trainer rank actors (rank 0 first, each a ``TrainerRank``).
    ``weights_spec``: the receive-buffer spec; by default asked of trainer rank 0
    (``spec()``) at the first reconcile — the constructor never waits on an actor, so it
    is safe in an event loop. ``workers``: a shard's communicator members, by default its one actor
    (``[fleet.handle(shard)]``); give it for shards of several ranks (tp × pp).
    ``allocate_timeout_s`` bounds each allocation. The remaining keywords
    (``refit_timeout_s``, ``grace_s``, ``settle_s``, ``build_timeout_s``) are
    :class:`GlooBroadcastSynchronizer`'s bounds, passed on as they are.
    """

    def __init__(
        self,
        fleet: IncarnatedFleet,
        trainers: Sequence[ActorHandle],
        *,
        weights_spec: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
        workers: Callable[[int], Sequence[ActorHandle]] | None = None,
        allocate_timeout_s: float = 60.0,
        **bounds: Any,
    ) -> None:
        self._workers_of = workers or (lambda shard: [fleet.handle(shard)])
        super().__init__(
            trainers, {shard: self._workers_of(shard) for shard in fleet.shards}, **bounds
        )
        self._fleet = fleet
        self._trainer_0 = trainers[0]
        # Asked of trainer rank 0 at the first reconcile, not here: a constructor that
        # waits on an actor blocks an event loop, and a failed trainer surfaced as a
        # traceback out of it; in reconcile it is a refit failure naming trainer 0.
        self.weights_spec: WeightsSpec | None = None if weights_spec is None else dict(weights_spec)
        self.allocate_timeout_s = allocate_timeout_s
        # shard -> the incarnation whose workers hold buffers and are this transport's
        # members; a shard missing here has never been allocated.
        self._joined: dict[int, int] = {}
        self.readmitted = 0  # shards taken back after a restart (not the first allocation)

    def joined_incarnation(self, shard: int) -> int | None:
        """The incarnation of ``shard`` whose workers this transport builds with
        (``None``: not allocated yet). A death the push saw of a shard whose fleet
        incarnation has moved on since was the replaced actor's."""
        return self._joined.get(shard)

    def _admit(self, absent: frozenset[int], cancel: threading.Event) -> bool:
        """Allocate buffers on every present shard whose process changed since it joined,
        and take its workers in; True when one did (the rebuild is then forced). A
        replacement that does not answer fails the refit naming it, within the bound —
        and within ``CANCEL_POLL_S`` of an abort."""
        if self.weights_spec is None:
            (spec,) = self._gather(
                {self._trainer_0.spec.remote(): Party.trainer(0)},
                self.allocate_timeout_s,
                "weights spec",
                cancel=cancel,
            )
            self.weights_spec = dict(spec)
        changed = False
        for shard in range(self.dp_size):
            if shard in absent:
                continue
            current = self._fleet.incarnation(shard)
            joined = self._joined.get(shard)
            if joined == current:
                continue
            workers = list(self._workers_of(shard))
            self._gather(
                {w.refit_allocate.remote(self.weights_spec): Party.shard(shard) for w in workers},
                self.allocate_timeout_s,
                "allocate",
                cancel=cancel,
            )
            self.replace_shard(shard, workers)
            self._joined[shard] = current
            if joined is not None:
                self.readmitted += 1
                changed = True
        return changed
