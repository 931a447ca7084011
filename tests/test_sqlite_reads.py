"""A SQLite ledger is read on the standard library's driver alone: no SQLAlchemy.

Importing SQLAlchemy was most of a read command's start-up, so a read open of a SQLite
ledger builds no engine. Every read the library offers runs in a fresh interpreter
here, which then reports whether SQLAlchemy was loaded (the test process has it, so
only a new process can tell); a write open, and PostgreSQL, still load it.

The read connections (``SqliteReads``) are kept for the next read; each read is one
transaction, and a connection whose read failed is never handed out again.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from fleetledger.projections.fleet_view import fold
from fleetledger.projections.snapshot import PROJECTION_VERSION, to_snapshot
from fleetledger.queries.reader import RunReader
from fleetledger.store.errors import LedgerReadError
from fleetledger.store.log import EventLog
from fleetledger.store.sqlite_file import SqliteReads
from tests.builders import probe_failed, probe_ok, run_started

READS = """
import json, sys
from fleetledger.store.log import EventLog
from fleetledger.store.sqlite_file import SqliteReads
from fleetledger.queries.reader import RunReader

url, run = sys.argv[1], sys.argv[2]
with EventLog.open(url, mode=sys.argv[3]) as log:
    reader = RunReader(log, run)
    answers = {
        "epoch": reader.view().epoch,
        "at_2": reader.view(2).epoch,
        "history": len(list(reader.history())),
        "explained": type(reader.explain(0)).__name__,
        "seq_at": log.seq_at(run, reader.head.at_us),
        "runs": [r.run_id for r in log.runs()],
        "ids": len(log.event_ids(run)),
        "events": log.count_events(),
        "snapshot": log.load_snapshot(run, int(sys.argv[4])) is not None,
    }
