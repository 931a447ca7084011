"""The log's statements as Core builds them from the table objects, compiled for a
dialect: PostgreSQL's at open, and SQLite's once, into ``sqlite_statements`` (a test
compiles them again and compares)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import bindparam, func, insert, select

from fleetledger.events.schema import events, runs, snapshots
from fleetledger.events.statements import (
    INSERT_COLUMNS,
    POSTCOMPILE,
    DriverStatement,
    ListStatement,
    Statements,
)

_NAMED = re.compile(r"%\((\w+)\)s")


def compile_statement(statement: Any, dialect: Any) -> DriverStatement:
    compiled = statement.compile(dialect=dialect)
    sql = str(compiled)
    order = tuple(compiled.positiontup) if compiled.positional else None
    used = set(order) if order is not None else set(_NAMED.findall(sql))
    # Values Core bound itself (LIMIT 1), under the names the SQL uses.
    defaults = {
        name: bind.value
        for name, bind in compiled.binds.items()
        if bind.value is not None and name in used
    }
    return DriverStatement(sql, order, defaults)


def compile_list(statement: Any, dialect: Any, listed: str) -> ListStatement:
    compiled = compile_statement(statement, dialect)
    before, marker, after = compiled.sql.partition(POSTCOMPILE.format(listed))
    if not marker:
        raise AssertionError(f"no IN list {listed!r} in {compiled.sql!r}")
    return ListStatement(before, after, compiled.order, listed)


def _page_of(*id_column: Any) -> Any:
    """seq, stamp, the id when asked for (``id_column``), type, version, payload."""
    c = events.c
    return (
        select(c.seq, c.at_us, *id_column, c.type, c.schema_version, c.payload)
        .where(c.run_id == bindparam("run"), c.seq > bindparam("lo"), c.seq <= bindparam("hi"))
        .order_by(c.seq)
    )


def compile_statements(dialect: Any) -> Statements:
    e, r, s = events.c, runs.c, snapshots.c
    run = bindparam("run")

    def one(statement: Any) -> DriverStatement:
        return compile_statement(statement, dialect)

    statements = Statements(
        lock_run=None
        if dialect.name == "sqlite"
        else one(select(r.run_id).where(r.run_id == run).with_for_update()),
        last_event=one(
            select(e.seq, e.at_us, e.type).where(e.run_id == run).order_by(e.seq.desc()).limit(1)
        ),
        insert_events=one(insert(events).values({n: bindparam(n) for n in INSERT_COLUMNS})),
        insert_run=one(insert(runs).values(run_id=run, started_at_us=bindparam("at_us"))),
        page=one(_page_of(e.event_id)),
        content_page=one(_page_of()),
        time_of=one(select(e.at_us).where(e.run_id == run, e.seq == bindparam("seq"))),
        run_names=one(select(r.run_id).order_by(r.run_id).limit(20)),
        run_list=one(select(r.run_id, r.started_at_us).order_by(r.started_at_us, r.run_id)),
        event_ids=one(select(e.seq, e.event_id).where(e.run_id == run)),
        count_events=one(select(func.count()).select_from(events)),
        stored_ids=compile_list(
            select(e.event_id, e.seq, e.type, e.schema_version, e.payload).where(
                e.run_id == run, e.event_id.in_(bindparam("ids", expanding=True))
            ),
            dialect,
            "ids",
        ),
        snapshot_exists=one(
            select(s.seq).where(
                s.run_id == run,
                s.projection_version == bindparam("version"),
                s.seq == bindparam("seq"),
            )
        ),
        insert_snapshot=one(
            insert(snapshots).values(
                run_id=run,
                projection_version=bindparam("version"),
                seq=bindparam("seq"),
                payload=bindparam("payload"),
            )
        ),
        load_snapshot=one(
            select(s.seq, s.payload)
            .where(
                s.run_id == run,
                s.projection_version == bindparam("version"),
                s.seq <= bindparam("at_most"),
            )
            .order_by(s.seq.desc())
            .limit(1)
        ),
    )
    if statements.insert_events.order not in (None, INSERT_COLUMNS):
        raise AssertionError(f"unexpected INSERT order {statements.insert_events.order}")
    return statements
