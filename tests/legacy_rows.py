"""Histories as older fleetledgers stored them: per-shard probe events at schema version 1.

Before the probe round (``probe_round``, schema version 2), a round was one
``probe_succeeded`` / ``probe_failed`` v1 row per shard. Today's vocabulary has no model
for them, and the codec reads each as a one-shard round through its upcasters; a test
that needs such a history writes real v1 rows — the payload the v1 model held — either
through an import of an old export (:func:`import_old_run`, what an operator does with
an old file) or as rows inserted into the events table (:func:`insert_old_rows`, what an
old fleetledger's append left behind).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, insert, select

from fleetledger.events.codec import EventCodec
from fleetledger.events.jsonl import ExportChecker
from fleetledger.events.legacy import ProbeFailedV1, ProbeSucceededV1
from fleetledger.events.models import Event, iso_at
from fleetledger.store.log import EventLog
from fleetledger.store.schema import events, runs

OldEvent = ProbeSucceededV1 | ProbeFailedV1
Item = Event | OldEvent
"""What an old ledger held: a current event, or a v1 per-shard probe event."""

FIRST_US = 1_700_000_000_000_000
STEP_US = 1_000


def probe_ok_v1(shard: int, **fields: Any) -> ProbeSucceededV1:
    return ProbeSucceededV1(shard=shard, **fields)


def probe_failed_v1(
    shard: int, kind: str = "timeout", error: str = "", **fields: Any
) -> ProbeFailedV1:
    return ProbeFailedV1(shard=shard, kind=kind, error=error, **fields)  # type: ignore[arg-type]


def stored_form(item: Item, codec: EventCodec | None = None) -> tuple[str, int, str]:
    """(type, schema version, payload) as an old fleetledger's append stored ``item``:
    the payload with its id and type (before schema revision 0003)."""
    if isinstance(item, ProbeSucceededV1 | ProbeFailedV1):
        return item.type, 1, item.model_dump_json()
    type_, version, _payload = (codec or EventCodec()).encode(item)
    return type_, version, item.model_dump_json()


def imported_form(item: Item) -> tuple[str, int, str]:
    """(type, schema version, payload) as an import stores ``item`` today: the export
    line's ``data``, without id and type (their columns hold them)."""
    type_, version, payload = stored_form(item)
    data = json.loads(payload)
    del data["id"], data["type"]
    return type_, version, json.dumps(data, separators=(",", ":"))


def export_lines(
    run: str, items: Sequence[Item], *, first_us: int = FIRST_US, step_us: int = STEP_US
) -> list[str]:
    """An export of ``items`` (seq 1 first) as an old fleetledger wrote it."""
    lines = []
    for seq, item in enumerate(items, start=1):
        type_, version, payload = stored_form(item)
        data = json.loads(payload)
        data.pop("id")
        data.pop("type")
        line = {
            "run": run,
            "seq": seq,
            "id": item.id,
            "at": iso_at(first_us + (seq - 1) * step_us),
            "type": type_,
            "schema_version": version,
            "data": data,
        }
        lines.append(json.dumps(line, separators=(",", ":")))
    return lines


def import_old_run(
    log: EventLog, run: str, items: Sequence[Item], *, first_us: int = FIRST_US
) -> None:
    """Import ``items`` as a whole run, through the import's own checks, rows kept raw."""
    checker = ExportChecker(log.codec)
    log.import_run(run, checker.rows(export_lines(run, items, first_us=first_us)))


def insert_old_rows(engine: Engine, run: str, items: Iterable[Item]) -> list[int]:
    """Rows for ``items`` after the run's head (a new run if it has none), inserted as an
    old fleetledger's append stored them; returns their seqs."""
    c = events.c
    with engine.begin() as conn:
        head = conn.execute(
            select(c.seq, c.at_us).where(c.run_id == run).order_by(c.seq.desc()).limit(1)
        ).first()
        seq, at_us = (0, FIRST_US) if head is None else (head[0], head[1])
        rows = []
        for item in items:
            seq, at_us = seq + 1, at_us + STEP_US
            type_, version, payload = stored_form(item)
            rows.append(
                {
                    "run_id": run,
                    "seq": seq,
                    "event_id": item.id,
                    "type": type_,
                    "schema_version": version,
                    "at_us": at_us,
                    "payload": payload,
                }
            )
        if not rows:
            return []
        if head is None:
            conn.execute(insert(runs).values(run_id=run, started_at_us=rows[0]["at_us"]))
        conn.execute(insert(events), rows)
    return [r["seq"] for r in rows]
