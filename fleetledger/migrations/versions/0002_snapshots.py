"""Snapshots of projections, so resuming a long run does not refold it from seq 1.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "fleetledger_snapshots",
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("projection_version", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint(
            "run_id", "projection_version", "seq", name="pk_fleetledger_snapshots"
        ),
    )


def downgrade() -> None:
    op.drop_table("fleetledger_snapshots")
