"""Database URLs: which one a command means, how it is parsed, what it tells each
backend's driver, and how it is shown. The one place a URL is read: every caller parses
with :func:`parse_db_url` and asks this module what the parts mean.

A URL is parsed here, by the grammar SQLAlchemy's ``make_url`` reads (a property test
holds the two to the same answers and the same rendering), not by ``make_url`` itself:
importing SQLAlchemy costs a read command more than the rest of its start-up, and a
SQLite ledger is read without it. The engine of a write open or of PostgreSQL gets the
same URL as SQLAlchemy's own (:meth:`LedgerUrl.sqlalchemy`).

What a URL tells the drivers:

- SQLite: a file (:func:`sqlite_path`: never a host, a user or memory), handed to the
  driver as a ``file:`` URI with every SQLite parameter of the query, and the driver's
  own arguments (``timeout``, ...) checked before any file is touched (:func:`sqlite_uri`).
- PostgreSQL: bounded waits by default, which the URL's own settings override
  (:func:`postgres_connect`).

A URL's password is never shown: messages name a database by :func:`display_url_of`,
and driver text that might quote the password is passed through :func:`scrub_password`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, quote_plus, unquote, urlencode

from fleetledger.store.errors import LedgerOpenError

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


# ── SQLite: a file ───────────────────────────────────────────────────────────

SQLITE_BUSY_TIMEOUT_MS = 30_000
_TRUE = ("1", "true", "yes", "on")


def _flag(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on", "y", "t"):
        return True
    if lowered in ("0", "false", "no", "off", "n", "f"):
        return False
    raise ValueError(f"{value!r} is not a boolean")


def _seconds(value: str) -> float:
    seconds = float(value)
    if not 0 <= seconds < 2**31 / 1000:  # the driver's busy timeout is a C int of ms
        raise ValueError(f"{value!r} is out of range")
    return seconds


def _c_int(value: str) -> int:
    number = int(value)
    if not 0 <= number < 2**31:  # the driver takes a C int
        raise ValueError(f"{value!r} is out of range")
    return number


# Query parameters the Python driver takes, each read as SQLAlchemy reads it (and held
# to what the driver can take, so a value is refused before any file is touched), and
# what it must be; every other one is a SQLite URI parameter.
_PYSQLITE_ARGS: dict[str, tuple[Callable[[str], Any], str]] = {
    "timeout": (_seconds, "a number of seconds, 0 or more (up to 2147483)"),
    "isolation_level": (str, "text"),
    "detect_types": (_c_int, "a whole number from 0 to 2147483647"),
    "check_same_thread": (_flag, "true or false"),
    "cached_statements": (_c_int, "a whole number from 0 to 2147483647"),
}


def sqlite_path(url: LedgerUrl) -> Path:
    """The ledger file a SQLite URL names (a ``file:`` URI of this machine's too)."""
    database = url.database
    if url.username or url.password or url.host or url.port:
        raise LedgerOpenError(
            "a SQLite URL names a file, not a user, password or host: use "
            "sqlite:///relative/ledger.db or sqlite:////absolute/ledger.db"
        )
    if not database or database == ":memory:" or query_params(url).get("mode") == "memory":
        database = ":memory:"
    elif database.startswith("file:"):  # the user's own URI form
        database = database[len("file:") :]
        if database.startswith("//"):  # file://host/path: only this machine
            host, _, rest = database[2:].partition("/")
            if host not in ("", "localhost"):
                raise LedgerOpenError(f"a SQLite ledger is a local file, not one on {host!r}")
            database = "/" + rest
        database = unquote(database)
    if not database or database.startswith(":memory:"):
        raise LedgerOpenError(
            "an in-memory SQLite database cannot hold a ledger (nothing would survive the "
            "process); give a file, e.g. sqlite:///fleetledger.db"
        )
    return Path(database)


def sqlite_params(url: LedgerUrl) -> dict[str, str]:
    """The URL's query without ``uri``: every SQLite URL goes to the driver as a URI."""
    return {k: v for k, v in query_params(url).items() if k != "uri"}


def params_read_only(params: dict[str, str]) -> bool:
    """The URL opens the file read-only (``mode=ro``) or vouches nothing changes it."""
    return params.get("mode") == "ro" or params_immutable(params)


def params_immutable(params: dict[str, str]) -> bool:
    return params.get("immutable", "").lower() in _TRUE


def sqlite_uri(path: Path, params: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """The file as a ``file:`` URI carrying every SQLite parameter, and the driver's own
    arguments (``timeout``, ...) with their types; a value of the wrong type is refused."""
    uri = "file:" + quote(os.path.abspath(path), safe="/")
    in_uri = {k: v for k, v in params.items() if k not in _PYSQLITE_ARGS}
    if in_uri:
        uri += "?" + urlencode(in_uri)
    driver: dict[str, Any] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
    for name, value in params.items():
        if name not in _PYSQLITE_ARGS:
            continue
        convert, expected = _PYSQLITE_ARGS[name]
        try:
            driver[name] = convert(value)
        except ValueError:
            raise LedgerOpenError(
                f"the database URL's {name}={value!r} for {path} must be {expected}"
            ) from None
    return uri, driver


# ── PostgreSQL: a session ────────────────────────────────────────────────────

# A server that accepts and never answers, or a writer frozen inside its transaction,
# must cost a bounded wait and one clear line, never a hung command. Each is
# overridable in the URL (?connect_timeout=30&lock_timeout=2min&statement_timeout=0).
PG_CONNECT_TIMEOUT_S = 10
PG_SESSION_DEFAULTS = {"lock_timeout": "30s", "statement_timeout": "5min"}


def _pg_option_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def postgres_connect(url: LedgerUrl, *, read_only: bool) -> tuple[LedgerUrl, dict[str, Any]]:
    """The driver URL and connect arguments: bounded times, and read-only for reads.

    The URL's own settings win: ``connect_timeout`` is libpq's; ``lock_timeout`` and
    ``statement_timeout`` become ``-c`` options after the defaults; the URL's own
    ``options`` come after those. ``default_transaction_read_only`` comes last on a read
    open, so nothing in the URL turns it off.
    """
    query = query_params(url)
    settings = dict(PG_SESSION_DEFAULTS)
    for key in PG_SESSION_DEFAULTS:
        if key in query:
            settings[key] = query.pop(key)
    options = [f"-c {key}={_pg_option_value(value)}" for key, value in settings.items()]
    if "options" in query:
        options.append(query.pop("options"))
    if read_only:
        options.append("-c default_transaction_read_only=on")
    connect_args: dict[str, Any] = {"options": " ".join(options)}
    if "connect_timeout" not in query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    return url.replace(query=query), connect_args


def connect_timeout_of(url: LedgerUrl) -> str | int:
    """The seconds a PostgreSQL connect waits: the URL's ``connect_timeout``, else ours."""
    return query_params(url).get("connect_timeout", PG_CONNECT_TIMEOUT_S)
