"""PostgreSQL's SQL for the log, each statement beside the method that runs it on the
driver (psycopg 3, ``%s`` parameters).

Several processes, on several hosts, may append to one run, so an append locks the
run's row before it reads the head (``SELECT … FOR UPDATE``) and holds it until commit:
the seq it assigns is the head's successor when it commits, no two appenders assign the
same one, and commit order is seq order — a reader tailing ``seq > n`` never sees n+2
committed before n+1 and skips it. A PostgreSQL sequence would leave gaps on rollback.

Each append also notifies ``APPENDED_CHANNEL`` (delivered at commit, so only for what
committed): a follower in another process (``fleetledger serve``) is pushed the news
instead of polling for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetledger.store.statements import Conn, InsertRow

# The channel an append notifies on commit, with ``appended_payload`` as the payload.
APPENDED_CHANNEL = "fleetledger_appended"


def appended_payload(run: str, last_seq: int) -> str:
    """``"<last seq> <run id>"``: the seq first, so a run id holding spaces reads back."""
    return f"{last_seq} {run}"


def read_appended_payload(payload: str) -> tuple[str, int] | None:
    """(run, last seq) from a notification's payload; None for one this code did not send."""
    seq, _, run = payload.partition(" ")
    return (run, int(seq)) if seq.isdigit() and run else None


def _one(conn: Conn, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def _all(conn: Conn, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with conn.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


class PostgresStatements:
    """The log's statements on a PostgreSQL ledger (``store.statements.Statements``)."""

    def _locked(self, conn: Conn, run: str) -> bool:
        row = _one(conn, "SELECT run_id FROM fleetledger_runs WHERE run_id = %s FOR UPDATE", (run,))
        return row is not None

    def lock_run(self, conn: Conn, run: str) -> None:
        self._locked(conn, run)

    def last_event(self, conn: Conn, run: str, *, lock: bool) -> tuple[int, int, str] | None:
        if lock and not self._locked(conn, run):
            return None
        return _one(
            conn,
            "SELECT seq, at_us, type FROM fleetledger_events WHERE run_id = %s "
            "ORDER BY seq DESC LIMIT 1",
            (run,),
        )

    def insert_run(self, conn: Conn, run: str, at_us: int) -> None:
        with conn.cursor() as cursor:
            cursor.execute(
                "INSERT INTO fleetledger_runs (run_id, started_at_us) VALUES (%s, %s)",
                (run, at_us),
            )

    def insert_events(self, conn: Conn, rows: Sequence[InsertRow]) -> None:
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO fleetledger_events (run_id, seq, event_id, type, schema_version, "
                "at_us, payload) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
            if rows:
                # Sent when the append commits (never for one rolled back): followers that
                # LISTEN read the tail at once instead of at their next poll.
                run, last_seq = rows[-1][0], rows[-1][1]
                cursor.execute(
                    "SELECT pg_notify(%s, %s)", (APPENDED_CHANNEL, appended_payload(run, last_seq))
                )

    def insert_events_or_clash(self, conn: Conn, rows: Sequence[InsertRow]) -> bool:
        # psycopg is there whenever this runs (the connection is one of its), and is an
        # optional package this module's importers need not have.
        from psycopg import IntegrityError

        with conn.cursor() as cursor:
            cursor.execute("SAVEPOINT fleetledger_rows")
            try:
                self.insert_events(conn, rows)
            except IntegrityError:
                # The clash aborted the transaction: rolling back to the savepoint revives it.
                cursor.execute("ROLLBACK TO SAVEPOINT fleetledger_rows")
                cursor.execute("RELEASE SAVEPOINT fleetledger_rows")
                return False
            cursor.execute("RELEASE SAVEPOINT fleetledger_rows")
        return True

    def page(self, conn: Conn, run: str, lo: int, hi: int) -> list[Any]:
        return _all(
            conn,
            "SELECT seq, at_us, event_id, type, schema_version, payload FROM fleetledger_events "
            "WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq",
            (run, lo, hi),
        )

    def content_page(self, conn: Conn, run: str, lo: int, hi: int) -> list[Any]:
        return _all(
            conn,
            "SELECT at_us, type, schema_version, payload FROM fleetledger_events "
            "WHERE run_id = %s AND seq > %s AND seq <= %s ORDER BY seq",
            (run, lo, hi),
        )

    def time_of(self, conn: Conn, run: str, seq: int) -> int | None:
        row = _one(
            conn, "SELECT at_us FROM fleetledger_events WHERE run_id = %s AND seq = %s", (run, seq)
        )
        return None if row is None else int(row[0])

    def run_names(self, conn: Conn, limit: int) -> list[str]:
        rows = _all(conn, "SELECT run_id FROM fleetledger_runs ORDER BY run_id LIMIT %s", (limit,))
        return [name for (name,) in rows]

    def run_list(self, conn: Conn) -> list[tuple[str, int]]:
        return _all(
            conn,
            "SELECT run_id, started_at_us FROM fleetledger_runs ORDER BY started_at_us, run_id",
        )

    def event_ids(self, conn: Conn, run: str) -> list[tuple[int, str]]:
        return _all(conn, "SELECT seq, event_id FROM fleetledger_events WHERE run_id = %s", (run,))

    def count_events(self, conn: Conn) -> int:
        return int(_one(conn, "SELECT count(*) FROM fleetledger_events")[0])

    def database_identity(self, conn: Conn) -> str | None:
        # A database's oid is new when it is created again under the same name.
        oid = _one(conn, "SELECT oid FROM pg_database WHERE datname = current_database()")[0]
        return f"pg_database oid {oid}"

    def stored(self, conn: Conn, run: str, ids: Sequence[str]) -> list[Any]:
        # psycopg sends the ids as one array parameter, however many there are.
        return _all(
            conn,
            "SELECT event_id, seq, type, schema_version, payload FROM fleetledger_events "
            "WHERE run_id = %s AND event_id = ANY(%s)",
            (run, list(ids)),
        )

    def snapshot_exists(self, conn: Conn, run: str, version: int, seq: int) -> bool:
        row = _one(
            conn,
            "SELECT seq FROM fleetledger_snapshots "
            "WHERE run_id = %s AND projection_version = %s AND seq = %s",
            (run, version, seq),
        )
        return row is not None

    def insert_snapshot(self, conn: Conn, run: str, version: int, seq: int, payload: str) -> None:
        with conn.cursor() as cursor:
            cursor.execute(
                "INSERT INTO fleetledger_snapshots (run_id, projection_version, seq, payload) "
                "VALUES (%s, %s, %s, %s)",
                (run, version, seq, payload),
            )

    def load_snapshot(
        self, conn: Conn, run: str, version: int, at_most: int
    ) -> tuple[int, str] | None:
        row = _one(
            conn,
            "SELECT seq, payload FROM fleetledger_snapshots "
            "WHERE run_id = %s AND projection_version = %s AND seq <= %s "
            "ORDER BY seq DESC LIMIT 1",
            (run, version, at_most),
        )
        return None if row is None else (row[0], row[1])


POSTGRES = PostgresStatements()
