"""A SQLite ledger as a file: its path, opening it to read without writing, to write
with WAL and full synchronous commits, and the engine every connection goes through.

See ``events.database`` for the rules of read and write opens; this module keeps how
they are carried out on a SQLite file.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlencode

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine

from fleetledger.events.db_urls import query_params
from fleetledger.events.errors import LedgerNotWritable, LedgerOpenError, NoLedger

SQLITE_BUSY_TIMEOUT_MS = 30_000
# Query parameters the Python driver takes; every other one is a SQLite URI parameter.
_PYSQLITE_ARGS = (
    "timeout",
    "isolation_level",
    "detect_types",
    "check_same_thread",
    "cached_statements",
)
_SQLITE_MAGIC = b"SQLite format 3\x00"
_TRUE = ("1", "true", "yes", "on")


# ── SQLite: the file ─────────────────────────────────────────────────────────


def sqlite_path(url: URL) -> Path:
    database = url.database
    if url.username or url.password or url.host or url.port:
        raise LedgerOpenError(
            "a SQLite URL names a file, not a user, password or host: use "
            "sqlite:///relative/ledger.db or sqlite:////absolute/ledger.db"
        )
    if not database or database == ":memory:" or query_params(url).get("mode") == "memory":
        database = ":memory:"
    elif database.startswith("file:"):  # the user's own URI form
        database = database[len("file:") :]
        if database.startswith("//"):  # file://host/path: only this machine
            host, _, rest = database[2:].partition("/")
            if host not in ("", "localhost"):
                raise LedgerOpenError(f"a SQLite ledger is a local file, not one on {host!r}")
            database = "/" + rest
        database = unquote(database)
    if not database or database.startswith(":memory:"):
        raise LedgerOpenError(
            "an in-memory SQLite database cannot hold a ledger (nothing would survive the "
            "process); give a file, e.g. sqlite:///fleetledger.db"
        )
    return Path(database)


def sqlite_params(url: URL) -> dict[str, str]:
    """The URL's query without ``uri``: every SQLite URL goes to the driver as a URI."""
    return {k: v for k, v in query_params(url).items() if k != "uri"}


def params_read_only(params: dict[str, str]) -> bool:
    return params.get("mode") == "ro" or params.get("immutable", "").lower() in _TRUE


def read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def cannot_write(path: Path, *, directory: bool = True) -> str | None:
    """Why this process cannot write the ledger file (or its directory), or None."""
    if not os.access(path, os.W_OK):
        if read_only_fs(path):
            return "it is on a read-only file system"
        return "this user may not write it"
    if directory and not os.access(path.parent, os.W_OK):
        if read_only_fs(path.parent):
            return f"its directory {path.parent} is on a read-only file system"
        return f"this user may not write its directory {path.parent}"
    return None


def refuse_odd_path(path: Path) -> None:
    if path.is_symlink() and not path.exists():
        raise NoLedger(
            f"no ledger at {path}: it is a symbolic link to {os.readlink(path)}, which does "
            "not exist"
        )
    if path.exists() and not path.is_file():
        raise LedgerOpenError(f"{path} is not a file; a SQLite ledger must be a file")


def check_readable_file(path: Path) -> None:
    """A read open needs a ledger file that is there: it never creates one."""
    refuse_odd_path(path)
    if not path.exists():
        why = (
            f"{path} does not exist"
            if path.parent.is_dir()
            else f"directory {path.parent} does not exist"
        )
        raise NoLedger(f"no ledger at {path}: {why} (opened read-only, so it was not created)")
    if path.stat().st_size == 0:
        raise NoLedger(
            f"no ledger at {path}: the file is empty (0 bytes); a read never initialises one"
        )


def prepare_sqlite_file(path: Path, params: dict[str, str]) -> None:
    """A write open: refuse a file this process cannot write; create a missing ledger
    file with mode 0600 before SQLite creates it 0644."""
    refuse_odd_path(path)
    if path.exists():
        # The -wal and -shm are created beside it unless both are there already.
        there = Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
        reason = cannot_write(path, directory=not there)
        if reason is not None:
            raise LedgerNotWritable(
                f"{path} is not writable: {reason}; this command writes to the ledger "
                "(read commands can still read it)"
            )
        return
    if params.get("mode") == "rw":
        raise NoLedger(f"no ledger at {path}: it does not exist, and mode=rw says not to create it")
    if not path.parent.exists():
        raise LedgerOpenError(f"cannot create {path}: directory {path.parent} does not exist")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, stat.S_IRUSR | stat.S_IWUSR)
    except FileExistsError:
        return  # another process created it first
    except OSError as exc:
        raise LedgerOpenError(f"cannot create {path}: {exc.strerror}") from None
    os.close(fd)


