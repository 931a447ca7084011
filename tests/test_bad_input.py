"""Bad input, through the public surface: a clear error naming what and where, nothing changed.

Every case of the table builds a real ledger (a SQLite file; some cases also a fresh
database on the real PostgreSQL server), takes a full dump of the stored state (every
row of every table, ordered; for file-level cases the bytes of the files), feeds one bad
input through ``EventLog``, the ``fleetledger`` CLI or the database opener, and checks:

- the error: a specific ``LedgerError`` subclass (or pydantic's ``ValidationError`` where
  the model itself refuses), or for the CLI exit status 2 with exactly one line on
  stderr starting ``fleetledger: error:``, nothing on stdout and no traceback;
- the message names what and where (import line, run and seq, field, shard, revision);
- the stored state is unchanged.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from pydantic import ValidationError
from sqlalchemy import create_engine, inspect, text
from typer.testing import Result

from fleetledger.events.errors import EventDecodeError, LedgerError
from fleetledger.events.jsonl import export_lines
from fleetledger.events.models import (
    Event,
    FleetConfig,
    OutcomeWindowReported,
    RefitCompleted,
    RefitStarted,
    RunEnded,
    RunStarted,
    ShardOutcomes,
)
from fleetledger.store.errors import (
    AppendRejected,
    LedgerOpenError,
    LedgerWriteError,
    MigrationRequired,
    UnknownRevision,
    UnknownRun,
)
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok
from tests.cli_support import run_cli
from tests.legacy_rows import insert_old_rows, probe_failed_v1, probe_ok_v1

SHARDS = 3
R1_HEAD = 6
R2_HEAD = 3


# ── the ledger every case starts from ─────────────────────────────────────────


def _config(shards: int) -> FleetConfig:
    return FleetConfig(
        shard_count=shards,
        train_world_size=2,
        base_urls=tuple(f"http://127.0.0.1:{8000 + i}/v1" for i in range(shards)),
        settings={"source": "test_bad_input"},
    )


def _build(url: str) -> None:
    """Run r1 (3 shards, 6 events, open) and run r2 (2 shards, 3 events, ended).

    r1 began under an older fleetledger: seqs 1-3 are the rows it stored, its probes one
    v1 ``probe_succeeded`` / ``probe_failed`` per shard, and this fleetledger appended
    the rest. So the cases about stored and imported probe rows meet real v1 rows.
    """
    with EventLog.open(url) as log:
        insert_old_rows(
            log.database.engine,
            "r1",
            [
                RunStarted(id="r1-1", config=_config(SHARDS)),
                probe_ok_v1(0, id="r1-2"),
                probe_failed_v1(1, "timeout", "no answer", id="r1-3"),
            ],
        )
        log.append(
            "r1",
            [
                RefitStarted(id="r1-4", weight_version=1, shards=(0, 1, 2)),
                RefitCompleted(id="r1-5", weight_version=1, shards=(0, 1, 2)),
            ],
        )
        log.append(
            "r1",
            [
                OutcomeWindowReported(
                    id="r1-6", adapter="router", outcomes=(ShardOutcomes(shard=2, successes=3),)
                )
            ],
        )
        log.append("r2", [RunStarted(id="r2-1", config=_config(2))])
        log.append(
            "r2",
            [
                probe_ok(0, id="r2-2"),
                RunEnded(id="r2-3", outcome="completed", cause="done"),
            ],
        )
        assert log.head("r1") == R1_HEAD and log.head("r2") == R2_HEAD


@dataclass
class Ctx:
    url: str
    backend: str
    tmp: Path

    @property
    def path(self) -> Path:
        """The SQLite ledger file (SQLite cases only)."""
        assert self.url.startswith("sqlite:///"), self.url
        return Path(self.url.removeprefix("sqlite:///"))

    @property
    def bad_dir(self) -> Path:
        """Where file-level cases put the file they open; its bytes are compared."""
        return self.tmp / "bad"

    @property
    def bad_db(self) -> Path:
        return self.bad_dir / "ledger.db"

    @property
    def bad_url(self) -> str:
        return f"sqlite:///{self.bad_db}"

    @property
    def ro_url(self) -> str:
        return f"sqlite:///file:{self.path}?mode=ro&uri=true"

    def fmt(self, s: str) -> str:
        return s.format(tmp=self.tmp, bad=self.bad_db)


# ── stored state ──────────────────────────────────────────────────────────────


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the database, ordered by all columns."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            out = {}
            for table in sorted(inspect(conn).get_table_names()):
                columns = [c["name"] for c in inspect(conn).get_columns(table)]
                order = ", ".join(f'"{c}"' for c in columns)
                rows = conn.execute(text(f'SELECT * FROM "{table}" ORDER BY {order}')).all()
                out[table] = [tuple(r) for r in rows]
            return out
    finally:
        engine.dispose()


def file_bytes(directory: Path) -> dict[str, str]:
    """Name -> sha256 of every file in ``directory`` (empty when it does not exist)."""
    if not directory.exists():
        return {}
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def raw_sql(url: str, *statements: str) -> None:
    """Change the database behind fleetledger's back, as another program would."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)  # no bind-parameter parsing of the JSON
    finally:
        engine.dispose()


