"""What the log hands out besides events: run summaries and heads; and the run-id rule.

Plain frozen records, so a read command can hold a run's head and pass it down without
holding a connection. (What an import hands the log is the export format's own row,
``events.jsonl.ImportRow``.)
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetledger.events.models import FleetConfig
from fleetledger.store.errors import AppendRejected

MAX_RUN_ID_LENGTH = 128


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    head_seq: int
    started_at_us: int
    last_at_us: int
    ended: bool


@dataclass(frozen=True, slots=True)
class RunHead:
    """What a read command needs to know of a run before it reads: its last event and
    its configuration, looked up together, once."""

    run: str
    seq: int
    at_us: int
    ended: bool
    config: FleetConfig


def check_run_id(run: str) -> None:
    if not isinstance(run, str) or not run or len(run) > MAX_RUN_ID_LENGTH or not run.isprintable():
        raise AppendRejected(
            str(run), f"a run id must be 1..{MAX_RUN_ID_LENGTH} printable characters"
        )
