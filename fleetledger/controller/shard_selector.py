"""Shard selection: least outstanding requests among the serving shards.

Why least-outstanding rather than round-robin: round-robin keeps sending 1/N of the
traffic to a corpse, and to a shard that is merely slow or wedged; least-outstanding
steers away from a slow shard without anything having to diagnose it first, because
its requests pile up. Ties go to the lowest index so a choice is reproducible.

What it relies on and what it guarantees:

- The serving set is read from the view on *every* selection, never cached: a shard
  that leaves it (quarantined by a probe, killed, condemned) stops being chosen at
  once, even while requests to it are still in flight. Those requests keep their count
  until they finish; the count only matters again if the shard comes back.
- The in-flight count is taken and given back by :meth:`ShardSelector.acquire`, whose
  release sits in a ``finally`` — exceptions and asyncio cancellation included. A
  leaked count would permanently bias selection away from a shard that is fine.
- A release is floored at 0: a negative count (a double release) would permanently
  bias selection *towards* that shard.
- One lock guards the counts and is never held across I/O or an ``await``, so the
  selector is safe from threads and from coroutines alike (``with selector.acquire()
  as shard: await ...``).
- No serving shard is an infrastructure failure (the taxonomy's
  :class:`~fleetledger.controller.failure_taxonomy.NoHealthyShards`): the prompt is
  fine, the fleet is not — back off and select again. Its message carries the fleet's
  counts per state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from fleetledger.controller.failure_taxonomy import NoHealthyShards

if TYPE_CHECKING:
    from fleetledger.controller.ledger import Ledger


def no_healthy_shards(counts: Mapping[str, int]) -> NoHealthyShards:
    """The error for an empty serving set, naming how many shards are in each state, so
    it says what the fleet looks like rather than only that nothing serves."""
    fleet = ", ".join(f"{state} {n}" for state, n in counts.items() if n) or "no shards"
    return NoHealthyShards(f"no healthy shards: no generation shard is serving (fleet: {fleet})")


class ServingSource(Protocol):
    """What the selector reads: a :class:`~fleetledger.projections.fleet_view.FleetView`
    satisfies it."""

    @property
    def serving(self) -> tuple[int, ...]: ...

    def counts(self) -> dict[str, int]: ...


class ShardSelector:
    """Least-outstanding selection over the serving set of a view that may change."""

    def __init__(self, source: Callable[[], ServingSource]) -> None:
        """``source`` returns the current view; it is called on every selection."""
        self._source = source
        self._lock = threading.Lock()
        self._in_flight: dict[int, int] = {}

    @classmethod
    def for_ledger(cls, ledger: Ledger) -> ShardSelector:
        """Select over a ledger's membership (which folds events from other processes too).

        Reads the ledger's consistent copy, not the view being folded in another thread.
        """
        return cls(lambda: ledger.membership)

    # ── selection ───────────────────────────────────────────────────────────

    @contextmanager
    def acquire(self) -> Iterator[int]:
        """Choose a shard and hold one in-flight count on it for the ``with`` body.

        Raises :class:`NoHealthyShards` (holding nothing) when no shard serves.
        """
        shard = self._take()
        try:
            yield shard
        finally:
            self.release(shard)

    def release(self, shard: int) -> None:
        """Give back one in-flight count on ``shard``, never going below 0.

        :meth:`acquire` calls this in its ``finally``. The floor makes a stray extra
        release harmless instead of turning into a permanent preference for ``shard``.
        """
        with self._lock:
            left = self._in_flight.get(shard, 0) - 1
            if left > 0:
                self._in_flight[shard] = left
            else:
                self._in_flight.pop(shard, None)

    def _take(self) -> int:
        view = self._source()
        serving: Iterable[int] = view.serving
        with self._lock:
            # min over (count, index): the least outstanding, ties to the lowest index.
            best = min(serving, key=lambda s: (self._in_flight.get(s, 0), s), default=None)
            if best is not None:
                self._in_flight[best] = self._in_flight.get(best, 0) + 1
                return best
        raise no_healthy_shards(view.counts())

    # ── read side ───────────────────────────────────────────────────────────

    def in_flight(self, shard: int) -> int:
        with self._lock:
            return self._in_flight.get(shard, 0)

    def in_flight_counts(self) -> dict[int, int]:
        """Non-zero in-flight counts per shard (serving or not), for metrics."""
        with self._lock:
            return dict(self._in_flight)

    @property
    def total_in_flight(self) -> int:
        with self._lock:
            return sum(self._in_flight.values())
