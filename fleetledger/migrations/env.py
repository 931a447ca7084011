"""Alembic environment for the fleetledger log.

fleetledger drives Alembic programmatically (``fleetledger migrate``, or the automatic
upgrade of a SQLite ledger on open) and passes its own connection in
``config.attributes["connection"]``; the URL path serves the ``alembic`` command line.

The target is the log's tables as ``store.schema`` describes them (the head revision, as
a test holds them), so ``alembic revision --autogenerate`` writes the difference between
a database and them; the revisions themselves never import it: each one is the schema
as it was when it was written.
"""

from alembic import context
from sqlalchemy import create_engine

from fleetledger.store.revisions import VERSION_TABLE
from fleetledger.store.schema import metadata
from fleetledger.store.urls import parse_db_url

config = context.config


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,
        version_table=config.get_main_option("version_table") or VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # The ``alembic`` command line's URL, read the way every ledger URL is read.
    url = parse_db_url(config.get_main_option("sqlalchemy.url") or "")
    engine = create_engine(url.sqlalchemy())
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()
