"""Database URLs: which one a command means, how it is parsed, and how it is shown.

A URL is parsed here, by the grammar SQLAlchemy's ``make_url`` reads (a property test
holds the two to the same answers and the same rendering), not by ``make_url`` itself:
importing SQLAlchemy costs a read command more than the rest of its start-up, and a
SQLite ledger is read without it. The engine of a write open or of PostgreSQL gets the
same URL as SQLAlchemy's own (:meth:`LedgerUrl.sqlalchemy`).

A URL's password is never shown: messages name a database by :func:`display_url_of`,
and driver text that might quote the password is passed through :func:`scrub_password`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, quote_plus, unquote

from fleetledger.events.errors import LedgerOpenError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DEFAULT_DB_URL = "sqlite:///fleetledger.db"
DB_URL_ENV = "FLEETLEDGER_DB"
# What the grammar below reads as the password: after "user:", up to the first "@".
_RAW_PASSWORD = re.compile(r"^[\w+]+://[^:/]*:(?P<password>[^@]*)@")
# RFC-1738 as SQLAlchemy reads it: underscores (not dashes or dots) in the scheme, an
# optional user, password, host ([IPv6] or name) and port, then /database and ?query.
# Unanchored at the end, as make_url is: a query stops at a line break.
_URL = re.compile(
    r"""
    (?P<drivername>[\w+]+)://
    (?:(?P<username>[^:/]*)(?::(?P<password>[^@]*))?@)?
    (?:(?:\[(?P<ipv6host>[^/?]+)\]|(?P<ipv4host>[^/:?]+))?(?::(?P<port>[^/?]*))?)?
    (?:/(?P<database>[^?]*))?
    (?:\?(?P<query>.*))?
    """,
    re.X,
)

QueryValue = str | tuple[str, ...]


@dataclass(frozen=True)
class LedgerUrl:
    """A parsed database URL; ``query`` holds each parameter's value, or its values in
    order when it is repeated."""

    drivername: str
    username: str | None = None
    password: str | None = None
    host: str | None = None
    port: int | None = None
    database: str | None = None
    query: Mapping[str, QueryValue] = field(default_factory=dict)

    @property
    def backend(self) -> str:
        """The database, without the driver: ``sqlite``, ``postgresql``."""
        return self.drivername.partition("+")[0]

    def replace(self, **changes: object) -> LedgerUrl:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def render(self, *, hide_password: bool = True) -> str:
        """The URL as text, as ``URL.render_as_string`` writes it (query keys sorted)."""
        text = self.drivername + "://"
        if self.username is not None:
            text += quote(self.username, safe=" +")
            if self.password is not None:
                text += ":" + ("***" if hide_password else quote(self.password, safe=" +"))
            text += "@"
        if self.host is not None:
            text += f"[{self.host}]" if ":" in self.host else self.host
        if self.port is not None:
            text += f":{self.port}"
        if self.database is not None:
            text += "/" + quote(self.database, safe=" +/")
        if self.query:
            text += "?" + "&".join(
                f"{quote_plus(key)}={quote_plus(value)}"
                for key in sorted(self.query)
                for value in _values(self.query[key])
            )
        return text

    def sqlalchemy(self) -> URL:
        """The same URL as SQLAlchemy's, for an engine."""
        from sqlalchemy.engine import URL

        return URL.create(
            self.drivername,
            self.username,
            self.password,
            self.host,
            self.port,
            self.database,
            dict(self.query),
        )


def _values(value: QueryValue) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else value


def resolve_db_url(url: str | None) -> str:
    """``--db`` wins, then ``$FLEETLEDGER_DB``, then ``sqlite:///fleetledger.db`` here."""
    return url or os.environ.get(DB_URL_ENV) or DEFAULT_DB_URL


def display_url_of(url: LedgerUrl) -> str:
    return url.render(hide_password=True)


def scrub_password(text: str, password: str | None) -> str:
    """``text`` with every spelling of ``password`` (plain, percent-encoded) as ***."""
    if not password:
        return text
    for spelling in {password, quote(password, safe="")}:
        text = text.replace(spelling, "***")
    return text


def split_url(text: str) -> LedgerUrl:
    """``text`` read by the URL grammar; ``ValueError`` saying what does not fit."""
    match = _URL.match(text)
    if match is None:
        raise ValueError("it is not of the form scheme://[user[:password]@][host[:port]]/name")
    parts = match.groupdict()
    query: dict[str, QueryValue] = {}
    for key, value in parse_qsl(parts["query"] or ""):
        held = query.get(key)
        query[key] = value if held is None else (*_values(held), value)
    port = parts["port"]
    try:
        number = None if port is None else int(port)
    except ValueError:
        raise ValueError(f"port {port!r} is not a number") from None
    return LedgerUrl(
        drivername=parts["drivername"],
        username=None if parts["username"] is None else unquote(parts["username"]),
        password=None if parts["password"] is None else unquote(parts["password"]),
        host=parts["ipv4host"] or parts["ipv6host"],
        port=number,
        database=None if parts["database"] is None else unquote(parts["database"]),
        query=query,
    )


def parse_db_url(url: str) -> LedgerUrl:
    raw = _RAW_PASSWORD.match(url)
    password, shown = None, url
    if raw is not None:
        password = raw.group("password")
        shown = url[: raw.start("password")] + "***" + url[raw.end("password") :]
    try:
        parsed = split_url(url)
    except ValueError as exc:
        raise LedgerOpenError(
            f"cannot parse database URL {shown!r}: {scrub_password(str(exc), password)}. Use "
            "sqlite:///path/to/ledger.db or postgresql://user@host:5432/dbname"
        ) from None
    if parsed.drivername in ("postgresql", "postgres"):
        # psycopg 3 is the driver the postgres extra installs; psycopg2 is not a dependency.
        parsed = parsed.replace(drivername="postgresql+psycopg")
    if parsed.backend not in ("sqlite", "postgresql"):
        raise LedgerOpenError(
            f"unsupported database {parsed.backend!r} in {display_url_of(parsed)!r}: "
            "fleetledger stores its log in SQLite or PostgreSQL"
        )
    return parsed


def query_params(url: LedgerUrl) -> dict[str, str]:
    """The URL's query parameters, one value each (the last, if one is repeated)."""
    return {k: v if isinstance(v, str) else v[-1] for k, v in url.query.items()}
