"""Commands: replay and watch (issue 3, forensics), and the ``SEQ|TIME`` points they take.

``replay`` prints a run's history — transitions with their rules and evidence, epoch
changes with the rank layout, refits, restarts, decisions, stalls, the end — as a table
on a terminal or as JSON lines (one ``Entry.as_dict()`` per line) with ``--json``.
``watch`` prints the same entries for a live run as they are appended, and exits when
the run ends. The reading and polling are the controller's (``controller.follow``);
this module parses the options and prints.

Times on the command line are ISO 8601 with a zone: the log stamps events in UTC, and a
naive "10:25" would mean a different moment on every machine that reads it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from types import TracebackType
from typing import Annotated, TextIO

import typer
from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column, Table
from rich.text import Text

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log
from fleetledger.controller.follow import DEFAULT_POLL_INTERVAL_S, Follower, read_history
from fleetledger.events.errors import LedgerError
from fleetledger.events.log import EventLog
from fleetledger.events.models import FleetConfig, datetime_from_us, us_from_datetime
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    EpochEntry,
    RefitEntry,
    RestartEntry,
    StallEntry,
    TransitionEntry,
)

# A fold shorter than this shows no progress bar: it would only flicker.
PROGRESS_DELAY_S = 1.0
# Rows per rendered table: rich measures a whole table before printing it, so a long
# replay is printed as a stack of tables with the same fixed columns.
TABLE_CHUNK = 500
# Off a terminal (a pipe, a file) lines are not wrapped: one entry, one line, for grep.
UNWRAPPED_WIDTH = 100_000
TIME_EXAMPLE = "2026-11-29T10:25:43Z"
# More subjects than this move from the narrow shard column into the detail.
MAX_SHARD_COLUMN = 2


class CommandLineError(LedgerError):
    """An option value that cannot be used (a time without a zone, two exclusive bounds)."""


# ── points in a run: SEQ or TIME ───────────────────────────────────────────────


def parse_time(text: str, option: str, *, or_seq: bool = False) -> int:
    """An ISO 8601 time with a zone, as stamped microseconds since the epoch (UTC).

    ``or_seq``: the option also takes a seq, and the error says so.
    """
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        expected = "a seq (an integer) or an ISO 8601 time" if or_seq else "an ISO 8601 time"
        raise CommandLineError(
            f"{option} {text!r} is not {expected}; give e.g. "
            + ("812, " if or_seq else "")
            + f"{TIME_EXAMPLE} or 2026-11-29T11:25:43+01:00"
        ) from None
    if at.tzinfo is None:
        raise CommandLineError(
            f"{option} {text!r} has no time zone; give one (e.g. {text.strip()}Z or "
            f"{text.strip()}+00:00): stored times are UTC, and a naive time means a "
            "different moment on each machine"
        )
    return us_from_datetime(at)


def is_seq(text: str) -> bool:
    body = text.strip()
    return body.removeprefix("-").isdigit()


def seq_for(log: EventLog, run: str, point: str, option: str) -> int:
    """``point`` as a seq of ``run``: an integer is a seq, anything else a time."""
    if is_seq(point):
        return int(point)
    return log.seq_at(run, parse_time(point, option, or_seq=True))


# ── rendering entries ──────────────────────────────────────────────────────────

DECISIONS = {
    "weights_partial": "weights partial",
    "condemned": "condemned",
    "retired": "retired",
    "condemnation_refused": "condemnation refused",
    "fleet_exhausted": "fleet exhausted",
}


def _time(at_us: int) -> str:
    # The year is in replay's title line (a watch is live: it is this year); milliseconds
    # are enough for a person to order what happened.
    return datetime_from_us(at_us).strftime("%m-%d %H:%M:%S.%f")[:-3]


def _shards(shards: Iterable[int]) -> str:
    return ",".join(str(s) for s in shards)


def _seqs(seqs: Iterable[int]) -> str:
    return ", ".join(str(s) for s in seqs)


def describe_layout(entry: EpochEntry, config: FleetConfig) -> str:
    """The rank layout as ranges: the trainer ranks, then each present shard's ranks.

    ``shard_prefixes`` are worker offsets after the trainer ranks (the transports'
    contract); a reader wants global ranks, so they are shifted here.
    """
    if entry.world_size is None or entry.shard_prefixes is None:
        return f"no rank layout: {entry.layout_error}"
    trainers = config.train_world_size
    width = config.workers_per_shard
    parts = [f"trainer {_span(0, trainers)}"]
    parts += [
        f"shard {shard} {_span(trainers + prefix, trainers + prefix + width)}"
        for shard, prefix in sorted(entry.shard_prefixes.items(), key=lambda kv: kv[1])
    ]
    return f"world {entry.world_size}: " + ", ".join(parts)


def _span(first: int, end: int) -> str:
    return str(first) if end - first == 1 else f"{first}–{end - 1}"


def describe(entry: Entry, config: FleetConfig) -> tuple[str, str, str, str]:
    """(shard column, what happened, why / detail, style) for one entry of a run."""
    if isinstance(entry, TransitionEntry):
        style = {"DEAD": "red", "RETIRED": "bold red", "HEALTHY": "green", "SUSPECT": "yellow"}
        return (
            str(entry.shard),
            f"{entry.before} → {entry.after}",
            f"{entry.rule} [evidence: seq {_seqs(entry.evidence)}]",
            style.get(entry.after, ""),
        )
    if isinstance(entry, EpochEntry):
        return (
            "",
            f"epoch {entry.epoch}",
            f"serving [{_shards(entry.serving)}] · absent [{_shards(entry.absent)}] · "
            + describe_layout(entry, config),
            "bold cyan",
        )
    if isinstance(entry, RefitEntry):
        span = f"seq {entry.started_seq}→{entry.seq}, {entry.duration_us / 1e6:.3f} s"
        detail = f"{span}, shards [{_shards(entry.participants)}]"
        if entry.outcome == "aborted":
            detail += f"; {entry.reason}"
            if entry.context_lost:
                detail += "; device context lost"
        elif entry.outcome == "open":
            detail += f"; still open: {entry.reason}"
        style = {"aborted": "red", "open": "yellow"}.get(entry.outcome, "")
        return "", f"refit v{entry.weight_version} {entry.outcome}", detail, style
    if isinstance(entry, RestartEntry):
        return str(entry.shard), f"restart {entry.action}", entry.detail, ""
    if isinstance(entry, DecisionEntry):
        what = DECISIONS.get(entry.decision, entry.decision)
        if len(entry.subjects) <= MAX_SHARD_COLUMN:
            return _shards(entry.subjects), what, entry.detail, "magenta"
        return "", what, f"{entry.detail}; shards [{_shards(entry.subjects)}]", "magenta"
    if isinstance(entry, StallEntry):
        return (
            "",
            f"stall ({entry.action})",
            f"idle {entry.idle_s:g} s; committed groups {entry.committed_groups}, "
            f"train steps {entry.train_steps}, in flight {entry.in_flight}",
            "yellow",
        )
    if isinstance(entry, EndEntry):
        return "", f"run ended ({entry.outcome})", entry.cause, "bold"
    return "", entry.kind, json.dumps(entry.as_dict()), ""


def stdout_console() -> Console:
    """A console on the current stdout: wraps to a terminal, never wraps into a pipe."""
    stream = sys.stdout
    terminal = stream.isatty()
    return Console(
        file=stream,
        highlight=False,
        width=None if terminal else UNWRAPPED_WIDTH,
        soft_wrap=False,
    )


class EntryTable:
    """Prints entries as rows of one table with fixed columns, a few rows at a time.

    The columns before the detail have fixed widths, so tables printed one after the
    other (chunks of a replay, single rows of a watch) line up under one header.
    """

    def __init__(self, console: Console, config: FleetConfig, seq_width: int) -> None:
        self.console = console
        self.config = config
        self.seq_width = max(3, seq_width)

    def _table(self, header: bool) -> Table:
        return Table(
            Column("time (UTC)", width=18, no_wrap=True),
            Column("seq", width=self.seq_width, justify="right", no_wrap=True),
            Column("shard", width=5, overflow="fold"),
            Column("what", width=22, overflow="fold"),
            Column("why / detail", overflow="fold"),
            box=box.SIMPLE_HEAD,
            show_header=header,
            show_edge=False,
            pad_edge=False,
        )

    def header(self) -> None:
        self._print(self._table(header=True))

    def _print(self, table: Table) -> None:
        if self.console.is_terminal:
            self.console.print(table)
            return
        # Off a terminal there are no colours to keep, and the padding rich adds to the
        # last column would leave trailing blanks on every line of a file.
        with self.console.capture() as captured:
            self.console.print(table)
        self.console.file.write(
            "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
        )

    def rows(self, entries: Iterable[Entry], *, header: bool = False) -> None:
        table = self._table(header)
        count = 0
        for entry in entries:
            shard, what, detail, style = describe(entry, self.config)
            # Text, not markup: rules and reasons come from the log and may hold brackets.
            cells = (_time(entry.at_us), str(entry.seq), shard, what, detail)
            table.add_row(*(Text(cell) for cell in cells), style=style)
            count += 1
            if count == TABLE_CHUNK:
                self._print(table)
                table, count = self._table(False), 0
        if count or header:
            self._print(table)


def write_json_lines(entries: Iterable[Entry], stream: TextIO) -> None:
    write = stream.write
    dumps = json.dumps
    for entry in entries:
        write(dumps(entry.as_dict(), ensure_ascii=False) + "\n")


class FoldProgress:
    """A transient progress bar on stderr for a fold long enough to wonder about.

    It appears only once ``delay_s`` has passed, and only when stderr is a terminal: a
    pipe or a log file gets no bar, and stdout never does (it carries the answer).
    """

    def __init__(self, label: str, *, delay_s: float | None = None) -> None:
        self.label = label
        self.delay_s = PROGRESS_DELAY_S if delay_s is None else delay_s
        self.console = Console(stderr=True)
        self._began = time.monotonic()
        self._progress: Progress | None = None
        self._task: int | None = None

    def update(self, done: int, total: int) -> None:
        if self._progress is None:
            if not self.console.is_terminal or time.monotonic() - self._began < self.delay_s:
                return
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),  # run ids are not markup
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("events"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._task = self._progress.add_task(self.label, total=total)
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> FoldProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@contextmanager
def stdout_may_close() -> Iterator[None]:
    """``replay … | head`` closes the pipe early: stop quietly, like other filters do.

    Without this the broken pipe would be reported as an error (and Python would
    complain again when it flushes stdout at exit).
    """
    try:
        yield
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (captured by a test runner)
            pass
        raise typer.Exit(code=1) from None


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
    if to_seq is not None and until is not None:
        raise CommandLineError("give --to SEQ or --until TIME, not both")
    with open_log(db) as log:
        last = to_seq if until is None else log.seq_at(run, parse_time(until, "--until"))
        config = log.config(run)
        if shard is not None:
            count = config.shard_count
            if not 0 <= shard < count:
                raise CommandLineError(f"--shard {shard}: run {run!r} has shards 0..{count - 1}")
        with FoldProgress(f"replaying {run}") as progress:
            entries = list(
                read_history(
                    log,
                    run,
                    from_seq=1 if from_seq is None else from_seq,
                    to_seq=last,
                    on_page=progress.update,
                )
            )
    if shard is not None:
        entries = [e for e in entries if shard in e.shards or isinstance(e, EndEntry)]
    with stdout_may_close():
        if as_json:
            write_json_lines(entries, sys.stdout)
            sys.stdout.flush()
            return
        console = stdout_console()
        if not entries:
            console.print(Text(f"run {run}: no history entries in this range"))
            return
        first, final = entries[0], entries[-1]
        console.print(
            Text(
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
    if not interval > 0:
        raise CommandLineError(f"--interval {interval}: give a positive number of seconds")
    try:
        with open_log(db) as log, stdout_may_close():
            follower = Follower(log, run)
            view = follower.history.view
            # Status on stderr: stdout carries only entries (JSON lines stay clean).
            typer.echo(
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
                    write_json_lines((entry,), sys.stdout)
                else:
                    table.rows((entry,))
                sys.stdout.flush()  # a watcher reads lines as they come, not per buffer
    except KeyboardInterrupt:
        typer.echo("", err=True)
        raise typer.Exit(code=130) from None
