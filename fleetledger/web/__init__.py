"""The ledger over HTTP, read-only: a JSON API (``/api/v1/``), a stream of a run's new
entries (server-sent events, resumable from an id) and a live page (``/``).

One process serves every run of one ledger, SQLite or PostgreSQL, and never writes it.
What it answers is what the read commands print: the same membership document, history
entries, explanations and timeline scene, from the same folds.
"""

from fleetledger.web.server import DEFAULT_PORT, ServedLedger, serve_forever, start_server

__all__ = ["DEFAULT_PORT", "ServedLedger", "serve_forever", "start_server"]
