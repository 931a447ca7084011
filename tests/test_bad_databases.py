"""Files, databases and servers: what the commands do with a ledger that is missing,
empty, read-only, old, foreign, unreachable or locked, and with a URL's password.

Every CLI case checks the one shape: exit status 2, exactly one ``fleetledger: error:``
line on stderr naming what and where, nothing on stdout, no traceback — and that nothing
was created (no file, no ``-wal``/``-shm`` that was not there) and the stored ledger is
byte-for-byte what it was.

Root bypasses file permissions, so "cannot write" is made real with a read-only bind
mount (``mount -o remount,bind,ro``) and ``chattr +i``; a case skips, saying why, when
the machine allows neither. A server that accepts and never answers is a real TCP
listener on 127.0.0.1; a writer frozen inside its transaction is a real second
connection holding the run's row lock. Bounded waits are checked by a generous pytest
timeout, never by a timing assertion.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import Result
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from fleetledger.store.database import migrate, open_database
from fleetledger.store.errors import LedgerWriteError
from fleetledger.store.log import EventLog
from fleetledger.store.revisions import head_revision
from tests.builders import probe_ok
from tests.cli_support import invoke, run_cli
from tests.test_bad_input import _build, assert_cli_error, dump, file_bytes
from tests.test_migrations import _build_at_0001

pytestmark = pytest.mark.usefixtures("cli_sandbox")

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
PASSWORD = "Pw-s3cr3t-9f2c"

# Every command that only reads, with arguments that succeed on the ledger _build makes
# (watch follows r2, which has ended, so it returns).
READ_COMMANDS = {
    "runs": ("runs",),
    "membership": ("membership", "r1"),
    "replay": ("replay", "r1"),
    "explain": ("explain", "r1"),
    "watch": ("watch", "r2"),
    "export": ("export", "r1"),
    "timeline": ("timeline", "r1", "-o", "picture.html"),
}
READS = pytest.mark.parametrize("command", list(READ_COMMANDS))


# ── helpers ───────────────────────────────────────────────────────────────────


def listing(directory: Path) -> tuple[list[str], dict[str, str]]:
    """Every name in ``directory`` (dangling links too) and the bytes of every file."""
    return sorted(os.listdir(directory)), file_bytes(directory)


def read_cli(command: str, url: str) -> Result:
    return run_cli(*READ_COMMANDS[command], "--db", url)


def refused(result: Result, *fragments: str) -> str:
    """The one-line refusal, which never quotes the password nor blames corruption."""
    line = assert_cli_error(result, fragments)
    assert PASSWORD not in result.stdout + result.stderr
    assert "corrupted" not in line
    return line


def built_ledger(directory: Path) -> Path:
    """A checkpointed WAL-mode ledger (runs r1, r2) alone in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "ledger.db"
    _build(f"sqlite:///{path}")
    assert sorted(os.listdir(directory)) == ["ledger.db"]
    assert path.read_bytes()[18] == 2  # WAL mode
    return path


def with_password(url: str) -> str:
    assert "postgres@" in url, url
    return url.replace("postgres@", f"postgres:{PASSWORD}@", 1)


def libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


# ── read commands never create a ledger ───────────────────────────────────────


@READS
def test_a_read_command_on_a_mistyped_path_says_no_ledger_and_creates_nothing(
    command: str, tmp_path: Path
) -> None:
    typo = tmp_path / "ledgr.db"
    before = listing(tmp_path)

    refused(read_cli(command, f"sqlite:///{typo}"), f"no ledger at {typo}")

    assert listing(tmp_path) == before


