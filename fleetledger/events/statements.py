"""The log's hot-path SQL: Core statements compiled once per dialect, run on the driver.

Appending and replaying are the log's hot paths, and per execution Core spends more
time building parameters and ``Row`` objects than SQLite spends on the statement (a
replay read 3.1 µs/row through Core, 1.0 µs/row this way). The SQL is still Core's:
compiled from the table objects, in the dialect's own parameter style.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, bindparam, insert, select

from fleetledger.events.schema import events, runs


class DriverStatement:
    """A Core statement compiled once for the engine's dialect, run on the driver cursor.

    Appending and replaying are the log's hot paths, and per execution Core spends more
    time building parameters and ``Row`` objects than SQLite spends on the statement
    (a replay read 3.1 µs/row through Core, 1.0 µs/row this way). The SQL is still
    Core's: compiled from the table objects, in the dialect's own parameter style.
    """

    def __init__(self, statement: Any, dialect: Any) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.order: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positional else None
        )
        # Values Core bound itself, e.g. LIMIT 1.
        self._defaults = {
            name: bind.value for name, bind in compiled.binds.items() if bind.value is not None
        }

    def params(self, **values: Any) -> tuple[Any, ...] | dict[str, Any]:
        merged = {**self._defaults, **values}
        return merged if self.order is None else tuple(merged[k] for k in self.order)


INSERT_COLUMNS = ("run_id", "seq", "event_id", "type", "schema_version", "at_us", "payload")


def _page_of(*id_column: Any) -> Any:
    """One page of a run's rows in seq order, ``(lo, hi]``: seq, stamp, the id when
    asked for (``id_column``), type, version, payload."""
    return (
        select(
            events.c.seq,
            events.c.at_us,
            *id_column,
            events.c.type,
            events.c.schema_version,
            events.c.payload,
        )
        .where(
            events.c.run_id == bindparam("run"),
            events.c.seq > bindparam("lo"),
            events.c.seq <= bindparam("hi"),
        )
        .order_by(events.c.seq)
    )


class Statements:
    """The hot-path statements of one database, compiled once."""

    def __init__(self, dialect: Any) -> None:
        # SQLite needs no row lock: BEGIN IMMEDIATE already admits one writer at a time.
        self.lock_run = (
            None
            if dialect.name == "sqlite"
            else DriverStatement(
                select(runs.c.run_id).where(runs.c.run_id == bindparam("run")).with_for_update(),
                dialect,
            )
        )
        self.last_event = DriverStatement(
            select(events.c.seq, events.c.at_us, events.c.type)
            .where(events.c.run_id == bindparam("run"))
            .order_by(events.c.seq.desc())
            .limit(1),
            dialect,
        )
        self.insert_events = DriverStatement(
            insert(events).values({name: bindparam(name) for name in INSERT_COLUMNS}), dialect
        )
        if self.insert_events.order not in (None, INSERT_COLUMNS):
            raise AssertionError(f"unexpected INSERT order {self.insert_events.order}")
        self.page = DriverStatement(_page_of(events.c.event_id), dialect)
        # The page a fold reads: the same rows without their ids, which a fold never
        # reads (a fifth less to fetch; ``EventCodec.decode_contents``).
        self.content_page = DriverStatement(_page_of(), dialect)
        # One primary-key point lookup: the probes of ``EventLog.seq_at``'s bisection.
        self.time_of = DriverStatement(
            select(events.c.at_us).where(
                events.c.run_id == bindparam("run"), events.c.seq == bindparam("seq")
            ),
            dialect,
        )

    def insert_rows(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        """Rows in ``INSERT_COLUMNS`` order, in the driver's parameter style."""
        if self.insert_events.order is not None:
            return rows
        return [dict(zip(INSERT_COLUMNS, row, strict=True)) for row in rows]


@contextmanager
def driver_cursor(conn: Connection) -> Iterator[Any]:
    """A cursor of the connection's driver, closed after use (see ``DriverStatement``)."""
    cursor = conn.connection.driver_connection.cursor()
    try:
        yield cursor
    finally:
        cursor.close()


def fetch_one(conn: Connection, statement: DriverStatement, **params: Any) -> Any:
    with driver_cursor(conn) as cursor:
        cursor.execute(statement.sql, statement.params(**params))
        return cursor.fetchone()
