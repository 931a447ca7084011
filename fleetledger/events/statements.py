"""The log's SQL as the driver runs it: each statement's text and parameter order.

Every statement of the log runs on the driver's own cursor. Per execution, Core spends
more time building parameters and ``Row`` objects than SQLite spends on the statement
(a replay read 3.1 µs/row through Core, 1.0 µs/row this way), and a read command that
needs no Core starts without importing SQLAlchemy at all (a third of its start-up).

The SQL is still Core's: ``core_statements`` compiles it from the table objects, in the
dialect's own parameter style, for PostgreSQL at open; SQLite's is that compilation's
text, kept in ``sqlite_statements`` (a test compiles it again and compares).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

INSERT_COLUMNS = ("run_id", "seq", "event_id", "type", "schema_version", "at_us", "payload")
# SQLAlchemy's marker for an IN list whose values are bound at execution.
POSTCOMPILE = "__[POSTCOMPILE_{}]"


@dataclass(frozen=True)
class DriverStatement:
    """One statement's SQL, the names of its parameters in order (positional styles;
    None: named, ``%(name)s``), and the values Core bound itself (``LIMIT 1``)."""

    sql: str
    order: tuple[str, ...] | None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def params(self, **values: Any) -> tuple[Any, ...] | dict[str, Any]:
        merged = {**self.defaults, **values}
        return merged if self.order is None else tuple(merged[k] for k in self.order)


@dataclass(frozen=True)
class ListStatement:
    """A statement with one ``IN (...)`` list that takes any number of values: the SQL
    before and after the list, and the parameter order (the list's name stands for all
    of its values)."""

    before: str
    after: str
    order: tuple[str, ...] | None
    listed: str

    def bound(self, values: Sequence[Any], **named: Any) -> tuple[str, Any]:
        """The SQL for ``len(values)`` values, and its parameters."""
        if self.order is None:
            names = [f"{self.listed}_{i}" for i in range(len(values))]
            sql = self.before + ", ".join(f"%({name})s" for name in names) + self.after
            return sql, {**named, **dict(zip(names, values, strict=True))}
        params: list[Any] = []
        for name in self.order:
            if name == self.listed:
                params.extend(values)
            else:
                params.append(named[name])
        return self.before + ", ".join("?" * len(values)) + self.after, tuple(params)


@dataclass(frozen=True)
class Statements:
    """Every statement of the log, for one backend."""

    # Own a run's appends until commit (PostgreSQL); None on SQLite, where BEGIN
    # IMMEDIATE already admits one writer at a time.
    lock_run: DriverStatement | None
    last_event: DriverStatement
    insert_events: DriverStatement
    insert_run: DriverStatement
    # One page of a run's rows in seq order, ``(lo, hi]``.
    page: DriverStatement
    # The page a fold reads: the same rows without their ids, which a fold never reads
    # (a fifth less to fetch; ``EventCodec.decode_contents``).
    content_page: DriverStatement
    # One primary-key point lookup: the probes of ``EventLog.seq_at``'s bisection.
    time_of: DriverStatement
    run_names: DriverStatement  # the first runs by name, for an error naming them
    run_list: DriverStatement  # every run, oldest first
    event_ids: DriverStatement
    count_events: DriverStatement
    stored_ids: ListStatement  # the rows a retried batch's ids already have
    snapshot_exists: DriverStatement
    insert_snapshot: DriverStatement
    load_snapshot: DriverStatement  # the newest at or before a seq

    def insert_rows(self, rows: list[tuple[Any, ...]]) -> list[Any]:
        """Rows in ``INSERT_COLUMNS`` order, in the driver's parameter style."""
        if self.insert_events.order is not None:
            return rows
        return [dict(zip(INSERT_COLUMNS, row, strict=True)) for row in rows]


@contextmanager
def driver_cursor(conn: Any) -> Iterator[Any]:
    """A cursor of a driver connection, closed after use."""
    cursor = conn.cursor()
    try:
        yield cursor
    finally:
        cursor.close()


def execute(conn: Any, statement: DriverStatement, **params: Any) -> None:
    with driver_cursor(conn) as cursor:
        cursor.execute(statement.sql, statement.params(**params))


def fetch_one(conn: Any, statement: DriverStatement, **params: Any) -> Any:
    with driver_cursor(conn) as cursor:
        cursor.execute(statement.sql, statement.params(**params))
        return cursor.fetchone()


def fetch_all(conn: Any, statement: DriverStatement, **params: Any) -> list[Any]:
    with driver_cursor(conn) as cursor:
        cursor.execute(statement.sql, statement.params(**params))
        return cursor.fetchall()
