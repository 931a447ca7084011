"""Live runs: each followed once, its new entries handed to every client that streams it.

A run's feed folds the run's tail (``queries.Follower``) when asked to catch up, numbers
the new entries (:mod:`.entry_ids`), serialises each once, keeps the latest few for a
page that opens, and puts them on the queue of every subscriber. Folding runs in a
worker thread (the log's reads block), one catch-up per feed at a time; everything else
happens on the event loop, so a subscriber that joins between two catch-ups sees every
entry after the feed's last id and none before — no entry lost or repeated.

A feed starts ``RECENT_WINDOW`` events before the head (the fold before that is silent,
from the nearest snapshot), so opening the page of a million-event run reads a window,
not the run. A subscriber too slow to drain its queue is dropped, not waited for: its
client reconnects with its last id and catches up from the log.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from fleetledger.events.models import FleetConfig
from fleetledger.projections.entry_words import describe
from fleetledger.projections.history import Entry
from fleetledger.projections.membership import membership_document
from fleetledger.queries import Follower
from fleetledger.web.entry_ids import WHOLE_SEQ, EntryId, Numbering, id_text
from fleetledger.web.ledger_source import LedgerSource

RECENT_WINDOW = 20_000  # events a new feed folds with entries (the rest silently)
RECENT_ENTRIES = 500  # entries a feed keeps for a page that opens
QUEUE_BATCHES = 1_000  # batches a subscriber may fall behind before it is dropped


@dataclass(frozen=True, slots=True)
class WireEntry:
    """One history entry as it goes out: its id, its stamp, its JSON (serialised once)."""

    id: EntryId
    seq: int
    at_us: int
    json: str
    shards: tuple[int, ...]  # the shards it is about (``replay --shard``'s filter)
    ends_run: bool

    @classmethod
    def of(cls, entry: Entry, entry_id: EntryId, config: FleetConfig) -> WireEntry:
        shards, what, detail, tone = describe(entry, config)  # the replay table's words
        words = {"shards": shards, "what": what, "detail": detail, "tone": tone}
        body = {"id": id_text(entry_id), **entry.as_json(), "words": words}
        kind = body.get("kind")
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
        return cls(entry_id, entry.seq, entry.at_us, text, tuple(entry.shards), kind == "end")

    def about(self, shard: int | None) -> bool:
        return shard is None or self.ends_run or shard in self.shards


def wire_entries(
    entries: Iterable[Entry], numbering: Numbering, config: FleetConfig
) -> list[WireEntry]:
    return [WireEntry.of(e, numbering.next_id(e.seq), config) for e in entries]


@dataclass(frozen=True, slots=True)
class Batch:
    """What one catch-up found: the new entries (maybe none) and the seq folded to."""

    entries: list[WireEntry]
    seq: int


@dataclass(eq=False)
class Subscriber:
    """One streaming client's queue of entry batches; ``dropped`` once it fell behind."""

    queue: asyncio.Queue[Batch] = field(default_factory=lambda: asyncio.Queue(QUEUE_BATCHES))
    dropped: bool = False

    def offer(self, batch: Batch) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(batch)
        except asyncio.QueueFull:
            self.drop()

    def drop(self) -> None:
        self.dropped = True
        self.queue = asyncio.Queue(1)
        self.queue.put_nowait(Batch([], 0))  # wake the handler: it sees ``dropped``


