"""Old logs stay readable: stored rows keep their version, upcasters lift them on read.

No event type has a second version yet, so these tests give ``probe_failed`` a
hypothetical version 2 (a new required field) through a codec built for the test — the
same registry mechanism a real version bump uses.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import Field
from sqlalchemy import text

from fleetledger.events.codec import UPCASTERS, EventCodec
from fleetledger.events.errors import EventDecodeError
from fleetledger.events.log import EventLog
from fleetledger.events.models import EVENT_TYPES, ProbeFailed, ProbeSucceeded
from tests.builders import run_started


class ProbeFailedV2(ProbeFailed):
    """probe_failed as a later fleetledger might store it: with the probe's attempt."""

    SCHEMA_VERSION: ClassVar[int] = 2
    attempt: int = Field(ge=1)


def _v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "attempt": 1}  # version 1 probes were never retried


V2_TYPES = {**EVENT_TYPES, "probe_failed": ProbeFailedV2}


def _stored_versions(log: EventLog, run: str) -> list[tuple[int, str, int]]:
    with log.database.engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text(
                    "SELECT seq, type, schema_version FROM fleetledger_events "
                    "WHERE run_id = :run ORDER BY seq"
                ),
                {"run": run},
            )
        ]


def test_an_old_version_is_lifted_on_read_and_the_stored_row_keeps_its_version(ledger_url):
    with EventLog.open(ledger_url) as old:
        old.append("r", [run_started(), ProbeFailed(shard=1, kind="timeout", error="2 s")])
    newer = EventCodec(V2_TYPES, {**UPCASTERS, ("probe_failed", 1): _v1_to_v2})
    with EventLog.open(ledger_url, codec=newer) as log:
        events = [r.event for r in log.read("r")]
        assert isinstance(events[1], ProbeFailedV2)
        assert (events[1].shard, events[1].error, events[1].attempt) == (1, "2 s", 1)
        assert _stored_versions(log, "r")[1] == (2, "probe_failed", 1)
        # New appends are stored at the new version, next to the old row.
        log.append("r", [ProbeFailedV2(shard=0, kind="error", attempt=3)])
        assert _stored_versions(log, "r")[2] == (3, "probe_failed", 2)
        assert [r.event.attempt for r in log.read("r", 1)] == [1, 3]


def test_a_missing_upcaster_is_an_error_naming_the_run_and_seq(ledger_url):
    with EventLog.open(ledger_url) as old:
        old.append(
            "r", [run_started(), ProbeSucceeded(shard=0), ProbeFailed(shard=2, kind="error")]
        )
    with EventLog.open(ledger_url, codec=EventCodec(V2_TYPES, UPCASTERS)) as log:
        with pytest.raises(EventDecodeError) as caught:
            list(log.read("r"))
    assert (caught.value.run, caught.value.seq) == ("r", 3)
    assert "no upcaster lifts 'probe_failed' from schema version 1 to 2" in str(caught.value)


def test_a_version_newer_than_this_code_reads_is_refused_not_skipped(ledger_url):
    newer = EventCodec(V2_TYPES, {**UPCASTERS, ("probe_failed", 1): _v1_to_v2})
    with EventLog.open(ledger_url, codec=newer) as log:
        log.append("r", [run_started(), ProbeFailedV2(shard=0, kind="timeout", attempt=2)])
    with EventLog.open(ledger_url) as today:
        with pytest.raises(EventDecodeError, match="schema version 2, newer than the 1") as caught:
            list(today.read("r"))
    assert caught.value.seq == 2
