"""The ``fleetledger`` command line.

Every command takes ``--db URL`` (else ``$FLEETLEDGER_DB``, else ``sqlite:///fleetledger.db``
in the working directory); every command that prints takes ``--json``. Errors print one
line naming what was wrong and where, and exit with status 2 — never a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import structlog
import typer
from rich.console import Console
from rich.table import Column, Table

from fleetledger.controller.demo import new_demo_run_id, run_demo
from fleetledger.controller.ledger import load_view
from fleetledger.events.database import DB_URL_ENV
from fleetledger.events.database import migrate as migrate_database
from fleetledger.events.errors import LedgerError
from fleetledger.events.jsonl import export_lines, format_at, parse_export
from fleetledger.events.log import EventLog
from fleetledger.projections.fleet_view import FleetView, ProjectionError
from fleetledger.projections.membership import membership_document
from fleetledger.projections.rank_layout import RankLayoutError

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
out = Console(highlight=False, soft_wrap=True)


def _configure_logging() -> None:
    # Logs go to stderr: stdout carries the command's answer (and --json must stay clean).
    # Transitions are logged at info; the CLI shows them only with FLEETLEDGER_LOG=info.
    level = logging.getLevelNamesMapping().get(
        os.environ.get("FLEETLEDGER_LOG", "warning").upper(), logging.WARNING
    )
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
    )


def _fail(message: str) -> typer.Exit:
    typer.echo(f"fleetledger: error: {message}", err=True)
    return typer.Exit(code=2)


def cli_errors(fn: F) -> F:
    """Turn our own errors into one line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LedgerError, ProjectionError, RankLayoutError) as exc:
            raise _fail(str(exc)) from None
        except OSError as exc:
            raise _fail(f"{exc.filename or ''}: {exc.strerror or exc}") from None

    return wrapper  # type: ignore[return-value]


@contextmanager
def _open_log(db: str | None) -> Iterator[EventLog]:
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


def _print_json(doc: Any) -> None:
    typer.echo(json.dumps(doc, indent=2, sort_keys=False))


# ── runs ───────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def runs(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List the runs in the ledger."""
    with _open_log(db) as log:
        summaries = log.runs()
    if as_json:
        _print_json(
            [
                {
                    "run": s.run_id,
                    "events": s.head_seq,
                    "started": format_at(s.started_at_us),
                    "last_event": format_at(s.last_at_us),
                    "ended": s.ended,
                }
                for s in summaries
            ]
        )
        return
    if not summaries:
        out.print("no runs in this ledger")
        return
    # The run id is what every other command takes: never let the table cut it short.
    run_column = Column("run", no_wrap=True, min_width=max(len(s.run_id) for s in summaries))
    table = Table(run_column, "events", "started", "last event", "ended")
    for s in summaries:
        table.add_row(
            s.run_id,
            str(s.head_seq),
            format_at(s.started_at_us),
            format_at(s.last_at_us),
            "yes" if s.ended else "no",
        )
    out.print(table)


# ── membership ─────────────────────────────────────────────────────────────────


def render_membership(view: FleetView) -> None:
    doc = membership_document(view)
    out.print(
        f"run {doc['run']} at seq {doc['seq']} ({doc['at']}): epoch {doc['epoch']}, "
        f"serving {doc['serving']}, absent {doc['absent']}, suspected {doc['suspected']}"
    )
    table = Table("shard", "state", "weights", "restarts", "since seq", "because")
    for index, shard in doc["shards"].items():
        table.add_row(
            index,
            shard["state"],
            str(shard["weight_version"]),
            str(shard["restart_attempts"]),
            str(shard["since_seq"]),
            shard["since_rule"],
        )
    out.print(table)
    layout = doc["layout"]
    if layout is None:
        out.print(f"rank layout: none ({doc['layout_error']})")
    else:
        out.print(
            f"rank layout: world {layout['world_size']} = {layout['train_world_size']} trainer "
            f"ranks + {len(layout['shard_prefixes'])} shards × {layout['workers_per_shard']}; "
            f"shard prefixes {layout['shard_prefixes']}"
        )
    for key in ("exhausted", "ended"):
        if doc[key]:
            out.print(f"{key}: {doc[key]}")


