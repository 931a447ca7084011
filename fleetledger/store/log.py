"""The durable, ordered event log of every run, in SQLite or PostgreSQL.

Guarantees, and how each is kept:

- **Durable when it returns.** An append is one transaction; it returns only after
  COMMIT, which on SQLite runs with ``synchronous=FULL`` in WAL mode and on PostgreSQL
  with its default ``synchronous_commit=on``. A process killed mid-append leaves the
  transaction uncommitted: the log holds every committed event and no part of another.
- **One gap-free total order per run.** The seq is assigned inside the appending
  transaction from the run's head row, which the appender holds exclusively: on
  PostgreSQL by ``SELECT … FOR UPDATE`` on that row, on SQLite by ``BEGIN IMMEDIATE``
  (one writer at a time). A PostgreSQL sequence would leave gaps on rollback. Because
  the lock is held until commit, commit order equals seq order, so a reader tailing
  ``seq > n`` can never see seq n+2 before n+1 and skip it.
- **Idempotent appends.** Every event carries a unique id; appending an id the run
  already holds, as the same event, returns the stored seq and writes nothing, so a
  retry after an ambiguous failure (a lost connection at COMMIT) does not duplicate.
  The same id as another event is refused (``EventIdConflict``): its seq is not this
  event's, and saying it is would lose the event.
- **Nothing invalid is written.** A batch is checked whole before its first insert: the
  run must exist (or the batch must start it), shards must be in range, nothing may
  follow ``run_ended``. A refused batch leaves the log unchanged.

Every statement runs on the driver's cursor, written once per backend beside the code
that runs it (``store.sqlite``, ``store.postgres``: ``statements``); SQLAlchemy holds the
write transactions and PostgreSQL's pool, and is imported only by an open that has an
engine: a read of a SQLite ledger never loads it.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from fleetledger.events.codec import NOT_IN_PAYLOAD, EventCodec, StoredRow
from fleetledger.events.errors import EventDecodeError, LedgerError
from fleetledger.events.models import (
    Event,
    FleetConfig,
    RecordedEvent,
    RunEnded,
    RunStarted,
    iso_at,
)
from fleetledger.store.batch_rules import check_batch, refuse_ids
from fleetledger.store.database import Database, OpenMode, open_database
from fleetledger.store.errors import (
    AppendRejected,
    BeforeTheRun,
    EventIdConflict,
    ImportedIdTwice,
    LedgerWriteError,
    RetryWithLookups,
    UnknownRun,
)
from fleetledger.store.import_spool import RowSpool
from fleetledger.store.records import RunHead, RunSummary, check_run_id
from fleetledger.store.statements import Conn, InsertRow
from fleetledger.store.urls import sqlite_path

if TYPE_CHECKING:
    from fleetledger.events.jsonl import ImportRow
    from fleetledger.store.write_connections import WriteConnections

# Reads one page of rows, ``lo < seq <= hi``: ``Statements.page`` or ``content_page``.
PageReader = Callable[[Conn, str, int, int], list[Any]]
T = TypeVar("T")
READ_PAGE = 20_000
DECODE_PAGE = 64
"""Rows decoded at a time when reading. Story: the structure change took the garbage
collector's pause out of the library's read (it paused collection for every thread of a
live controller), and a replay of a million events slowed by a third: a 20,000-row page
decoded at once (three tracked objects an event: the event, its field dict, the recorded
tuple) outlived the young collections, so every page was promoted to the oldest
generation and each full collection walked it. Measured on the bench's million-event run
(``fold(log.read(run))``, best of 3, with the codec caching repeated payloads only):
20,000 rows a page 4.97 s, 1,024 4.31 s, 256 3.80 s, 64 3.20 s; with collection off
3.13 s. A page of 64 is folded before a young collection promotes it."""
# The most payload text an import writes per statement (a page of rows is held while the
# driver runs it; 20,000 rows of a 256-shard fleet's rounds would be 22 MB).
IMPORT_PAGE_BYTES = 4 << 20
# Ids looked up per statement: well under SQLite's bind-parameter limit (one ``?`` each;
# PostgreSQL takes them as one array).
LOOKUP_CHUNK = 10_000
RUN_ENDED = RunEnded.model_fields["type"].default
# Above every seq: a BIGINT's largest value.
SEQ_LIMIT = 2**63 - 1
# The runs an unknown run's error names, first by name.
RUNS_NAMED = 20


def wall_clock_us() -> int:
    return time.time_ns() // 1_000


class _Encoded(NamedTuple):
    event: Event
    type: str
    version: int
    payload: str


class _Head(NamedTuple):
    """The run's last event: its seq, its time, and whether it ended the run."""

    seq: int
    at_us: int
    ended: bool


