"""A SQLite ledger as a file: checking it before an open, opening it to read without
writing, and the connections every read goes through (the standard library's driver, no
SQLAlchemy).

See ``store.database`` for the rules of read and write opens; this module keeps how
they are carried out on a SQLite file. Which file a URL names, and what its query tells
the driver, is ``store.urls``'; the engine of a write open is ``sqlite_engine``'s.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetledger.store.errors import LedgerNotWritable, LedgerOpenError, LedgerReadError, NoLedger
from fleetledger.store.urls import SQLITE_BUSY_TIMEOUT_MS, params_immutable, sqlite_uri

_SQLITE_MAGIC = b"SQLite format 3\x00"


# ── SQLite: the file ─────────────────────────────────────────────────────────


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
    """Whether the file's header says WAL mode.

    Call it only where no SQLite connection of this process can be open on the file (no
    -shm beside it): closing *any* descriptor of a file releases every POSIX lock the
    process holds on it, SQLite's included. Story: the chaos campaign's process kept a
    ledger open and, each trial, opened a follower that read the header; the SHARED lock
    its connections held was gone, so a controller process that closed its own last
    connection took itself for the last one, checkpointed and deleted the -wal and -shm
    under the campaign's live connections, and every read after that failed with
    "database disk image is malformed" (``PRAGMA integrity_check`` afterwards: ok).
    """
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
    if params_immutable(params):
        return params, False  # the user vouches nothing changes it
    if Path(f"{path}-shm").exists():
        # Join the index that is there — before any look at the file's header: a WAL
        # connection open anywhere keeps the -shm, and reading the header is an open()
        # and close() of the ledger file, which drops every POSIX lock this process
        # holds on it, its SQLite connections' too (see ``is_wal_file``).
        return params, False
    if not is_wal_file(path):
        return params, False  # no WAL index needed
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


class SqliteReads:
    """The connections a SQLite ledger is read through, kept for the next read.

    The standard library's driver, with no SQLAlchemy in between: a read command that
    needs nothing else starts in a third of the time (importing SQLAlchemy was most of
    its start-up). Each read is one deferred transaction, so everything it reads comes
    from one snapshot of the ledger, and it ends with a rollback (a read never writes).
    A connection serves one read at a time, from any thread; one that failed is closed,
    never reused. The driver's own ``isolation_level`` and ``check_same_thread`` are
    the pool's to set: transactions are begun here, and a kept connection moves
    between threads.
    """

    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, params: dict[str, str]) -> None:
        self._path = path
        self._uri, driver = sqlite_uri(path, params)
        driver.pop("isolation_level", None)
        driver.pop("check_same_thread", None)
        self._driver = driver
        self._idle: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._configure: list[Callable[[sqlite3.Connection], None]] = []

    def configure(self, setup: Callable[[sqlite3.Connection], None]) -> None:
        """Run ``setup`` on every read connection: the kept ones now, new ones as they
        open (a trace callback, a pragma). Call it between reads: a connection serving
        a read at that moment is kept without it."""
        with self._lock:
            self._configure.append(setup)
            for conn in self._idle:
                setup(conn)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._uri, uri=True, isolation_level=None, check_same_thread=False, **self._driver
        )
        for setup in self._configure:
            setup(conn)
        return conn

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                # A new connection now would have no keeper: it could leave a -wal and
                # -shm beside the file that nothing removes.
                raise LedgerReadError(f"{self._path}: the ledger was closed; open it again")
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        kept = False
        try:
            conn.execute("BEGIN")
            yield conn
            conn.rollback()
            kept = True
        finally:
            if kept:
                with self._lock:
                    kept = not self._closed
                    if kept:
                        self._idle.append(conn)
            if not kept:
                conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
        for conn in idle:
            conn.close()


# (mtime ns, size) of the ledger file and of its -wal; None for one that is not there.
FileStamp = tuple[tuple[int, int] | None, tuple[int, int] | None]


def change_stamp(path: Path) -> FileStamp:
    """What a commit to the ledger at ``path`` changes: its ``-wal`` grows (or, after a
    checkpoint, is rewritten), and a checkpoint rewrites the file. Two ``stat`` calls,
    no read: a follower in another process looks at it often and reads the tail only
    when it moved."""
    out = []
    for candidate in (path, path.with_name(path.name + "-wal")):
        try:
            st = candidate.stat()
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime_ns, st.st_size))
    return (out[0], out[1])