@app.command()
@cli_errors
def membership(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    at: Annotated[int | None, typer.Option("--at", help="Answer as of this seq.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Who is in the fleet: states, serving/absent sets, epoch and the rank layout."""
    with _open_log(db) as log:
        view = load_view(log, run, at)
    if as_json:
        _print_json(membership_document(view))
    else:
        render_membership(view)


# ── export / import ────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def export(
    run: Annotated[str, typer.Argument(help="Run id to export.")],
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Write here instead of stdout.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Write a run's stored events as JSON Lines (format: docs/events.md)."""
    with _open_log(db) as log:
        lines = export_lines(run, log.read_stored(run))
        if output is None:
            for line in lines:
                sys.stdout.write(line + "\n")
            return
        tmp = output.with_name(output.name + ".partial")
        with tmp.open("w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(line + "\n")
        tmp.replace(output)


@app.command(name="import")
@cli_errors
def import_(
    file: Annotated[Path, typer.Argument(help="A JSON Lines export ('-' for stdin).")],
    run: Annotated[str | None, typer.Option("--run", help="Import under this run id.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import an exported run. Every line is checked before any is written."""
    with _open_log(db) as log:
        if str(file) == "-":
            parsed = parse_export(sys.stdin.buffer, log.codec, run)
        else:
            with file.open("rb") as fh:
                parsed = parse_export(fh, log.codec, run)
        log.import_run(parsed.run, parsed.rows)
        view = load_view(log, parsed.run)
    if as_json:
        _print_json({"run": parsed.run, "events": len(parsed.rows), "epoch": view.epoch})
    else:
        out.print(f"imported {len(parsed.rows)} events as run {parsed.run}")


# ── demo ───────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def demo(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Write a scripted run into the ledger and print the membership after each step."""
    run = new_demo_run_id()
    with _open_log(db) as log:
        for number, (ledger, step) in enumerate(run_demo(log, run), start=1):
            doc = membership_document(ledger.view)
            if as_json:
                typer.echo(
                    json.dumps(
                        {
                            "step": number,
                            "title": step.title,
                            "transitions": [
                                {
                                    "seq": t.seq,
                                    "shard": t.shard,
                                    "from": t.before.value,
                                    "to": t.after.value,
                                    "rule": t.rule,
                                }
                                for t in step.transitions
                            ],
                            "membership": doc,
                        }
                    )
                )
                continue
            states = " ".join(f"{i}:{s['state']}" for i, s in doc["shards"].items())
            world = doc["layout"]["world_size"] if doc["layout"] else "-"
            out.print(f"[bold]{number:2d}. {step.title}[/bold]")
            for t in step.transitions:
                out.print(f"      shard {t.shard}: {t.before.value} → {t.after.value} ({t.rule})")
            out.print(
                f"      seq {doc['seq']} · epoch {doc['epoch']} · serving {doc['serving']} · "
                f"absent {doc['absent']} · world {world} · {states}"
            )
        if not as_json:
            out.print()
            render_membership(ledger.view)
            out.print(f"\nrun id: {run} — try `fleetledger membership {run} --at 5`")


# ── migrate ────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def migrate(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Upgrade the ledger schema to this version's head (required for PostgreSQL)."""
    before, after = migrate_database(db)
    if as_json:
        _print_json({"from": before, "to": after})
    elif before == after:
        out.print(f"ledger schema already at revision {after}")
    else:
        out.print(f"ledger schema upgraded from {before or 'empty'} to revision {after}")


@app.callback()
def _setup() -> None:
    """Configure logging for every command (also when ``app`` is invoked directly)."""
    _configure_logging()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