class RunFeed:
    """One run followed live; its state changes only on the event loop."""

    def __init__(self, source: LedgerSource, run: str, head_seq: int) -> None:
        self.source = source
        self.run = run
        self._start_seq = max(1, head_seq - RECENT_WINDOW + 1)
        self._follower: Follower | None = None
        self._numbering = Numbering()
        self._lock = asyncio.Lock()
        self.recent: deque[WireEntry] = deque(maxlen=RECENT_ENTRIES)
        self.subscribers: set[Subscriber] = set()
        self.membership: dict[str, Any] = {}
        self.membership_json = b""
        self.drawings: dict[tuple[int, str, str], str] = {}  # the timeline at the latest seq
        self._polls_started = 0
        self._last_good_poll = 0
        self.seq = 0  # the last seq folded
        self.ended = False
        self.last_id: EntryId = (0, 0)  # the last entry's id (none yet: before any)
        self.started_seq = self._start_seq  # entries before it are only in the log

    def _poll(self) -> tuple[list[WireEntry], dict[str, Any] | None]:
        """In a worker thread (one at a time: the caller holds the feed's lock): fold what
        was appended; its entries numbered and serialised; the membership if it moved."""
        with self.source.reading() as log:
            follower = self._follower
            try:
                if follower is None or follower.log is not log:  # first, or log reopened
                    follower = Follower(log, self.run, from_seq=self._start_seq)
                    self._follower = follower
                before = follower.seq
                view = follower.history.view
                numbering = Numbering(self._numbering.last)
                entries = wire_entries(follower.poll(), numbering, view.config)
                moved = view.seq != before or not self.membership
                membership = membership_document(view) if moved else None
            except BaseException:
                # Part of the tail may be folded with its entries lost: fold it again,
                # from after the last catch-up that handed its entries out.
                self._follower = None
                raise
            self._numbering = numbering
            return entries, membership

    async def catch_up(self, executor: Executor) -> None:
        """Fold the run's tail and hand what is new to every subscriber.

        Callers that ask while a catch-up is running wait for it, then skip their own
        if one began after they asked: its read saw everything committed before they
        asked (a hundred requests at once cost one read, not a hundred).
        """
        asked = self._polls_started
        async with self._lock:
            if self._last_good_poll > asked:  # a poll that began after the ask succeeded
                return
            self._polls_started += 1
            this_poll = self._polls_started
            loop = asyncio.get_running_loop()
            polled = loop.run_in_executor(executor, self._poll)
            try:
                result = await asyncio.shield(polled)
            except asyncio.CancelledError:
                # The thread goes on folding: hold the lock until it is done, so no second
                # poll runs beside it on the same fold, and hand its entries out.
                self._hand_out(*await polled)
                self._last_good_poll = this_poll
                raise
            self._last_good_poll = this_poll
            self._hand_out(*result)

    def _hand_out(self, entries: list[WireEntry], membership: dict[str, Any] | None) -> None:
        if membership is None and not entries:
            return
        if membership is not None:
            self.membership = membership
            self.membership_json = json.dumps(membership, separators=(",", ":")).encode()
            self.seq = membership["seq"]
            self.ended = membership["ended"] is not None
        # A reopened log resumes after what this feed has handed out.
        self._start_seq = self.seq + 1
        batch = Batch(entries, self.seq)
        if batch.entries:
            self.last_id = batch.entries[-1].id
            self.recent.extend(batch.entries)
        for subscriber in self.subscribers:
            subscriber.offer(batch)

    def subscribe(self) -> Subscriber:
        subscriber = Subscriber()
        self.subscribers.add(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        self.subscribers.discard(subscriber)

    def drop_subscribers(self) -> None:
        """End every stream of this feed: its clients reconnect and resume by id."""
        for subscriber in self.subscribers:
            subscriber.drop()

    def recent_after(self, after: EntryId) -> list[WireEntry] | None:
        """The kept entries after ``after``; None when the feed does not hold them all
        (they are before its window, or were let go), so the caller reads the log."""
        if self.last_id[0] and after >= self.last_id:
            return []
        held = bool(self.recent) and after >= self.recent[0].id
        # Nothing let go yet, and ``after`` at or past the window's start: none missing.
        whole = len(self.recent) < RECENT_ENTRIES and after >= (self.started_seq - 1, WHOLE_SEQ)
        return [e for e in self.recent if e.id > after] if held or whole else None


def lag_seconds(entry: WireEntry) -> float:
    """How long ago the entry's event was stamped (the appender's clock)."""
    return max(0.0, time.time() - entry.at_us / 1e6)
