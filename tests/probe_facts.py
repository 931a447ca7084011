"""What a run's log says about each shard's probes and deaths, whatever their shape.

Probe results are recorded as one ``probe_round`` per round (schema version 2); a death
seen outside a probe is an ``actor_death_confirmed``. (Older logs' per-shard v1 probe
rows are read as one-shard rounds, so they come out here the same way.) Tests that ask
"which probe results, and which deaths, were recorded" read them through
:func:`shard_facts`, so they pin the facts, not the event shape.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetledger.events.models import RecordedEvent


@dataclass(frozen=True, slots=True)
class ShardFact:
    seq: int
    shard: int
    kind: str  # ok | failed | died (probes and deaths); else the event's own type
    error: str = ""  # the cause's one line
    event_type: str = ""
    raw: str = ""  # what was said, whole (the cause's raw text; older rows: ``error``)


def _raw(said: object) -> str:
    cause = getattr(said, "cause", None)
    return cause.raw if cause is not None else str(getattr(said, "error", ""))


def shard_facts(records: Iterable[RecordedEvent]) -> list[ShardFact]:
    facts = []
    for r in records:
        event = r.event
        if event.type == "probe_round":
            facts += [ShardFact(r.seq, s, "ok", "", event.type) for s in event.ok]
            facts += [
                ShardFact(r.seq, f.shard, "failed", f.error, event.type, _raw(f))
                for f in event.failed
            ]
            facts += [
                ShardFact(r.seq, d.shard, "died", d.error, event.type, _raw(d)) for d in event.died
            ]
        elif event.type == "actor_death_confirmed":
            facts.append(
                ShardFact(r.seq, event.shard, "died", event.error, event.type, _raw(event))
            )
        elif isinstance(getattr(event, "shard", None), int):
            facts.append(ShardFact(r.seq, event.shard, event.type, "", event.type))
    return facts


def deaths(records: Iterable[RecordedEvent], shard: int | None = None) -> list[ShardFact]:
    return [f for f in shard_facts(records) if f.kind == "died" and shard in (None, f.shard)]


def probes(records: Iterable[RecordedEvent]) -> list[ShardFact]:
    return [f for f in shard_facts(records) if f.kind in ("ok", "failed")]
