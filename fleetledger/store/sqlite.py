"""SQLite's SQL for the log, each statement beside the method that runs it on the
standard library's driver (``sqlite3``, ``?`` parameters).

Written as text, not compiled from SQLAlchemy Core: a read of a SQLite ledger imports no
SQLAlchemy (it was a third of a read command's start-up). Ordering lives in the write
transaction, not here: an append's transaction begins with ``BEGIN IMMEDIATE``
(``sqlite_engine``), which admits one writer to the whole database at a time, so the
seq an append reads from the run's last event is still the last when it commits — and
commit order is seq order, which is what lets a reader tailing ``seq > n`` never skip.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from fleetledger.store.statements import InsertRow


class SqliteStatements:
    """The log's statements on a SQLite ledger (``store.statements.Statements``)."""

    def lock_run(self, conn: sqlite3.Connection, run: str) -> None:
        """Nothing to run: ``BEGIN IMMEDIATE`` already holds the database's write lock."""

    def last_event(
        self, conn: sqlite3.Connection, run: str, *, lock: bool
    ) -> tuple[int, int, str] | None:
        # The last row of the (run_id, seq) primary key: one index probe.
        return conn.execute(
            "SELECT seq, at_us, type FROM fleetledger_events WHERE run_id = ? "
            "ORDER BY seq DESC LIMIT 1",
            (run,),
        ).fetchone()

    def insert_run(self, conn: sqlite3.Connection, run: str, at_us: int) -> None:
        conn.execute(
            "INSERT INTO fleetledger_runs (run_id, started_at_us) VALUES (?, ?)", (run, at_us)
        )

    def insert_events(self, conn: sqlite3.Connection, rows: Sequence[InsertRow]) -> None:
        conn.executemany(
            "INSERT INTO fleetledger_events (run_id, seq, event_id, type, schema_version, "
            "at_us, payload) VALUES (?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    def insert_events_or_clash(self, conn: sqlite3.Connection, rows: Sequence[InsertRow]) -> bool:
        conn.execute("SAVEPOINT fleetledger_rows")
        try:
            self.insert_events(conn, rows)
        except sqlite3.IntegrityError:
            conn.execute("ROLLBACK TO fleetledger_rows")
            conn.execute("RELEASE fleetledger_rows")
            return False
        conn.execute("RELEASE fleetledger_rows")
        return True

    def page(self, conn: sqlite3.Connection, run: str, lo: int, hi: int) -> list[Any]:
        # A range of the (run_id, seq) primary key.
        return conn.execute(
            "SELECT seq, at_us, event_id, type, schema_version, payload FROM fleetledger_events "
            "WHERE run_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
            (run, lo, hi),
        ).fetchall()

    def content_page(self, conn: sqlite3.Connection, run: str, lo: int, hi: int) -> list[Any]:
        return conn.execute(
            "SELECT at_us, type, schema_version, payload FROM fleetledger_events "
            "WHERE run_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
            (run, lo, hi),
        ).fetchall()

    def time_of(self, conn: sqlite3.Connection, run: str, seq: int) -> int | None:
        row = conn.execute(
            "SELECT at_us FROM fleetledger_events WHERE run_id = ? AND seq = ?", (run, seq)
        ).fetchone()
        return None if row is None else int(row[0])

    def run_names(self, conn: sqlite3.Connection, limit: int) -> list[str]:
        rows = conn.execute(
            "SELECT run_id FROM fleetledger_runs ORDER BY run_id LIMIT ?", (limit,)
        ).fetchall()
        return [name for (name,) in rows]

    def run_list(self, conn: sqlite3.Connection) -> list[tuple[str, int]]:
        return conn.execute(
            "SELECT run_id, started_at_us FROM fleetledger_runs ORDER BY started_at_us, run_id"
        ).fetchall()

    def event_ids(self, conn: sqlite3.Connection, run: str) -> list[tuple[int, str]]:
        return conn.execute(
            "SELECT seq, event_id FROM fleetledger_events WHERE run_id = ?", (run,)
        ).fetchall()

    def count_events(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute("SELECT count(*) FROM fleetledger_events").fetchone()[0])

    def database_identity(self, conn: sqlite3.Connection) -> str | None:
        return None  # the file's (device, inode) says it, without a query

    def stored(self, conn: sqlite3.Connection, run: str, ids: Sequence[str]) -> list[Any]:
        # One ``?`` per id: the caller keeps a call's ids well under SQLite's bind limit.
        listed = ", ".join("?" * len(ids))
        return conn.execute(
            "SELECT event_id, seq, type, schema_version, payload FROM fleetledger_events "
            f"WHERE run_id = ? AND event_id IN ({listed})",
            (run, *ids),
        ).fetchall()

    def snapshot_exists(self, conn: sqlite3.Connection, run: str, version: int, seq: int) -> bool:
        row = conn.execute(
            "SELECT seq FROM fleetledger_snapshots "
            "WHERE run_id = ? AND projection_version = ? AND seq = ?",
            (run, version, seq),
        ).fetchone()
        return row is not None

    def insert_snapshot(
        self, conn: sqlite3.Connection, run: str, version: int, seq: int, payload: str
    ) -> None:
        conn.execute(
            "INSERT INTO fleetledger_snapshots (run_id, projection_version, seq, payload) "
            "VALUES (?, ?, ?, ?)",
            (run, version, seq, payload),
        )

    def load_snapshot(
        self, conn: sqlite3.Connection, run: str, version: int, at_most: int
    ) -> tuple[int, str] | None:
        row = conn.execute(
            "SELECT seq, payload FROM fleetledger_snapshots "
            "WHERE run_id = ? AND projection_version = ? AND seq <= ? "
            "ORDER BY seq DESC LIMIT 1",
            (run, version, at_most),
        ).fetchone()
        return None if row is None else (row[0], row[1])


SQLITE = SqliteStatements()
