"""A PostgreSQL ledger's sessions: the engine every connection goes through (SQLAlchemy,
imported when one is built), its reads, and a bounded wait that ran out, told in words.

What a session is set to (bounded waits, read-only for read opens) is what the URL says
to the driver: ``urls.postgres_connect``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fleetledger.store.errors import LedgerOpenError
from fleetledger.store.urls import LedgerUrl, connect_timeout_of, postgres_connect

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine


def postgres_engine(url: LedgerUrl, *, read_only: bool) -> Engine:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import NoSuchModuleError

    driver_url, connect_args = postgres_connect(url, read_only=read_only)
    try:
        return create_engine(driver_url.sqlalchemy(), pool_pre_ping=True, connect_args=connect_args)
    except (NoSuchModuleError, ModuleNotFoundError):
        raise LedgerOpenError(
            "the PostgreSQL driver is not installed: pip install 'fleetledger[postgres]'"
        ) from None


class PostgresReads:
    """Reads through the engine's pool: each read is a pooled connection's own driver
    connection, in the transaction psycopg begins, rolled back when it is returned."""

    def __init__(self, engine: Engine) -> None:
        from sqlalchemy.exc import DBAPIError

        self._engine = engine
        self.errors: tuple[type[BaseException], ...] = (
            DBAPIError,
            engine.dialect.loaded_dbapi.Error,
        )

    @contextmanager
    def reading(self) -> Iterator[Any]:
        with self._engine.connect() as conn:
            yield conn.connection.driver_connection

    def close(self) -> None:
        """The engine's pool is closed with the engine."""


def waited_too_long(detail: str, url: LedgerUrl | None = None) -> str | None:
    """What a driver error says about a bounded wait running out, in words; else None."""
    lowered = detail.lower()
    if "timeout expired" in lowered:
        seconds = connect_timeout_of(url) if url else None
        within = f"within connect_timeout={seconds} s" if seconds else "within connect_timeout"
        return (
            f"the server did not answer {within}; set connect_timeout=SECONDS in the URL "
            "to wait longer"
        )
    if "lock timeout" in lowered:
        return (
            "another session held a lock it needed for longer than lock_timeout (a stuck "
            "writer or a migration?); set lock_timeout in the URL to wait longer"
        )
    if "statement timeout" in lowered:
        return "a statement ran longer than statement_timeout; set statement_timeout in the URL"
    return None
