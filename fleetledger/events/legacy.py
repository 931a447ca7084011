"""Version 1 of the probe record, kept only to lift old rows to the round they mean.

Rules of this module:

- Before schema version 2 a probe round was stored as one event per shard:
  ``probe_succeeded`` and ``probe_failed`` (and ``actor_death_confirmed``, still a
  current type: the ledger records a death seen outside a probe with it). Version 2 of
  the probe record is the round (:class:`~fleetledger.events.models.ProbeRound`); a
  per-shard v1 row means a round of that one shard, at the row's seq.
- Nothing here is in the live vocabulary (``EVENT_TYPES``): no code appends these, no
  fold has a rule for them. The upcasters below are their only reader, registered in
  :data:`fleetledger.events.codec.UPCASTERS`, so the fold takes a probe result one way.
- Each upcaster validates the v1 payload whole before it lifts it, with the model the
  v1 type had, so a bad old row or import line is refused with the same one-line
  error as when the type was current ("invalid 'probe_succeeded' event: shard: Field
  required", from the codec, naming run and seq). The models here never change: a v1
  row is what it was when it was written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetledger.events.ids import new_event_id
from fleetledger.events.models import MAX_TEXT, ShardIndex


class _LegacyRecord(BaseModel):
    """The fields every v1 event had, as :class:`~fleetledger.events.models.Event` had them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_event_id, min_length=1, max_length=64)


class ProbeSucceededV1(_LegacyRecord):
    """``probe_succeeded`` v1: one shard answered its probe."""

    type: Literal["probe_succeeded"] = "probe_succeeded"
    shard: ShardIndex


class ProbeFailedV1(_LegacyRecord):
    """``probe_failed`` v1: one shard's probe timed out or failed."""

    type: Literal["probe_failed"] = "probe_failed"
    shard: ShardIndex
    kind: Literal["timeout", "error"]
    error: str = Field(default="", max_length=MAX_TEXT)


def probe_succeeded_to_round(payload: dict[str, Any]) -> dict[str, Any]:
    """``probe_succeeded`` v1 → ``probe_round`` v2: a round in which that shard answered."""
    old = ProbeSucceededV1.model_validate(payload)
    return {"id": old.id, "type": "probe_round", "ok": [old.shard]}


def probe_failed_to_round(payload: dict[str, Any]) -> dict[str, Any]:
    """``probe_failed`` v1 → ``probe_round`` v2: a round in which that shard's probe failed."""
    old = ProbeFailedV1.model_validate(payload)
    failure = {"shard": old.shard, "kind": old.kind, "error": old.error}
    return {"id": old.id, "type": "probe_round", "failed": [failure]}


# (v1 type, 1) → its lift to the round; the codec's registry includes these.
PROBE_V1_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("probe_succeeded", 1): probe_succeeded_to_round,
    ("probe_failed", 1): probe_failed_to_round,
}

# The v1 models by type: what a v1 row of each held (tests write old rows with them).
LEGACY_TYPES: dict[str, type[_LegacyRecord]] = {
    "probe_succeeded": ProbeSucceededV1,
    "probe_failed": ProbeFailedV1,
}
