"""Opening a ledger database: engine settings per backend, and the schema revision check.

Rules that live here:

- SQLite is the embedded default. Every connection runs in WAL mode with
  ``synchronous=FULL`` (a commit that returned survives power loss) and a busy timeout;
  write transactions start with ``BEGIN IMMEDIATE`` so concurrent appenders queue for
  the write lock up front instead of failing half-way on a lock upgrade. The file is
  created with mode 0600: a ledger holds a run's configuration and its URLs.
- PostgreSQL serves several processes or hosts writing one run. Its schema is never
  changed implicitly: a shared database is migrated on purpose, with
  ``fleetledger migrate``. SQLite ledgers are upgraded on open (and say so).
- A database at a revision this code does not know, or one that holds somebody
  else's tables, is refused before anything is written.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from fleetledger.events.errors import (
    LedgerOpenError,
    MigrationRequired,
    UnknownRevision,
    first_line,
)

DEFAULT_DB_URL = "sqlite:///fleetledger.db"
DB_URL_ENV = "FLEETLEDGER_DB"
VERSION_TABLE = "fleetledger_alembic_version"
SQLITE_BUSY_TIMEOUT_MS = 30_000
LEDGER_TABLE_PREFIX = "fleetledger_"

_log = structlog.get_logger("fleetledger.database")


def resolve_db_url(url: str | None) -> str:
    """``--db`` wins, then ``$FLEETLEDGER_DB``, then ``sqlite:///fleetledger.db`` here."""
    return url or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL


@dataclass
class Database:
    """An engine bound to a ledger whose schema is at this code's head revision."""

    engine: Engine
    url: URL
    backend: str  # "sqlite" | "postgresql"
    upgraded_from: str | None  # the revision an automatic upgrade started from
    created: bool  # the schema was created by this open

    @property
    def display_url(self) -> str:
        return self.url.render_as_string(hide_password=True)

    def write_connection(self) -> Connection:
        """A connection whose transactions take the write lock when they begin."""
        return self.engine.connect().execution_options(fleetledger_write=True)

    def dispose(self) -> None:
        self.engine.dispose()


def _parse_url(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise LedgerOpenError(
            f"cannot parse database URL {url!r}: {exc}. Use sqlite:///path/to/ledger.db "
            "or postgresql://user@host:5432/dbname"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        # psycopg 3 is the driver the postgres extra installs; psycopg2 is not a dependency.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise LedgerOpenError(
            f"unsupported database {parsed.get_backend_name()!r} in {url!r}: "
            "fleetledger stores its log in SQLite or PostgreSQL"
        )
    return parsed


def _sqlite_read_only(url: URL) -> bool:
    return url.query.get("mode") == "ro"


def _sqlite_path(url: URL) -> Path:
    database = url.database
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        raise LedgerOpenError(
            "an in-memory SQLite database cannot hold a ledger (nothing would survive the "
            "process); give a file, e.g. sqlite:///fleetledger.db"
        )
    if database.startswith("file:"):
        database = database[len("file:") :]
    return Path(database)


def _prepare_sqlite_file(url: URL) -> None:
    """Create a missing ledger file with mode 0600 before SQLite creates it 0644."""
    path = _sqlite_path(url)
    if path.exists():
        if not path.is_file():
            raise LedgerOpenError(f"{path} is not a file; a SQLite ledger must be a file")
        return
    if _sqlite_read_only(url):
        raise LedgerOpenError(f"{path} does not exist (opened read-only, so it was not created)")
    if not path.parent.exists():
        raise LedgerOpenError(f"cannot create {path}: directory {path.parent} does not exist")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, stat.S_IRUSR | stat.S_IWUSR)
    except FileExistsError:
        return  # another process created it first
    except OSError as exc:
        raise LedgerOpenError(f"cannot create {path}: {exc.strerror}") from None
    os.close(fd)


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from the driver so BEGIN IMMEDIATE can be issued.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # No PRAGMA journal_mode=WAL here: it rewrites the file's header, and a file is
            # put in WAL mode only once it is known to be a ledger (_use_wal).
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


def _use_wal(engine: Engine) -> None:
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


def _refuse_foreign(state: SchemaState, where: str) -> None:
    if state.revision is None and state.foreign_tables:
        raise LedgerOpenError(
            f"{where} is not a fleetledger ledger: it holds the tables "
            f"{', '.join(state.foreign_tables)} and no fleetledger schema; refusing to "
            "write into it. Point --db at a new file."
        )


def _postgres_engine(url: URL) -> Engine:
    try:
        return create_engine(url, pool_pre_ping=True)
    except (NoSuchModuleError, ModuleNotFoundError):
        raise LedgerOpenError(
            "the PostgreSQL driver is not installed: pip install 'fleetledger[postgres]'"
        ) from None


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "fleetledger:migrations")
    cfg.set_main_option("version_table", VERSION_TABLE)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    assert len(heads) == 1, f"migrations have several heads: {heads}"
    return heads[0]


