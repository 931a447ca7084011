"""Reading a run's history from any seq: the I/O around ``projections.history``.

A replay from seq S prints exactly the entries a full replay prints from S on: the
fold up to S is silent (from the nearest snapshot), not skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from fleetledger.events.errors import LedgerError
from fleetledger.projections.history import Entry, History
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunHead

# Called after each page with (events folded so far, events to fold in all).
PageCallback = Callable[[int, int], None]


def read_history(
    log: EventLog,
    run: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    on_page: PageCallback | None = None,
    head: RunHead | None = None,
    finish: bool = True,
) -> Iterator[Entry]:
    """The history entries of ``run`` at seqs ``from_seq..to_seq`` (default: the head).

    Events before ``from_seq`` are folded without producing entries. Where the events
    stop before the run's end, a refit still open there is entered as "open", exactly
    as ``projections.history.replay`` does for a truncated run. ``head``: the run's
    head as the caller already read it. ``finish=False``: no such "open" entry — for a
    page of a longer history, whose next page goes on where this one stops.
    """
    head = head or log.run_head(run)
    last = head.seq if to_seq is None else to_seq
    if not 1 <= from_seq <= head.seq:
        raise LedgerError(f"run {run!r} has seqs 1..{head.seq}; cannot start at seq {from_seq}")
    if not 1 <= last <= head.seq:
        raise LedgerError(f"run {run!r} has seqs 1..{head.seq}; cannot stop at seq {last}")
    if last < from_seq:
        raise LedgerError(
            f"run {run!r}: seqs {from_seq}..{last} is an empty range (it starts after it stops)"
        )
    history: History | None = None
    after = from_seq - 1
    if after >= 1:
        history = History(load_view(log, run, after, head=head))
    total = last - after
    # History entries hold no event ids: one shared event per repeated payload.
    for page in log.read_pages(run, after, last, ids=False):
        if history is None:  # from seq 1: the first entry is the starting membership
            history, entries = History.start(page[0])
            yield from entries
            page = page[1:]
        yield from history.feed_page(page)
        if on_page is not None:
            on_page(history.view.seq - after, total)
    if finish and history is not None and history.view.ended is None:
        yield from history.finish()
