"""The ledger a server reads: opened read-only on first need, opened again after it failed.

A server outlives what happens to its ledger: it may start before the run creates the
file, see it migrated by ``fleetledger migrate``, or lose the PostgreSQL connection.
Each request asks for the log here; an open that fails is that request's one-line error
(503) and the next request tries again; a read that fails closes the log, so the next
request opens it afresh (and checks its schema revision again). Nothing here writes:
the log is opened with ``mode="read"``, which never creates, upgrades or writes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from fleetledger.store.errors import LedgerOpenError, LedgerReadError
from fleetledger.store.log import EventLog
from fleetledger.store.urls import display_url_of, parse_db_url, resolve_db_url, sqlite_path


class LedgerSource:
    """One ledger URL, and the log open on it while it works."""

    def __init__(self, url: str | None) -> None:
        self.url = resolve_db_url(url)
        self.backend = parse_db_url(self.url).backend  # a malformed URL fails here, at start
        # What pages and errors show: never a password.
        self.display_url = display_url_of(parse_db_url(self.url))
        self._path = sqlite_path(parse_db_url(self.url)) if self.backend == "sqlite" else None
        self._identity: tuple[int, int] | None = None
        self._database: str | None = None  # PostgreSQL's word on which database it is
        self._replacements = 0
        self._replacements_seen = 0
        self._log: EventLog | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _open(self) -> EventLog:
        with self._lock:
            self._refuse_if_closed()
            self._drop_if_replaced()
            if self._log is not None:
                return self._log
            identity = self._file_identity()
        # Opened outside the lock: a database that accepts and never answers holds the
        # open up to its connect timeout, and the event loop takes this lock to look for
        # a replaced file — held here, it froze the whole server, its static files too.
        opened = EventLog.open(self.url, mode="read")
        try:
            database = opened.database_identity()
        except BaseException:
            opened.close()
            raise
        with self._lock:
            if not self._closed and self._log is None:
                self._log, self._identity = opened, identity
                if self._database is not None and database != self._database:
                    # Dropped and created again under the same name: another ledger,
                    # whose runs the feeds must not mix with what they folded.
                    self._replacements += 1
                self._database = database
                return opened
            log = self._log
        opened.close()  # another request opened it meanwhile, or the server is stopping
        if log is None:  # stopping: it was closed under us
            raise LedgerReadError(f"{self.display_url}: the server is shutting down")
        return log

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise LedgerReadError(f"{self.display_url}: the server is shutting down")

    def _drop_if_replaced(self) -> None:
        """Under the lock: close the log of a SQLite ledger replaced under us (deleted and
        created again, moved over), whose open connections would read the old file
        forever; the next read opens the new one."""
        if self._log is not None and self._file_identity() != self._identity:
            self._log, stale = None, self._log
            self._replacements += 1
            with suppress(Exception):
                stale.close()

    def _file_identity(self) -> tuple[int, int] | None:
        """(device, inode) of a SQLite ledger's file; None for PostgreSQL or no file."""
        if self._path is None:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def replaced(self) -> bool:
        """Whether the ledger was replaced since the last call: a SQLite file replaced
        (it is then reopened), a PostgreSQL database found another when reopened."""
        with self._lock:
            self._drop_if_replaced()
            seen, self._replacements_seen = self._replacements_seen, self._replacements
            return self._replacements != seen

    @contextmanager
    def reading(self) -> Iterator[EventLog]:
        """The open log for one request's reads; a failed read closes it for the next."""
        log = self._open()
        try:
            yield log
        except (LedgerOpenError, LedgerReadError):
            self._forget(log)
            raise

    def _forget(self, log: EventLog) -> None:
        with self._lock:
            if self._log is not log:
                return
            self._log = None
        with suppress(Exception):  # it failed already; closing it may fail the same way
            log.close()

    def close(self) -> None:
        with self._lock:
            log, self._log, self._closed = self._log, None, True
        if log is not None:
            log.close()
