"""The reads behind an explanation: the view, the history, and the events it cites.

The words are ``projections.explain``'s (pure); this module does the I/O they need:
the view at ``at`` (nearest snapshot + tail, the same answer ``membership --at``
gives), the history of the same events in one read (counting probes on the way, for a
reported streak's span), and the few events the explanation cites, read by seq.
"""

from __future__ import annotations

from collections.abc import Iterable

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
from fleetledger.projections.fault_cost import FaultCost, FaultCosts
from fleetledger.projections.history import Entry, History
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunHead


def _contiguous(seqs: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted seqs as inclusive ranges, so neighbouring evidence is one read."""
    ranges: list[tuple[int, int]] = []
    for seq in sorted(set(seqs)):
        if ranges and seq == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges


def _history_of(
    log: EventLog, run: str, to_seq: int, tallies: ProbeTallies, costs: FaultCosts
) -> tuple[list[Entry], tuple[FaultCost, ...]]:
    """``replay`` of the run up to ``to_seq`` a page at a time (``History.feed_page``),
    counting probes and what each fault cost on the way; a replay never reads event ids
    (``ids=False``)."""
    history: History | None = None
    entries: list[Entry] = []
    for page in log.read_pages(run, 0, to_seq, ids=False):
        page = list(tallies.watch(page))
        if history is None:
            history, first = History.start(page[0], costs.observe)
            entries += first
            page = page[1:]
        entries += history.feed_page(page)
    if history is None:
        return entries, ()
    faults = costs.finish(history.view)
    if history.view.ended is None:
        entries += history.finish()
    return entries, faults


def read_evidence(log: EventLog, run: str, seqs: Iterable[int]) -> dict[int, RecordedEvent]:
    """The events at ``seqs`` of ``run``, by seq."""
    found: dict[int, RecordedEvent] = {}
    for first, last in _contiguous(seqs):
        for recorded in log.read(run, first - 1, last):
            found[recorded.seq] = recorded
    return found


def explain_from_log(
    log: EventLog,
    run: str,
    shard: int | None = None,
    at: int | None = None,
    *,
    head: RunHead | None = None,
) -> ShardExplanation | RunExplanation:
    """Fold, replay and read the evidence for one explanation of ``run`` as of ``at``."""
    view = load_view(log, run, at, head=head)
    if shard is not None:
        check_shard(view, shard)  # before the replay: a typo should not cost a full fold
    # One pass: the history, and the probe counts a reported streak's explanation cites.
    tallies = ProbeTallies()
    entries, faults = _history_of(log, run, view.seq, tallies, FaultCosts())
    wanted = evidence_needed(view, entries, shard)
    evidence = read_evidence(log, run, wanted.to_read)
    if shard is None:
        return explain_run(view, entries, evidence, faults)
    tally = None if wanted.span is None else tallies.span(shard, *wanted.span)
    return explain_shard(view, entries, shard, evidence, tally)
