"""The ``fleetledger`` application object and what every command shares.

Every command takes ``--db URL`` (else ``$FLEETLEDGER_DB``, else ``sqlite:///fleetledger.db``
in the working directory); every command that prints takes ``--json``. Errors print one
line naming what was wrong and where, and exit with status 2 — never a traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer

from fleetledger.errors import FleetledgerError
from fleetledger.events.database import DB_URL_ENV
from fleetledger.events.log import EventLog
from fleetledger.logs import configure_logging

app = typer.Typer(
    name="fleetledger",
    help="Event-sourced membership ledger for the generation fleet of async RL runs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Ledger database URL [default: ${DB_URL_ENV} or sqlite:///fleetledger.db]",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

F = TypeVar("F", bound=Callable[..., Any])


def _configure_logging() -> None:
    # Transitions are logged at info; the CLI shows them only with FLEETLEDGER_LOG=info
    # (FLEETLEDGER_LOG_FORMAT=json for JSON lines). A bad value is said, then ignored:
    # a logging typo must not stop a forensics command at 3 a.m.
    level = os.environ.get("FLEETLEDGER_LOG", "warning")
    fmt = os.environ.get("FLEETLEDGER_LOG_FORMAT", "console")
    try:
        configure_logging(level, fmt)  # type: ignore[arg-type]
    except ValueError as exc:
        configure_logging()
        typer.echo(
            f"fleetledger: warning: {exc}; logging at warning level to the console", err=True
        )


def _fail(message: str) -> typer.Exit:
    typer.echo(f"fleetledger: error: {message}", err=True)
    return typer.Exit(code=2)


def cli_errors(fn: F) -> F:
    """Turn every error raised on purpose into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FleetledgerError as exc:
            raise _fail(str(exc)) from None
        except OSError as exc:
            raise _fail(f"{exc.filename or ''}: {exc.strerror or exc}") from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def open_log(db: str | None) -> Iterator[EventLog]:
    log = EventLog.open(db)
    if log.database.upgraded_from is not None:
        typer.echo(
            f"fleetledger: upgraded the ledger schema at {log.database.display_url} from "
            f"revision {log.database.upgraded_from}",
            err=True,
        )
    try:
        yield log
    finally:
        log.close()


@app.callback()
def _setup() -> None:
    """Configure logging for every command (also when ``app`` is invoked directly)."""
    _configure_logging()


def main() -> None:
    app()
