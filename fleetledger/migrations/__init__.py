"""Alembic environment and revisions: the only place the log's schema changes."""