answers["sqlalchemy"] = sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy")[:3]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    """A ledger with one run (and a snapshot), and the answers read in this process."""
    path = tmp_path_factory.mktemp("read") / "ledger.db"
    with EventLog.open(f"sqlite:///{path}") as log:
        log.append("r1", [run_started(), probe_ok(0), probe_failed(1), probe_ok(1)])
        at_2 = fold(log.read("r1", to_seq=2))
        log.save_snapshot("r1", PROJECTION_VERSION, 2, to_snapshot(at_2))
        reader = RunReader(log, "r1")
        here = {"epoch": reader.view().epoch, "history": len(list(reader.history()))}
    return path, {**here, "ids": 4, "events": 4, "runs": ["r1"], "seq_at": 4, "snapshot": True}


def read_fresh(url: str, mode: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", READS, url, "r1", mode, str(PROJECTION_VERSION)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "suffix", ["", "?mode=ro", "?immutable=1"], ids=["read", "mode=ro", "immutable"]
)
def test_every_read_of_a_sqlite_ledger_runs_without_sqlalchemy(ledger, suffix: str) -> None:
    path, expected = ledger
    answers = read_fresh(f"sqlite:///{path}{suffix}", "read")
    assert answers["sqlalchemy"] == []
    assert {k: answers[k] for k in expected} == expected


def test_a_write_open_still_builds_its_engine(ledger) -> None:
    path, expected = ledger
    answers = read_fresh(f"sqlite:///{path}", "write")
    assert answers["sqlalchemy"] != []  # the report sees SQLAlchemy when it is loaded
    assert {k: answers[k] for k in expected} == expected


# ── the read connections ───────────────────────────────────────────────────────


def test_a_read_connection_is_kept_for_the_next_read_and_nested_reads_get_their_own(
    ledger,
) -> None:
    path, _ = ledger
    reads = SqliteReads(path, {"mode": "ro"})
    try:
        with reads.reading() as first:
            with reads.reading() as nested:
                assert nested is not first
        with reads.reading() as again:
            assert again in (first, nested)
    finally:
        reads.close()


def test_a_read_is_one_snapshot_and_the_next_read_sees_what_was_committed(tmp_path) -> None:
    path = tmp_path / "ledger.db"
    with EventLog.open(f"sqlite:///{path}") as log:
        log.append("r1", [run_started(), probe_ok(0)])
        reads = SqliteReads(path, {})
        try:
            count = "SELECT count(*) FROM fleetledger_events"
            with reads.reading() as conn:
                assert conn.execute(count).fetchone() == (2,)
                log.append("r1", [probe_ok(1)])  # committed by the writer meanwhile
                assert conn.execute(count).fetchone() == (2,)
            with reads.reading() as conn:
                assert conn.execute(count).fetchone() == (3,)
        finally:
            reads.close()


def test_a_connection_whose_read_failed_is_closed_not_kept(ledger) -> None:
    path, _ = ledger
    reads = SqliteReads(path, {"mode": "ro"})
    try:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            with reads.reading() as failed:
                failed.execute("SELECT * FROM no_such_table")
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            failed.execute("SELECT 1")
        with reads.reading() as conn:
            assert conn is not failed
            assert conn.execute("SELECT count(*) FROM fleetledger_runs").fetchone() == (1,)
    finally:
        reads.close()


def test_closing_the_reads_closes_the_kept_connections(ledger) -> None:
    path, _ = ledger
    reads = SqliteReads(path, {"mode": "ro"})
    with reads.reading() as kept:
        pass
    reads.close()
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        kept.execute("SELECT 1")


def test_a_read_of_the_ledger_after_it_was_closed_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with EventLog.open(f"sqlite:///{path}") as log:
        log.append("r1", [run_started()])
    log = EventLog.open(f"sqlite:///{path}", mode="read")
    log.close()
    with pytest.raises(LedgerReadError, match="the ledger was closed"):
        log.runs()
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.db"]  # no -wal, -shm


# ── reads beside a writer ──────────────────────────────────────────────────────


def test_a_read_past_the_head_takes_in_what_was_appended_while_it_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page short of its bound looks the head up again and reads the page once more,
    in one snapshot with that head: rows appended meanwhile are the run's, not damage."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with EventLog.open(url) as writer, EventLog.open(url, mode="read") as reader:
        writer.append("r1", [run_started(), probe_ok(0), probe_ok(1)])
        short_page = EventLog._short_page

        def appended_first(self: EventLog, *args: object, **kwargs: object) -> object:
            writer.append("r1", [probe_failed(2)])  # between the page's read and this
            return short_page(self, *args, **kwargs)

        monkeypatch.setattr(EventLog, "_short_page", appended_first)
        rows = [row for page in reader.read_stored("r1", 0, 100) for row in page]
    assert [row[0] for row in rows] == [1, 2, 3, 4]


def test_a_page_held_by_the_caller_holds_no_lock_a_writer_would_wait_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without shared memory (``vfs=unix-dotfile``) a ledger keeps a rollback journal, in
    which an open read locks every writer out: a read must not stay open while the
    caller works on a page it was given (``export | less``)."""
    import fleetledger.store.log as log_module

    monkeypatch.setattr(log_module, "READ_PAGE", 2)
    url = f"sqlite:///{tmp_path / 'ledger.db'}?vfs=unix-dotfile&timeout=1"
    with EventLog.open(url) as log:
        log.append("r1", [run_started(), probe_ok(0), probe_ok(1), probe_ok(2)])
        with sqlite3.connect(tmp_path / "ledger.db") as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        pages = log.read_pages("r1")
        first = next(pages)
        log.append("r1", [probe_failed(0)])  # refused after 1 s if the read were open
        rest = [event for page in pages for event in page]
        assert log.head("r1") == 5
    # The read ends at the head it found when it began; the append is there for the next.
    assert [e.seq for e in [*first, *rest]] == [1, 2, 3, 4]


WRITER = """
import sys
from fleetledger.store.log import EventLog
from tests.builders import probe_ok, run_started

with EventLog.open(sys.argv[1]) as log:  # closed on the way out: its last connection
    log.append(sys.argv[2], [run_started(), *(probe_ok(0) for _ in range(200))])
"""


def test_opening_a_reader_keeps_this_process_locks_so_another_writer_leaves_the_wal(
    tmp_path: Path,
) -> None:
    """A read open beside this process's own connections must not touch the file with a
    plain open() and close(): that drops every POSIX lock the process holds on it, and a
    writer in another process that then closes its last connection takes itself for the
    last one anywhere — it checkpoints and deletes the -wal and -shm under connections
    still reading them (what the chaos campaign's reads met: "database disk image is
    malformed"). Here the writer's exit must leave both, and every read sees it all."""
    path = tmp_path / "shared.db"
    url = f"sqlite:///{path}"
    with EventLog.open(url) as log:
        log.append("mine", [run_started(), probe_ok(0)])
        assert len(list(log.read("mine"))) == 2  # a read connection kept open
        with EventLog.open(url, mode="read") as follower:  # beside it, in this process
            assert len(list(follower.read("mine"))) == 2
            done = subprocess.run(
                [sys.executable, "-c", WRITER, url, "theirs"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                cwd=Path(__file__).parent.parent,
            )
            assert done.returncode == 0, done.stderr
            # This process's connections are open: the writer was not the last one.
            assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
            assert len(list(follower.read("theirs"))) == 201
            assert len(list(log.read("theirs"))) == 201
            log.append("mine", [probe_ok(1)])
            assert len(list(follower.read("mine"))) == 3