class EventLog:
    """Append, read and list runs in one ledger database."""

    def __init__(
        self,
        database: Database,
        *,
        codec: EventCodec | None = None,
        clock_us: Callable[[], int] = wall_clock_us,
    ) -> None:
        self.database = database
        self.codec = codec or EventCodec()
        self._clock_us = clock_us
        self._configs: dict[str, FleetConfig] = {}
        self._sql = database.statements()
        # ``EventCodec.encode`` for each registered class, looked up once per event.
        self._by_class = {
            cls: (name, cls.SCHEMA_VERSION, cls.__pydantic_serializer__)
            for name, cls in self.codec.types.items()
        }
        # The head each run had after this log's last committed append to it.
        self._heads: dict[str, _Head] = {}
        self._writes: WriteConnections | None = None
        self._writes_lock = threading.Lock()

    def _transact(self, body: Callable[[Conn], T]) -> T:
        """``body`` in one write transaction (``WriteConnections.transact``).

        The write connections are built by the first write, once, whichever thread it
        comes from: a log that only reads never imports SQLAlchemy.
        """
        writes = self._writes
        if writes is None:
            with self._writes_lock:
                if self._writes is None:
                    # A log that only reads never loads SQLAlchemy, which this imports.
                    from fleetledger.store.write_connections import WriteConnections  # SQLAlchemy

                    self._writes = WriteConnections(self.database)
                writes = self._writes
        return writes.transact(body)

    @classmethod
    def open(cls, url: str | None = None, *, mode: OpenMode = "write", **kwargs: Any) -> EventLog:
        """Open the ledger at ``url``: ``mode="read"`` never creates, upgrades or writes it
        (its appends fail), ``"write"`` may create or upgrade a SQLite ledger."""
        return cls(open_database(url, mode=mode), **kwargs)

    def close(self) -> None:
        if self._writes is not None:
            self._writes.close()
        self.database.dispose()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── append ────────────────────────────────────────────────────────────────

    def append(self, run: str, batch: Sequence[Event]) -> list[int]:
        """Append ``batch`` to ``run`` in one transaction; returns each event's seq.

        Events whose id the run already holds are not written again: their stored seq
        is returned (an id held as another event raises :class:`EventIdConflict`).
        Raises :class:`AppendRejected` (nothing written) for invalid input
        and :class:`LedgerWriteError` when the database refuses the write.
        """
        check_run_id(run)
        if not batch:
            return []
        encoded = self._encode(run, batch)
        try:
            return self._remember(
                run,
                self._transact(lambda conn: self._append_in(conn, run, encoded, lookup=False)),
            )
        except RetryWithLookups:
            pass
        except BaseException:
            self._heads.pop(run, None)
            raise
        # Slow path: some ids may be stored already, or another process started the run
        # between our read and our insert. Each retry sees strictly more committed state.
        for _ in range(3):
            self._heads.pop(run, None)
            try:
                return self._remember(
                    run,
                    self._transact(lambda conn: self._append_in(conn, run, encoded, lookup=True)),
                )
            except RetryWithLookups:
                continue
            except BaseException:
                self._heads.pop(run, None)
                raise
        raise LedgerWriteError(
            f"{self.database.display_url}: run {run!r}: the append kept conflicting with "
            "concurrent writers; nothing was written"
        )

    def _remember(self, run: str, outcome: tuple[list[int], _Head | None]) -> list[int]:
        """Keep the head a committed append left, so the next one need not read it.

        A stale memory is harmless: if another process appended meanwhile, seq head+1
        exists, the (run_id, seq) primary key refuses our insert, and the append is
        redone from a fresh read of the head (the slow path).
        """
        seqs, head = outcome
        if head is not None:
            self._heads[run] = head
        return seqs

    def _encode(self, run: str, batch: Sequence[Event]) -> list[_Encoded]:
        """Each event with its stored type, version and payload, in batch order.

        An append's hot path: an event of a registered class costs one lookup of its
        class (its type, version and serializer) and one serialization; anything else
        (a subclass, a non-event) goes through the codec, which says what is wrong.
        """
        by_class = self._by_class
        make = tuple.__new__  # _Encoded's own __new__ is a Python function
        out: list[_Encoded] = []
        append = out.append
        for index, event in enumerate(batch):
            spec = by_class.get(type(event))
            # An event whose ``type`` was changed behind its model (``model_copy`` with an
            # update, ``model_construct``) is not its class's: the codec refuses it.
            if spec is not None and event.type == spec[0]:
                type_, version, serializer = spec
                payload = serializer.to_json(event, exclude=NOT_IN_PAYLOAD).decode()
                append(make(_Encoded, (event, type_, version, payload)))
                continue
            if not isinstance(event, Event):
                refuse_ids(run, [e.event for e in out])  # refusals in batch order
                raise AppendRejected(run, f"{type(event).__name__} is not an event", index=index)
            try:
                type_, version, payload = self.codec.encode(event)
            except TypeError as exc:
                refuse_ids(run, [e.event for e in out])
                raise AppendRejected(run, str(exc), index=index) from None
            append(make(_Encoded, (event, type_, version, payload)))
        ids = [e.event.id for e in out]
        if len(set(ids)) != len(ids) or not all(ids):
            refuse_ids(run, [e.event for e in out])
        return out

    def _cached_head(self, conn: Conn, run: str) -> _Head | None:
        """The head this log last wrote to ``run``, with the run locked (PostgreSQL)."""
        head = self._heads.get(run)
        if head is None:
            return None
        self._sql.lock_run(conn, run)
        return head

    def _head(self, conn: Conn, run: str, *, lock: bool) -> _Head | None:
        """The run's last event (None: no such run); with ``lock``, own the run's appends."""
        row = self._sql.last_event(conn, run, lock=lock)
        return None if row is None else _Head(row[0], row[1], row[2] == RUN_ENDED)

    def _append_in(
        self, conn: Conn, run: str, encoded: list[_Encoded], *, lookup: bool
    ) -> tuple[list[int], _Head | None]:
        """Returns the seqs, and the run's new head if anything was written."""
        head = self._cached_head(conn, run) if not lookup else None
        if head is None:
            head = self._head(conn, run, lock=True)
        stored = self._stored_seqs(conn, run, encoded) if lookup and head is not None else {}
        fresh = [e for e in encoded if e.event.id not in stored] if stored else encoded
        if not fresh:
            return [stored[e.event.id] for e in encoded], None
        try:
            check_batch(
                run,
                [e.event for e in fresh],
                head=None if head is None else (head.seq, head.ended),
                config=lambda: self._config_in(conn, run),
            )
        except AppendRejected:
            if lookup:
                raise
            raise RetryWithLookups() from None  # maybe a retried batch: look its ids up first
        # Time lives in events: stamps never go backwards within a run, whatever the
        # clocks of the processes appending to it say.
        now = max(self._clock_us(), head.at_us if head else 0)
        first = (head.seq if head else 0) + 1
        rows = [
            (run, first + i, e.event.id, e.type, e.version, now, e.payload)
            for i, e in enumerate(fresh)
        ]
        if head is None:
            self._sql.insert_run(conn, run, now)
        self._sql.insert_events(conn, rows)
        last = first + len(fresh) - 1
        new_head = _Head(last, now, isinstance(fresh[-1].event, RunEnded))
        if not stored:
            return list(range(first, first + len(fresh))), new_head
        assigned = {e.event.id: first + i for i, e in enumerate(fresh)}
        return [stored.get(e.event.id) or assigned[e.event.id] for e in encoded], new_head

    def _stored_seqs(self, conn: Conn, run: str, encoded: list[_Encoded]) -> dict[str, int]:
        """The seq of each id of the batch the run already holds (a retry's events).

        An id held as another event (another type, another payload) is refused, naming
        the id and its seq: returning that seq would tell the caller its event is stored.
        """
        index = {e.event.id: i for i, e in enumerate(encoded)}
        ids, stored = list(index), {}
        for at in range(0, len(ids), LOOKUP_CHUNK):
            rows = self._sql.stored(conn, run, ids[at : at + LOOKUP_CHUNK])
            for event_id, seq, type_, version, payload in rows:
                i = index[event_id]
                differs = self.codec.difference(run, seq, type_, version, payload, encoded[i].event)
                if differs is not None:
                    raise EventIdConflict(run, event_id, seq, differs, index=i)
                stored[event_id] = seq
        return stored

    def _config_in(self, conn: Conn, run: str) -> FleetConfig:
        config = self._configs.get(run)
        if config is None:
            rows = self._sql.page(conn, run, 0, 1)
            if not rows:
                raise LedgerError(f"run {run!r} has a head but no seq 1: the ledger is damaged")
            _seq, _at_us, event_id, type_, version, payload = rows[0]
            started = self.codec.decode(run, 1, type_, version, payload, event_id)
            if not isinstance(started, RunStarted):
                raise EventDecodeError(run, 1, f"the first event is {type_!r}, not run_started")
            config = self._configs[run] = started.config
        return config

    # ── read ─────────────────────────────────────────────────────────────────

    def config(self, run: str) -> FleetConfig:
        with self.database.reading() as conn:
            self._require_run(conn, run)
            return self._config_in(conn, run)

    def run_head(self, run: str) -> RunHead:
        """The run's head and configuration in one read (an unknown run is an error)."""
        with self.database.reading() as conn:
            head = self._require_run(conn, run)
            return RunHead(run, head.seq, head.at_us, head.ended, self._config_in(conn, run))

    def head(self, run: str) -> int:
        with self.database.reading() as conn:
            return self._require_run(conn, run).seq

    def _require_run(self, conn: Conn, run: str) -> _Head:
        head = self._head(conn, run, lock=False)
        if head is None:
            listed = ", ".join(self._sql.run_names(conn, RUNS_NAMED)) or "none"
            raise UnknownRun(run, f"no run {run!r} in {self.database.display_url} (runs: {listed})")
        return head

    def read_stored(
        self, run: str, after_seq: int = 0, to_seq: int | None = None
    ) -> Iterator[list[StoredRow]]:
        for _after, page in self._read_rows(self._sql.page, run, after_seq, to_seq):
            yield page

    def _read_rows(
        self, read_page: PageReader, run: str, after_seq: int, to_seq: int | None
    ) -> Iterator[tuple[int, list[Any]]]:
        """Stored rows of ``run`` with ``after_seq < seq <= to_seq``, in pages, undecoded,
        each with the seq it follows: a page holds every seq of its range, in order, or
        it is damage (``_short_page``), so row i of a page is seq ``after + 1 + i``.

        Rows are plain tuples, ``StoredRow`` or ``ContentRow`` as ``read_page`` reads;
        seqs are immutable once committed, so pages read in separate reads still form
        one consistent prefix of the run.

        Each page is its own read: nothing is held while the caller works on a page
        (``export | less``). A read held open across pages would keep a WAL from being
        checkpointed past it, and on a ledger in rollback-journal mode would lock out
        every writer, this log's own included, until the caller finished.
        """
        # A caller that names ``to_seq`` knows the head already (a reader looks it up
        # once per command): the head is looked up only if the rows stop short of it.
        if to_seq is None:
            with self.database.reading() as conn:
                last = self._require_run(conn, run).seq
        else:
            last = to_seq
        lo = after_seq
        while lo < last:
            hi = min(lo + READ_PAGE, last)
            with self.database.reading() as conn:
                page = read_page(conn, run, lo, hi)
            if len(page) != hi - lo:
                page, last = self._short_page(read_page, run, lo, hi, page, to_seq)
            if page:
                yield lo, page
            lo = hi

    def _short_page(
        self,
        read_page: PageReader,
        run: str,
        lo: int,
        hi: int,
        page: list[Any],
        to_seq: int | None,
    ) -> tuple[list[Any], int]:
        """A page with fewer rows than its bounds ask: past the head, or damage.

        Without ``to_seq`` the head was looked up before reading, so any missing row is
        damage. With it, the bound may lie past the head (the read then ends at the
        head, as a read past the head always has), or rows may have been committed
        since the page was read: the head decides, and the page is read once more up
        to it, in the same read as the head (one snapshot holds both). Rows still
        missing below the head are damage, never a shorter run.
        """
        if to_seq is not None:
            with self.database.reading() as conn:
                head = self._require_run(conn, run).seq  # an unknown run is an error
                end = max(lo, min(hi, head))
                if len(page) != end - lo:
                    page = read_page(conn, run, lo, end)
            if len(page) == end - lo:
                return page, min(to_seq, head)
        raise LedgerError(
            f"run {run!r}: expected seqs {lo + 1}..{hi}, found {len(page)} rows; "
            "the ledger is damaged"
        )

    def read(
        self, run: str, after_seq: int = 0, to_seq: int | None = None
    ) -> Iterator[RecordedEvent]:
        """Decoded events of ``run`` after ``after_seq`` (up to ``to_seq``), in seq order."""
        for page in self.read_pages(run, after_seq, to_seq):
            yield from page

    def read_pages(
        self, run: str, after_seq: int = 0, to_seq: int | None = None, *, ids: bool = True
    ) -> Iterator[Sequence[RecordedEvent]]:
        """``read`` a page at a time; ``ids=False``: for a fold, events without their ids,
        one shared event per repeated payload (``EventCodec.decode_contents``).

        Rows are fetched ``READ_PAGE`` at a time and decoded ``DECODE_PAGE`` at a time (the
        pages yielded): a decoded event is garbage once its page is consumed, and a small
        page is consumed before the collector's young generations promote it."""
        if ids:
            decode_rows = self.codec.decode_rows
            for rows in self.read_stored(run, after_seq, to_seq):
                for start in range(0, len(rows), DECODE_PAGE):
                    yield decode_rows(run, rows[start : start + DECODE_PAGE])
            return
        decode_contents = self.codec.decode_contents
        for after, rows in self._read_rows(self._sql.content_page, run, after_seq, to_seq):
            for start in range(0, len(rows), DECODE_PAGE):
                yield decode_contents(run, after + 1 + start, rows[start : start + DECODE_PAGE])

    def seq_at(self, run: str, at_us: int, *, head: RunHead | None = None) -> int:
        """The last seq of ``run`` whose stored time is at or before ``at_us``.

        What "the fleet at 10:25:43" means: every event recorded by then, none after.
        Stamps never go backwards within a run (the appender takes the later of its
        clock and the head's time), so the times are sorted by seq and a bisection over
        seqs finds the answer in O(log n) primary-key lookups — no index on time, and
        no scan of a million-event run. A time before the run's first event has no
        answer: the error names the run and when it began.
        """
        stored_time = self._sql.time_of
        with self.database.reading() as conn:
            last = self._require_run(conn, run) if head is None else head
            if at_us >= last.at_us:
                return last.seq

            def time_of(seq: int) -> int:
                at = stored_time(conn, run, seq)
                if at is None:
                    raise LedgerError(
                        f"run {run!r} has a head at seq {last.seq} but no seq {seq}: "
                        "the ledger is damaged"
                    )
                return at

            first_at = time_of(1)
            if at_us < first_at:
                raise BeforeTheRun(
                    f"run {run!r} began at {iso_at(first_at)} (seq 1); "
                    f"{iso_at(at_us)} is before its first event"
                )
            # Invariant: time_of(lo) <= at_us < time_of(hi).
            lo, hi = 1, last.seq
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if time_of(mid) <= at_us:
                    lo = mid
                else:
                    hi = mid
            return lo

    def event_ids(self, run: str) -> dict[int, str]:
        with self.database.reading() as conn:
            self._require_run(conn, run)
            rows = self._sql.event_ids(conn, run)
        return dict(rows)

    def runs(self) -> list[RunSummary]:
        """Every run, oldest first, with its head (one index lookup per run)."""
        with self.database.reading() as conn:
            listed = self._sql.run_list(conn)
            out = []
            for run_id, started_at_us in listed:
                head = self._head(conn, run_id, lock=False)
                if head is None:
                    raise LedgerError(f"run {run_id!r} is listed but has no events: damaged")
                out.append(RunSummary(run_id, head.seq, started_at_us, head.at_us, head.ended))
            return out

    def count_events(self) -> int:
        with self.database.reading() as conn:
            return self._sql.count_events(conn)

    def database_identity(self) -> str | None:
        """Which database this is beyond its URL (None on SQLite: its file says it)."""
        with self.database.reading() as conn:
            return self._sql.database_identity(conn)

    # ── import ───────────────────────────────────────────────────────────────

    def import_run(self, run: str, rows: Iterable[ImportRow]) -> int:
        """Write a run whole from its checked rows, keeping ids, times and versions;
        returns how many were written.

        ``rows`` may be checked as they are pulled (an import file read line by line), and
        memory holds one page of them however long the run: on PostgreSQL they are
        written a page at a time inside one transaction, and anything raised while
        pulling them (a refused line) rolls the whole import back; on SQLite, which
        admits one writer at a time, they are pulled into a spool on disk first, so the
        write lock is held only to insert (``import_spool``). An id on two rows is found
        by the database's unique key (or within a page) and refused as
        :class:`ImportedIdTwice` naming both seqs.
        """
        check_run_id(run)
        if self.database.backend == "sqlite":
            # One writer at a time: the rows are checked into a spool before the write
            # lock is taken, so the transaction holds it only to insert (import_spool).
            self._refuse_existing(run)
            with RowSpool(sqlite_path(self.database.url).parent) as spool:
                spool.fill(rows)
                return self._write_import(run, spool.rows())
        return self._write_import(run, rows)

    def _refuse_existing(self, run: str) -> None:
        with self.database.reading() as conn:
            if self._head(conn, run, lock=False) is not None:
                raise _imported_over(run)

    def _write_import(self, run: str, rows: Iterable[ImportRow]) -> int:
        sql = self._sql

        def body(conn: Conn) -> int:
            if self._head(conn, run, lock=True) is not None:
                raise _imported_over(run)
            pulled = iter(rows)
            first = next(pulled, None)
            if first is None:
                raise AppendRejected(run, "nothing to import")
            sql.insert_run(conn, run, first.at_us)
            written = 0
            for page in _import_pages(run, itertools.chain((first,), pulled)):
                if not sql.insert_events_or_clash(conn, page):
                    raise self._id_twice(conn, run, page)
                written += len(page)
            return written

        try:
            return self._transact(body)
        except RetryWithLookups:
            raise AppendRejected(
                run, f"run {run!r} was created by another process during the import"
            ) from None

    def _id_twice(self, conn: Conn, run: str, page: list[InsertRow]) -> ImportedIdTwice:
        """The first row of ``page`` (which the unique key refused) whose id an earlier
        row holds: one written by an earlier page, or one before it in this page."""
        ids = [row[2] for row in page]
        stored: dict[str, int] = {}
        for at in range(0, len(ids), LOOKUP_CHUNK):
            for event_id, seq, *_rest in self._sql.stored(conn, run, ids[at : at + LOOKUP_CHUNK]):
                stored[event_id] = seq
        for _run, seq, event_id, *_rest in page:
            first_seq = stored.setdefault(event_id, seq)
            if first_seq != seq:
                return ImportedIdTwice(run, event_id, seq, first_seq)
        raise LedgerError(f"run {run!r}: the database refused an import page, yet no id repeats")

    # ── snapshots ────────────────────────────────────────────────────────────

    def save_snapshot(self, run: str, projection_version: int, seq: int, payload: str) -> None:
        sql = self._sql

        def body(conn: Conn) -> list[int]:
            head = self._head(conn, run, lock=True)
            if head is None or seq > head.seq or seq < 1:
                raise AppendRejected(run, f"cannot snapshot at seq {seq}: not in the log")
            if not sql.snapshot_exists(conn, run, projection_version, seq):
                sql.insert_snapshot(conn, run, projection_version, seq, payload)
            return []

        try:
            self._transact(body)
        except RetryWithLookups:
            pass  # another process stored the same snapshot first: same seq, same content

    def load_snapshot(
        self, run: str, projection_version: int, at_most_seq: int | None = None
    ) -> tuple[int, str] | None:
        """The newest snapshot of this projection version at or before ``at_most_seq``."""
        at_most = SEQ_LIMIT if at_most_seq is None else at_most_seq
        with self.database.reading() as conn:
            return self._sql.load_snapshot(conn, run, projection_version, at_most)


def _imported_over(run: str) -> AppendRejected:
    return AppendRejected(
        run, f"run {run!r} already exists here; import it under another name with --run"
    )


def _import_pages(run: str, rows: Iterable[ImportRow]) -> Iterator[list[InsertRow]]:
    """Insert rows in pages of at most ``READ_PAGE`` rows and ``IMPORT_PAGE_BYTES`` of
    payload: the driver's parameters for a whole run would hold the run in memory."""
    page: list[InsertRow] = []
    size = 0
    in_page: dict[str, int] = {}  # an id twice in one page is found before its insert
    for r in rows:
        first_seq = in_page.setdefault(r.event_id, r.seq)
        if first_seq != r.seq:
            if page:  # its rows go first: one of them may repeat an earlier page's id
                yield page
            raise ImportedIdTwice(run, r.event_id, r.seq, first_seq)
        page.append((run, r.seq, r.event_id, r.type, r.schema_version, r.at_us, r.payload))
        size += len(r.payload)
        if len(page) >= READ_PAGE or size >= IMPORT_PAGE_BYTES:
            yield page
            page, size = [], 0
            in_page.clear()
    if page:
        yield page