def test_a_read_command_under_a_missing_directory_says_no_ledger(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "ledger.db"

    refused(
        read_cli("runs", f"sqlite:///{missing}"),
        f"no ledger at {missing}",
        f"directory {missing.parent} does not exist",
    )

    assert not (tmp_path / "no").exists()


@READS
def test_a_read_command_refuses_an_empty_file_and_leaves_it_empty(
    command: str, tmp_path: Path
) -> None:
    directory = tmp_path / "ledger"
    directory.mkdir()
    empty = directory / "ledger.db"
    empty.touch()

    before = listing(directory)

    refused(read_cli(command, f"sqlite:///{empty}"), f"no ledger at {empty}", "empty")

    assert listing(directory) == before
    assert empty.stat().st_size == 0


@READS
def test_a_read_command_refuses_a_dangling_symlink_and_creates_no_target(
    command: str, tmp_path: Path
) -> None:
    directory = tmp_path / "ledger"
    directory.mkdir()
    link = directory / "ledger.db"
    link.symlink_to(directory / "moved-away.db")
    before = listing(directory)

    refused(read_cli(command, f"sqlite:///{link}"), f"{link}", "symbolic link", "moved-away.db")

    assert listing(directory) == before
    assert not (directory / "moved-away.db").exists()


def test_a_writing_command_refuses_a_dangling_symlink_too(tmp_path: Path) -> None:
    link = tmp_path / "ledger.db"
    link.symlink_to(tmp_path / "moved-away.db")

    refused(run_cli("demo", "--db", f"sqlite:///{link}"), f"{link}", "symbolic link")

    assert not (tmp_path / "moved-away.db").exists()


# ── a read open is read-only for real ─────────────────────────────────────────


def test_a_read_open_of_sqlite_cannot_write_and_leaves_nothing_beside_the_file(
    tmp_path: Path,
) -> None:
    path = built_ledger(tmp_path / "ledger")
    url = f"sqlite:///{path}"
    rows, files = dump(url), listing(path.parent)

    database = open_database(url, mode="read")
    try:
        assert database.read_only
        assert database.engine is None  # the standard library's driver alone
        with database.reads.reading() as conn:
            with pytest.raises(sqlite3.OperationalError, match="readonly database"):
                conn.execute("DELETE FROM fleetledger_events")
        with pytest.raises(LedgerWriteError, match=r"write failed \(the ledger is read-only\)"):
            EventLog(database).append("r1", [probe_ok(0)])
    finally:
        database.dispose()

    assert dump(url) == rows
    assert listing(path.parent) == files  # the -wal and -shm the reads used are gone


@pytest.mark.parametrize("command", ["migrate", "runs", "demo"])
def test_a_malformed_ledger_is_one_line_for_migrate_as_for_every_open(
    tmp_path: Path, command: str
) -> None:
    path = built_ledger(tmp_path / "ledger")
    with path.open("r+b") as fh:  # page 2 (of 4096 bytes) scrawled over
        fh.seek(4096)
        fh.write(b"\xee" * 4096)
    before = listing(path.parent)
    args = ("migrate",) if command == "migrate" else READ_COMMANDS.get(command, (command,))
    result = run_cli(*args, "--db", f"sqlite:///{path}")
    assert_cli_error(result, ["is not a readable SQLite ledger", "malformed"])
    assert listing(path.parent) == before


@pytest.mark.postgres
def test_a_read_open_of_postgres_runs_read_only_transactions(migrated_postgres_url: str) -> None:
    _build(migrated_postgres_url)
    rows = dump(migrated_postgres_url)
    # The URL's own options cannot turn read-only off: the read open's setting comes last.
    url = migrated_postgres_url + "?options=-c%20default_transaction_read_only%3Doff"

    with EventLog.open(url, mode="read") as log:
        with log.database.engine.connect() as conn:
            assert conn.execute(text("SHOW default_transaction_read_only")).scalar() == "on"
            with pytest.raises(DBAPIError, match="read-only transaction"):
                conn.execute(text("DELETE FROM fleetledger_events"))
        with pytest.raises(LedgerWriteError, match=r"\(the ledger is read-only\)") as info:
            log.append("r1", [probe_ok(0)])
        assert "nothing was written" in str(info.value)

    assert dump(migrated_postgres_url) == rows


@READS
def test_every_read_command_reads_through_a_mode_ro_url_without_a_warning_or_a_trace(
    command: str, tmp_path: Path
) -> None:
    path = built_ledger(tmp_path / "ledger")
    url = f"sqlite:///{path}?mode=ro"
    before = listing(path.parent)

    with warnings.catch_warnings():
        # pysqlite's "Query string argument(s) 'mode' ... are being ignored" is an error.
        warnings.simplefilter("error")
        result = invoke(*READ_COMMANDS[command], "--db", url)

    assert result.stderr == "" or command == "watch"  # watch says what it follows there
    assert listing(path.parent) == before


# ── read-only URLs ────────────────────────────────────────────────────────────


@pytest.mark.parametrize("command", ["demo", "import"])
@pytest.mark.parametrize(
    "form", ["sqlite:///{path}?mode=ro", "sqlite:///file:{path}?mode=ro&uri=true"]
)
def test_a_writing_command_through_a_read_only_url_is_refused_and_writes_nothing(
    command: str, form: str, tmp_path: Path
) -> None:
    path = built_ledger(tmp_path / "ledger")
    url = form.format(path=path)
    export = tmp_path / "r1.jsonl"
    export.write_text(invoke("export", "r1", "--db", f"sqlite:///{path}").stdout)
    rows, files = dump(f"sqlite:///{path}"), listing(path.parent)
    args = ("demo",) if command == "demo" else ("import", str(export), "--run", "copy")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = run_cli(*args, "--db", url)

    refused(result, "the ledger is opened read-only", "nothing was written", str(path))
    assert dump(f"sqlite:///{path}") == rows
    assert listing(path.parent) == files


def test_an_append_through_a_read_only_url_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    path = built_ledger(tmp_path / "ledger")
    rows, files = dump(f"sqlite:///{path}"), listing(path.parent)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with EventLog.open(f"sqlite:///{path}?mode=ro") as log:
            assert log.runs()  # reads work
            with pytest.raises(LedgerWriteError, match="the ledger is read-only") as info:
                log.append("r1", [probe_ok(0)])

    assert "opened read-only, nothing was written" in str(info.value)
    assert dump(f"sqlite:///{path}") == rows
    assert listing(path.parent) == files


def test_the_installed_command_never_prints_sqlites_query_string_warning(tmp_path: Path) -> None:
    path = built_ledger(tmp_path / "ledger")
    url = f"sqlite:///{path}?mode=ro"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(CONSOLE_SCRIPT), *args, "--db", url],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )

    read = run("runs", "--json")
    assert (read.returncode, read.stderr) == (0, "")
    write = run("demo")
    assert write.returncode == 2
    assert write.stderr.count("\n") == 1, write.stderr
    assert "the ledger is opened read-only" in write.stderr


