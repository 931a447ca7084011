"""The JSON Lines export format of a run (documented in ``docs/events.md``).

One line per stored event, in seq order::

    {"run": "...", "seq": 1, "id": "...", "at": "2026-11-29T10:18:20.123456Z",
     "type": "run_started", "schema_version": 1, "data": {...}}

``data`` is the event's fields without ``id`` and ``type``, exactly as stored, at the
schema version it was stored with (an export does not upcast). An import checks every
line before writing any: a bad line names its number and the problem, and nothing is
written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetledger.events.codec import EventCodec, StoredRow
from fleetledger.events.errors import EventDecodeError, ImportFileError
from fleetledger.events.models import (
    RunEnded,
    RunStarted,
    iso_at,
    us_from_datetime,
)
from fleetledger.events.records import ImportRow

LINE_KEYS = ("run", "seq", "id", "at", "type", "schema_version", "data")


def export_lines(run: str, pages: Iterable[list[StoredRow]]) -> Iterator[str]:
    """The run's stored rows as export lines (no trailing newline)."""
    for page in pages:
        for seq, at_us, type_, version, stored in page:
            payload = json.loads(stored)
            event_id = payload.pop("id")
            payload.pop("type", None)
            yield json.dumps(
                {
                    "run": run,
                    "seq": seq,
                    "id": event_id,
                    "at": iso_at(at_us),
                    "type": type_,
                    "schema_version": version,
                    "data": payload,
                },
                separators=(",", ":"),
                ensure_ascii=False,
            )


@dataclass(frozen=True)
class ParsedRun:
    run: str
    rows: list[ImportRow]


def _field(obj: dict[str, Any], key: str, kind: type, line: int) -> Any:
    value = obj[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ImportFileError(line, f"field {key!r} must be an integer, got {value!r}")
    if kind is str and not isinstance(value, str):
        raise ImportFileError(line, f"field {key!r} must be a string, got {value!r}")
    if kind is dict and not isinstance(value, dict):
        raise ImportFileError(line, f"field {key!r} must be a JSON object, got {value!r}")
    return value


def _parse_line(number: int, text: str) -> dict[str, Any]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ImportFileError(number, f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ImportFileError(number, "an event line must be a JSON object")
    missing = [k for k in LINE_KEYS if k not in obj]
    if missing:
        raise ImportFileError(number, f"missing field(s) {', '.join(missing)}")
    extra = sorted(set(obj) - set(LINE_KEYS))
    if extra:
        raise ImportFileError(number, f"unknown field(s) {', '.join(extra)}")
    return obj


def parse_export(
    lines: Iterable[str | bytes], codec: EventCodec, rename_to: str | None = None
) -> ParsedRun:
    """Validate a whole export; returns the rows to write. Raises on the first bad line."""
    rows: list[ImportRow] = []
    run: str | None = None
    config = None
    ids: set[str] = set()
    last_at = 0
    ended_at_line: int | None = None
    for number, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ImportFileError(
                    number, f"not UTF-8 text: {exc.reason} at byte {exc.start + 1} of the line"
                ) from None
        text = raw.strip()
        if not text:
            raise ImportFileError(number, "empty line (an export has one event per line)")
        obj = _parse_line(number, text)
        line_run = _field(obj, "run", str, number)
        seq = _field(obj, "seq", int, number)
        event_id = _field(obj, "id", str, number)
        at_text = _field(obj, "at", str, number)
        type_ = _field(obj, "type", str, number)
        version = _field(obj, "schema_version", int, number)
        data = _field(obj, "data", dict, number)
        if run is None:
            run = line_run
        elif line_run != run:
            raise ImportFileError(
                number, f"run {line_run!r} differs from {run!r}: an export holds one run"
            )
        expected = len(rows) + 1
        if seq != expected:
            raise ImportFileError(number, f"seq {seq} out of order: expected {expected}")
        if ended_at_line is not None:
            raise ImportFileError(number, f"event after run_ended (line {ended_at_line})")
        if event_id in ids:
            raise ImportFileError(number, f"event id {event_id} appears twice")
        ids.add(event_id)
        try:
            at_us = us_from_datetime(datetime.fromisoformat(at_text))
        except ValueError as exc:
            raise ImportFileError(number, f"field 'at' is not an ISO 8601 time: {exc}") from None
        if at_us < last_at:
            raise ImportFileError(number, f"time {at_text} goes backwards")
        last_at = at_us
        for reserved in ("id", "type"):
            if reserved in data:
                raise ImportFileError(number, f"'data' must not contain {reserved!r}")
        payload = {"id": event_id, "type": type_, **data}
        try:
            event = codec.decode(run, seq, type_, version, payload)
        except EventDecodeError as exc:
            raise ImportFileError(number, exc.problem) from None
        if seq == 1:
            if not isinstance(event, RunStarted):
                raise ImportFileError(number, f"a run begins with run_started, not {type_!r}")
            config = event.config
        elif isinstance(event, RunStarted):
            raise ImportFileError(number, "a second run_started inside one run")
        assert config is not None
        try:
            config.check_event(event)
        except ValueError as exc:
            raise ImportFileError(number, f"{type_}: {exc}") from None
        if isinstance(event, RunEnded):
            ended_at_line = number
        rows.append(
            ImportRow(
                seq, event_id, at_us, type_, version, json.dumps(payload, separators=(",", ":"))
            )
        )
    if run is None:
        raise ImportFileError(1, "the file holds no events")
    return ParsedRun(rename_to or run, rows)
