"""Commands: replay and watch — a run's history, printed as it was or as it grows.

``replay`` prints a run's history — transitions with their rules and evidence, epoch
changes with the rank layout, refits, restarts, decisions, stalls, the end — as a table
on a terminal or as JSON lines (one entry per line) with ``--json``. ``watch`` prints
the same entries for a live run as they are appended, and exits when the run ends. The
reading and polling are ``queries``'; this module parses the options and prints.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

import sys
from typing import Annotated

import typer

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log
from fleetledger.cli.output import (
    CommandLineError,
    safe_text,
    say,
    stdout_console,
    stdout_may_close,
    write_json_lines,
)
from fleetledger.cli.paused_gc import paused_gc
from fleetledger.cli.progress import progress_bar

# Option defaults and help, without importing the read side (cli.app: each command
# imports what it uses when it runs). Held to the queries' own values by a test.
DEFAULT_POLL_INTERVAL_S = 1.0
TIME_EXAMPLE = "2026-11-29T10:25:43Z"

# ── replay ─────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def replay(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    from_seq: Annotated[
        int | None,
        typer.Option(
            "--from",
            metavar="SEQ",
            help="Print entries from this seq on (the fold before it is silent).",
        ),
    ] = None,
    to_seq: Annotated[
        int | None, typer.Option("--to", metavar="SEQ", help="Stop after this seq.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(
            "--until",
            metavar="TIME",
            help=f"Stop after the last event at or before this time (ISO 8601 with a zone, "
            f"e.g. {TIME_EXAMPLE}).",
        ),
    ] = None,
    shard: Annotated[
        int | None,
        typer.Option(
            "--shard", metavar="N", help="Only entries about this shard (and the run's end)."
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The run's history: transitions with rule and evidence, epochs and rank layouts,
    refits, restarts, decisions, stalls and the end."""
    from fleetledger.projections.history import EndEntry
    from fleetledger.queries import RunReader

    if to_seq is not None and until is not None:
        raise CommandLineError("give --to SEQ or --until TIME, not both")
    with open_log(db, mode="read") as log:
        reader = RunReader(log, run)
        last = to_seq if until is None else reader.seq_until(until, "--until")
        config = reader.config
        if shard is not None:
            reader.check_shard(shard, "--shard")
        with progress_bar(f"replaying {run}", None, quiet=as_json) as progress, paused_gc():
            entries = list(
                reader.history(
                    from_seq=1 if from_seq is None else from_seq,
                    to_seq=last,
                    on_page=progress.update,
                )
            )
    if shard is not None:
        entries = [e for e in entries if shard in e.shards or isinstance(e, EndEntry)]
    with stdout_may_close():
        if as_json:
            write_json_lines(e.as_json() for e in entries)
            sys.stdout.flush()
            return
        # The table's code (and rich) only for a table: --json stops above.
        from fleetledger.cli.entry_table import EntryTable
        from fleetledger.events.models import datetime_from_us

        console = stdout_console()
        if not entries:
            console.print(safe_text(f"run {run}: no history entries in this range"))
            return
        first, final = entries[0], entries[-1]
        console.print(
            safe_text(
                f"run {run}: seqs {first.seq}..{final.seq}, "
                f"{datetime_from_us(first.at_us):%Y-%m-%d %H:%M:%S} → "
                f"{datetime_from_us(final.at_us):%Y-%m-%d %H:%M:%S} UTC, "
                f"{len(entries)} entries" + (f" about shard {shard}" if shard is not None else "")
            )
        )
        EntryTable(console, config, len(str(final.seq))).rows(entries, header=True)


# ── watch ──────────────────────────────────────────────────────────────────────


@app.command()
@cli_errors
def watch(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    interval: Annotated[
        float,
        typer.Option("--interval", metavar="S", help="Seconds between looks at the log."),
    ] = DEFAULT_POLL_INTERVAL_S,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Follow a live run: print each transition, epoch, refit … as it is appended.

    Exits 0 once the run ends (after printing its end); Ctrl-C stops it (status 130).
    """
    from fleetledger.cli.entry_table import EntryTable
    from fleetledger.queries import Follower

    if not interval > 0:
        raise CommandLineError(f"--interval {interval}: give a positive number of seconds")
    try:
        with open_log(db, mode="read") as log, stdout_may_close():
            with paused_gc():  # the fold up to the head; never while it follows
                follower = Follower(log, run)
            view = follower.history.view
            # Status on stderr: stdout carries only entries (JSON lines stay clean).
            say(
                f"watching run {run} from seq {view.seq} (epoch {view.epoch}, serving "
                f"{list(view.serving)}, absent {list(view.absent)}); Ctrl-C to stop",
                err=True,
            )
            table = None if as_json else EntryTable(stdout_console(), view.config, 7)
            if table is not None:
                table.header()
                sys.stdout.flush()
            for entry in follower.follow(interval):
                if table is None:
                    write_json_lines([entry.as_json()])
                else:
                    table.rows((entry,))
                sys.stdout.flush()  # a watcher reads lines as they come, not per buffer
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(code=130) from None
