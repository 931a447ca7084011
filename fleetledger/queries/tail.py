"""A run's tail: what other processes appended after the seq a view has folded.

Every party that follows a live run — the controller's ledger folding the router's and
the adapters' appends, the router's routing table, ``watch``, the chaos campaign — reads
it the same way, here: from the view's own seq, page by page, so a poll when nothing
happened costs one short read, and the log's seq order means a poll never sees seq n+2
before n+1. The caller folds each record into the view as it comes; the view's seq is
where the next read starts, so a record that failed to fold is read again, never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

from fleetledger.events.models import RecordedEvent
from fleetledger.projections.fleet_view import FleetView
from fleetledger.store.log import EventLog

__all__ = ["Tail"]


class Tail:
    """The records of one run appended after ``view``'s seq, for the caller to fold."""

    __slots__ = ("log", "run", "view")

    def __init__(self, log: EventLog, run: str, view: FleetView) -> None:
        self.log = log
        self.run = run
        self.view = view

    def new(self) -> Iterator[RecordedEvent]:
        """Each record after the view's seq at the time of the call, in seq order."""
        for page in self.log.read_pages(self.run, self.view.seq):
            yield from page
