"""Opening a ledger database: the open mode, engine settings per backend, and the schema
revision check.

Rules that live here:

- Every open says what it is for. A **read** open (``mode="read"``: the commands that
  only look) never creates, initialises, upgrades or writes a ledger: a missing path is
  "no ledger at PATH", an empty file or a dangling symlink is refused, a SQLite file is
  opened through a ``file:`` URI with ``mode=ro`` and a PostgreSQL session runs with
  ``default_transaction_read_only``, so not even a bug can write through it. A **write**
  open (``mode="write"``, the default of the API) may create a new SQLite ledger.
- A SQLite read open builds no SQLAlchemy engine: it runs on the standard library's
  driver alone (``sqlite_file.SqliteReads``), because importing SQLAlchemy cost a read
  command more than everything else it does. Every other open has an engine, for its
  writes (and, on PostgreSQL, its pool); every read of every open runs on the driver.
- SQLite is the embedded default. Every connection runs in WAL mode with
  ``synchronous=FULL`` (a commit that returned survives power loss) and a busy timeout;
  write transactions start with ``BEGIN IMMEDIATE`` so concurrent appenders queue for
  the write lock up front instead of failing half-way on a lock upgrade. The file is
  created with mode 0600: a ledger holds a run's configuration and its URLs. A
  ``mode=ro`` URL is honoured (a write through it is refused), with or without
  ``uri=true``: every SQLite URL is handed to the driver as a ``file:`` URI.
- PostgreSQL serves several processes or hosts writing one run. Its schema is never
  changed implicitly: a shared database is migrated on purpose, with
  ``fleetledger migrate``, and a database that already holds other tables only when
  asked (``--into-foreign-database``). SQLite ledgers are upgraded on a write open (and
  say so). Every session has a bounded connect, lock-wait and statement time
  (``urls.PG_CONNECT_TIMEOUT_S``, ``urls.PG_SESSION_DEFAULTS``); what the URL sets wins.
- A database at a revision this code does not know, or one that holds somebody
  else's tables, is refused before anything is written.
- A URL's password is never shown: messages name the database by ``display_url``, and
  driver text is scrubbed of the password before it is quoted.

Reading a WAL-mode SQLite file without writing (measured on SQLite 3.40): a reader needs
the WAL index, ``LEDGER-shm``. A ``mode=ro`` connection joins an index that exists (a
read-only one too: SQLite then reads the WAL into private memory), and otherwise creates
``-shm`` and ``-wal`` beside the file — and cannot remove them when it closes, because
removing them takes the write lock. So a read open, when no ``-shm`` is there:

- the file and its directory are writable: a query-only read-write "keeper" connection
  is opened first and closed last; as the last connection to close it removes the
  ``-wal`` and ``-shm``, as every SQLite writer's last close does. Every read still goes
  through a ``mode=ro`` connection.
- they are not, the file system is mounted read-only and no ``-wal`` is there:
  ``immutable=1``. Nothing writes through a read-only mount, and a writer elsewhere
  would first have to create the ``-wal`` beside the file. (``immutable=1`` ignores a
  ``-wal``: with one present it would read a stale ledger, so it is never used then.)
- otherwise the ledger is refused as not writable, with what to do: SQLite cannot read
  it without creating files it could not remove (or cannot create them at all).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fleetledger.events.errors import first_line
from fleetledger.logs import get_logger
from fleetledger.store.errors import (
    LedgerNotWritable,
    LedgerOpenError,
    LedgerReadError,
    LedgerWriteError,
)
from fleetledger.store.postgres import POSTGRES
from fleetledger.store.postgres_session import PostgresReads, postgres_engine, waited_too_long
from fleetledger.store.revisions import (
    check_known,
    check_readable,
    head_revision,
    migration_required,
    refuse_foreign,
    schema_state,
    upgrade,
)
from fleetledger.store.sqlite import SQLITE
from fleetledger.store.sqlite_file import (
    SqliteReads,
    check_readable_file,
    open_keeper,
    plan_sqlite_read,
    prepare_sqlite_file,
)
from fleetledger.store.statements import Statements
from fleetledger.store.urls import (
    LedgerUrl,
    display_url_of,
    params_read_only,
    parse_db_url,
    resolve_db_url,
    scrub_password,
    sqlite_params,
    sqlite_path,
)

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection, Engine

OpenMode = Literal["read", "write"]


_log = get_logger("fleetledger.database")  # structlog is loaded on the first warning


class Reads(Protocol):
    """Where a database's reads connect: a driver connection per read, in one
    transaction, and the driver errors a read can raise."""

    errors: tuple[type[BaseException], ...]

    def reading(self) -> AbstractContextManager[Any]: ...

    def close(self) -> None: ...


@dataclass
class Database:
    """A ledger database whose schema this code can use: where its reads connect, and
    the SQLAlchemy engine its writes go through (none on a SQLite read open, which runs
    on the standard library's driver alone).

    Write opens are at this code's head revision; a read open may be at an older
    revision the read path can still query (``revision``).
    """

    url: LedgerUrl
    backend: str  # "sqlite" | "postgresql"
    reads: Reads
    engine: Engine | None
    upgraded_from: str | None = None  # the revision an automatic upgrade started from
    created: bool = False  # the schema was created by this open
    read_only: bool = False  # opened to read (mode="read", or a mode=ro SQLite URL)
    revision: str | None = None  # the schema revision found (after any upgrade)
    # SQLite read opens only: the connection that removes the -wal/-shm when it closes.
    keeper: sqlite3.Connection | None = field(default=None, repr=False)

    @property
    def display_url(self) -> str:
        return display_url_of(self.url)

    def scrub(self, text: str) -> str:
        """Driver text with this URL's password, should it appear, replaced by ***."""
        return scrub_password(text, self.url.password)

    def statements(self) -> Statements:
        """This backend's SQL, each statement beside the method that runs it."""
        return SQLITE if self.backend == "sqlite" else POSTGRES

    @contextmanager
    def reading(self) -> Iterator[Any]:
        """A read's driver connection (one transaction), whose database errors name the
        ledger, not SQL."""
        try:
            with self.reads.reading() as conn:
                yield conn
        except self.reads.errors as exc:
            detail = self.scrub(first_line(exc))
            lowered = detail.lower()
            problem = waited_too_long(detail)
            if problem is None and ("readonly" in lowered or "read-only" in lowered):
                problem = "reading it needs a write (a WAL recovery?) that this open may not do"
            elif problem is None and ("closed" in lowered or "terminat" in lowered):
                problem = "the connection to the database was lost"
            raise LedgerReadError(
                f"{self.display_url}: read failed "
                f"({problem or 'is the ledger corrupted or truncated?'}): {detail}"
            ) from None

    def write_connection(self) -> Connection:
        """A connection whose transactions take the write lock when they begin."""
        if self.engine is None:  # a SQLite read open runs on the driver alone
            raise LedgerWriteError(
                f"{self.display_url}: write failed (the ledger is read-only): it was opened "
                "to read, nothing was written"
            )
        return self.engine.connect().execution_options(fleetledger_write=True)

    def dispose(self) -> None:
        if self.engine is not None:
            self.engine.dispose()
        self.reads.close()
        keeper, self.keeper = self.keeper, None
        if keeper is not None:  # last: it removes the index files the readers used
            keeper.close()


def _connect_error(url: LedgerUrl, exc: BaseException) -> LedgerOpenError:
    detail = scrub_password(first_line(exc), url.password)
    lowered = detail.lower()
    if url.backend == "sqlite":
        path = sqlite_path(url)
        if "unable to open" in lowered:
            return LedgerOpenError(
                f"cannot open {path}: {detail} (SQLite must read it and open or create "
                f"{path.name}-wal and {path.name}-shm in {path.parent})"
            )
        if "readonly" in lowered or "read-only" in lowered:
            return LedgerNotWritable(f"{path} is not writable: {detail}")
        if "locked" in lowered:
            return LedgerOpenError(f"{path} is locked by another process: {detail}")
        return LedgerOpenError(
            f"{path} is not a readable SQLite ledger (truncated, corrupted or "
            f"not a database): {detail}"
        )
    waited = waited_too_long(detail, url)
    hint = f" ({waited})" if waited else ""
    return LedgerOpenError(
        f"cannot use the ledger database at {display_url_of(url)}{hint}: {detail}"
    )


# ── opening ──────────────────────────────────────────────────────────────────


def open_database(url: str | None = None, *, mode: OpenMode = "write") -> Database:
    """Open the ledger at ``url`` to read, or to write (a SQLite one created or upgraded)."""
    parsed = parse_db_url(resolve_db_url(url))
    if parsed.backend == "sqlite":
        params = sqlite_params(parsed)
        if mode == "read" or params_read_only(params):
            return _open_sqlite_read(parsed, params)
        return _open_sqlite_write(parsed, params)
    return _open_postgres(parsed, mode)


@contextmanager
def _refused_disposes(database: Database, *driver_errors: type[BaseException]) -> Iterator[None]:
    """A refused open leaves no engine, pool or keeper behind, and a driver's error (one
    of ``driver_errors``, by default those its reads raise) is told as the ledger's: one
    line naming it."""
    errors = driver_errors or database.reads.errors
    try:
        yield
    except (LedgerOpenError, *errors) as exc:
        database.dispose()
        if isinstance(exc, LedgerOpenError):
            raise
        raise _connect_error(database.url, exc) from None


def _open_sqlite_read(parsed: LedgerUrl, params: dict[str, str]) -> Database:
    """A read open: no engine, no SQLAlchemy (see ``sqlite_file.SqliteReads``)."""
    path = sqlite_path(parsed)
    check_readable_file(path)
    params, wants_keeper = plan_sqlite_read(path, params)
    reads = SqliteReads(path, params)  # refuses a bad driver argument before any connection
    try:
        keeper = open_keeper(path) if wants_keeper else None
    except sqlite3.Error as exc:
        raise _connect_error(parsed, exc) from None
    database = Database(parsed, "sqlite", reads, None, read_only=True, keeper=keeper)
    with _refused_disposes(database):
        with database.reads.reading() as conn:
            state = schema_state(conn, "sqlite")
        check_known(state.revision, database.display_url)
        check_readable(state, database.display_url, "sqlite")
        database.revision = state.revision
    return database


def _open_sqlite_write(parsed: LedgerUrl, params: dict[str, str]) -> Database:
    from sqlalchemy.exc import DBAPIError

    from fleetledger.store.sqlite_engine import sqlite_engine, use_wal  # loads SQLAlchemy

    path = sqlite_path(parsed)
    # Built before the file is created: a bad driver argument is refused, leaving nothing.
    engine = sqlite_engine(path, params)
    reads = SqliteReads(path, params)
    prepare_sqlite_file(path, params)
    database = Database(parsed, "sqlite", reads, engine)
    where = database.display_url
    head = head_revision()
    with _refused_disposes(database, sqlite3.Error, DBAPIError):
        with engine.connect() as conn:
            state = schema_state(conn.connection.driver_connection, "sqlite")
            conn.rollback()
        check_known(state.revision, where)
        database.revision = state.revision
        if state.revision != head:
            refuse_foreign(state, where)
            use_wal(engine)  # before the first schema write
            # Re-check under the write lock: another process may be creating it right now.
            with engine.connect().execution_options(fleetledger_write=True) as conn:
                with conn.begin():
                    locked = schema_state(conn.connection.driver_connection, "sqlite")
                    check_known(locked.revision, where)
                    if locked.revision != head:
                        upgrade(conn)
                        database.created = locked.revision is None
                        database.upgraded_from = locked.revision
            database.revision = head
            if database.upgraded_from is not None:
                _log.warning(
                    "ledger schema upgraded",
                    db=where,
                    from_revision=database.upgraded_from,
                    to_revision=head,
                )
        else:
            use_wal(engine)  # a no-op on a ledger already in WAL mode
    return database


def _open_postgres(parsed: LedgerUrl, mode: OpenMode) -> Database:
    read_only = mode == "read"
    engine = postgres_engine(parsed, read_only=read_only)
    database = Database(parsed, "postgresql", PostgresReads(engine), engine, read_only=read_only)
    where = database.display_url
    with _refused_disposes(database):
        with database.reads.reading() as conn:
            state = schema_state(conn, "postgresql")
        check_known(state.revision, where)
        if read_only:
            check_readable(state, where, "postgresql")
        elif state.revision != head_revision():
            raise migration_required(state, where)
        database.revision = state.revision
    return database


def migrate(
    url: str | None = None, *, into_foreign_database: bool = False
) -> tuple[str | None, str]:
    """Upgrade the ledger schema at ``url`` to this code's head; returns (from, to).

    A PostgreSQL database that holds other tables and no ledger is refused unless
    ``into_foreign_database``; a SQLite file that does is always refused (a SQLite ledger
    is a file of its own).
    """
    from alembic.util.exc import CommandError  # migrating is the one place alembic runs
    from sqlalchemy.exc import DBAPIError

    from fleetledger.store.sqlite_engine import sqlite_engine, use_wal  # loads SQLAlchemy

    parsed = parse_db_url(resolve_db_url(url))
    where = display_url_of(parsed)
    sqlite = parsed.backend == "sqlite"
    if sqlite:
        path = sqlite_path(parsed)
        params = sqlite_params(parsed)
        if params_read_only(params):
            raise LedgerNotWritable(
                f"{where} opens the ledger read-only (mode=ro or immutable in the URL); "
                "migrating writes to it"
            )
        engine = sqlite_engine(path, params)  # a bad driver argument: refused, nothing created
        prepare_sqlite_file(path, params)
    else:
        engine = postgres_engine(parsed, read_only=False)
    # The schema is read on the driver's cursor: its errors are the driver's own.
    driver_error = engine.dialect.loaded_dbapi.Error
    try:
        if sqlite:  # refuse before the first write, which use_wal is
            with engine.connect() as conn:
                state = schema_state(conn.connection.driver_connection, "sqlite")
                conn.rollback()
            check_known(state.revision, where)
            refuse_foreign(state, where)
            use_wal(engine)
        with engine.connect().execution_options(fleetledger_write=True) as conn:
            with conn.begin():
                state = schema_state(conn.connection.driver_connection, parsed.backend)
                check_known(state.revision, where)
                if sqlite:
                    refuse_foreign(state, where)
                elif state.revision is None and state.foreign_tables and not into_foreign_database:
                    raise LedgerOpenError(
                        f"{where} holds the tables {', '.join(state.foreign_tables)} and no "
                        "fleetledger schema; refusing to create a ledger among them: point "
                        "--db at a database of its own, or pass --into-foreign-database to "
                        "create the fleetledger_* tables beside them"
                    )
                if state.revision != head_revision():
                    upgrade(conn)
        return state.revision, head_revision()
    except (DBAPIError, driver_error) as exc:
        raise _connect_error(parsed, exc) from None
    except CommandError as exc:
        detail = scrub_password(str(exc), parsed.password)
        raise LedgerOpenError(f"migrating {where} failed: {detail}") from None
    finally:
        engine.dispose()
