"""Old logs stay readable: stored rows keep their type and version, upcasters lift them.

The production registry holds one real lift: version 1 of the probe record (one
``probe_succeeded`` / ``probe_failed`` row per shard) to version 2, the ``probe_round``
— a change of type. These tests store real v1 rows (as an older fleetledger's append
left them) and read them through every path a read takes, then pin each error of the
chain: a future version of a lifted type, a missing link, an unknown type, an invalid
v1 payload, an upcaster whose output is not valid for its target. A hypothetical
version 2 of ``restart_requested`` (a new required field, given through a codec built
for the test) covers the same-type lift a plain version bump uses.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
from pydantic import Field
from sqlalchemy import text

from fleetledger.events.codec import UPCASTERS, EventCodec
from fleetledger.events.errors import EventDecodeError
from fleetledger.events.legacy import ProbeFailedV1, ProbeSucceededV1
from fleetledger.events.models import (
    EVENT_TYPES,
    ProbeFailure,
    ProbeRound,
    RestartRequested,
)
from fleetledger.store.log import EventLog
from tests.builders import probe_ok, run_started
from tests.legacy_rows import insert_old_rows, probe_failed_v1, probe_ok_v1, stored_form


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


def _decode_error(codec: EventCodec, type_: str, version: int, payload: Any) -> EventDecodeError:
    with pytest.raises(EventDecodeError) as caught:
        codec.decode("r", 7, type_, version, payload)
    assert (caught.value.run, caught.value.seq) == ("r", 7)
    return caught.value


# ── the production registry: v1 per-shard probes become rounds ─────────────────


def test_the_registry_lifts_the_v1_probe_types_and_nothing_current() -> None:
    assert set(UPCASTERS) == {("probe_succeeded", 1), ("probe_failed", 1)}
    assert not {"probe_succeeded", "probe_failed"} & set(EVENT_TYPES)
    # A death seen outside a probe is still recorded as its own event: not lifted.
    assert "actor_death_confirmed" in EVENT_TYPES
    assert EVENT_TYPES["probe_round"].SCHEMA_VERSION == 2


def test_v1_probe_rows_read_as_one_shard_rounds_and_stay_stored_as_they_were(
    ledger_url: str,
) -> None:
    old = [
        run_started(),
        probe_ok_v1(1),
        probe_failed_v1(2, "timeout", "no answer in 2 s"),
        probe_ok_v1(1),  # a repeated payload: the read's cache of decoded payloads
    ]
    with EventLog.open(ledger_url) as log:
        insert_old_rows(log.database.engine, "r", old)
        expected = [
            ProbeRound(id=old[1].id, ok=(1,)),
            ProbeRound(
                id=old[2].id,
                failed=(ProbeFailure(shard=2, kind="timeout", error="no answer in 2 s"),),
            ),
            ProbeRound(id=old[3].id, ok=(1,)),
        ]
        assert [r.event for r in log.read("r")][1:] == expected
        by_page = [r.event for page in log.read_pages("r") for r in page]
        assert by_page[1:] == expected
        # A fold's read leaves ids out, and must lift all the same.
        contents = [r.event for page in log.read_pages("r", ids=False) for r in page]
        assert contents[1:] == [e.model_copy(update={"id": ""}) for e in expected]
        # Nothing stored was rewritten; the run goes on with rounds after the v1 rows.
        assert log.append("r", [probe_ok(0)]) == [5]
        assert _stored_versions(log, "r") == [
            (1, "run_started", 1),
            (2, "probe_succeeded", 1),
            (3, "probe_failed", 1),
            (4, "probe_succeeded", 1),
            (5, "probe_round", 2),
        ]
        stored = [row[3:] for page in log.read_stored("r", 0, 4) for row in page]
        assert stored == [stored_form(item) for item in old]


def test_a_v1_row_and_the_round_it_is_read_as_are_the_same_event() -> None:
    codec = EventCodec()
    old = probe_failed_v1(0, "error", "HTTP 503")
    type_, version, payload = stored_form(old)
    same = ProbeRound(id=old.id, failed=(ProbeFailure(shard=0, kind="error", error="HTTP 503"),))
    assert codec.difference("r", 2, type_, version, payload, same) is None
    other = ProbeRound(id=old.id, ok=(0,))
    assert codec.difference("r", 2, type_, version, payload, other) == (
        "a 'probe_failed' event (read as 'probe_round') with other failed, ok"
    )
    restart = RestartRequested(id=old.id, shard=0)
    assert codec.difference("r", 2, type_, version, payload, restart) == (
        "a 'probe_failed' event, not 'restart_requested'"
    )


def test_a_future_version_of_a_lifted_type_is_refused_not_skipped(ledger_url: str) -> None:
    with EventLog.open(ledger_url) as log:
        insert_old_rows(log.database.engine, "r", [run_started(), probe_ok_v1(0)])
        with log.database.engine.begin() as conn:
            conn.execute(text("UPDATE fleetledger_events SET schema_version = 2 WHERE seq = 2"))
        with pytest.raises(EventDecodeError) as caught:
            list(log.read("r"))
    assert (caught.value.run, caught.value.seq) == ("r", 2)
    assert "event type 'probe_succeeded' has schema version 2, newer than the 1" in str(
        caught.value
    )


def test_an_unknown_type_is_neither_a_model_nor_a_lifted_type() -> None:
    problem = _decode_error(EventCodec(), "shard_teleported", 1, {"id": "x"}).problem
    assert problem.startswith("unknown event type 'shard_teleported'; this fleetledger knows ")
    assert "(and reads the older probe_failed, probe_succeeded)" in problem
    # Without its upcasters a v1 probe type is unknown too: nothing reads it.
    alone = EventCodec(EVENT_TYPES, {})
    assert (
        "unknown event type 'probe_failed'" in _decode_error(alone, "probe_failed", 1, {}).problem
    )


@pytest.mark.parametrize(
    ("type_", "payload", "problem"),
    [
        ("probe_succeeded", {"id": "x"}, "invalid 'probe_succeeded' event: shard: Field required"),
        (
            "probe_failed",
            {"id": "x", "shard": 1, "kind": "lost"},
            "invalid 'probe_failed' event: kind: Input should be 'timeout' or 'error'",
        ),
        (
            "probe_succeeded",
            {"id": "x", "shard": 1, "attempt": 2},
            "invalid 'probe_succeeded' event: attempt: Extra inputs are not permitted",
        ),
        (
            "probe_succeeded",
            {"id": "x", "type": "probe_round", "ok": [1]},
            "payload says type 'probe_round' but the row says 'probe_succeeded'",
        ),
    ],
    ids=["missing_field", "bad_kind", "extra_field", "type_mismatch"],
)
def test_an_invalid_v1_payload_is_refused_as_the_v1_type_it_claims(
    type_: str, payload: dict[str, Any], problem: str
) -> None:
    assert _decode_error(EventCodec(), type_, 1, payload).problem == problem


def test_a_missing_link_in_a_chain_is_named() -> None:
    """A registry that reads probe_failed v2 but not v1: a v1 row has no way up."""
    registry = {("probe_failed", 2): UPCASTERS[("probe_failed", 1)]}
    codec = EventCodec(EVENT_TYPES, registry)
    error = _decode_error(codec, "probe_failed", 1, {"id": "x", "shard": 0, "kind": "error"})
    assert error.problem == "no upcaster lifts 'probe_failed' from schema version 1 to 2"


def test_an_upcaster_whose_output_is_not_valid_for_its_target_is_named() -> None:
    def empty_round(payload: dict[str, Any]) -> dict[str, Any]:
        ProbeSucceededV1.model_validate(payload)
        return {"id": payload["id"], "type": "probe_round"}  # no result in it

    def past_the_model(payload: dict[str, Any]) -> dict[str, Any]:
        ProbeFailedV1.model_validate(payload)
        return {"id": payload["id"], "type": "restart_requested", "shard": payload["shard"]}

    registry = {("probe_succeeded", 1): empty_round, ("probe_failed", 1): past_the_model}
    codec = EventCodec(EVENT_TYPES, registry)
    invalid = _decode_error(codec, "probe_succeeded", 1, {"id": "x", "shard": 0}).problem
    assert invalid.startswith("invalid 'probe_round' event (lifted from 'probe_succeeded' v1): ")
    assert "at least one shard's result" in invalid
    beyond = _decode_error(codec, "probe_failed", 1, {"id": "x", "shard": 0, "kind": "error"})
    assert beyond.problem == (
        "the upcaster of 'probe_failed' v1 made a 'restart_requested' event at schema "
        "version 2, newer than the 1 this fleetledger reads"
    )


# ── a hypothetical version bump of a current type (same type, new field) ─────────


class RestartRequestedV2(RestartRequested):
    """restart_requested as a later fleetledger might store it: with the attempt's cause."""

    SCHEMA_VERSION: ClassVar[int] = 2
    cause: str = Field(min_length=1)


