"""The event log: runs and their events.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleetledger_runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("started_at_us", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "fleetledger_events",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("schema_version", sa.Integer, nullable=False),
        sa.Column("at_us", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("run_id", "seq", name="pk_fleetledger_events"),
        sa.UniqueConstraint("run_id", "event_id", name="uq_fleetledger_events_event_id"),
    )


def downgrade() -> None:
    op.drop_table("fleetledger_events")
    op.drop_table("fleetledger_runs")
