"""What the log asks of a backend's SQL: one method per statement, run on the driver.

Every statement of the log runs on the driver's own cursor, not through SQLAlchemy
Core: per execution, Core spends more time building parameters and ``Row`` objects than
SQLite spends on the statement (a replay read 3.1 µs/row through Core, 1.0 µs/row
this way), and a read command that needs no Core starts without importing SQLAlchemy
at all (a third of its start-up).

Each backend writes its SQL once, as text in its driver's parameter style, beside the
method that runs it (``store.sqlite``, ``store.postgres``). Rows go in and come out as
plain tuples in the same column order on both, so the log never asks which backend it
has. ``tests/test_statements.py`` runs every method on both backends against the
tables Alembic created.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# The column order of ``insert_events``' rows (and of the tables' own definition).
INSERT_COLUMNS = ("run_id", "seq", "event_id", "type", "schema_version", "at_us", "payload")

# A connection of the database's driver (sqlite3, psycopg): every statement runs on one.
Conn = Any
# (run_id, seq, event_id, type, schema_version, at_us, payload): ``INSERT_COLUMNS``.
InsertRow = tuple[str, int, str, str, int, int, str]


class Statements(Protocol):
    """Every statement of the log, for one backend; ``conn`` is a driver connection in
    the transaction the caller holds (a read's, or an append's write transaction)."""

    def lock_run(self, conn: Conn, run: str) -> None:
        """Own the run's appends until the transaction ends (a no-op where the write
        transaction already admits one writer at a time)."""
        ...

    def last_event(self, conn: Conn, run: str, *, lock: bool) -> tuple[int, int, str] | None:
        """(seq, at_us, type) of the run's last event, None when there is no such run;
        with ``lock``, own the run's appends first (``lock_run``)."""
        ...

    def insert_run(self, conn: Conn, run: str, at_us: int) -> None: ...

    def insert_events(self, conn: Conn, rows: Sequence[InsertRow]) -> None:
        """Rows in ``INSERT_COLUMNS`` order, in one round of the driver (executemany)."""
        ...

    def insert_events_or_clash(self, conn: Conn, rows: Sequence[InsertRow]) -> bool:
        """``insert_events`` under a savepoint: False when a row clashes with a unique key
        (an id stored already, or twice in ``rows``), with none of ``rows`` written and
        the transaction still usable, so the caller can look up which row it was."""
        ...

    def page(self, conn: Conn, run: str, lo: int, hi: int) -> list[Any]:
        """The run's rows with ``lo < seq <= hi`` in seq order, as
        (seq, at_us, event_id, type, schema_version, payload)."""
        ...

    def content_page(self, conn: Conn, run: str, lo: int, hi: int) -> list[Any]:
        """``page`` without the ids, which a fold never reads, and without the seqs, which
        the range already says (the caller checks it got every row of it): two fifths
        less to fetch, as (at_us, type, schema_version, payload)."""
        ...

    def time_of(self, conn: Conn, run: str, seq: int) -> int | None:
        """The stored time of one seq: a primary-key point lookup."""
        ...

    def run_names(self, conn: Conn, limit: int) -> list[str]:
        """The first ``limit`` run ids by name (for an error that names them)."""
        ...

    def run_list(self, conn: Conn) -> list[tuple[str, int]]:
        """Every run as (run_id, started_at_us), oldest first."""
        ...

    def event_ids(self, conn: Conn, run: str) -> list[tuple[int, str]]: ...

    def count_events(self, conn: Conn) -> int: ...

    def database_identity(self, conn: Conn) -> str | None:
        """Which database this is beyond its URL (None: the backend's file says it):
        one dropped and created again under the same name is another."""
        ...

    def stored(self, conn: Conn, run: str, ids: Sequence[str]) -> list[Any]:
        """The run's rows holding one of ``ids``, as (event_id, seq, type, schema_version,
        payload), in no order."""
        ...

    def snapshot_exists(self, conn: Conn, run: str, version: int, seq: int) -> bool: ...

    def insert_snapshot(
        self, conn: Conn, run: str, version: int, seq: int, payload: str
    ) -> None: ...

    def load_snapshot(
        self, conn: Conn, run: str, version: int, at_most: int
    ) -> tuple[int, str] | None:
        """(seq, payload) of the newest snapshot of ``version`` at or before ``at_most``."""
        ...