# ── surfaces ──────────────────────────────────────────────────────────────────


def append(url: str, run: str, events: Callable[[], Sequence[Any]]) -> None:
    with EventLog.open(url) as log:
        log.append(run, events())


def read_all(url: str, run: str) -> None:
    with EventLog.open(url) as log:
        list(log.read(run))


def open_and_list(url: str) -> None:
    with EventLog.open(url) as log:
        log.runs()


def export_dicts(url: str, run: str) -> list[dict[str, Any]]:
    with EventLog.open(url) as log:
        return [json.loads(line) for line in export_lines(run, log.read_stored(run))]


Line = dict[str, Any] | str | bytes


def import_file(
    ctx: Ctx, mutate: Callable[[list[dict[str, Any]]], list[Line]], run: str = "r1"
) -> Path:
    """An export of ``run`` after ``mutate``: dicts are dumped, str/bytes written as is."""
    lines = mutate(export_dicts(ctx.url, run))
    path = ctx.tmp / "import.jsonl"
    with path.open("wb") as fh:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line, separators=(",", ":"))
            fh.write((line if isinstance(line, bytes) else line.encode()) + b"\n")
    return path


def import_as_copy(mutate: Callable[[list[dict[str, Any]]], list[Line]], run: str = "r1"):
    def act(c: Ctx) -> Result:
        return run_cli("import", str(import_file(c, mutate, run)), "--run", "copy", "--db", c.url)

    return act


def _set(index: int, path: str, value: Any) -> Callable[[list[dict[str, Any]]], list[Line]]:
    """Set ``lines[index][a][b]...`` (path 'a.b') to ``value``."""

    def mutate(lines: list[dict[str, Any]]) -> list[Line]:
        *parents, last = path.split(".")
        target = lines[index]
        for key in parents:
            target = target[key]
        target[last] = value
        return list(lines)

    return mutate


def _delete(index: int, path: str) -> Callable[[list[dict[str, Any]]], list[Line]]:
    def mutate(lines: list[dict[str, Any]]) -> list[Line]:
        *parents, last = path.split(".")
        target = lines[index]
        for key in parents:
            target = target[key]
        del target[last]
        return list(lines)

    return mutate


def _second_run_started(lines: list[dict[str, Any]]) -> list[Line]:
    again = {**lines[0], "id": "r1-again", "seq": 2}
    rest = [{**line, "seq": line["seq"] + 1} for line in lines[1:]]
    return [lines[0], again, *rest]


def _after_run_ended(lines: list[dict[str, Any]]) -> list[Line]:
    extra = {**lines[1], "id": "r2-late", "seq": len(lines) + 1, "at": lines[-1]["at"]}
    return [*lines, extra]


def _corrupt_root_page(c: Ctx, table: str) -> None:
    """Copy the ledger, then overwrite the root page of ``table`` with 0xFF."""
    _copy_ledger(c)
    conn = sqlite3.connect(c.bad_db)
    try:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
    finally:
        conn.close()
    data = bytearray(c.bad_db.read_bytes())
    data[(root - 1) * page_size : root * page_size] = b"\xff" * page_size
    c.bad_db.write_bytes(bytes(data))


def _corrupt_runs_page(c: Ctx) -> None:
    _corrupt_root_page(c, "fleetledger_runs")


def _corrupt_events_page(c: Ctx) -> None:
    # membership reads the run's events (its head is its last event), not the runs table.
    _corrupt_root_page(c, "fleetledger_events")


def _copy_ledger(c: Ctx) -> None:
    assert not Path(f"{c.path}-wal").exists(), "the ledger must be checkpointed to copy it"
    c.bad_dir.mkdir()
    c.bad_db.write_bytes(c.path.read_bytes())


