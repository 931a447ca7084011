"""The ``fleetledger`` application object and what every command shares.

Every command takes ``--db URL`` (else ``$FLEETLEDGER_DB``, else ``sqlite:///fleetledger.db``
in the working directory); every command that prints takes ``--json``. Errors print one
line naming what was wrong and where, and exit with status 2 — never a traceback. Usage
errors too (a bad value, a missing argument, an unknown option or command): click's
usage block and "Try --help" are left out, here in the group every invocation goes through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from fleetledger import __version__
from fleetledger.cli.output import say
from fleetledger.errors import FleetledgerError
from fleetledger.logs import defer_logging_from_env
from fleetledger.store.urls import DB_URL_ENV, DEFAULT_DB_URL

if TYPE_CHECKING:
    from fleetledger.store.database import OpenMode
    from fleetledger.store.log import EventLog

# Each command imports what it needs when it runs (the log, the projections, a bundle's
# zip, the timeline's painters, rich for a table, structlog when something logs), so
# `fleetledger --help` or a read command does not pay for what another command uses;
# Alembic is imported only where a migration can happen. typer builds every command's
# parameters from its annotations on each start, whichever command runs: the command
# modules keep their annotations as objects (no `from __future__ import annotations`),
# because typer compiles a string annotation on every start (about 10 ms for them all).

# ── usage errors: one line, like every other error ─────────────────────────────


def _click_class(name: str) -> type[Exception]:
    # typer raises click's exceptions, from its own copy of click in recent versions (from
    # click before): take them from the class typer exports, not from ``import click``.
    return next(c for c in typer.BadParameter.__mro__ if c.__name__ == name)


_ClickException = _click_class("ClickException")
# What a value had to be, by the conversion error typer reports (pydantic's error type).
_EXPECTED = {
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_parsing": "a number",
    "bool_parsing": "true or false",
}


def _param_name(param: Any) -> str:
    """How the user wrote the parameter: ``SHARD`` for an argument, ``--from`` for an option."""
    if getattr(param, "param_type_name", "") == "argument":
        return str(param.name).upper()
    opts = getattr(param, "opts", None) or [str(param.name)]
    return max(opts, key=len)


def usage_error_line(exc: Any) -> str:
    """A usage error (click's) as the line after ``fleetledger: error:``: no usage, no hint."""
    param = getattr(exc, "param", None)
    if type(exc).__name__ == "MissingParameter" and param is not None:
        return f"missing {param.param_type_name} {_param_name(param)}"
    problems = getattr(exc.__cause__, "errors", list)()  # pydantic's, for a conversion
    if isinstance(exc, typer.BadParameter) and param is not None and problems:
        expected = _EXPECTED.get(problems[0].get("type"))
        if expected is not None:
            return f"{_param_name(param)} must be {expected}, got {problems[0].get('input')!r}"
    possibilities = getattr(exc, "possibilities", None)  # an unknown option click can place
    if possibilities:
        return f"{exc.message}; did you mean {' or '.join(sorted(possibilities))}?"
    return str(exc.format_message())


@contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    try:
        yield
    except _ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `fleetledger` alone prints the help
            raise
        raise _fail(usage_error_line(exc), code=getattr(exc, "exit_code", 2)) from None


class FleetledgerGroup(TyperGroup):
    """The app's click group: argument parsing and command lookup happen in these two
    methods, for the console script (:func:`main`) and for an in-process runner
    (``CliRunner().invoke(app)``) alike, so a usage error is one line in both."""

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        with _usage_errors_in_one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _usage_errors_in_one_line():
            return super().invoke(ctx)


app = typer.Typer(
    name="fleetledger",
    help="Event-sourced membership ledger for the generation fleet of async RL runs.",
    cls=FleetledgerGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich markup would read "[default: 1.0]" as a tag and drop it.
    rich_markup_mode=None,
)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help=f"Ledger database URL [default: ${DB_URL_ENV} or {DEFAULT_DB_URL}]",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]

F = TypeVar("F", bound=Callable[..., Any])


def _configure_logging() -> None:
    # Transitions are logged at info; the CLI shows them only with FLEETLEDGER_LOG=info
    # (FLEETLEDGER_LOG_FORMAT=json for JSON lines). A bad value is said, then ignored:
    # a logging typo must not stop a forensics command at 3 a.m. The settings are checked
    # here, for every command; structlog is loaded and configured only if something logs
    # (fleetledger.logs: a read command that logs nothing does not pay for it).
    warning = defer_logging_from_env()
    if warning is not None:
        say(f"fleetledger: warning: {warning}", err=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    # One line, whatever the message quotes (a newline in it is shown as \n).
    say(f"fleetledger: error: {message}", err=True, fold=False)
    return typer.Exit(code=code)


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
def open_log(db: str | None, *, mode: OpenMode) -> Iterator[EventLog]:
    """The command's ledger: ``mode="read"`` for the commands that only look (the ledger
    is opened read-only: never created, upgraded or written), ``"write"`` for those that
    append (a new SQLite ledger may be created, an older one is upgraded, and says so)."""
    from fleetledger.store.errors import LedgerWriteError
    from fleetledger.store.log import EventLog

    log = EventLog.open(db, mode=mode)
    try:
        if mode == "write" and log.database.read_only:
            # Refused before the command does any work: nothing would be written anyway.
            raise LedgerWriteError(
                f"{log.database.display_url}: the ledger is opened read-only (mode=ro in "
                "the URL) and this command writes to it; nothing was written"
            )
        if log.database.upgraded_from is not None:
            typer.echo(
                f"fleetledger: upgraded the ledger schema at {log.database.display_url} from "
                f"revision {log.database.upgraded_from}",
                err=True,
            )
        yield log
    finally:
        log.close()


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"fleetledger {__version__}")
        raise typer.Exit()


@app.callback()
def _setup(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print fleetledger's version and exit.",
        ),
    ] = False,
) -> None:
    """Configure logging for every command (also when ``app`` is invoked directly)."""
    _configure_logging()


def main() -> None:
    app()
