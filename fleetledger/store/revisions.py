"""Schema revisions: the head this code writes, the oldest it can read, and what a
database that is at another revision, or holds somebody else's tables, is told.

Alembic is imported only where a migration can happen (:func:`upgrade`,
:func:`alembic_config`): importing it cost a read command 170 ms of its start-up for a
migration it never runs. What every open needs — the revisions this code knows, and the
one a database is at — is data here (``REVISIONS``, held to the migration scripts by
a test) and two queries on the driver: the tables there are, and the revision in
Alembic's version table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.engine import Connection

from fleetledger.store.errors import LedgerOpenError, MigrationRequired, NoLedger, UnknownRevision

VERSION_TABLE = "fleetledger_alembic_version"
LEDGER_TABLE_PREFIX = "fleetledger_"
# The oldest schema revision the read path can query unchanged: it reads
# fleetledger_snapshots, which 0002 created. An older ledger must be migrated to be read.
OLDEST_READABLE_REVISION = "0002"


# ── schema revisions ─────────────────────────────────────────────────────────


# Every revision of ``fleetledger/migrations/versions``, oldest first (a test compares).
REVISIONS = ("0001", "0002", "0003")


def alembic_config(connection: Connection | None = None, url: str | None = None) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", "fleetledger:migrations")
    cfg.set_main_option("version_table", VERSION_TABLE)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    return REVISIONS[-1]


def known_revisions() -> set[str]:
    return set(REVISIONS)


def readable_revisions() -> set[str]:
    """The head and every revision back to ``OLDEST_READABLE_REVISION``."""
    return set(REVISIONS[REVISIONS.index(OLDEST_READABLE_REVISION) :])


@dataclass(frozen=True)
class SchemaState:
    revision: str | None
    foreign_tables: tuple[str, ...]  # tables that are not fleetledger's


# The tables of a database, as SQLAlchemy's inspector lists them: SQLite's own
# (sqlite_sequence, ...) left out; on PostgreSQL, every table the session sees by its
# search_path (not only current_schema(): a schema named after the user, which the
# default "$user", public puts first, must not hide a ledger in public), temporary
# tables and pg_catalog's left out.
_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite~_%' "
    "ESCAPE '~'",
    "postgresql": "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') AND c.relpersistence <> 't' "
    "AND pg_catalog.pg_table_is_visible(c.oid) AND n.nspname <> 'pg_catalog'",
}


def schema_state(conn: Any, backend: str) -> SchemaState:
    """What schema the database behind the driver connection ``conn`` holds."""
    cursor = conn.cursor()
    try:
        cursor.execute(_TABLES[backend])
        tables = {name for (name,) in cursor.fetchall()}
        revision = None
        if VERSION_TABLE in tables:
            # Alembic's version table: one row (none before the first revision completes).
            cursor.execute(f"SELECT version_num FROM {VERSION_TABLE}")
            row = cursor.fetchone()
            revision = None if row is None else row[0]
    finally:
        cursor.close()
    foreign = tuple(sorted(t for t in tables if not t.startswith(LEDGER_TABLE_PREFIX)))
    return SchemaState(revision, foreign)


def check_known(revision: str | None, where: str) -> None:
    if revision is not None and revision not in known_revisions():
        raise UnknownRevision(
            f"{where} is at schema revision {revision!r}, which this fleetledger does not "
            f"know (it knows up to {head_revision()!r}); it was written by a newer "
            "fleetledger — upgrade fleetledger to open it"
        )


def refuse_foreign(state: SchemaState, where: str) -> None:
    if state.revision is None and state.foreign_tables:
        raise LedgerOpenError(
            f"{where} is not a fleetledger ledger: it holds the tables "
            f"{', '.join(state.foreign_tables)} and no fleetledger schema; refusing to "
            "write into it. Point --db at a new file."
        )


def check_readable(state: SchemaState, where: str, backend: str) -> None:
    """A read open: the schema must be one the read path can query as it is."""
    if state.revision is None:
        if state.foreign_tables:
            raise LedgerOpenError(
                f"{where} is not a fleetledger ledger: it holds the tables "
                f"{', '.join(state.foreign_tables)} and no fleetledger schema"
            )
        create = (
            f"`fleetledger migrate --db {where}` creates one"
            if backend == "postgresql"
            else "a writing command (demo, import, simulate) or `fleetledger migrate` creates one"
        )
        raise NoLedger(f"no ledger at {where}: it holds no fleetledger schema; {create}")
    if state.revision not in readable_revisions():
        raise MigrationRequired(
            f"the ledger at {where} is at schema revision {state.revision}, older than this "
            f"fleetledger reads ({OLDEST_READABLE_REVISION!r} or newer); it was opened "
            f"read-only, so it was not upgraded: run `fleetledger migrate --db {where}` as "
            "someone who can write it"
        )


def migration_required(state: SchemaState, where: str) -> MigrationRequired:
    head = head_revision()
    if state.revision is None and state.foreign_tables:
        return MigrationRequired(
            f"{where} holds the tables {', '.join(state.foreign_tables)} and no fleetledger "
            f"schema: point --db at a database of its own, or create the ledger beside "
            f"them with `fleetledger migrate --into-foreign-database --db {where}`"
        )
    return MigrationRequired(
        f"the ledger at {where} is at schema revision {state.revision or 'none'}, "
        f"this fleetledger needs {head!r}: run `fleetledger migrate --db {where}` "
        "(shared databases are migrated on purpose, never on open)"
    )


def upgrade(conn: Connection) -> None:
    from alembic import command

    command.upgrade(alembic_config(connection=conn), "head")
