"""Opening ledgers at every schema state: fresh, older, unknown, foreign, corrupted.

SQLite ledgers are created and upgraded on open; PostgreSQL ledgers are only ever
migrated on purpose. A database that cannot be used is refused with a LedgerOpenError
that says what and where, and nothing in it changes.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, inspect, text

from fleetledger.events.models import ProbeFailure, ProbeRound, RunStarted
from fleetledger.store.database import migrate, open_database
from fleetledger.store.errors import LedgerOpenError, MigrationRequired, UnknownRevision
from fleetledger.store.log import EventLog
from fleetledger.store.revisions import VERSION_TABLE, alembic_config, head_revision
from fleetledger.store.schema import metadata
from tests.builders import (
    dump_tables,
    fleet_config,
    ledger_tables,
    mixed_events,
    probe_ok,
    run_started,
)
from tests.legacy_rows import probe_failed_v1, probe_ok_v1, stored_form

LEDGER_TABLES = sorted(metadata.tables)
INSERT_KEYS = ("run", "seq", "id", "type", "version", "at", "payload")


def _revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one_or_none()


def _plain_engine(url: str) -> Engine:
    """An engine without fleetledger's settings: what another tool would use."""
    return create_engine(url)


def _file_state(path: Path) -> tuple[str, list[str]]:
    """The file's content hash and the names beside it (a -wal or -shm left behind)."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, sorted(p.name for p in path.parent.iterdir())


def _sqlite_path(url: str) -> Path:
    return Path(url.removeprefix("sqlite:///"))


# ── fresh and current ledgers ────────────────────────────────────────────────


def test_a_fresh_sqlite_file_is_created_at_head_and_reopened_without_upgrade(sqlite_url):
    created = open_database(sqlite_url)
    try:
        assert (created.backend, created.created, created.upgraded_from) == ("sqlite", True, None)
        assert _revision(created.engine) == head_revision()
        assert ledger_tables(created.engine) == sorted([*LEDGER_TABLES, VERSION_TABLE])
    finally:
        created.dispose()

    again = open_database(sqlite_url)
    try:
        assert (again.created, again.upgraded_from) == (False, None)
        assert _revision(again.engine) == head_revision()
    finally:
        again.dispose()


def test_migrate_creates_a_sqlite_ledger_at_head_and_is_a_no_op_at_head(sqlite_url):
    assert migrate(sqlite_url) == (None, head_revision())
    assert stat.S_IMODE(_sqlite_path(sqlite_url).stat().st_mode) == 0o600
    assert migrate(sqlite_url) == (head_revision(), head_revision())

    database = open_database(sqlite_url)
    try:
        assert (database.created, database.upgraded_from) == (False, None)
    finally:
        database.dispose()


# ── older revisions ──────────────────────────────────────────────────────────


def _build_at_0001(url: str) -> list[tuple]:
    """A ledger at revision 0001 holding one run written by hand, as the fleetledger of
    that revision wrote it (its probes one v1 event per shard); returns its event rows."""
    started = RunStarted(config=fleet_config(shards=2))
    batch = [started, probe_ok_v1(1), probe_failed_v1(0, "error", "é ✓")]
    rows = []
    for seq, event in enumerate(batch, start=1):
        type_, version, payload = stored_form(event)
        rows.append(("legacy", seq, event.id, type_, version, 1_700_000_000_000_000 + seq, payload))
    engine = _plain_engine(url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(connection=conn), "0001")
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO fleetledger_runs (run_id, started_at_us) VALUES ('legacy', :at)"),
                {"at": rows[0][5]},
            )
            conn.execute(
                text(
                    "INSERT INTO fleetledger_events "
                    "(run_id, seq, event_id, type, schema_version, at_us, payload) "
                    "VALUES (:run, :seq, :id, :type, :version, :at, :payload)"
                ),
                [dict(zip(INSERT_KEYS, r, strict=True)) for r in rows],
            )
        assert _revision(engine) == "0001"
        assert "fleetledger_snapshots" not in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    return rows


def _assert_rows_read_back(log: EventLog, rows: list[tuple]) -> None:
    """The run reads back whole — its v1 probe rows as the one-shard rounds they mean —
    and its stored rows are left byte for byte as they were."""
    recorded = list(log.read("legacy"))
    assert [(r.run, r.seq, r.event.id, r.at_us) for r in recorded] == [
        (run, seq, event_id, at_us) for run, seq, event_id, _, _, at_us, _ in rows
    ]
    assert recorded[0].event.model_dump_json() == rows[0][6]  # the bytes as written
    assert [r.event for r in recorded[1:]] == [
        ProbeRound(id=rows[1][2], ok=(1,)),
        ProbeRound(id=rows[2][2], failed=(ProbeFailure(shard=0, kind="error", error="é ✓"),)),
    ]
    assert log.config("legacy") == fleet_config(shards=2)
    stored = dump_tables(log.database.engine)["fleetledger_events"]
    assert stored == sorted(rows, key=repr)  # byte-for-byte, nothing rewritten


def test_a_sqlite_ledger_at_0001_is_upgraded_on_open_and_keeps_its_rows(sqlite_url):
    rows = _build_at_0001(sqlite_url)

    database = open_database(sqlite_url)
    with EventLog(database) as log:
        assert (database.created, database.upgraded_from) == (False, "0001")
        assert _revision(database.engine) == head_revision()
        assert "fleetledger_snapshots" in inspect(database.engine).get_table_names()
        _assert_rows_read_back(log, rows)
        # The upgraded ledger works: the run continues and takes snapshots.
        assert log.append("legacy", [probe_ok(0)]) == [4]
        log.save_snapshot("legacy", 1, 4, "{}")
        assert log.load_snapshot("legacy", 1) == (4, "{}")

    reopened = open_database(sqlite_url)
    reopened.dispose()
    assert reopened.upgraded_from is None


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_rows_with_and_without_their_ids_read_alike_and_pin_the_revision(backend, request):
    """A ledger written before revision 0003 and appended to after it holds payloads in
    both forms: each reads back as the event written, by id, in a fold and in an export;
    and a downgrade that would hand the id-less rows to an older reader is refused."""
    ledger_url = request.getfixturevalue(f"{backend}_url")
    rows = _build_at_0001(ledger_url)
    migrate(ledger_url)
    with EventLog.open(ledger_url) as log:
        later = [probe_ok(0), probe_ok(1), probe_ok(0)]
        assert log.append("legacy", later) == [4, 5, 6]
        stored = dump_tables(log.database.engine)["fleetledger_events"]
        payloads = {row[1]: row[6] for row in stored}
        assert all(payloads[seq].startswith('{"id":"') for seq in (1, 2, 3))
        assert payloads[4] == payloads[6] == '{"ok":[0],"failed":[],"died":[]}'
        read = list(log.read("legacy"))
        assert [r.event.id for r in read] == [row[2] for row in rows] + [e.id for e in later]
        assert [r.event for r in read[3:]] == later
        folded = [r.event.ok for page in log.read_pages("legacy", ids=False) for r in page[1:]]
        assert folded == [(1,), (), (0,), (1,), (0,)]
    engine = _plain_engine(ledger_url)
    try:
        with pytest.raises(RuntimeError, match="seq 4 was stored without its id"):
            with engine.begin() as conn:
                command.downgrade(alembic_config(connection=conn), "0002")
        assert _revision(engine) == head_revision()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_postgres_ledger_at_an_older_revision_is_refused_until_migrated(postgres_url):
    rows = _build_at_0001(postgres_url)
    engine = _plain_engine(postgres_url)
    before = dump_tables(engine)

    with pytest.raises(MigrationRequired) as caught:
        open_database(postgres_url)

    message = str(caught.value)
    assert "fleetledger migrate" in message
    assert "0001" in message
    assert dump_tables(engine) == before  # not upgraded behind the operator's back

    assert migrate(postgres_url) == ("0001", head_revision())
    assert "fleetledger_snapshots" in inspect(engine).get_table_names()
    engine.dispose()
    database = open_database(postgres_url)
    with EventLog(database) as log:
        assert (database.created, database.upgraded_from) == (False, None)
        _assert_rows_read_back(log, rows)
        assert log.append("legacy", [probe_ok(1)]) == [4]


@pytest.mark.postgres
def test_an_empty_postgres_database_is_refused_until_migrated(postgres_url):
    with pytest.raises(MigrationRequired, match="fleetledger migrate"):
        open_database(postgres_url)
    engine = _plain_engine(postgres_url)
    try:
        assert inspect(engine).get_table_names() == []  # opening created nothing
    finally:
        engine.dispose()

    assert migrate(postgres_url) == (None, head_revision())

    with EventLog.open(postgres_url) as log:
        assert (log.database.created, log.database.upgraded_from) == (False, None)
        assert log.append("r", [run_started()]) == [1]


@pytest.mark.postgres
def test_a_missing_postgres_database_is_a_clear_open_error(postgres_server_url):
    url = postgres_server_url.rsplit("/", 1)[0] + "/fl_does_not_exist"

    with pytest.raises(LedgerOpenError) as caught:
        open_database(url)

    message = str(caught.value)
    assert "fl_does_not_exist" in message
    assert "cannot use the ledger database" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# ── unknown revision ─────────────────────────────────────────────────────────


def test_an_unknown_revision_is_refused_and_nothing_changes(ledger_url):
    with EventLog.open(ledger_url) as log:
        log.append("r", [run_started(), *mixed_events(5)])
    engine = _plain_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '9999'"))
    before = dump_tables(engine)
    engine.dispose()
    sqlite_file = _sqlite_path(ledger_url) if ledger_url.startswith("sqlite") else None
    file_before = _file_state(sqlite_file) if sqlite_file else None

    with pytest.raises(UnknownRevision, match="9999") as opened:
        open_database(ledger_url)
    with pytest.raises(UnknownRevision, match="9999"):
        migrate(ledger_url)
    with pytest.raises(UnknownRevision):
        EventLog.open(ledger_url)

    assert "upgrade fleetledger" in str(opened.value)
    assert isinstance(opened.value, LedgerOpenError)
    if sqlite_file:
        assert _file_state(sqlite_file) == file_before
    engine = _plain_engine(ledger_url)
    try:
        assert dump_tables(engine) == before
    finally:
        engine.dispose()


# ── foreign and damaged files ────────────────────────────────────────────────


def _foreign_file(path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    conn.execute("INSERT INTO customers VALUES (1, 'Ada')")
    conn.commit()
    conn.close()


def test_a_sqlite_file_holding_someone_elses_tables_is_refused_naming_them(tmp_path):
    path = tmp_path / "app.db"
    _foreign_file(path)

    with pytest.raises(LedgerOpenError) as caught:
        open_database(f"sqlite:///{path}")

    message = str(caught.value)
    assert "not a fleetledger ledger" in message
    assert "customers" in message and "invoices" in message
    assert str(path) in message


def test_refusing_a_foreign_sqlite_file_leaves_its_bytes_unchanged(tmp_path):
    path = tmp_path / "app.db"
    _foreign_file(path)
    before = _file_state(path)

    with pytest.raises(LedgerOpenError):
        open_database(f"sqlite:///{path}")

    # Byte 18-19 of the header hold the journal mode: a refused file is not turned to WAL.
    assert _file_state(path) == before


def test_migrate_refuses_a_sqlite_file_holding_someone_elses_tables(tmp_path):
    path = tmp_path / "app.db"
    _foreign_file(path)
    before = _file_state(path)

    with pytest.raises(LedgerOpenError, match="customers"):
        migrate(f"sqlite:///{path}")

    assert _file_state(path) == before


def _assert_clean_open_error(exc: LedgerOpenError, path: Path) -> None:
    message = str(exc)
    assert type(exc).__module__.startswith("fleetledger.")
    assert str(path) in message
    assert "not a readable SQLite ledger" in message
    assert "sqlalchemy" not in message.lower() and "background on this error" not in message
    assert exc.__cause__ is None and exc.__suppress_context__  # no chained driver traceback


@pytest.mark.parametrize("keep", [100, 1000, 4096, "half"])
def test_a_truncated_ledger_file_is_refused_with_a_clear_error(sqlite_url, keep):
    with EventLog.open(sqlite_url) as log:
        log.append("r", [run_started(), *mixed_events(1500)])
    path = _sqlite_path(sqlite_url)
    size = path.stat().st_size
    keep = size // 2 if keep == "half" else keep
    assert size > keep
    os.truncate(path, keep)
    before = _file_state(path)

    with pytest.raises(LedgerOpenError) as caught:
        EventLog.open(sqlite_url)

    _assert_clean_open_error(caught.value, path)
    assert _file_state(path) == before


def test_a_file_of_random_bytes_is_refused_with_a_clear_error(tmp_path):
    path = tmp_path / "noise.db"
    path.write_bytes(os.urandom(16384))
    before = _file_state(path)

    with pytest.raises(LedgerOpenError) as caught:
        open_database(f"sqlite:///{path}")

    _assert_clean_open_error(caught.value, path)
    assert "not a database" in str(caught.value)
    assert _file_state(path) == before


# ── the head revision is the schema the code queries ─────────────────────────


def _describe(engine: Engine) -> dict[str, dict[str, object]]:
    """Per table: columns (name, type, nullable) in order, primary key, unique sets."""
    inspector = inspect(engine)
    dialect = engine.dialect
    out: dict[str, dict[str, object]] = {}
    for table in sorted(t for t in inspector.get_table_names() if t != VERSION_TABLE):
        out[table] = {
            "columns": [
                (c["name"], c["type"].compile(dialect=dialect).upper(), c["nullable"])
                for c in inspector.get_columns(table)
            ],
            "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
            "unique": sorted(
                tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)
            ),
        }
    return out


def _describe_metadata(engine: Engine) -> dict[str, dict[str, object]]:
    from sqlalchemy import UniqueConstraint

    dialect = engine.dialect
    return {
        name: {
            "columns": [
                (c.name, c.type.compile(dialect=dialect).upper(), c.nullable) for c in table.columns
            ],
            "primary_key": [c.name for c in table.primary_key.columns],
            "unique": sorted(
                tuple(c.name for c in u.columns)
                for u in table.constraints
                if isinstance(u, UniqueConstraint)
            ),
        }
        for name, table in sorted(metadata.tables.items())
    }


def test_the_head_revision_creates_exactly_the_tables_the_code_queries(ledger_url):
    database = open_database(ledger_url)
    try:
        assert _revision(database.engine) == head_revision()
        described = _describe(database.engine)
        assert sorted(described) == LEDGER_TABLES
        assert described == _describe_metadata(database.engine)
    finally:
        database.dispose()


def test_the_revisions_every_open_checks_are_the_migration_scripts() -> None:
    """Opens read ``REVISIONS`` instead of importing Alembic: it must list the scripts."""
    from alembic.script import ScriptDirectory

    from fleetledger.store.revisions import REVISIONS, alembic_config

    scripts = ScriptDirectory.from_config(alembic_config())
    assert list(REVISIONS) == [rev.revision for rev in reversed(list(scripts.walk_revisions()))]
    assert scripts.get_heads() == [REVISIONS[-1]]


def test_a_read_command_does_not_import_alembic(tmp_path) -> None:
    import subprocess
    import sys

    from fleetledger.events.models import RunStarted
    from fleetledger.store.log import EventLog
    from tests.builders import fleet_config

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with EventLog.open(url) as log:
        log.append("r", [RunStarted(config=fleet_config(2))])
    code = (
        "import sys; from fleetledger.cli import app; "
        f"app(['membership', 'r', '--json', '--db', {url!r}], standalone_mode=False); "
        "print('alembic' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "False"
