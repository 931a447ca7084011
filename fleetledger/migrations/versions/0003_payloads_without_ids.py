"""Payloads stored without the event's id and type, which have columns of their own.

Revision ID: 0003
Revises: 0002

No table changes shape: from this revision on, a row's ``payload`` may be the event's
fields without ``id`` and ``type`` (``EventCodec.encode``), and rows written before it
keep theirs, read as they always were (``codec.OLD_FORM_OPENING``; never rewritten: a
stored row is what was written). The revision is the mark an older fleetledger needs:
it would read an id-less payload as an event with a fresh id, and the revision it does
not know makes it refuse the ledger instead ("upgrade fleetledger"), never misread it.
A downgrade is refused while the ledger holds a row an older version would misread.
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nothing to change in the tables: rows before this revision stay as written, and
    # are read as they always were. Being at 0003 is what tells other versions.
    return None


def downgrade() -> None:
    # Rows written since 0003 hold no id (every row before it opens with its own):
    # a fleetledger at 0002 would misread them.
    bind = op.get_bind()
    newer = bind.execute(
        sa.text(
            "SELECT run_id, seq FROM fleetledger_events "
            "WHERE substr(payload, 1, 7) <> :opening LIMIT 1"
        ),
        {"opening": '{"id":"'},
    ).first()
    if newer is not None:
        raise RuntimeError(
            f"run {newer[0]!r} seq {newer[1]} was stored without its id (schema revision "
            "0003); a fleetledger at revision 0002 would misread it: not downgraded"
        )
