"""Command: ``fleetledger explain RUN [SHARD] [--at SEQ|TIME]``.

The words are ``projections.explain``'s and the reads ``queries``'; this prints them.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

from typing import TYPE_CHECKING, Annotated

import typer

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log
from fleetledger.cli.output import CommandLineError, data_row, print_json, say
from fleetledger.cli.paused_gc import paused_gc

if TYPE_CHECKING:  # loaded only when the command runs (cli.app: start-up stays light)
    from fleetledger.projections.explain import RunExplanation


@app.command()
@cli_errors
def explain(
    run: Annotated[str, typer.Argument(help="Run id (see `fleetledger runs`).")],
    shard: Annotated[
        int | None,
        typer.Argument(help="Explain this shard's state; without it, explain the run."),
    ] = None,
    at: Annotated[
        str | None,
        typer.Option("--at", metavar="SEQ|TIME", help="Explain as of this seq or ISO 8601 time."),
    ] = None,
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Also print each cited cause as it was said (Ray's, vLLM's, gloo's own text).",
        ),
    ] = False,
    cost: Annotated[
        bool,
        typer.Option(
            "--cost",
            help="What each fault cost, as a table: rollouts in flight and their fates, "
            "shard-seconds out of service, detection and re-admission times.",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a shard is in its state, or why the run ended / where its progress stopped."""
    from fleetledger.projections.explain import RunExplanation
    from fleetledger.queries import RunReader  # imported when the command runs (cli.app)

    if cost and shard is not None:
        raise CommandLineError(
            f"--cost is what the faults of run {run!r} cost: give the run without a shard"
        )
    with open_log(db, mode="read") as log, paused_gc():
        reader = RunReader(log, run)
        explanation = reader.explain(shard, reader.seq_of(at, "--at"))
    if cost and isinstance(explanation, RunExplanation):
        if as_json:
            print_json([f.as_json() for f in explanation.faults])
        else:
            render_costs(explanation)
    elif as_json:
        print_json(explanation.as_json())
    else:
        # Error texts and reasons are free text ("[rank0] …", ESC …): never markup, every
        # control escaped but the line breaks the explanation's lines are joined with (a
        # newline inside an error text cannot be told from them, so it starts a line too).
        say(explanation.raw_text if raw else explanation.text, keep_newlines=True)


def _known(value: object, unit: str = "") -> str:
    """A cell: the value, or ``unknown`` where the ledger cannot say."""
    if value is None:
        return "unknown" if unit != "readmit" else "never"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def render_costs(explanation: "RunExplanation") -> None:
    from rich.table import Table  # a table is printed: only then is rich loaded (not --json)

    faults = explanation.faults
    say(f"run {explanation.run}: {len(faults)} faults, as of seq {explanation.seq}")
    if not faults:
        return
    table = Table(
        "seq", "fault", "shards", "detect s", "readmit s", "out shard-s",
        "in flight", "re-disp.", "dropped", "ended run", "partial", "stale", "unattested",
    )  # fmt: skip
    for f in faults:
        data_row(
            table,
            f.seq,
            f.kind.replace("_", " "),
            " ".join(str(s) for s in f.shards) or "-",
            _known(f.detection_s),
            _known(f.readmitted_s, "readmit") if f.kind != "stall" else "-",
            f"{f.out_of_service_s:.1f}",
            _known(f.in_flight) if f.in_flight is not None else f"≥{f.failures_seen}?",
            _known(f.redispatched),
            _known(f.dropped),
            _known(f.ended_run),
            f.partial_served,
            f.stale_served,
            f.unattested,
        )
    say(table)
    say(
        "unknown: the adapters' windows did not say (older rows, a foreign adapter); "
        "≥N?: N attempts failed on the shard, their fate unknown"
    )