def _truncate_copy(c: Ctx) -> None:
    _copy_ledger(c)
    data = c.bad_db.read_bytes()
    c.bad_db.write_bytes(data[: len(data) // 2])


def _foreign_file(c: Ctx) -> None:
    c.bad_dir.mkdir()
    conn = sqlite3.connect(c.bad_db)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('somebody else')")
    conn.commit()
    conn.close()


def _random_file(c: Ctx) -> None:
    c.bad_dir.mkdir()
    c.bad_db.write_bytes(hashlib.sha512(b"not a database").digest() * 128)


STORE_UNKNOWN_TYPE = (
    "INSERT INTO fleetledger_events (run_id, seq, event_id, type, schema_version, at_us, payload) "
    "SELECT 'r1', 7, 'r1-7', 'shard_teleported', 1, at_us, "
    """'{"id":"r1-7","type":"shard_teleported","shard":0}' """
    "FROM fleetledger_events WHERE run_id = 'r1' AND seq = 6",
)
STORE_FUTURE_VERSION = (
    "UPDATE fleetledger_events SET schema_version = 99 WHERE run_id = 'r1' AND seq = 3",
)
STORE_OLD_ROW_WITHOUT_SHARD = (
    """UPDATE fleetledger_events SET payload = '{"id":"r1-2","type":"probe_succeeded"}' """
    "WHERE run_id = 'r1' AND seq = 2",
)
STORE_BAD_PAYLOAD = (
    'UPDATE fleetledger_events SET payload = \'{"id": "r1-2", oops\' '
    "WHERE run_id = 'r1' AND seq = 2",
)
SET_REVISION_9999 = ("UPDATE fleetledger_alembic_version SET version_num = '9999'",)
SET_REVISION_0001 = ("UPDATE fleetledger_alembic_version SET version_num = '0001'",)


# ── the table ─────────────────────────────────────────────────────────────────

BOTH = ("sqlite", "postgresql")
SQLITE = ("sqlite",)


@dataclass(frozen=True)
class Case:
    name: str
    act: Callable[[Ctx], Any]
    # The exception type for API cases; None for CLI cases (exit 2, one line on stderr).
    error: type[BaseException] | None
    fragments: tuple[str, ...]
    backends: tuple[str, ...] = SQLITE
    setup: Callable[[Ctx], None] | None = None  # bad state put in place before the dump
    check: Callable[[Ctx, Any], None] | None = None  # further checks on the error / files
    marks: tuple[Any, ...] = field(default=())


def _sql(*statements: str) -> Callable[[Ctx], None]:
    return lambda c: raw_sql(c.url, *statements)


def _decode_error_at(run: str, seq: int) -> Callable[[Ctx, Any], None]:
    def check(_c: Ctx, exc: Any) -> None:
        assert isinstance(exc, EventDecodeError)
        assert (exc.run, exc.seq) == (run, seq)

    return check


def _batch_index(index: int) -> Callable[[Ctx, Any], None]:
    def check(_c: Ctx, exc: Any) -> None:
        assert isinstance(exc, AppendRejected)
        assert exc.index == index

    return check


def _nothing_created(relative: str) -> Callable[[Ctx, Any], None]:
    def check(c: Ctx, _exc: Any) -> None:
        assert not (c.tmp / relative).exists()

    return check


CASES: list[Case] = [
    # ── import files ──
    Case(
        "import_malformed_json_on_line_3",
        import_as_copy(lambda ls: [ls[0], ls[1], '{"run": "r1", "seq": 3, "id": ', *ls[3:]]),
        None,
        ("line 3: not valid JSON",),
    ),
    Case(
        "import_line_not_an_object",
        import_as_copy(lambda ls: [ls[0], "[1, 2]", *ls[2:]]),
        None,
        ("line 2: an event line must be a JSON object",),
    ),
    Case(
        "import_not_utf8_on_line_3",
        import_as_copy(lambda ls: [ls[0], ls[1], b'{"run": "r1\xff\xfe"}', *ls[3:]]),
        None,
        ("line 3", "UTF-8"),
    ),
    Case(
        "import_unknown_event_type",
        import_as_copy(_set(1, "type", "shard_teleported")),
        None,
        ("line 2: unknown event type 'shard_teleported'",),
    ),
    Case(
        "import_future_schema_version",
        import_as_copy(_set(1, "schema_version", 99)),
        None,
        ("line 2: event type 'probe_succeeded' has schema version 99, newer than the 1",),
    ),
    Case(
        "import_data_missing_shard",
        import_as_copy(_delete(2, "data.shard")),
        None,
        ("line 3: invalid 'probe_failed' event: shard: Field required",),
    ),
    Case(
        "import_missing_top_level_key",
        import_as_copy(_delete(1, "at")),
        None,
        ("line 2: missing field(s) at",),
    ),
    Case(
        "import_seq_not_an_integer",
        import_as_copy(_set(1, "seq", "2")),
        None,
        ("line 2: field 'seq' must be an integer, got '2'",),
    ),
    Case(
        "import_time_without_zone",
        import_as_copy(_set(1, "at", "2026-01-01T00:00:00")),
        None,
        ("line 2: field 'at' is not an ISO 8601 time", "no time zone"),
    ),
    Case(
        "import_negative_shard",
        import_as_copy(_set(1, "data.shard", -1)),
        None,
        ("line 2: invalid 'probe_succeeded' event: shard:", "greater than or equal to 0"),
    ),
    Case(
        "import_shard_out_of_range",
        import_as_copy(_set(1, "data.shard", SHARDS)),
        None,
        ("line 2: probe_succeeded: shard 3 is out of range", "shard_count=3"),
    ),
    Case(
        "import_refit_shard_out_of_range",
        import_as_copy(_set(3, "data.shards", [0, 1, 7])),
        None,
        ("line 4: refit_started: shard 7 is out of range",),
    ),
    Case(
        "import_seq_gap",
        import_as_copy(lambda ls: [ls[0], ls[1], *ls[3:]]),
        None,
        ("line 3: seq 4 out of order: expected 3",),
    ),
    Case(
        "import_two_runs_in_one_file",
        import_as_copy(_set(3, "run", "other")),
        None,
        ("line 4: run 'other' differs from 'r1'",),
    ),
    Case(
        "import_second_run_started",
        import_as_copy(_second_run_started),
        None,
        ("line 2: a second run_started inside one run",),
    ),
    Case(
        "import_event_after_run_ended",
        import_as_copy(_after_run_ended, run="r2"),
        None,
        ("line 4: event after run_ended (line 3)",),
    ),
    Case(
        "import_duplicate_event_id",
        import_as_copy(_set(2, "id", "r1-2")),
        None,
        ("line 3: event id r1-2 appears twice",),
    ),
    Case(
        "import_config_base_urls_count",
        import_as_copy(_set(0, "data.config.base_urls", ["http://a/v1", "http://b/v1"])),
        None,
        (
            "line 1: invalid 'run_started' event: config:",
            "base_urls has 2 entries for shard_count=3",
        ),
    ),
    Case(
        "import_config_min_healthy_above_shard_count",
        import_as_copy(_set(0, "data.config.min_healthy_shards", 4)),
        None,
        ("line 1: invalid 'run_started' event", "min_healthy_shards=4 exceeds shard_count=3"),
    ),
    Case(
        "import_into_existing_run_without_rename",
        lambda c: run_cli("import", str(import_file(c, list)), "--db", c.url),
        None,
        ("run 'r1' already exists here", "--run"),
        backends=BOTH,
    ),
    Case(
        "import_invalid_run_name",
        lambda c: run_cli("import", str(import_file(c, list)), "--run", "x" * 200, "--db", c.url),
        None,
        ("a run id must be 1..128 printable characters",),
    ),
    Case(
        "import_empty_file",
        import_as_copy(lambda _ls: []),
        None,
        ("line 1: the file holds no events",),
    ),
    Case(
        "import_missing_file",
        lambda c: run_cli("import", str(c.tmp / "missing.jsonl"), "--run", "copy", "--db", c.url),
        None,
        ("{tmp}/missing.jsonl: No such file or directory",),
    ),
    Case(
        "import_into_read_only_ledger",
        lambda c: run_cli("import", str(import_file(c, list)), "--run", "copy", "--db", c.ro_url),
        None,
        ("read-only",),
    ),
    # ── appends ──
    Case(
        "append_shard_out_of_range_second_in_batch",
        lambda c: append(c.url, "r1", lambda: [probe_ok(0), probe_ok(3)]),
        AppendRejected,
        (
            "run 'r1', event #1 of the batch: probe_round: shard 3 is out of range",
            "shard_count=3 (valid shards 0..2)",
        ),
        backends=BOTH,
        check=_batch_index(1),
    ),
    Case(
        "append_negative_shard",
        lambda c: append(c.url, "r1", lambda: [probe_failed(-1)]),
        ValidationError,
        ("shard", "greater than or equal to 0"),
    ),
    Case(
        "append_unknown_run",
        lambda c: append(c.url, "ghost", lambda: [probe_ok(0)]),
        UnknownRun,
        ("run 'ghost'", "no run 'ghost' in this ledger", "got 'probe_round'"),
        backends=BOTH,
    ),
    Case(
        "append_second_run_started",
        lambda c: append(c.url, "r1", lambda: [RunStarted(config=_config(SHARDS))]),
        AppendRejected,
        ("run 'r1', event #0 of the batch: the run has already started",),
    ),
    Case(
        "append_after_run_ended",
        lambda c: append(c.url, "r2", lambda: [probe_ok(0)]),
        AppendRejected,
        ("run 'r2': the run ended at seq 3; nothing may be appended after it",),
        backends=BOTH,
    ),
    Case(
        "append_run_ended_not_last",
        lambda c: append(c.url, "r1", lambda: [RunEnded(outcome="failed", cause="x"), probe_ok(0)]),
        AppendRejected,
        ("event #0 of the batch: run_ended must be the last event",),
    ),
    Case(
        "append_duplicate_id_in_batch",
        lambda c: append(
            c.url,
            "r1",
            lambda: [probe_ok(0, id="dup"), probe_ok(1, id="dup")],
        ),
        AppendRejected,
        ("run 'r1', event #1 of the batch: event id dup appears twice",),
        backends=BOTH,
        check=_batch_index(1),
    ),
    Case(
        "append_not_an_event",
        lambda c: append(c.url, "r1", lambda: [{"type": "probe_succeeded", "shard": 0}]),
        AppendRejected,
        ("event #0 of the batch: dict is not an event",),
    ),
    Case(
        # A model whose ``type`` was changed behind it is not its class's event: written,
        # its payload would name another type than its row, and the run stop reading.
        "append_type_changed_behind_the_model",
        lambda c: append(
            c.url, "r1", lambda: [probe_ok(0).model_copy(update={"type": "restart_requested"})]
        ),
        AppendRejected,
        ("event #0 of the batch: ProbeRound is not a registered event type",),
        backends=BOTH,
    ),
    Case(
        # Refusals in batch order: the repeated id (#1) comes before the non-event (#2).
        "append_first_refusal_in_batch_order",
        lambda c: append(
            c.url, "r1", lambda: [probe_ok(0, id="twice"), probe_ok(1, id="twice"), "x"]
        ),
        AppendRejected,
        ("run 'r1', event #1 of the batch: event id twice appears twice",),
        check=_batch_index(1),
    ),
    Case(
        "append_empty_run_id",
        lambda c: append(c.url, "", lambda: [probe_ok(0)]),
        AppendRejected,
        ("a run id must be 1..128 printable characters",),
    ),
    Case(
        "append_to_read_only_ledger",
        lambda c: append(c.ro_url, "r1", lambda: [probe_ok(0)]),
        LedgerWriteError,
        ("write failed (the ledger is read-only)", "opened read-only, nothing was written"),
    ),
    # ── events already stored that this fleetledger cannot read ──
    Case(
        "stored_unknown_type_membership",
        lambda c: run_cli("membership", "r1", "--db", c.url),
        None,
        ("run 'r1' seq 7: unknown event type 'shard_teleported'",),
        backends=BOTH,
        setup=_sql(*STORE_UNKNOWN_TYPE),
    ),
    Case(
        "stored_unknown_type_read",
        lambda c: read_all(c.url, "r1"),
        EventDecodeError,
        ("run 'r1' seq 7: unknown event type 'shard_teleported'", "newer version"),
        backends=BOTH,
        setup=_sql(*STORE_UNKNOWN_TYPE),
        check=_decode_error_at("r1", 7),
    ),
    Case(
        "stored_future_schema_version_membership",
        lambda c: run_cli("membership", "r1", "--json", "--db", c.url),
        None,
        ("run 'r1' seq 3: event type 'probe_failed' has schema version 99, newer than the 1",),
        setup=_sql(*STORE_FUTURE_VERSION),
    ),
    Case(
        "stored_future_schema_version_read",
        lambda c: read_all(c.url, "r1"),
        EventDecodeError,
        ("run 'r1' seq 3:", "schema version 99"),
        backends=BOTH,
        setup=_sql(*STORE_FUTURE_VERSION),
        check=_decode_error_at("r1", 3),
    ),
    Case(
        "stored_old_probe_row_without_shard_read",
        lambda c: read_all(c.url, "r1"),
        EventDecodeError,
        ("run 'r1' seq 2: invalid 'probe_succeeded' event: shard: Field required",),
        backends=BOTH,
        setup=_sql(*STORE_OLD_ROW_WITHOUT_SHARD),
        check=_decode_error_at("r1", 2),
    ),
    Case(
        "stored_payload_not_json",
        lambda c: run_cli("membership", "r1", "--db", c.url),
        None,
        ("run 'r1' seq 2: payload is not valid JSON",),
        setup=_sql(*STORE_BAD_PAYLOAD),
    ),
    # ── databases fleetledger must not use ──
    Case(
        "unknown_revision_open",
        lambda c: open_and_list(c.url),
        UnknownRevision,
        ("schema revision '9999'", "upgrade fleetledger"),
        backends=BOTH,
        setup=_sql(*SET_REVISION_9999),
    ),
    Case(
        "unknown_revision_cli",
        lambda c: run_cli("runs", "--db", c.url),
        None,
        ("schema revision '9999'",),
        backends=BOTH,
        setup=_sql(*SET_REVISION_9999),
    ),
    Case(
        "unknown_revision_migrate",
        lambda c: run_cli("migrate", "--db", c.url),
        None,
        ("schema revision '9999'",),
        backends=BOTH,
        setup=_sql(*SET_REVISION_9999),
    ),
    Case(
        "postgres_older_revision_open",
        lambda c: open_and_list(c.url),
        MigrationRequired,
        ("at schema revision 0001", "fleetledger migrate"),
        backends=("postgresql",),
        setup=_sql(*SET_REVISION_0001),
    ),
    Case(
        "postgres_older_revision_cli",
        lambda c: run_cli("membership", "r1", "--db", c.url),
        None,
        ("at schema revision 0001", "fleetledger migrate"),
        backends=("postgresql",),
        setup=_sql(*SET_REVISION_0001),
    ),
    Case(
        "foreign_sqlite_file_open",
        lambda c: open_and_list(c.bad_url),
        LedgerOpenError,
        ("{bad} is not a fleetledger ledger", "holds the tables users"),
        setup=_foreign_file,
    ),
    Case(
        "foreign_sqlite_file_cli",
        lambda c: run_cli("runs", "--db", c.bad_url),
        None,
        ("{bad} is not a fleetledger ledger", "users"),
        setup=_foreign_file,
    ),
    Case(
        "foreign_sqlite_file_migrate",
        lambda c: run_cli("migrate", "--db", c.bad_url),
        None,
        ("{bad} is not a fleetledger ledger", "users"),
        setup=_foreign_file,
    ),
    Case(
        "truncated_ledger_open",
        lambda c: open_and_list(c.bad_url),
        LedgerOpenError,
        ("{bad} is not a readable SQLite ledger (truncated, corrupted or not a database)",),
        setup=_truncate_copy,
    ),
    Case(
        "truncated_ledger_cli",
        lambda c: run_cli("membership", "r1", "--db", c.bad_url),
        None,
        ("{bad} is not a readable SQLite ledger",),
        setup=_truncate_copy,
    ),
    Case(
        "random_bytes_open",
        lambda c: open_and_list(c.bad_url),
        LedgerOpenError,
        ("{bad} is not a readable SQLite ledger", "not a database"),
        setup=_random_file,
    ),
    Case(
        "random_bytes_cli",
        lambda c: run_cli("runs", "--db", c.bad_url),
        None,
        ("{bad} is not a readable SQLite ledger",),
        setup=_random_file,
    ),
    Case(
        "corrupted_page_open",
        lambda c: open_and_list(c.bad_url),
        LedgerError,
        ("{bad}", "malformed"),
        setup=_corrupt_runs_page,
    ),
    Case(
        "corrupted_page_cli_runs",
        lambda c: run_cli("runs", "--db", c.bad_url),
        None,
        ("{bad}", "malformed"),
        setup=_corrupt_runs_page,
    ),
    Case(
        "corrupted_page_cli_membership",
        lambda c: run_cli("membership", "r1", "--db", c.bad_url),
        None,
        ("{bad}", "malformed"),
        setup=_corrupt_events_page,
    ),
    # ── URLs ──
    Case(
        "in_memory_sqlite_open",
        lambda c: open_and_list("sqlite:///:memory:"),
        LedgerOpenError,
        ("an in-memory SQLite database cannot hold a ledger",),
    ),
    Case(
        "in_memory_sqlite_cli",
        lambda c: run_cli("runs", "--db", "sqlite://"),
        None,
        ("an in-memory SQLite database cannot hold a ledger",),
    ),
    Case(
        "unparseable_url_open",
        lambda c: open_and_list("not a url"),
        LedgerOpenError,
        ("cannot parse database URL 'not a url'", "sqlite:///path/to/ledger.db"),
    ),
    Case(
        "unparseable_url_cli",
        lambda c: run_cli("membership", "r1", "--db", "://"),
        None,
        ("cannot parse database URL '://'",),
    ),
    Case(
        "url_with_non_numeric_port_cli",
        lambda c: run_cli("runs", "--db", "postgresql://postgres@127.0.0.1:notaport/db"),
        None,
        ("cannot parse database URL", "notaport"),
    ),
    Case(
        "unsupported_backend_cli",
        lambda c: run_cli("runs", "--db", "mysql://user@127.0.0.1/ledger"),
        None,
        ("unsupported database 'mysql'",),
    ),
    Case(
        "unreachable_postgres_cli",
        lambda c: run_cli("runs", "--db", "postgresql://postgres@127.0.0.1:1/nowhere"),
        None,
        ("cannot use the ledger database at postgresql+psycopg://postgres@127.0.0.1:1/nowhere",),
    ),
    Case(
        "sqlite_directory_missing_cli",
        lambda c: run_cli("demo", "--db", f"sqlite:///{c.tmp}/no/such/ledger.db"),
        None,
        ("cannot create {tmp}/no/such/ledger.db: directory {tmp}/no/such does not exist",),
        check=_nothing_created("no"),
    ),
    Case(
        "sqlite_path_is_a_directory_cli",
        lambda c: run_cli("runs", "--db", f"sqlite:///{c.tmp}"),
        None,
        ("{tmp} is not a file",),
    ),
    Case(
        "sqlite_driver_argument_of_the_wrong_type_cli",
        lambda c: run_cli("runs", "--db", f"{c.url}?timeout=soon"),
        None,
        ("the database URL's timeout='soon' for", "must be a number of seconds"),
    ),
    Case(
        "sqlite_driver_argument_of_the_wrong_type_creates_nothing",
        lambda c: open_and_list(f"sqlite:///{c.tmp}/new.db?check_same_thread=maybe"),
        LedgerOpenError,
        ("the database URL's check_same_thread='maybe' for", "must be true or false"),
        check=_nothing_created("new.db"),
    ),
    Case(
        "sqlite_driver_argument_out_of_range_cli",
        lambda c: run_cli("runs", "--db", f"{c.url}?detect_types=99999999999999999999"),
        None,
        ("detect_types='99999999999999999999'", "a whole number from 0 to 2147483647"),
    ),
    Case(
        "sqlite_driver_argument_out_of_range_creates_nothing",
        lambda c: open_and_list(f"sqlite:///{c.tmp}/new.db?cached_statements=1e99"),
        LedgerOpenError,
        ("cached_statements='1e99'", "a whole number from 0 to 2147483647"),
        check=_nothing_created("new.db"),
    ),
    Case(
        "sqlite_busy_timeout_out_of_range_creates_nothing",
        lambda c: open_and_list(f"sqlite:///{c.tmp}/new.db?timeout=inf"),
        LedgerOpenError,
        ("timeout='inf'", "a number of seconds"),
        check=_nothing_created("new.db"),
    ),
    Case(
        "read_only_url_to_missing_file_cli",
        lambda c: run_cli("runs", "--db", f"sqlite:///file:{c.tmp}/absent.db?mode=ro&uri=true"),
        None,
        ("{tmp}/absent.db does not exist (opened read-only",),
        check=_nothing_created("absent.db"),
    ),
    # ── membership / export arguments ──
    Case(
        "membership_at_zero",
        lambda c: run_cli("membership", "r1", "--at", "0", "--db", c.url),
        None,
        ("run 'r1' has seqs 1..6; --at 0 is outside it",),
        backends=BOTH,
    ),
    Case(
        "membership_at_beyond_head",
        lambda c: run_cli("membership", "r1", "--at", "7", "--json", "--db", c.url),
        None,
        ("run 'r1' has seqs 1..6; --at 7 is outside it",),
    ),
    Case(
        "membership_unknown_run",
        lambda c: run_cli("membership", "ghost", "--db", c.url),
        None,
        ("no run 'ghost' in", "(runs: r1, r2)"),
    ),
    Case(
        "export_unknown_run",
        lambda c: run_cli("export", "ghost", "--db", c.url),
        None,
        ("no run 'ghost' in",),
    ),
]


def _params() -> list[Any]:
    params = []
    for case in CASES:
        for backend in case.backends:
            marks = [pytest.mark.postgres] if backend == "postgresql" else []
            params.append(pytest.param(case, backend, id=f"{case.name}-{backend}", marks=marks))
    return params


@pytest.fixture(autouse=True)
def _logging_like_main(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Work in an empty directory; restore the logging the commands configure."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FLEETLEDGER_DB", raising=False)
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def assert_cli_error(result: Result, fragments: Sequence[str]) -> str:
    """Exit 2, one 'fleetledger: error:' line on stderr with every fragment, no traceback."""
    shown = result.stdout + result.stderr
    crashed = ""
    if result.exc_info is not None and not isinstance(result.exception, SystemExit):
        crashed = "".join(traceback.format_exception(*result.exc_info))
    assert result.exit_code == 2, (
        f"exit {result.exit_code}\nstdout: {result.stdout}\nstderr: {result.stderr}\n{crashed}"
    )
    assert "Traceback" not in shown
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fleetledger: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    return lines[0]


@pytest.mark.parametrize(("case", "backend"), _params())
def test_bad_input_is_refused_clearly_and_changes_nothing(
    case: Case, backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "migrated_postgres_url")
    ctx = Ctx(url, backend, tmp_path)
    _build(url)
    if case.setup is not None:
        case.setup(ctx)
    rows_before = dump(url)
    files_before = file_bytes(ctx.bad_dir)
    fragments = [ctx.fmt(f) for f in case.fragments]

    if case.error is None:
        result = case.act(ctx)
        assert_cli_error(result, fragments)
        raised: Any = result.exception
    else:
        with pytest.raises(case.error) as info:
            case.act(ctx)
        raised = info.value
        message = str(raised)
        for fragment in fragments:
            assert fragment in message, f"{fragment!r} not in {message!r}"
        assert "Traceback" not in message

    assert dump(url) == rows_before, "the stored log changed"
    assert file_bytes(ctx.bad_dir) == files_before, "the file's bytes changed"
    assert not (tmp_path / "fleetledger.db").exists(), "a default ledger was created in cwd"
    if case.check is not None:
        case.check(ctx, raised)


def test_the_table_covers_at_least_fifteen_bad_inputs() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 15


# ── shapes that differ from the table ────────────────────────────────────────


def test_stored_unknown_type_stays_in_the_log_untouched(sqlite_url: str) -> None:
    """The unreadable row is reported by run and seq, and never skipped or removed."""
    _build(sqlite_url)
    raw_sql(sqlite_url, *STORE_UNKNOWN_TYPE)
    before = dump(sqlite_url)
    with EventLog.open(sqlite_url) as log:
        readable = list(log.read("r1", to_seq=R1_HEAD))  # the events before it still read
        with pytest.raises(EventDecodeError) as info:
            list(log.read("r1"))
    assert [e.seq for e in readable] == list(range(1, R1_HEAD + 1))
    assert (info.value.run, info.value.seq) == ("r1", 7)
    result = run_cli("membership", "r1", "--db", sqlite_url)
    assert_cli_error(result, ["run 'r1' seq 7: unknown event type 'shard_teleported'"])
    after = dump(sqlite_url)
    assert after == before
    stored = [r for r in after["fleetledger_events"] if r[0] == "r1" and r[1] == 7]
    assert len(stored) == 1
    assert stored[0][3] == "shard_teleported"
    assert json.loads(stored[0][6]) == {"id": "r1-7", "type": "shard_teleported", "shard": 0}


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"shard_count": 3, "base_urls": ("http://a/v1", "http://b/v1")},
            "base_urls has 2 entries for shard_count=3",
        ),
        (
            {"shard_count": 3, "min_healthy_shards": 4, "base_urls": ("a", "b", "c")},
            "min_healthy_shards=4 exceeds shard_count=3",
        ),
        ({"shard_count": 0, "base_urls": ()}, "shard_count"),
        ({"shard_count": 1, "base_urls": ("a",), "unknown_knob": 1}, "unknown_knob"),
    ],
    ids=["base_urls_count", "min_healthy_above_shards", "zero_shards", "unknown_field"],
)
def test_invalid_fleet_config_names_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError) as info:
        FleetConfig(train_world_size=2, **fields)
    assert named in str(info.value)


