"""Reading a run's history out of the log: from any seq (replay) and as it grows (watch).

The history itself is a pure projection (``projections.history``); what lives here is
the I/O around it: where to start folding (the nearest snapshot), which pages to read,
and — for a live run — when to look again. A replay from seq S and a watch that
started at seq S both print exactly the entries a full replay prints from S on: the
fold up to S is silent, not skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fleetledger.controller.ledger import load_view
from fleetledger.events.errors import LedgerError
from fleetledger.events.log import EventLog
from fleetledger.projections.history import EndEntry, Entry, History

# Called after each page with (events folded so far, events to fold in all).
PageCallback = Callable[[int, int], None]

DEFAULT_POLL_INTERVAL_S = 1.0


def history_after(log: EventLog, run: str, seq: int | None = None) -> History:
    """A ``History`` that has folded ``run`` up to ``seq`` (default: the head), silently.

    The view comes from the nearest snapshot plus the tail (``load_view``).
    """
    return History(load_view(log, run, seq))


def read_history(
    log: EventLog,
    run: str,
    *,
    from_seq: int = 1,
    to_seq: int | None = None,
    on_page: PageCallback | None = None,
) -> Iterator[Entry]:
    """The history entries of ``run`` at seqs ``from_seq..to_seq`` (default: the head).

    Events before ``from_seq`` are folded without producing entries. Where the events
    stop before the run's end, a refit still open there is entered as "open", exactly
    as ``projections.history.replay`` does for a truncated run.
    """
    head = log.head(run)
    last = head if to_seq is None else to_seq
    if not 1 <= from_seq <= head:
        raise LedgerError(f"run {run!r} has seqs 1..{head}; cannot start at seq {from_seq}")
    if not 1 <= last <= head:
        raise LedgerError(f"run {run!r} has seqs 1..{head}; cannot stop at seq {last}")
    if last < from_seq:
        raise LedgerError(
            f"run {run!r}: seqs {from_seq}..{last} is an empty range (it starts after it stops)"
        )
    history: History | None = None
    after = from_seq - 1
    if after >= 1:
        history = history_after(log, run, after)
    total = last - after
    for page in log.read_pages(run, after, last):
        if history is None:  # from seq 1: the first entry is the starting membership
            history, entries = History.start(page[0])
            yield from entries
            page = page[1:]
        feed = history.feed
        for recorded in page:
            entries = feed(recorded)
            if entries:
                yield from entries
        if on_page is not None:
            on_page(history.view.seq - after, total)
    if history is not None and history.view.ended is None:
        yield from history.finish()


class Follower:
    """Follows a live run: folds what other processes append, entry by entry.

    It starts at the run's head (the past is ``replay``'s business) and reads only what
    was appended after the last seq it folded, so each poll costs one head lookup when
    nothing happened. The log commits in seq order, so a poll never sees seq n+2
    before n+1.
    """

    def __init__(self, log: EventLog, run: str) -> None:
        self.log = log
        self.run = run
        self.history = history_after(log, run)
        self.started_at_seq = self.history.view.seq

    @property
    def seq(self) -> int:
        """The last seq folded."""
        return self.history.view.seq

    @property
    def ended(self) -> bool:
        return self.history.view.ended is not None

    def poll(self) -> list[Entry]:
        """Fold whatever was appended since the last poll; returns its entries."""
        entries: list[Entry] = []
        feed = self.history.feed
        for page in self.log.read_pages(self.run, self.seq):
            for recorded in page:
                entries += feed(recorded)
        return entries

    def follow(
        self,
        interval_s: float = DEFAULT_POLL_INTERVAL_S,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> Iterator[Entry]:
        """Every new entry as it is appended; stops after the run's end entry.

        A run that had already ended when following began yields its end entry at once,
        so a caller always learns how the run ended.
        """
        if interval_s <= 0:
            raise ValueError(f"the poll interval must be positive, got {interval_s}")
        view = self.history.view
        if view.ended is not None:
            # The end is the run's last event, so the view's time is the end's time.
            yield EndEntry(view.ended.seq, view.at_us, view.ended.outcome, view.ended.cause)
            return
        while True:
            yield from self.poll()
            if self.ended:
                return
            sleep(interval_s)
