"""Errors of the event vocabulary and its formats, and ``LedgerError``, the base every
error of the log derives from (the store's own: ``fleetledger.store.errors``)."""

from __future__ import annotations

from fleetledger.errors import FleetledgerError


def first_line(exc: BaseException) -> str:
    """A driver error's first line: the part that says what happened, without the SQL."""
    cause = getattr(exc, "orig", None) or exc
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


class LedgerError(FleetledgerError):
    """The durable log refused or failed: the base of the log's own errors."""


class EventDecodeError(LedgerError):
    """A stored or imported event cannot be read: unknown type, future version, bad payload."""

    def __init__(self, run: str, seq: int | None, problem: str) -> None:
        where = f"run {run!r} seq {seq}" if seq is not None else f"run {run!r}"
        super().__init__(f"{where}: {problem}")
        self.run = run
        self.seq = seq
        self.problem = problem


class ImportFileError(LedgerError):
    """A line of an import file is invalid; nothing was written."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem
