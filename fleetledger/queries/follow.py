"""Following a live run entry by entry (``watch``): the run's tail (:mod:`.tail`) fed
into its history."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fleetledger.projections.history import EndEntry, Entry, History
from fleetledger.queries.tail import Tail
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog

DEFAULT_POLL_INTERVAL_S = 1.0


class Follower:
    """Follows a live run: folds what other processes append, entry by entry.

    It starts at the run's head (the past is ``replay``'s business) and reads the tail
    after the last seq it folded. With ``from_seq`` it starts there instead: the fold up
    to it is silent, and the first poll returns the entries from ``from_seq`` on — how a
    stream resumed from a seq catches up before it goes on live.
    """

    def __init__(self, log: EventLog, run: str, *, from_seq: int | None = None) -> None:
        self.log = log
        self.run = run
        self._pending: list[Entry] = []
        if from_seq is None or from_seq > 1:
            at = None if from_seq is None else from_seq - 1
            self.history = History(load_view(log, run, at))
        else:  # from the run's start: its first entry is the starting membership
            first = next(iter(log.read(run, 0, 1)))
            self.history, self._pending = History.start(first)
        self._tail = Tail(log, run, self.history.view)
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
        entries, self._pending = self._pending, []
        feed = self.history.feed
        for recorded in self._tail.new():
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
