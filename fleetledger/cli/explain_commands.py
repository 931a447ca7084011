"""Command: ``fleetledger explain RUN [SHARD] [--at SEQ|TIME]``.

The words are ``projections.explain``'s and the reads ``queries``'; this prints them.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

from typing import Annotated

import typer

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log
from fleetledger.cli.output import print_json, say
from fleetledger.cli.paused_gc import paused_gc


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
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a shard is in its state, or why the run ended / where its progress stopped."""
    from fleetledger.queries import RunReader  # imported when the command runs (cli.app)

    with open_log(db, mode="read") as log, paused_gc():
        reader = RunReader(log, run)
        explanation = reader.explain(shard, reader.seq_of(at, "--at"))
    if as_json:
        print_json(explanation.as_json())
    else:
        # Error texts and reasons are free text ("[rank0] …", ESC …): never markup, every
        # control escaped but the line breaks the explanation's lines are joined with (a
        # newline inside an error text cannot be told from them, so it starts a line too).
        say(explanation.raw_text if raw else explanation.text, keep_newlines=True)
