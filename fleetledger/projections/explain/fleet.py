"""The fleet around an explanation: the rank layout, the refit open, when the run began.

Both explanations — a shard's and the run's — end with the same facts about the whole
fleet at the explained seq; they are built here once.

Rules of this file:

- Every fact comes from the view, the history entries of the same events, or an event
  the caller supplied; what is missing is said to be missing (a layout that cannot be
  built carries its error), never filled in.
- Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from fleetledger.events.models import RecordedEvent
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.history import Entry, RefitEntry
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.rank_layout import RankLayoutError, layout_words


@dataclass(frozen=True, slots=True)
class LayoutSummary(JsonForm):
    """The refit communicator the transports would build for this view's absent set."""

    world_size: int | None
    train_world_size: int
    workers_per_shard: int
    shard_ranks: dict[int, tuple[int, ...]]
    error: str | None

    @classmethod
    def of(cls, view: FleetView) -> LayoutSummary:
        c = view.config
        try:
            layout = view.layout()
        except RankLayoutError as exc:
            return cls(None, c.train_world_size, c.workers_per_shard, {}, str(exc))
        ranks = {s: tuple(layout.shard_ranks(s)) for s in layout.survivors}
        return cls(layout.world_size, c.train_world_size, c.workers_per_shard, ranks, None)

    def describe(self) -> str:
        if self.world_size is None:
            return f"no refit communicator can be built ({self.error})"
        return layout_words(self.world_size, self.train_world_size, self.shard_ranks)

    def describe_shard(self, shard: int) -> str:
        """One shard's place in the layout, in the same notation: a shard's explanation
        needs its own ranks, not a line that grows with the fleet."""
        if self.world_size is None:
            return self.describe()
        held = self.shard_ranks.get(shard)
        if held is None:
            return f"world {self.world_size}; shard {shard} has no rank (absent)"
        return layout_words(self.world_size, self.train_world_size, {shard: held})


def started_at_us(entries: Sequence[Entry], evidence: Mapping[int, RecordedEvent]) -> int | None:
    """When the run began: from its first history entry, else from a supplied seq 1."""
    if entries and entries[0].seq == 1:
        return entries[0].at_us
    first = evidence.get(1)
    return None if first is None else first.at_us


def open_refit_at(
    view: FleetView, entries: Sequence[Entry], evidence: Mapping[int, RecordedEvent]
) -> RefitEntry | None:
    """The refit open at the view's seq: from history when it recorded one, else the view."""
    opened = view.open_refit
    if opened is None:
        return None
    for e in reversed(entries):
        if isinstance(e, RefitEntry) and e.outcome == "open" and e.started_seq == opened.seq:
            return e
    started = evidence.get(opened.seq)
    started_at = view.at_us if started is None else started.at_us
    return RefitEntry(
        view.seq,
        view.at_us,
        opened.seq,
        started_at,
        opened.weight_version,
        opened.shards,
        "open",
        "no completion or abort was recorded",
        False,
    )
