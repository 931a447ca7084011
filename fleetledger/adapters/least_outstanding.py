"""Least outstanding requests: the one choice rule and the one in-flight counter, shared by
the adapters' :class:`~fleetledger.adapters.shard_selector.ShardSelector` and the router.

Why least-outstanding rather than round-robin: round-robin keeps sending 1/N of the
traffic to a corpse, and to a shard that is merely slow or wedged; least-outstanding
steers away from a slow shard without anything having to diagnose it first, because
its requests pile up. Story: static round-robin kept sending ~1/N of the rollouts to a
dead engine for the rest of the run.

The rules, written once here:

- **The choice** (:func:`least_outstanding`): the candidate with the fewest requests in
  flight; ties go to the lowest shard index, so a choice is reproducible.
- **The count is floored at 0** (:meth:`InFlight.release`): a negative count (a double
  release) would permanently bias selection *towards* that shard; a leaked count would
  bias it away, which is why callers release in a ``finally``.
- **Choose and count in one step** (:meth:`InFlight.take`), under one lock that is never
  held across I/O or an ``await``: two threads (or two coroutines between awaits) never
  both see the same shard as least loaded and both pick it on a stale count.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

__all__ = ["InFlight", "least_outstanding"]


def least_outstanding(candidates: Iterable[int], in_flight: Mapping[int, int]) -> int | None:
    """The candidate shard with the fewest requests in flight, ties to the lowest index;
    ``None`` when there is no candidate."""
    best: int | None = None
    best_count = 0
    for shard in candidates:
        count = in_flight.get(shard, 0)
        if best is None or count < best_count or (count == best_count and shard < best):
            best, best_count = shard, count
    return best


class InFlight:
    """Requests in flight per shard: taken by a choice, given back by a release.

    Safe from threads and from coroutines alike; shards with no request in flight hold
    no entry, so :meth:`counts` is the non-zero counts.
    """

    __slots__ = ("_counts", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}

    def take(self, candidates: Iterable[int]) -> int | None:
        """Choose the least outstanding of ``candidates`` and count one request on it;
        ``None`` (counting nothing) when there is no candidate."""
        with self._lock:
            counts = self._counts
            best = least_outstanding(candidates, counts)
            if best is not None:
                counts[best] = counts.get(best, 0) + 1
            return best

    def release(self, shard: int) -> None:
        """Give back one request on ``shard``, never going below 0: a stray extra release
        is harmless instead of a permanent preference for ``shard``."""
        with self._lock:
            left = self._counts.get(shard, 0) - 1
            if left > 0:
                self._counts[shard] = left
            else:
                self._counts.pop(shard, None)

    def of(self, shard: int) -> int:
        """Requests in flight on ``shard``."""
        with self._lock:
            return self._counts.get(shard, 0)

    def counts(self) -> dict[int, int]:
        """Non-zero counts per shard (serving or not), for metrics."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def __bool__(self) -> bool:
        """Whether any request is in flight."""
        with self._lock:
            return bool(self._counts)