def test_a_refused_batch_writes_none_of_its_valid_events(ledger_url: str) -> None:
    """The valid first half of a bad batch is not written either (one transaction)."""
    _build(ledger_url)
    before = dump(ledger_url)
    good: list[Event] = [probe_ok(0, id="ok-1"), probe_ok(1, id="ok-2")]
    with EventLog.open(ledger_url) as log:
        with pytest.raises(AppendRejected):
            log.append("r1", [*good, probe_ok(SHARDS + 5, id="bad")])
        assert log.head("r1") == R1_HEAD
        assert "ok-1" not in log.event_ids("r1").values()
    assert dump(ledger_url) == before


def test_an_import_refused_at_line_3_writes_nothing_even_under_its_own_run_name(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Lines 1-2 were valid, line 3 is not: no run 'copy' appears, not even partially."""
    _build(sqlite_url)
    ctx = Ctx(sqlite_url, "sqlite", tmp_path)
    path = import_file(ctx, lambda ls: [ls[0], ls[1], "{oops", *ls[3:]])
    result = run_cli("import", str(path), "--run", "copy", "--db", sqlite_url)
    assert_cli_error(result, ["line 3:"])
    with EventLog.open(sqlite_url) as log:
        assert [s.run_id for s in log.runs()] == ["r1", "r2"]
        with pytest.raises(UnknownRun):
            log.head("copy")
