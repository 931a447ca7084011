"""Errors of the durable log. Each names what was wrong and where (run, seq, field, shard)."""

from __future__ import annotations

from fleetledger.errors import FleetledgerError


def first_line(exc: BaseException) -> str:
    """A driver error's first line: the part that says what happened, without the SQL."""
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


class LedgerError(FleetledgerError):
    """The durable log refused or failed: the base of the log's own errors."""


class LedgerOpenError(LedgerError):
    """The database cannot be used as a ledger: unreachable, foreign, corrupted, or too new."""


class MigrationRequired(LedgerOpenError):
    """A shared (PostgreSQL) ledger is at an older schema revision; migrate it on purpose."""


class UnknownRevision(LedgerOpenError):
    """The database is at a schema revision this fleetledger does not know."""


class LedgerWriteError(LedgerError):
    """The database refused a write (read-only file, disk full, lost connection)."""


class LedgerReadError(LedgerError):
    """The database failed a read: a corrupted or truncated file, a lost connection."""


class EventDecodeError(LedgerError):
    """A stored or imported event cannot be read: unknown type, future version, bad payload."""

    def __init__(self, run: str, seq: int | None, problem: str) -> None:
        where = f"run {run!r} seq {seq}" if seq is not None else f"run {run!r}"
        super().__init__(f"{where}: {problem}")
        self.run = run
        self.seq = seq
        self.problem = problem


class AppendRejected(LedgerError):
    """An append was refused before anything was written; the log is unchanged."""

    def __init__(self, run: str, problem: str, *, index: int | None = None) -> None:
        where = f"run {run!r}" + (f", event #{index} of the batch" if index is not None else "")
        super().__init__(f"{where}: {problem}")
        self.run = run
        self.index = index
        self.problem = problem


class UnknownRun(AppendRejected):
    """The run has no ``run_started`` event in this ledger."""


class ImportFileError(LedgerError):
    """A line of an import file is invalid; nothing was written."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem
