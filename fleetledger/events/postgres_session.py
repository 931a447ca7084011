"""A PostgreSQL ledger's sessions: bounded waits, read-only sessions for read opens, and
the engine every connection goes through (SQLAlchemy, imported when one is built)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from fleetledger.events.db_urls import LedgerUrl, query_params
from fleetledger.events.errors import LedgerOpenError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

# PostgreSQL: a server that accepts and never answers, or a writer frozen inside its
# transaction, must cost a bounded wait and one clear line, never a hung command. Each
# is overridable in the URL (?connect_timeout=30&lock_timeout=2min&statement_timeout=0).
PG_CONNECT_TIMEOUT_S = 10
PG_SESSION_DEFAULTS = {"lock_timeout": "30s", "statement_timeout": "5min"}


# ── PostgreSQL: the session ──────────────────────────────────────────────────


def pg_option_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def postgres_connect(url: LedgerUrl, *, read_only: bool) -> tuple[LedgerUrl, dict[str, Any]]:
    """The driver URL and connect arguments: bounded times, and read-only for reads.

    The URL's own settings win: ``connect_timeout`` is libpq's; ``lock_timeout`` and
    ``statement_timeout`` become ``-c`` options after the defaults; the URL's own
    ``options`` come after those. ``default_transaction_read_only`` comes last on a read
    open, so nothing in the URL turns it off.
    """
    query = query_params(url)
    settings = dict(PG_SESSION_DEFAULTS)
    for key in PG_SESSION_DEFAULTS:
        if key in query:
            settings[key] = query.pop(key)
    options = [f"-c {key}={pg_option_value(value)}" for key, value in settings.items()]
    if "options" in query:
        options.append(query.pop("options"))
    if read_only:
        options.append("-c default_transaction_read_only=on")
    connect_args: dict[str, Any] = {"options": " ".join(options)}
    if "connect_timeout" not in query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    return url.replace(query=query), connect_args


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
        seconds = query_params(url).get("connect_timeout", PG_CONNECT_TIMEOUT_S) if url else None
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
