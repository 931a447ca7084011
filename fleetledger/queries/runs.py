"""The runs of a ledger as one document: what ``runs --json`` prints and the HTTP API
serves (``GET /api/v1/runs``).

How each run ended is its last event, read by seq (one primary-key read per ended
run), so listing a ledger of many long runs costs one read per run, not a fold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetledger.events.models import RunEnded, iso_at
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunSummary


@dataclass(frozen=True, slots=True)
class RunListing:
    """One run as listed: its summary and, once it ended, its ``run_ended``."""

    summary: RunSummary
    end: RunEnded | None

    def as_json(self) -> dict[str, Any]:
        s, end = self.summary, self.end
        return {
            "run": s.run_id,
            "events": s.head_seq,
            "started": iso_at(s.started_at_us),
            "last_event": iso_at(s.last_at_us),
            "ended": s.ended,
            "outcome": None if end is None else end.outcome,
            "cause": None if end is None else end.cause,
        }


def list_runs(log: EventLog) -> list[RunListing]:
    """Every run of the ledger, oldest first, each with how it ended (if it did)."""
    listed = []
    for s in log.runs():
        end = None
        if s.ended:  # its last event, by seq: one primary-key read
            last = next(iter(log.read(s.run_id, s.head_seq - 1, s.head_seq)), None)
            if last is not None and isinstance(last.event, RunEnded):
                end = last.event
        listed.append(RunListing(s, end))
    return listed
