"""Shard selection: least outstanding requests among the serving shards.

The choice and the in-flight count are :mod:`fleetledger.adapters.least_outstanding`'s
(the router uses the same); what this file adds:

- The serving set is read from the view on *every* selection, never cached: a shard
  that leaves it (quarantined by a probe, killed, condemned) stops being chosen at
  once, even while requests to it are still in flight. Those requests keep their count
  until they finish; the count only matters again if the shard comes back.
- The in-flight count is taken and given back by :meth:`ShardSelector.acquire`, whose
  release sits in a ``finally`` — exceptions and asyncio cancellation included. A
  leaked count would permanently bias selection away from a shard that is fine.
- No serving shard is an infrastructure failure (the taxonomy's
  :class:`~fleetledger.adapters.failure_taxonomy.NoHealthyShards`): the prompt is
  fine, the fleet is not — back off and select again. Its message carries the fleet's
  counts per state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Protocol

from fleetledger.adapters.failure_taxonomy import NoHealthyShards
from fleetledger.adapters.least_outstanding import InFlight


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


class HasMembership(Protocol):
    """What :meth:`ShardSelector.for_ledger` reads: a
    :class:`~fleetledger.controller.ledger.Ledger` satisfies it."""

    @property
    def membership(self) -> ServingSource: ...


class ShardSelector:
    """Least-outstanding selection over the serving set of a view that may change."""

    def __init__(self, source: Callable[[], ServingSource]) -> None:
        """``source`` returns the current view; it is called on every selection."""
        self._source = source
        self._in_flight = InFlight()

    @classmethod
    def for_ledger(cls, ledger: HasMembership) -> ShardSelector:
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
        view = self._source()
        shard = self._in_flight.take(view.serving)
        if shard is None:
            raise no_healthy_shards(view.counts())
        try:
            yield shard
        finally:
            self.release(shard)

    def release(self, shard: int) -> None:
        """Give back one in-flight count on ``shard``, never going below 0 (:meth:`acquire`
        calls this in its ``finally``)."""
        self._in_flight.release(shard)

    # ── read side ───────────────────────────────────────────────────────────

    def in_flight(self, shard: int) -> int:
        return self._in_flight.of(shard)

    def in_flight_counts(self) -> dict[int, int]:
        """Non-zero in-flight counts per shard (serving or not), for metrics."""
        return self._in_flight.counts()

    @property
    def total_in_flight(self) -> int:
        return self._in_flight.total
