"""The log's SQL: written once per backend, beside the code that runs it, and the same
statements on both — each run here on SQLite and on PostgreSQL (``ledger_url``), against
the tables the schema revisions created, for what it reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fleetledger.store.log import EventLog
from fleetledger.store.postgres import PostgresStatements
from fleetledger.store.sqlite import SqliteStatements
from fleetledger.store.statements import INSERT_COLUMNS, Statements
from fleetledger.store.write_connections import WriteConnections

RUN = "run-a"
EVENTS = 6


def _row(run: str, seq: int) -> tuple[str, int, str, str, int, int, str]:
    """A row in ``INSERT_COLUMNS`` order (the SQL does not read the payload)."""
    return (run, seq, f"{run}-id-{seq}", "probe_round", 2, 1000 + seq, f'{{"id":"{run}-{seq}"}}')


class OpenedStore:
    """An opened log, its backend's statements, and a way to run them in a write."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.sql: Statements = log.database.statements()
        self._writes = WriteConnections(log.database)

    def write(self, body: Callable[[Any], Any]) -> Any:
        return self._writes.transact(body)

    def close(self) -> None:
        self._writes.close()


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[OpenedStore]:
    with EventLog.open(ledger_url) as log:
        opened = OpenedStore(log)
        try:
            yield opened
        finally:
            opened.close()


def _store_run(ledger: OpenedStore, run: str = RUN, events: int = EVENTS) -> None:
    sql = ledger.sql

    def body(conn: Any) -> None:
        assert sql.last_event(conn, run, lock=True) is None  # no run: nothing to lock
        sql.insert_run(conn, run, 1001)
        sql.insert_events(conn, [_row(run, seq) for seq in range(1, events + 1)])

    ledger.write(body)


def test_every_backend_has_every_statement_of_the_log() -> None:
    wanted = {name for name in vars(Statements) if not name.startswith("_")}
    for backend in (SqliteStatements, PostgresStatements):
        assert wanted - set(vars(backend)) == set(), backend.__name__


def test_an_insert_takes_rows_in_the_column_order_of_the_table(ledger: OpenedStore) -> None:
    _store_run(ledger)
    with ledger.log.database.reading() as conn:
        (row,) = ledger.sql.page(conn, RUN, 2, 3)
    stored = dict(
        zip(("seq", "at_us", "event_id", "type", "schema_version", "payload"), row, strict=True)
    )
    expected = dict(zip(INSERT_COLUMNS, _row(RUN, 3), strict=True))
    assert stored == {k: v for k, v in expected.items() if k != "run_id"}


def test_the_head_is_the_last_event_and_a_locked_read_of_it_says_the_same(
    ledger: OpenedStore,
) -> None:
    _store_run(ledger)
    sql = ledger.sql

    def locked(conn: Any) -> Any:
        sql.lock_run(conn, RUN)
        return sql.last_event(conn, RUN, lock=True)

    assert tuple(ledger.write(locked)) == (EVENTS, 1000 + EVENTS, "probe_round")
    with ledger.log.database.reading() as conn:
        assert tuple(sql.last_event(conn, RUN, lock=False)) == (
            EVENTS,
            1000 + EVENTS,
            "probe_round",
        )
        assert sql.last_event(conn, "no-such-run", lock=False) is None


def test_a_page_is_the_rows_after_lo_up_to_hi_in_seq_order(ledger: OpenedStore) -> None:
    _store_run(ledger)
    sql = ledger.sql
    with ledger.log.database.reading() as conn:
        page = [tuple(r) for r in sql.page(conn, RUN, 1, 4)]
        content = [tuple(r) for r in sql.content_page(conn, RUN, 1, 4)]
        past_the_head = sql.page(conn, RUN, EVENTS, EVENTS + 10)
    assert page == [
        (s, 1000 + s, f"{RUN}-id-{s}", *_row(RUN, s)[3:5], _row(RUN, s)[6]) for s in (2, 3, 4)
    ]
    # Without the id and the seq: row i of a page is seq lo + 1 + i.
    assert content == [
        (at, type_, version, payload) for _s, at, _id, type_, version, payload in page
    ]
    assert past_the_head == []