# ── ledgers this process cannot write ─────────────────────────────────────────


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(source, mount): ``mount`` shows ``source`` through a read-only bind mount."""
    source, mount = tmp_path / "source", tmp_path / "mount"
    source.mkdir()
    mount.mkdir()
    steps = (
        ["mount", "--bind", str(source), str(mount)],
        ["mount", "-o", "remount,bind,ro", str(mount)],
    )
    for step, argv in enumerate(steps):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            if step:
                subprocess.run(["umount", str(mount)], check=False)
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"a read-only bind mount is needed to make 'cannot write' real: {why}")
    try:
        with pytest.raises(OSError):
            (mount / "probe").touch()
        yield source, mount
    finally:
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def chattr() -> Iterator:
    """``chattr(path)`` makes a file or directory immutable until the test ends."""
    marked: list[Path] = []

    def mark(path: Path) -> None:
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"chattr +i is needed to make 'cannot write' real: {why}")
        marked.append(path)

    try:
        yield mark
    finally:
        for path in reversed(marked):
            subprocess.run(["chattr", "-i", str(path)], check=False)


def _stdout(*args: str) -> str:
    return invoke(*args).stdout


@READS
def test_a_sound_ledger_on_a_read_only_mount_is_read_by_every_read_command(
    command: str, read_only_mount: tuple[Path, Path]
) -> None:
    source, mount = read_only_mount
    built_ledger(source)
    before = listing(source)
    args = READ_COMMANDS[command]

    through_mount = _stdout(*args, "--db", f"sqlite:///{mount / 'ledger.db'}")

    assert listing(source) == before
    if command != "timeline":  # its line names the picture, written twice here
        assert through_mount == _stdout(*args, "--db", f"sqlite:///{source / 'ledger.db'}")


def test_a_ledger_on_a_read_only_mount_is_read_at_rest_and_while_its_writer_is_live(
    read_only_mount: tuple[Path, Path],
) -> None:
    source, mount = read_only_mount
    built_ledger(source)
    mounted = f"sqlite:///{mount / 'ledger.db'}"
    at_rest = [r["run"] for r in _json_runs(mounted)]
    assert at_rest == ["r1", "r2"]

    # A writer on the writable side keeps its -wal and -shm: the new events are only in
    # the WAL, and a reader on the mount must see them through the writer's index.
    with EventLog.open(f"sqlite:///{source / 'ledger.db'}") as writer:
        writer.append("r1", [probe_ok(0)])
        assert Path(f"{source / 'ledger.db'}-shm").exists()
        live = {r["run"]: r["events"] for r in _json_runs(mounted)}

    assert live == {"r1": 7, "r2": 3}


def _json_runs(url: str) -> list[dict]:
    return json.loads(_stdout("runs", "--json", "--db", url))


@pytest.mark.parametrize("command", ["runs", "membership", "export"])
def test_a_ledger_in_an_immutable_directory_is_refused_as_not_writable(
    command: str, tmp_path: Path, chattr
) -> None:
    path = built_ledger(tmp_path / "ledger")
    before = listing(path.parent)
    chattr(path.parent)

    line = refused(read_cli(command, f"sqlite:///{path}"), f"{path} is not writable", "-shm")

    assert "copy the ledger" in line
    assert listing(path.parent) == before


@pytest.mark.parametrize("command", ["runs", "membership", "export"])
def test_an_immutable_ledger_file_is_refused_rather_than_left_with_files_beside_it(
    command: str, tmp_path: Path, chattr
) -> None:
    path = built_ledger(tmp_path / "ledger")
    before = listing(path.parent)
    chattr(path)

    line = refused(read_cli(command, f"sqlite:///{path}"), f"{path} is not writable", "-wal")

    assert "could not remove" in line
    assert listing(path.parent) == before


@pytest.mark.parametrize("where", ["read-only mount", "immutable file"])
@pytest.mark.parametrize("command", ["demo", "import"])
def test_a_writing_command_refuses_a_ledger_it_cannot_write(
    command: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if where == "read-only mount":
        source, directory = request.getfixturevalue("read_only_mount")
    else:
        source = directory = tmp_path / "ledger"
    built_ledger(source)
    export = tmp_path / "r1.jsonl"
    export.write_text(_stdout("export", "r1", "--db", f"sqlite:///{source / 'ledger.db'}"))
    if where == "immutable file":
        request.getfixturevalue("chattr")(source / "ledger.db")
    path = directory / "ledger.db"
    files = listing(source)  # the bytes of every file: the rows cannot differ
    args = ("demo",) if command == "demo" else ("import", str(export), "--run", "copy")

    refused(run_cli(*args, "--db", f"sqlite:///{path}"), f"{path} is not writable")

    assert listing(source) == files


def _old_wal_ledger(path: Path) -> None:
    """A ledger at revision 0001, in WAL mode like every ledger fleetledger writes."""
    _build_at_0001(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    finally:
        conn.close()
    assert sorted(os.listdir(path.parent)) == [path.name]


def test_an_old_revision_ledger_on_a_read_only_mount_says_it_needs_migrate(
    read_only_mount: tuple[Path, Path],
) -> None:
    source, mount = read_only_mount
    _old_wal_ledger(source / "ledger.db")
    before = listing(source)

    for command in ("runs", "membership"):
        refused(
            read_cli(command, f"sqlite:///{mount / 'ledger.db'}"),
            "at schema revision 0001",
            "fleetledger migrate",
            "someone who can write it",
        )

    assert listing(source) == before


def test_a_read_command_never_upgrades_an_old_ledger_and_migrate_does(tmp_path: Path) -> None:
    directory = tmp_path / "ledger"
    directory.mkdir()
    path = directory / "ledger.db"
    _old_wal_ledger(path)
    url = f"sqlite:///{path}"
    before = listing(directory)

    refused(read_cli("runs", url), "at schema revision 0001", f"fleetledger migrate --db {url}")
    refused(read_cli("membership", url), "opened read-only, so it was not upgraded")

    assert listing(directory) == before
    invoke("migrate", "--db", url)
    assert [r["run"] for r in _json_runs(url)] == ["legacy"]


# ── PostgreSQL: a database that holds other tables ────────────────────────────


def _foreign_tables(url: str) -> None:
    import psycopg

    with psycopg.connect(libpq(url)) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers VALUES (1, 'Ada')")


@pytest.mark.postgres
def test_migrate_refuses_a_postgres_database_holding_other_tables_unless_asked(
    postgres_url: str,
) -> None:
    _foreign_tables(postgres_url)
    url = with_password(postgres_url)
    before = dump(postgres_url)

    refused(
        run_cli("migrate", "--db", url),
        "holds the tables customers and no fleetledger schema",
        "--into-foreign-database",
        "postgres:***@",
    )
    refused(run_cli("runs", "--db", url), "is not a fleetledger ledger", "customers")
    refused(run_cli("demo", "--db", url), "--into-foreign-database")
    assert dump(postgres_url) == before

    migrated = invoke("migrate", "--into-foreign-database", "--db", url).stdout
    assert migrated.strip() == f"ledger schema upgraded from empty to revision {head_revision()}"
    after = dump(postgres_url)
    assert after["customers"] == before["customers"]
    assert "fleetledger_events" in after
    invoke("demo", "--db", url)
    assert len(_json_runs(url)) == 1


# ── PostgreSQL: bounded waits ─────────────────────────────────────────────────


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP listener on 127.0.0.1 that accepts every connection and never says a word."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        thread.join(timeout=5)
        for conn in held:
            conn.close()


@pytest.mark.timeout(90)
def test_a_server_that_never_answers_costs_the_default_connect_timeout(silent_server: int) -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{silent_server}/ledger"

    refused(
        run_cli("runs", "--db", url),
        f"cannot use the ledger database at postgresql+psycopg://postgres:***@127.0.0.1:"
        f"{silent_server}/ledger",
        "did not answer within connect_timeout=10 s",
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("command", ["runs", "membership", "demo", "migrate"])
def test_a_server_that_never_answers_costs_the_urls_connect_timeout(
    command: str, silent_server: int
) -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{silent_server}/ledger?connect_timeout=2"
    args = ("membership", "r1") if command == "membership" else (command,)

    refused(run_cli(*args, "--db", url), "did not answer within connect_timeout=2 s")


@pytest.mark.postgres
def test_a_schema_named_after_the_user_does_not_hide_a_ledger_in_public(
    migrated_postgres_url: str,
) -> None:
    # The default search_path is "$user", public: once a schema named after the user
    # exists, current_schema() is that one, and the ledger's tables are still in public.
    import psycopg

    _build(migrated_postgres_url)
    rows = dump(migrated_postgres_url)
    libpq_url = migrated_postgres_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(libpq_url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', '\"$user\", public', false)")
        conn.execute('CREATE SCHEMA "' + conn.info.user + '"')
        assert conn.execute("SELECT current_schema()").fetchone() == (conn.info.user,)

    with EventLog.open(migrated_postgres_url, mode="read") as log:
        assert [r.run_id for r in log.runs()] == ["r1", "r2"]
    with EventLog.open(migrated_postgres_url) as log:
        log.append("r1", [probe_ok(0)])
    assert migrate(migrated_postgres_url) == (head_revision(), head_revision())
    assert len(dump(migrated_postgres_url)["fleetledger_events"]) == (
        len(rows["fleetledger_events"]) + 1
    )


@pytest.mark.postgres
def test_postgres_sessions_get_bounded_times_and_the_url_wins(migrated_postgres_url: str) -> None:
    def settings(url: str) -> tuple[str, str, str]:
        database = open_database(url)
        try:
            assert PASSWORD not in database.display_url
            with database.engine.connect() as conn:
                lock, statement = (
                    conn.execute(text(f"SHOW {name}")).scalar()
                    for name in ("lock_timeout", "statement_timeout")
                )
                connect = conn.connection.driver_connection.info.get_parameters()
            return lock, statement, connect.get("connect_timeout")
        finally:
            database.dispose()

    url = with_password(migrated_postgres_url)
    assert settings(url) == ("30s", "5min", "10")
    assert settings(url + "?lock_timeout=2s&statement_timeout=0&connect_timeout=3") == (
        "2s",
        "0",
        "3",
    )
    assert settings(url + "?options=-c%20lock_timeout%3D7s")[0] == "7s"


class _Holder:
    """A second, real session holding a lock inside an open transaction."""

    def __init__(self, url: str, statement: str) -> None:
        import psycopg

        self.conn = psycopg.connect(libpq(url))
        self.conn.execute(statement)  # the transaction stays open: the lock is held

    def release(self) -> None:
        if not self.conn.closed:
            self.conn.rollback()
            self.conn.close()


@pytest.fixture
def holder() -> Iterator:
    held: list[_Holder] = []

    def hold(url: str, statement: str) -> _Holder:
        held.append(_Holder(url, statement))
        return held[-1]

    try:
        yield hold
    finally:
        for h in held:
            h.release()


LOCK_R1 = "SELECT run_id FROM fleetledger_runs WHERE run_id = 'r1' FOR UPDATE"
LOCK_EVENTS = "LOCK TABLE fleetledger_events IN ACCESS EXCLUSIVE MODE"


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_an_import_behind_a_frozen_writer_costs_lock_timeout_and_writes_nothing(
    migrated_postgres_url: str, tmp_path: Path, holder
) -> None:
    _build(migrated_postgres_url)
    export = tmp_path / "r1.jsonl"
    export.write_text(_stdout("export", "r1", "--db", migrated_postgres_url))
    rows = dump(migrated_postgres_url)
    url = with_password(migrated_postgres_url) + "?lock_timeout=1s"
    frozen = holder(migrated_postgres_url, LOCK_R1)

    # Without the lock this import is refused as "already exists": it must get that far.
    refused(
        run_cli("import", str(export), "--db", url),
        "write failed (another session held a lock it needed for longer than lock_timeout",
        "nothing was written",
        "postgres:***@",
    )

    frozen.release()
    assert dump(migrated_postgres_url) == rows


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_an_append_behind_a_frozen_writer_costs_the_default_lock_timeout(
    migrated_postgres_url: str, holder
) -> None:
    _build(migrated_postgres_url)
    rows = dump(migrated_postgres_url)
    frozen = holder(migrated_postgres_url, LOCK_R1)

    with EventLog.open(with_password(migrated_postgres_url)) as log:
        with pytest.raises(LedgerWriteError, match="lock_timeout") as info:
            log.append("r1", [probe_ok(0)])

    assert PASSWORD not in str(info.value)
    frozen.release()
    assert dump(migrated_postgres_url) == rows


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("query", "named"),
    [("lock_timeout=1s", "lock_timeout"), ("lock_timeout=0&statement_timeout=1s", "statement")],
)
def test_a_read_behind_a_held_table_lock_costs_a_bounded_wait_and_one_line(
    query: str, named: str, migrated_postgres_url: str, holder
) -> None:
    _build(migrated_postgres_url)
    rows = dump(migrated_postgres_url)
    migration = holder(migrated_postgres_url, LOCK_EVENTS)  # what a migration holds
    url = with_password(migrated_postgres_url) + "?" + query

    for args in (("runs",), ("membership", "r1")):
        line = refused(run_cli(*args, "--db", url), "read failed", f"longer than {named}")
        assert "postgres:***@" in line

    migration.release()
    assert dump(migrated_postgres_url) == rows


# ── passwords in URLs that never reach a server ───────────────────────────────


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        (
            f"postgresql://postgres:{PASSWORD}@127.0.0.1:notaport/ledger",
            ("cannot parse database URL", "postgres:***@127.0.0.1:notaport"),
        ),
        (
            f"mysql://someone:{PASSWORD}@127.0.0.1/ledger",
            ("unsupported database 'mysql'", "someone:***@"),
        ),
        (f"sqlite://someone:{PASSWORD}@/ledger.db", ("a SQLite URL names a file",)),
    ],
    ids=["bad_port", "unsupported_backend", "sqlite_with_a_password"],
)
@pytest.mark.parametrize("command", ["runs", "demo", "migrate"])
def test_a_url_that_cannot_be_used_is_refused_without_its_password(
    command: str, url: str, fragments: tuple[str, ...], tmp_path: Path
) -> None:
    before = listing(tmp_path)

    refused(run_cli(command, "--db", url), *fragments)

    assert listing(tmp_path) == before