def _known_revisions() -> set[str]:
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


@dataclass(frozen=True)
class SchemaState:
    revision: str | None
    foreign_tables: tuple[str, ...]  # tables that are not fleetledger's


def _schema_state(conn: Connection) -> SchemaState:
    tables = inspect(conn).get_table_names()
    revision = None
    if VERSION_TABLE in tables:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        revision = context.get_current_revision()
    foreign = tuple(sorted(t for t in tables if not t.startswith(LEDGER_TABLE_PREFIX)))
    return SchemaState(revision, foreign)


def _check_known(revision: str | None, where: str) -> None:
    if revision is not None and revision not in _known_revisions():
        raise UnknownRevision(
            f"{where} is at schema revision {revision!r}, which this fleetledger does not "
            f"know (it knows up to {head_revision()!r}); it was written by a newer "
            "fleetledger — upgrade fleetledger to open it"
        )


def _upgrade(conn: Connection) -> None:
    command.upgrade(alembic_config(connection=conn), "head")


def _connect_error(url: URL, exc: DBAPIError) -> LedgerOpenError:
    detail = first_line(exc)
    shown = url.render_as_string(hide_password=True)
    if url.get_backend_name() == "sqlite":
        return LedgerOpenError(
            f"{_sqlite_path(url)} is not a readable SQLite ledger (truncated, corrupted or "
            f"not a database): {detail}"
        )
    return LedgerOpenError(f"cannot use the ledger database at {shown}: {detail}")


def open_database(url: str | None = None) -> Database:
    """Open (and for SQLite, create or upgrade) the ledger at ``url``."""
    parsed = _parse_url(resolve_db_url(url))
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        _prepare_sqlite_file(parsed)
        engine = _sqlite_engine(parsed)
    else:
        engine = _postgres_engine(parsed)
    where = parsed.render_as_string(hide_password=True)
    head = head_revision()
    try:
        with engine.connect() as conn:
            state = _schema_state(conn)
            conn.rollback()
        _check_known(state.revision, where)
        upgraded_from: str | None = None
        created = False
        if state.revision != head:
            if backend == "postgresql":
                raise MigrationRequired(
                    f"the ledger at {where} is at schema revision {state.revision or 'none'}, "
                    f"this fleetledger needs {head!r}: run `fleetledger migrate --db {where}` "
                    "(shared databases are migrated on purpose, never on open)"
                )
            _refuse_foreign(state, where)
            if _sqlite_read_only(parsed):
                raise LedgerOpenError(
                    f"{where} is opened read-only but its schema is at revision "
                    f"{state.revision or 'none'}, older than {head!r}; open it writable once "
                    "to upgrade it"
                )
            _use_wal(engine)  # before the first schema write
            # Re-check under the write lock: another process may be creating it right now.
            with engine.connect().execution_options(fleetledger_write=True) as conn:
                with conn.begin():
                    locked = _schema_state(conn)
                    _check_known(locked.revision, where)
                    if locked.revision != head:
                        _upgrade(conn)
                        created = locked.revision is None
                        upgraded_from = locked.revision
            if upgraded_from is not None:
                _log.warning(
                    "ledger schema upgraded",
                    db=where,
                    from_revision=upgraded_from,
                    to_revision=head,
                )
        elif backend == "sqlite" and not _sqlite_read_only(parsed):
            _use_wal(engine)  # a no-op on a ledger already in WAL mode
    except DBAPIError as exc:
        engine.dispose()
        raise _connect_error(parsed, exc) from None
    except LedgerOpenError:
        engine.dispose()
        raise
    return Database(engine, parsed, backend, upgraded_from, created)


def migrate(url: str | None = None) -> tuple[str | None, str]:
    """Upgrade the ledger schema at ``url`` to this code's head; returns (from, to)."""
    parsed = _parse_url(resolve_db_url(url))
    if parsed.get_backend_name() == "sqlite":
        _prepare_sqlite_file(parsed)
        engine = _sqlite_engine(parsed)
    else:
        engine = _postgres_engine(parsed)
    where = parsed.render_as_string(hide_password=True)
    sqlite = parsed.get_backend_name() == "sqlite"
    try:
        if sqlite:  # refuse before the first write, which _use_wal is
            with engine.connect() as conn:
                state = _schema_state(conn)
                conn.rollback()
            _check_known(state.revision, where)
            _refuse_foreign(state, where)
            _use_wal(engine)
        with engine.connect().execution_options(fleetledger_write=True) as conn:
            with conn.begin():
                state = _schema_state(conn)
                _check_known(state.revision, where)
                if sqlite:
                    _refuse_foreign(state, where)
                if state.revision != head_revision():
                    _upgrade(conn)
        return state.revision, head_revision()
    except DBAPIError as exc:
        raise _connect_error(parsed, exc) from None
    except CommandError as exc:
        raise LedgerOpenError(f"migrating {where} failed: {exc}") from None
    finally:
        engine.dispose()