def test_a_clashing_insert_writes_none_of_its_rows_and_the_transaction_goes_on(
    ledger: OpenedStore,
) -> None:
    _store_run(ledger, RUN, 3)
    sql = ledger.sql
    clash = (*_row(RUN, 4)[:2], f"{RUN}-id-2", *_row(RUN, 4)[3:])  # seq 2's id again
    outcome: list[bool] = []

    def body(conn: Any) -> None:
        outcome.append(sql.insert_events_or_clash(conn, [_row(RUN, 4), clash]))
        outcome.append(sql.insert_events_or_clash(conn, [_row(RUN, 4), _row(RUN, 5)]))

    ledger.write(body)
    assert outcome == [False, True]
    with ledger.log.database.reading() as conn:
        stored = [tuple(r)[:3] for r in sql.page(conn, RUN, 0, 10)]
    assert stored == [(s, 1000 + s, f"{RUN}-id-{s}") for s in range(1, 6)]


def test_point_lookups_and_listings(ledger: OpenedStore) -> None:
    for run in ("run-c", "run-a", "run-b"):
        _store_run(ledger, run, 3)
    sql = ledger.sql
    with ledger.log.database.reading() as conn:
        assert sql.time_of(conn, "run-b", 2) == 1002
        assert sql.time_of(conn, "run-b", 9) is None
        assert sql.run_names(conn, 2) == ["run-a", "run-b"]
        # The same start time: by name.
        assert [tuple(r) for r in sql.run_list(conn)] == [
            ("run-a", 1001),
            ("run-b", 1001),
            ("run-c", 1001),
        ]
        assert sorted(tuple(r) for r in sql.event_ids(conn, "run-c")) == [
            (s, f"run-c-id-{s}") for s in (1, 2, 3)
        ]
        assert sql.count_events(conn) == 9


@pytest.mark.parametrize("count", [1, 2, 7])
def test_a_lookup_of_ids_finds_the_stored_ones_among_any_number(
    ledger: OpenedStore, count: int
) -> None:
    _store_run(ledger, events=10)
    _store_run(ledger, "other-run", 10)
    asked = [f"{RUN}-id-{s}" for s in range(1, count + 1)] + ["never-stored"]
    with ledger.log.database.reading() as conn:
        found = sorted(tuple(r) for r in ledger.sql.stored(conn, RUN, asked))
    assert found == sorted(
        (f"{RUN}-id-{s}", s, "probe_round", 2, _row(RUN, s)[6]) for s in range(1, count + 1)
    )


def test_the_newest_snapshot_at_or_before_a_seq_of_its_version(ledger: OpenedStore) -> None:
    _store_run(ledger)
    sql = ledger.sql

    def body(conn: Any) -> None:
        assert not sql.snapshot_exists(conn, RUN, 1, 3)
        sql.insert_snapshot(conn, RUN, 1, 3, "v1@3")
        sql.insert_snapshot(conn, RUN, 1, 5, "v1@5")
        sql.insert_snapshot(conn, RUN, 2, 4, "v2@4")
        assert sql.snapshot_exists(conn, RUN, 1, 3)
        assert not sql.snapshot_exists(conn, RUN, 2, 3)

    ledger.write(body)
    with ledger.log.database.reading() as conn:
        assert sql.load_snapshot(conn, RUN, 1, 4) == (3, "v1@3")
        assert sql.load_snapshot(conn, RUN, 1, 2**63 - 1) == (5, "v1@5")
        assert sql.load_snapshot(conn, RUN, 1, 2) is None
        assert sql.load_snapshot(conn, RUN, 2, 10) == (4, "v2@4")
        assert sql.load_snapshot(conn, "no-such-run", 1, 10) is None
