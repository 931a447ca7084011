"""Commands over the ledger itself: runs, membership, export/import, demo, migrate."""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

import json
import sys
from contextlib import ExitStack
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fleetledger.cli.app import DbOption, JsonOption, _fail, app, cli_errors, open_log
from fleetledger.cli.output import (
    check_output,
    data_row,
    json_text_safe,
    lasted,
    ledger_files,
    print_json,
    safe_text,
    say,
    stdout_may_close,
    whole_file,
    write_json_lines,
)
from fleetledger.cli.paused_gc import paused_gc
from fleetledger.logs import structlog_ready
from fleetledger.store.errors import AppendRejected

if TYPE_CHECKING:
    from fleetledger.projections.fleet_view import FleetView
    from fleetledger.store.log import EventLog

# Each command imports what it uses when it runs (see ``cli.app``): a bundle's zip, the
# projections or the migrations are not the start-up of every command.

# ── runs ───────────────────────────────────────────────────────────────────────


RUNS_FIXED_CELLS = 6 + 19 + 8 + 2 * 4
"""What ``runs`` gives every column but the run id and the outcome: events, started,
lasted, and two cells between each two of the five."""


@app.command()
@cli_errors
def runs(db: DbOption = None, as_json: JsonOption = False) -> None:
    """List the runs in the ledger: how each ended (or that it is running), when it
    started and how long it lasted."""
    from fleetledger.events.models import iso_at
    from fleetledger.queries.runs import list_runs

    with open_log(db, mode="read") as log:
        listings = list_runs(log)
    if as_json:
        print_json([listing.as_json() for listing in listings])
        return
    summaries = [listing.summary for listing in listings]
    ends = {listing.summary.run_id: listing.end for listing in listings if listing.end}
    if not summaries:
        say("no runs in this ledger")
        return
    from rich.table import Column, Table  # a table is printed: only then is rich loaded

    # The run id is what every other command takes: never let the table cut it short.
    # No vertical rules: at 80 columns the outcome keeps the room they took.
    widest = max(safe_text(s.run_id).cell_len for s in summaries)  # cells, not characters
    # The outcome gets what the terminal has left (its first word, at least), cut here:
    # a longer cell made rich drop whole columns (events, lasted) instead.
    from rich.console import Console

    width = Console().width  # the width ``say`` prints the table at (COLUMNS, else 80)
    room = max(width - widest - RUNS_FIXED_CELLS, len("completed"))
    table = Table(
        Column("run", no_wrap=True, min_width=widest),
        Column("events", justify="right", no_wrap=True, min_width=6),
        Column("started (UTC)", no_wrap=True, min_width=19),
        Column("lasted", justify="right", no_wrap=True, min_width=8),
        Column("outcome", no_wrap=True),
        box=None,
        pad_edge=False,
    )
    for s in summaries:
        end = ends.get(s.run_id)
        outcome = "running" if end is None else end.outcome
        if end is not None and end.outcome != "completed":
            outcome = f"{end.outcome}: {end.cause}"
        if len(outcome) > room:  # cut here: the console prints tables without wrapping
            outcome = outcome[: room - 1] + "…"
        data_row(
            table,
            s.run_id,
            s.head_seq,
            iso_at(s.started_at_us)[:19].replace("T", " "),
            lasted(s.last_at_us - s.started_at_us),
            outcome,
        )
    say(table)


# ── membership ─────────────────────────────────────────────────────────────────


def render_membership(view: "FleetView") -> None:
    from rich.table import Table  # a table is printed: only then is rich loaded (not --json)

    from fleetledger.projections.membership import membership_document

    doc = membership_document(view)
    say(
        f"run {doc['run']} at seq {doc['seq']} ({doc['at']}): epoch {doc['epoch']}, "
        f"serving {doc['serving']}, absent {doc['absent']}, suspected {doc['suspected']}"
    )
    table = Table("shard", "state", "weights", "restarts", "since seq", "because")
    for index, shard in doc["shards"].items():
        data_row(
            table,
            index,
            shard["state"],
            shard["weight_version"],
            shard["restart_attempts"],
            shard["since_seq"],
            shard["since_rule"],
        )
    say(table)
    if doc["layout"] is None:
        say(f"rank layout: none ({doc['layout_error']})")
    else:
        say(f"rank layout: {doc['layout_words']}")
    if doc["exhausted"]:
        say(f"exhausted: {doc['exhausted']}")
    if doc["ended"]:
        ended = doc["ended"]  # the cause as written, not a dict's repr of it
        say(f"ended: {ended['outcome']} at seq {ended['seq']}: {ended['cause']}")


