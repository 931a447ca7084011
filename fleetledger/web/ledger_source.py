"""The ledger a server reads: opened read-only on first need, opened again after it failed.

A server outlives what happens to its ledger: it may start before the run creates the
file, see it migrated by ``fleetledger migrate``, or lose the PostgreSQL connection.
Each request asks for the log here; an open that fails is that request's one-line error
(503) and the next request tries again; a read that fails closes the log, so the next
request opens it afresh (and checks its schema revision again). Nothing here writes:
the log is opened with ``mode="read"``, which never creates, upgrades or writes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from fleetledger.store.errors import LedgerOpenError, LedgerReadError
from fleetledger.store.log import EventLog
from fleetledger.store.urls import display_url_of, parse_db_url, resolve_db_url


class LedgerSource:
    """One ledger URL, and the log open on it while it works."""

    def __init__(self, url: str | None) -> None:
        self.url = resolve_db_url(url)
        self.backend = parse_db_url(self.url).backend  # a malformed URL fails here, at start
        # What pages and errors show: never a password.
        self.display_url = display_url_of(parse_db_url(self.url))
        self._log: EventLog | None = None
        self._lock = threading.Lock()
        self._closed = False

    def _open(self) -> EventLog:
        with self._lock:
            if self._closed:
                raise LedgerReadError(f"{self.url}: the server is shutting down")
            if self._log is None:
                self._log = EventLog.open(self.url, mode="read")
            return self._log

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
