"""The SQLAlchemy engine of a SQLite ledger opened to write: WAL, full synchronous
commits, a busy timeout, and writers that take the lock when they begin.

Reads never pass through it (``sqlite_file.SqliteReads``); only a write open, which may
create, upgrade or append to the ledger, builds one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Connection, Engine

from fleetledger.store.urls import sqlite_uri


def sqlite_engine(path: Path, params: dict[str, str]) -> Engine:
    """An engine over the ledger file, its URI and driver arguments as reads have them."""
    uri, driver = sqlite_uri(path, params)
    # The driver's timeout is SQLite's busy timeout: a writer waits for the write lock.
    engine = create_engine(
        URL.create("sqlite", database=uri, query={"uri": "true"}), connect_args=driver
    )

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
