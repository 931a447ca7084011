"""The log's tables, as SQLAlchemy Core objects: the head revision's schema, for Alembic's
autogenerate (``migrations/env.py``) and for code that writes rows around the log (tests
building old ledgers, the benchmarks' raw side).

The schema itself moves only through the Alembic revisions in ``fleetledger/migrations``;
these objects must describe the head revision, and a test compares the two. The log's
own SQL is text, written per backend beside the code that runs it (``store.sqlite``,
``store.postgres``), and run against the tables the revisions created by its tests.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()

# One row per run. Appenders lock it (PostgreSQL: SELECT ... FOR UPDATE; SQLite locks the
# whole database with BEGIN IMMEDIATE) so seqs are assigned one transaction at a time:
# gap-free, and commit order equals seq order. The head itself is not stored here: it
# is the run's last event, one primary-key lookup away, so it can never disagree.
runs = Table(
    "fleetledger_runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("started_at_us", BigInteger, nullable=False),
)

events = Table(
    "fleetledger_events",
    metadata,
    Column("run_id", String(128), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("event_id", String(64), nullable=False),
    Column("type", String(64), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("at_us", BigInteger, nullable=False),
    Column("payload", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "seq", name="pk_fleetledger_events"),
    UniqueConstraint("run_id", "event_id", name="uq_fleetledger_events_event_id"),
)

snapshots = Table(
    "fleetledger_snapshots",
    metadata,
    Column("run_id", String(128), nullable=False),
    Column("projection_version", Integer, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("payload", Text, nullable=False),
    PrimaryKeyConstraint("run_id", "projection_version", "seq", name="pk_fleetledger_snapshots"),
)