@app.command()
@cli_errors
def membership(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    at: Annotated[
        str | None,
        typer.Option(
            "--at",
            metavar="SEQ|TIME",
            help="Answer as of this seq, or of this time (ISO 8601 with a zone, e.g. "
            "2026-11-29T10:25:43Z: the last event at or before it).",
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Who is in the fleet: states, serving/absent sets, epoch and the rank layout."""
    from fleetledger.projections.membership import membership_document
    from fleetledger.queries import RunReader

    with open_log(db, mode="read") as log, paused_gc():
        # A time becomes the last seq stamped at or before it; then the nearest
        # snapshot at or before that seq, folded forward.
        reader = RunReader(log, run)
        view = reader.view(reader.seq_of(at, "--at"))
    if as_json:
        print_json(membership_document(view))
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
    bundle: Annotated[
        Path | None,
        typer.Option(
            "--bundle",
            help="Write a self-contained bundle here instead (zip: manifest, events, "
            "config, summary; `fleetledger import` reads it).",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Write a run's stored events as JSON Lines, or a bundle (format: docs/events.md)."""
    from fleetledger.cli.progress import progress_bar, stdout_is_a_file
    from fleetledger.events.bundle import write_bundle
    from fleetledger.events.jsonl import export_lines
    from fleetledger.projections.membership import membership_document
    from fleetledger.queries import RunReader

    if bundle is not None and output is not None:
        raise _fail("give -o (JSON Lines) or --bundle, not both")
    target = bundle if bundle is not None else output
    if target is not None:
        check_output(target)  # before the ledger is opened (or created)
    with open_log(db, mode="read") as log, paused_gc():
        protect = ledger_files(log.database)
        if target is not None:
            check_output(target, protect)  # never the ledger itself
        # An unknown run fails here, before the target is touched; everything below is
        # as of this one head, even if the run is live. Pages are read, written and
        # dropped one at a time: memory holds a page whatever the run's length.
        reader = RunReader(log, run)
        head = reader.head.seq
        what = f"{'bundling' if bundle is not None else 'exporting'} {run}"
        # Lines on stdout go to the terminal stderr draws on, or to a reader that may
        # be (`export RUN | less`): only a file written here or a regular file on stdout
        # leaves the terminal to the progress line.
        quiet = target is None and not stdout_is_a_file()
        with progress_bar(what, head, quiet=quiet) as progress:
            pages = progress.count_pages(log.read_stored(run, 0, head))
            if bundle is not None:
                view = reader.view()
                with whole_file(bundle, protect) as stream:
                    write_bundle(
                        stream, run, pages, view.config, membership_document(view), name=str(bundle)
                    )
                return
            # The stored payloads as they are, but for controls a terminal would act on.
            lines = map(json_text_safe, export_lines(run, pages))
            if output is None:
                with stdout_may_close():  # `export RUN | head` ends quietly
                    for line in lines:
                        sys.stdout.write(line + "\n")
                    sys.stdout.flush()
                return
            with whole_file(output, protect) as stream:
                for line in lines:
                    stream.write((line + "\n").encode("utf-8"))


def snapshot_imported(log: "EventLog", run: str) -> "FleetView":
    """Fold an imported run once, storing snapshots at a live ledger's cadence, so
    ``membership``, ``explain`` and ``--at`` on it fold a short tail, as on the original.

    And one at its last seq: an imported run does not grow, and its head is what
    ``membership`` shows unless told otherwise — it then folds nothing at all.
    """
    from fleetledger.projections.snapshot import (
        PROJECTION_VERSION,
        fold_with_snapshots,
        to_snapshot,
    )

    def save(seq: int, payload: str) -> None:
        log.save_snapshot(run, PROJECTION_VERSION, seq, payload)

    with paused_gc():  # the command's own bulk read: the fold of the whole imported run
        final = fold_with_snapshots(log.read_pages(run, ids=False), save)
    save(final.seq, to_snapshot(final))  # a no-op where the cadence fell on the last seq
    return final


def same_summary_value(key: str, ours: object, theirs: object) -> bool:
    """A bundle's summary agrees with this fold's: the same values, and for ``at`` the
    same instant (older versions wrote ``+00:00`` where this one writes ``Z``)."""
    if key == "at" and isinstance(ours, str) and isinstance(theirs, str):
        try:
            return datetime.fromisoformat(ours) == datetime.fromisoformat(theirs)
        except ValueError:
            return False
    return ours == theirs


@app.command(name="import")
@cli_errors
def import_(
    file: Annotated[Path, typer.Argument(help="A JSON Lines export or a bundle ('-' for stdin).")],
    run: Annotated[str | None, typer.Option("--run", help="Import under this run id.")] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import an exported run or a bundle (told apart by content): every line checked,
    nothing kept unless all pass."""
    from fleetledger.cli.progress import Total, lines_of, progress_bar
    from fleetledger.events.bundle import open_import
    from fleetledger.projections.membership import membership_document
    from fleetledger.store.errors import ImportedIdTwice
    from fleetledger.store.records import check_run_id

    if run is not None:  # checked before anything is opened; '' is not "no --run"
        try:
            check_run_id(run)
        except AppendRejected as exc:
            raise _fail(f"--run {run!r}: {exc.problem}") from None
    source = "<stdin>" if str(file) == "-" else str(file)
    with ExitStack() as stack:
        log = stack.enter_context(open_log(db, mode="write"))
        stream = sys.stdin.buffer if str(file) == "-" else stack.enter_context(file.open("rb"))
        opened = stack.enter_context(open_import(stream, source, log.codec, run))
        bundle = opened.bundle
        total: Total = opened.lines
        if total is None and str(file) != "-":
            total = partial(lines_of, str(file))  # counted only if the bar is shown
        with progress_bar(f"importing {opened.run}", total, quiet=as_json) as progress:
            try:
                events = log.import_run(opened.run, progress.count(opened.rows))
            except ImportedIdTwice as exc:
                raise opened.id_twice(exc.event_id, exc.seq, exc.first_seq) from None
        view = snapshot_imported(log, opened.run)
    if bundle is not None:
        # The events are verified; a summary that disagrees with this version's fold
        # means the fold's rules changed since the bundle was written. Say so.
        ours = json.loads(json.dumps(membership_document(view)))
        theirs = dict(bundle.summary["membership"])
        keys = (ours.keys() | theirs.keys()) - {"run"}
        differ = sorted(k for k in keys if not same_summary_value(k, ours.get(k), theirs.get(k)))
        if differ:
            say(
                f"fleetledger: warning: {source}: the bundle's summary differs from this "
                f"fleetledger's fold of its events in {', '.join(differ)}; answers follow "
                "this version's rules",
                err=True,
            )
    if as_json:
        doc = {"run": opened.run, "events": events, "epoch": view.epoch}
        if bundle is not None:
            doc["bundle"] = bundle.manifest.as_dict()
        print_json(doc)
    elif bundle is not None:
        m = bundle.manifest
        say(
            f"imported {events} events as run {opened.run} from bundle {source} "
            f"(format {m.format_version}, run {m.run}, written {m.created} by fleetledger "
            f"{m.fleetledger_version})"
        )
    else:
        say(f"imported {events} events as run {opened.run}")


# ── demo ───────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def demo(db: DbOption = None, as_json: JsonOption = False) -> None:
    """Write a scripted run into the ledger and print the membership after each step."""
    # The one writing command here: the read commands beside it never load the controller.
    # It logs through structlog itself (transitions at info): configured before it loads.
    structlog_ready()
    from fleetledger.controller.demo import new_demo_run_id, run_demo
    from fleetledger.projections.membership import membership_document

    run = new_demo_run_id()
    with open_log(db, mode="write") as log:
        for number, (ledger, step) in enumerate(run_demo(log, run), start=1):
            doc = membership_document(ledger.view)
            if as_json:
                write_json_lines(
                    [
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
                    ]
                )
                continue
            states = " ".join(f"{i}:{s['state']}" for i, s in doc["shards"].items())
            world = doc["layout"]["world_size"] if doc["layout"] else "-"
            say(f"{number:2d}. {step.title}", style="bold")
            for t in step.transitions:
                say(f"      shard {t.shard}: {t.before.value} → {t.after.value} ({t.rule})")
            say(
                f"      seq {doc['seq']} · epoch {doc['epoch']} · serving {doc['serving']} · "
                f"absent {doc['absent']} · world {world} · {states}"
            )
        if not as_json:
            say()
            render_membership(ledger.view)
            say()
            say(f"run id: {run} — try `fleetledger membership {run} --at 5`")


# ── migrate ────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def migrate(
    db: DbOption = None,
    into_foreign_database: Annotated[
        bool,
        typer.Option(
            "--into-foreign-database",
            help="PostgreSQL: create the ledger's fleetledger_* tables in a database that "
            "already holds other tables (refused without it).",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Upgrade the ledger schema to this version's head (required for PostgreSQL)."""
    from fleetledger.store.database import migrate as migrate_database

    before, after = migrate_database(db, into_foreign_database=into_foreign_database)
    if as_json:
        print_json({"from": before, "to": after})
    elif before == after:
        say(f"ledger schema already at revision {after}")
    else:
        say(f"ledger schema upgraded from {before or 'empty'} to revision {after}")