def is_wal_file(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            header = fh.read(100)
    except OSError as exc:
        raise LedgerOpenError(f"cannot read {path}: {exc.strerror}") from None
    # Bytes 18 and 19 of the header: the read and write format versions, 2 in WAL mode.
    return len(header) >= 20 and header.startswith(_SQLITE_MAGIC) and header[18] == 2


def plan_sqlite_read(path: Path, params: dict[str, str]) -> tuple[dict[str, str], bool]:
    """The URI parameters of a read-only open, and whether it needs a keeper (see the
    module docstring for why each case is read the way it is)."""
    params = {**params, "mode": "ro"}
    if params.get("immutable", "").lower() in _TRUE or not is_wal_file(path):
        return params, False  # the user vouches nothing changes it; or no WAL index needed
    if Path(f"{path}-shm").exists():
        return params, False  # join the index that is there
    reason = cannot_write(path)
    if reason is None:
        return params, True
    if not Path(f"{path}-wal").exists() and read_only_fs(path.parent):
        return {**params, "immutable": "1"}, False
    if os.access(path.parent, os.W_OK):
        raise LedgerNotWritable(
            f"{path} is not writable ({reason}), and SQLite reads a WAL-mode ledger only "
            f"through {path.name}-shm and {path.name}-wal beside it, which it would create "
            "and could not remove: make the file writable, or read a copy of it"
        )
    raise LedgerNotWritable(
        f"{path} is not writable ({reason}), and SQLite reads a WAL-mode ledger only "
        f"through {path.name}-shm beside it, which is not there and cannot be created: "
        f"copy the ledger to a writable directory and read the copy, or run this as a user "
        f"who can write {path.parent}"
    )


def open_keeper(path: Path) -> sqlite3.Connection:
    """A query-only read-write connection that holds the WAL index while the reads run.

    A file SQLite cannot read raises here, the keeper closed (taking the -wal and -shm
    it created with it): the read connections would fail the same way, but leave them.
    """
    keeper = sqlite3.connect(
        os.path.abspath(path),
        timeout=SQLITE_BUSY_TIMEOUT_MS / 1000,
        isolation_level=None,
        check_same_thread=False,  # the log may be closed from another thread
    )
    try:
        keeper.execute("PRAGMA query_only=ON")
        keeper.execute("SELECT count(*) FROM sqlite_master").fetchall()  # opens the WAL
    except sqlite3.Error:
        keeper.close()
        raise
    return keeper


def sqlite_engine_url(path: Path, params: dict[str, str]) -> URL:
    """The driver's URL: the file as a ``file:`` URI carrying every SQLite parameter."""
    uri = "file:" + quote(os.path.abspath(path), safe="/")
    in_uri = {k: v for k, v in params.items() if k not in _PYSQLITE_ARGS}
    if in_uri:
        uri += "?" + urlencode(in_uri)
    driver = {k: v for k, v in params.items() if k in _PYSQLITE_ARGS}
    return URL.create("sqlite", database=uri, query={**driver, "uri": "true"})


def sqlite_engine(url: URL) -> Engine:
    connect_args = {} if "timeout" in url.query else {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    engine = create_engine(url, connect_args=connect_args)

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE can be issued.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # No PRAGMA journal_mode=WAL here: it rewrites the file's header, and a file is
            # put in WAL mode only once it is known to be a ledger (use_wal).
            # FULL: a commit that returned is on disk, not only in the WAL's page cache.
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # Writers take the lock at BEGIN: seq assignment then happens one transaction
        # at a time, and no writer can fail on a read-to-write lock upgrade.
        # Straight to the driver: this runs once per append, and Core's execution
        # pipeline costs more than SQLite's BEGIN does.
        driver = conn.connection.driver_connection
        if conn.get_execution_options().get("fleetledger_write"):
            driver.execute("BEGIN IMMEDIATE")
        else:
            driver.execute("BEGIN")

    return engine


def use_wal(engine: Engine) -> None:
    """Put a SQLite ledger in WAL mode: the mode is stored in the file, so this writes.

    Called only once the file is known to be a ledger (or about to become one).
    """
    raw = engine.raw_connection()
    try:
        # Our connections have isolation_level None: this runs outside a transaction,
        # the only place SQLite lets the journal mode change.
        cursor = raw.driver_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
        finally:
            cursor.close()
    finally:
        raw.close()
