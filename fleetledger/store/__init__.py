"""The durable log: every run's events in SQLite or PostgreSQL (``log.EventLog``).

One module per backend holds that backend's SQL beside the code that runs it
(``sqlite``, ``postgres``); what both share is here too: opening a database and the
schema revision check (``database``, ``revisions``), the tables (``schema``), and the
one reading of a database URL (``urls``). The events themselves, their codec and the
export formats are ``events``', which knows nothing of storage.

Import from the submodules: a read command on a SQLite ledger loads no SQLAlchemy, and
``fleetledger --version`` loads none of this.
"""
