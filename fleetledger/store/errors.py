"""Errors of the durable log: opening a database, reading and writing it, and an append's
admission. Each names what was wrong and where (run, seq, field, shard)."""

from __future__ import annotations

from fleetledger.events.errors import LedgerError


class LedgerOpenError(LedgerError):
    """The database cannot be used as a ledger: unreachable, foreign, corrupted, or too new."""


class MigrationRequired(LedgerOpenError):
    """A shared (PostgreSQL) ledger is at an older schema revision; migrate it on purpose."""


class UnknownRevision(LedgerOpenError):
    """The database is at a schema revision this fleetledger does not know."""


class NoLedger(LedgerOpenError):
    """Nothing to read at the path or in the database (a read open never creates one)."""


class LedgerNotWritable(LedgerOpenError):
    """This process cannot write the ledger: a write open is refused, and so is a read
    open that SQLite could only do by creating files beside the ledger."""


class LedgerWriteError(LedgerError):
    """The database refused a write (read-only file, disk full, lost connection)."""


class LedgerReadError(LedgerError):
    """The database failed a read: a corrupted or truncated file, a lost connection."""


class BeforeTheRun(LedgerError):
    """A time asked of a run before its first event: a question with no answer, the
    asker's (HTTP: 400), not the ledger's fault."""


class AppendRejected(LedgerError):
    """An append was refused before anything was written; the log is unchanged."""

    def __init__(self, run: str, problem: str, *, index: int | None = None) -> None:
        where = f"run {run!r}" + (f", event #{index} of the batch" if index is not None else "")
        super().__init__(f"{where}: {problem}")
        self.run = run
        self.index = index
        self.problem = problem


class RunAlreadyEnded(AppendRejected):
    """The run ended (at ``ended_seq``): nothing may be appended after its ``run_ended``.
    A report that meets it is late, not failed (``adapters.late_reports``)."""

    def __init__(self, run: str, ended_seq: int) -> None:
        super().__init__(run, f"the run ended at seq {ended_seq}; nothing may be appended after it")
        self.ended_seq = ended_seq


class UnknownRun(AppendRejected):
    """The run has no ``run_started`` event in this ledger."""


class EventIdConflict(AppendRejected):
    """An event id the run already holds, appended again as a different event.

    The same id with the same content is a retry and returns the stored seq; an id
    names one event, so other content under it is refused, naming the id and the seq.
    """

    def __init__(
        self, run: str, event_id: str, stored_seq: int, stored_as: str, *, index: int | None
    ) -> None:
        super().__init__(
            run,
            f"event id {event_id} is already stored at seq {stored_seq} as {stored_as}; a "
            "retry must resend the same event, and a new event needs a new id",
            index=index,
        )
        self.event_id = event_id
        self.stored_seq = stored_seq


class ImportedIdTwice(AppendRejected):
    """An import's row at ``seq`` holds an id the run's row at ``first_seq`` holds: the
    import is refused whole (its transaction rolled back). The importer names the line."""

    def __init__(self, run: str, event_id: str, seq: int, first_seq: int) -> None:
        super().__init__(run, f"event id {event_id} at seq {seq} is also the id of seq {first_seq}")
        self.event_id = event_id
        self.seq = seq
        self.first_seq = first_seq


class RetryWithLookups(Exception):
    """The fast path met an already-stored id or a racing run start: redo with lookups.

    Internal to the log: it never leaves ``EventLog``.
    """