def _v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "cause": "unrecorded"}  # version 1 never said why


V2_TYPES = {**EVENT_TYPES, "restart_requested": RestartRequestedV2}
V2_UPCASTERS = {**UPCASTERS, ("restart_requested", 1): _v1_to_v2}


def test_an_old_version_is_lifted_on_read_and_the_stored_row_keeps_its_version(
    ledger_url: str,
) -> None:
    with EventLog.open(ledger_url) as old:
        old.append("r", [run_started(), RestartRequested(shard=1)])
    with EventLog.open(ledger_url, codec=EventCodec(V2_TYPES, V2_UPCASTERS)) as log:
        events = [r.event for r in log.read("r")]
        assert isinstance(events[1], RestartRequestedV2)
        assert (events[1].shard, events[1].cause) == (1, "unrecorded")
        assert _stored_versions(log, "r")[1] == (2, "restart_requested", 1)
        # New appends are stored at the new version, next to the old row.
        log.append("r", [RestartRequestedV2(shard=0, cause="probe streak")])
        assert _stored_versions(log, "r")[2] == (3, "restart_requested", 2)
        assert [r.event.cause for r in log.read("r", 1)] == ["unrecorded", "probe streak"]


def test_a_missing_upcaster_of_a_current_type_is_an_error_naming_the_run_and_seq(
    ledger_url: str,
) -> None:
    with EventLog.open(ledger_url) as old:
        old.append("r", [run_started(), probe_ok(0), RestartRequested(shard=2)])
    with EventLog.open(ledger_url, codec=EventCodec(V2_TYPES, UPCASTERS)) as log:
        with pytest.raises(EventDecodeError) as caught:
            list(log.read("r"))
    assert (caught.value.run, caught.value.seq) == ("r", 3)
    assert "no upcaster lifts 'restart_requested' from schema version 1 to 2" in str(caught.value)


def test_a_version_newer_than_this_code_reads_is_refused_not_skipped(ledger_url: str) -> None:
    with EventLog.open(ledger_url, codec=EventCodec(V2_TYPES, V2_UPCASTERS)) as log:
        log.append("r", [run_started(), RestartRequestedV2(shard=0, cause="operator")])
    with EventLog.open(ledger_url) as today:
        with pytest.raises(EventDecodeError, match="schema version 2, newer than the 1") as caught:
            list(today.read("r"))
    assert caught.value.seq == 2
