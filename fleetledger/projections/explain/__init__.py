"""Explanations: why a shard is in its state, and why a run ended or where it stopped.

The ledger already holds every answer to "why did my run die"; this package puts them in
words. From a folded view (a ``FleetView`` at some seq), the history entries of the same
events (``projections.history``) and the events an explanation cites, it builds:

- ``ShardExplanation`` (``shard``): the causal chain that put one shard in its state:
  the rule that fired, the evidence it fired on (seqs, and what each event said), the
  earlier transitions, restart attempts against the budget, weight version, membership
  and the rank layout the transports would build.
- ``RunExplanation`` (``run``): how the run ended (the recorded cause, and the facts
  before it that end runs) or, for a run that has not ended, where progress stopped and
  which refit was open; and every shard that is not HEALTHY, with its reason.

The modules, in the order they build on each other: ``words`` (what one event says, and
the shared phrases), ``evidence`` (what the caller must read), ``fleet`` (the layout,
the open refit and the start both explanations end with), ``because`` (the sentences
per input of a shard's last transition), ``shard`` and ``run``.

Rules of this package:

- Pure, like every projection: no I/O, no clock, no randomness; it imports only
  ``fleetledger.events`` and ``fleetledger.projections``. The caller asks
  ``evidence_needed`` which events to read, reads them, and passes them in; so
  explaining the same events always prints the same words, wherever they are read.
- Every sentence is a fact the ledger holds or a rule of the fold (``shard_states``),
  never a guess. When an event the explanation wants was not supplied, it says so.
- Each explanation has ``.text`` for people and ``.as_json()`` (``json_form``) for
  ``--json``.
"""

from fleetledger.projections.explain.because import BECAUSE
from fleetledger.projections.explain.evidence import (
    Cited,
    EvidenceRequest,
    ProbeTallies,
    SpanTally,
    check_shard,
    evidence_needed,
    tally_span,
)
from fleetledger.projections.explain.fleet import LayoutSummary
from fleetledger.projections.explain.run import (
    FINDINGS,
    Finding,
    ProgressSummary,
    RunExplanation,
    ShardLine,
    explain_run,
)
from fleetledger.projections.explain.shard import ShardExplanation, explain_shard
from fleetledger.projections.explain.words import EVENT_WORDS, TEXT_LIMIT, describe_event

__all__ = [
    "BECAUSE",
    "EVENT_WORDS",
    "FINDINGS",
    "TEXT_LIMIT",
    "Cited",
    "EvidenceRequest",
    "Finding",
    "LayoutSummary",
    "ProbeTallies",
    "ProgressSummary",
    "RunExplanation",
    "ShardExplanation",
    "ShardLine",
    "SpanTally",
    "check_shard",
    "describe_event",
    "evidence_needed",
    "explain_run",
    "explain_shard",
    "tally_span",
]
