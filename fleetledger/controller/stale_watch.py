"""The liveness of a refit's STALE participants, which nothing else watches.

The probe pump probes serving shards only (the reference's rule: a STALE shard serves
nothing, so its probes are not folded). But a STALE shard — a replacement being
re-admitted, a survivor whose weights an aborted refit left partial — is a participant
of the next refit, and a refit parked on a frozen one waited for the transport's own
bound: 61 s of a build's rendezvous in the chaos campaign (a replacement SIGSTOPped as
its re-admitting build began), where a frozen serving participant costs the pump's
three failed probes.

So while a refit waits, its STALE participants are probed on the pump's cadence, the
results kept here and never folded: ``unhealthy_threshold`` consecutive failures name
the shard as silent, and the coordinator aborts and recovers (where the condemnation
decision condemns a STALE shard that the failure named and the recovery's own probe
found silent). A probe that finds the actor gone is a conclusive death, and is recorded
as one: a death is a death in any state.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import Prober
from fleetledger.projections.shard_states import ShardState

__all__ = ["StaleWatch"]


@dataclass
class StaleWatch:
    """Probes ``shards`` at most every ``interval_s`` while :meth:`silent` is polled."""

    ledger: Ledger
    prober: Prober
    shards: tuple[int, ...]
    interval_s: float
    timeout_s: float
    threshold: int
    _streaks: dict[int, int] = field(default_factory=dict)
    _next_at: float = 0.0

    @classmethod
    def of(
        cls,
        ledger: Ledger,
        prober: Prober,
        participants: Sequence[int],
        *,
        interval_s: float | None,
        timeout_s: float,
    ) -> StaleWatch | None:
        """The watch of ``participants`` that are STALE now; ``None`` when there are none
        or the watch is off (``interval_s=None``)."""
        if interval_s is None:
            return None
        with ledger.lock:
            view = ledger.view
            stale = tuple(s for s in participants if view.shards[s].state is ShardState.STALE)
            threshold = view.config.unhealthy_threshold
        if not stale:
            return None
        return cls(ledger, prober, stale, interval_s, timeout_s, threshold)

    def silent(self) -> tuple[int, str] | None:
        """(shard, why) of a participant that failed ``threshold`` probes in a row, when
        it is time for a round and one did; ``None`` otherwise."""
        if time.monotonic() < self._next_at:
            return None
        results = dict(self.prober.probe(self.shards, self.timeout_s))
        self._next_at = time.monotonic() + self.interval_s
        deaths: dict[int, ProbeResult] = {}
        found: tuple[int, str] | None = None
        for shard in self.shards:
            result = results.get(shard, ProbeResult("error", "the prober returned nothing"))
            if result.kind == "ok":
                self._streaks[shard] = 0
            elif result.kind == "died":
                deaths[shard] = result
            else:
                streak = self._streaks[shard] = self._streaks.get(shard, 0) + 1
                if streak >= self.threshold and found is None:
                    last = f"{result.kind}: {result.error}" if result.error else result.kind
                    found = (
                        shard,
                        f"{streak} consecutive failed probes while STALE ≥ unhealthy_threshold "
                        f"{self.threshold} (last: {last})",
                    )
        if deaths:
            self.ledger.record_probes(deaths)  # the watch's absent check sees them next
        return found
