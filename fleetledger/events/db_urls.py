"""Database URLs: which one a command means, how it is parsed, and how it is shown.

A URL's password is never shown: messages name a database by :func:`display_url_of`,
and driver text that might quote the password is passed through :func:`scrub_password`.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING
from urllib.parse import quote

from fleetledger.events.errors import LedgerOpenError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DEFAULT_DB_URL = "sqlite:///fleetledger.db"
DB_URL_ENV = "FLEETLEDGER_DB"
# What make_url reads as the password: after "user:", up to the first "@".
_RAW_PASSWORD = re.compile(r"^[\w+]+://[^:/]*:(?P<password>[^@]*)@")


def resolve_db_url(url: str | None) -> str:
    """``--db`` wins, then ``$FLEETLEDGER_DB``, then ``sqlite:///fleetledger.db`` here."""
    return url or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL


def display_url_of(url: URL) -> str:
    return url.render_as_string(hide_password=True)


def scrub_password(text: str, password: str | None) -> str:
    """``text`` with every spelling of ``password`` (plain, percent-encoded) as ***."""
    if not password:
        return text
    for spelling in {password, quote(password, safe="")}:
        text = text.replace(spelling, "***")
    return text


def parse_db_url(url: str) -> URL:
    # SQLAlchemy is imported by the commands that open a ledger, not by the CLI's start.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    raw = _RAW_PASSWORD.match(url)
    password, shown = None, url
    if raw is not None:
        password = raw.group("password")
        shown = url[: raw.start("password")] + "***" + url[raw.end("password") :]
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise LedgerOpenError(
            f"cannot parse database URL {shown!r}: {scrub_password(str(exc), password)}. Use "
            "sqlite:///path/to/ledger.db or postgresql://user@host:5432/dbname"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        # psycopg 3 is the driver the postgres extra installs; psycopg2 is not a dependency.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise LedgerOpenError(
            f"unsupported database {parsed.get_backend_name()!r} in {display_url_of(parsed)!r}: "
            "fleetledger stores its log in SQLite or PostgreSQL"
        )
    return parsed


def query_params(url: URL) -> dict[str, str]:
    """The URL's query parameters, one value each (the last, if one is repeated)."""
    return {k: v[-1] if isinstance(v, tuple) else v for k, v in url.query.items()}
