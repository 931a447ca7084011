"""The log's write connections: one per thread, kept, and the transaction around them.

Checking a connection out of the pool for every append cost more than the append's own
SQL, so each thread keeps one. A thread that exits cannot close its own, so the next new
writer closes those of dead threads. A transaction's database errors become one
``LedgerWriteError`` that says what to do (a lost connection: retry with the same
events, their ids make the retry safe); a unique-key clash means the batch may be a
retry, to be redone with lookups.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from fleetledger.events.errors import first_line
from fleetledger.store.database import Database
from fleetledger.store.errors import LedgerWriteError, RetryWithLookups
from fleetledger.store.postgres_session import waited_too_long

T = TypeVar("T")


class WriteConnections:
    def __init__(self, database: Database) -> None:
        self.database = database
        self._writer = threading.local()
        self._writers: dict[Connection, threading.Thread] = {}
        self._writers_lock = threading.Lock()

    def close(self) -> None:
        with self._writers_lock:
            writers, self._writers = list(self._writers), {}
        for conn in writers:
            try:
                conn.close()
            except Exception:  # closing must not mask the caller's error
                pass

    def connection(self) -> Connection:
        conn: Connection | None = getattr(self._writer, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            with self._writers_lock:
                orphans = [c for c, t in self._writers.items() if not t.is_alive()]
                for orphan in orphans:
                    del self._writers[orphan]
            for orphan in orphans:  # owned by exited threads: never in a transaction
                try:
                    orphan.close()
                except Exception:
                    pass
            conn = self.database.write_connection()
            self._writer.conn = conn
            with self._writers_lock:
                self._writers[conn] = threading.current_thread()
        return conn

    def drop(self) -> None:
        conn: Connection | None = getattr(self._writer, "conn", None)
        self._writer.conn = None
        if conn is not None:
            with self._writers_lock:
                self._writers.pop(conn, None)
            try:
                conn.close()
            except Exception:  # the connection is being discarded anyway
                pass

    def transact(self, body: Callable[[Any], T]) -> T:
        """``body`` in one write transaction on this thread's connection, given its
        driver connection (every statement of the log runs on the driver); database
        errors become one ``LedgerWriteError``, a unique-key clash ``RetryWithLookups``."""
        if self.database.engine is None:  # a SQLite read open: nothing to write with
            raise self.error(None, False)
        try:
            conn = self.connection()
        except DBAPIError as exc:
            raise self.error(exc.orig or exc, False) from None
        except SQLAlchemyError as exc:  # e.g. the pool's TimeoutError
            raise self.error(exc, False) from None
        dbapi = conn.dialect.loaded_dbapi
        try:
            with conn.begin():
                return body(conn.connection.driver_connection)
        except (IntegrityError, dbapi.IntegrityError):
            # Raised through Core or straight from the driver cursor of the hot path.
            raise RetryWithLookups() from None
        except DBAPIError as exc:
            self.drop()
            raise self.error(exc.orig or exc, exc.connection_invalidated) from None
        except dbapi.Error as exc:
            self.drop()
            raise self.error(exc, False) from None
        except BaseException:
            self.drop()
            raise

    def error(self, exc: BaseException | None, invalidated: bool) -> LedgerWriteError:
        """The one line a failed write says; ``exc``: the driver's error, if it raised."""
        detail = "" if exc is None else self.database.scrub(first_line(exc))
        hint = ""
        waited = waited_too_long(detail)
        if self.database.read_only:
            hint = " (the ledger is read-only): it was opened read-only, nothing was written"
        elif "readonly" in detail or "read-only" in detail:
            hint = " (the ledger is read-only): nothing was written"
        elif waited is not None:
            hint = f" ({waited}): nothing was written"
        elif invalidated or "closed" in detail.lower() or "terminat" in detail.lower():
            hint = (
                " (the connection was lost; the append may or may not have committed — "
                "retry with the same events, their ids make the retry safe)"
            )
        told = f": {detail}" if detail else ""
        return LedgerWriteError(f"{self.database.display_url}: write failed{hint}{told}")
