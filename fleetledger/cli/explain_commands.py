"""Command: ``fleetledger explain RUN [SHARD] [--at SEQ|TIME]`` (issue 3, forensics).

The words come from ``projections.explain`` (pure); this module does the I/O it needs:
the view at ``--at`` (nearest snapshot + tail, the same answer ``membership --at``
gives), the history of the same events in one read (counting probes on the way, for a
reported streak's span), and the few events the explanation cites, read by seq.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

import typer

from fleetledger.cli.app import DbOption, JsonOption, app, cli_errors, open_log, out, print_json
from fleetledger.cli.replay_commands import seq_for
from fleetledger.controller.ledger import load_view
from fleetledger.events.log import EventLog
from fleetledger.events.models import RecordedEvent
from fleetledger.projections.explain import (
    ProbeTallies,
    RunExplanation,
    ShardExplanation,
    check_shard,
    evidence_needed,
    explain_run,
    explain_shard,
)
from fleetledger.projections.history import replay


def _contiguous(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted seqs as inclusive ranges, so neighbouring evidence is one read."""
    ranges: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def read_evidence(log: EventLog, run: str, seqs: Iterable[int]) -> dict[int, RecordedEvent]:
    """The events at ``seqs`` of ``run``, by seq."""
    found: dict[int, RecordedEvent] = {}
    for first, last in _contiguous(seqs):
        for recorded in log.read(run, first - 1, last):
            found[recorded.seq] = recorded
    return found


def explain_from_log(
    log: EventLog, run: str, shard: int | None = None, at: int | None = None
) -> ShardExplanation | RunExplanation:
    """Fold, replay and read the evidence for one explanation of ``run`` as of ``at``."""
    view = load_view(log, run, at)
    if shard is not None:
        check_shard(view, shard)  # before the replay: a typo should not cost a full fold
    # One pass: the history, and the probe counts a reported streak's explanation cites.
    tallies = ProbeTallies()
    entries = list(replay(tallies.watch(log.read(run, 0, view.seq))))
    wanted = evidence_needed(view, entries, shard)
    evidence = read_evidence(log, run, wanted.seqs)
    if shard is None:
        return explain_run(view, entries, evidence)
    tally = None if wanted.span is None else tallies.span(shard, *wanted.span)
    return explain_shard(view, entries, shard, evidence, tally)


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
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Why a shard is in its state, or why the run ended / where its progress stopped."""
    with open_log(db) as log:
        seq = None if at is None else seq_for(log, run, at, "--at")
        explanation = explain_from_log(log, run, shard, seq)
    if as_json:
        print_json(explanation.as_dict())
    else:
        # Error texts and reasons are free text ("[rank0] …"): never read them as markup.
        out.print(explanation.text, markup=False)
