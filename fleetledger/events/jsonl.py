"""The JSON Lines export format of a run (documented in ``docs/events.md``).

One line per stored event, in seq order::

    {"run": "...", "seq": 1, "id": "...", "at": "2026-11-29T10:18:20.123456Z",
     "type": "run_started", "schema_version": 1, "data": {...}}

``data`` is the event's fields without ``id`` and ``type``, exactly as stored, at the
schema version it was stored with (an export does not upcast). An import checks every
line, and a bad line names its number and the problem; nothing is written (the rows
are written as they are checked, in one transaction that a refused line rolls back).

An import file comes from someone else, and may hold a week of a large fleet, so
reading one is bounded by the line, never by the file: lines are read at most
:data:`MAX_LINE_BYTES` at a time, so a 100 MB line is refused after reading one
megabyte, not after holding it; each line is parsed by the codec's strict
:func:`~fleetledger.events.codec.load_json`; :class:`ExportChecker` keeps what the
rules need of the lines before (the run, its config, the last time, the counts) and
nothing of their rows. One rule it cannot keep that way: an id on two lines. The log
holds every id the import wrote, so the write finds it (``EventLog.import_run``).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

from fleetledger.events.codec import LAST_STAMP, EventCodec, JSONRefused, StoredRow, cut, load_json
from fleetledger.events.errors import EventDecodeError, ImportFileError
from fleetledger.events.models import FleetConfig, RunEnded, RunStarted, iso_at, us_from_datetime

LINE_KEYS = ("run", "seq", "id", "at", "type", "schema_version", "data")
# The longest line an import reads (without its newline): a run_started line carries
# the run's configuration, settings included; every other event is far shorter. The
# file itself has no limit: an import holds a line, never the file.
MAX_LINE_BYTES = 1 << 20
READ_CHUNK = 1 << 20
NO_EVENTS = "the file holds no events"


@dataclass(frozen=True)
class ImportRow:
    """A stored event as an export line holds it: ``payload`` is its ``data``, which is
    what a row stores (the codec's form: no id, no type)."""

    seq: int
    event_id: str
    at_us: int
    type: str
    schema_version: int
    payload: str


def export_lines(run: str, pages: Iterable[list[StoredRow]]) -> Iterator[str]:
    """The run's stored rows as export lines (no trailing newline)."""
    for page in pages:
        for seq, at_us, event_id, type_, version, stored in page:
            payload = json.loads(stored)
            payload.pop("id", None)  # the row's id is the event's (checked on the way in)
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


def read_lines(stream: IO[bytes], *, head: bytes = b"") -> Iterator[bytes]:
    """The lines of ``stream`` (after ``head``, bytes already read from it), without
    their newlines, each at most :data:`MAX_LINE_BYTES`.

    Memory stays at one chunk and one line whatever the stream holds: a line is refused
    as soon as it outgrows the limit, before the rest of it is read.
    """
    pending, number = head, 0
    while True:
        chunk = stream.read(READ_CHUNK)
        if not chunk:
            break
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            number += 1
            _check_length(number, len(line))
            yield line
        _check_length(number + 1, len(pending))
    if pending:
        yield pending


def _check_length(number: int, length: int) -> None:
    if length > MAX_LINE_BYTES:
        raise ImportFileError(
            number,
            f"longer than {MAX_LINE_BYTES:,} bytes, the longest line an import reads "
            "(docs/events.md, Limits); nothing was imported",
        )


def _cut_repr(value: Any) -> str:
    return cut(repr(value))


def _field(obj: dict[str, Any], key: str, kind: type, line: int) -> Any:
    value = obj[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ImportFileError(line, f"field {key!r} must be an integer, got {_cut_repr(value)}")
    if kind is str and not isinstance(value, str):
        raise ImportFileError(line, f"field {key!r} must be a string, got {_cut_repr(value)}")
    if kind is dict and not isinstance(value, dict):
        raise ImportFileError(line, f"field {key!r} must be a JSON object, got {_cut_repr(value)}")
    return value


def _parse_line(number: int, text: str) -> dict[str, Any]:
    try:
        obj = load_json(text)
    except JSONRefused as exc:
        raise ImportFileError(number, exc.problem) from None
    if not isinstance(obj, dict):
        raise ImportFileError(number, "an event line must be a JSON object")
    missing = [k for k in LINE_KEYS if k not in obj]
    if missing:
        raise ImportFileError(number, f"missing field(s) {', '.join(missing)}")
    extra = sorted(set(obj) - set(LINE_KEYS))
    if extra:
        raise ImportFileError(number, f"unknown field(s) {cut(', '.join(extra))}")
    return obj


def _stamp(number: int, at_text: str) -> int:
    try:
        at_us = us_from_datetime(datetime.fromisoformat(at_text))
    except ValueError as exc:
        raise ImportFileError(
            number, f"field 'at' is not an ISO 8601 time: {cut(str(exc))}"
        ) from None
    if not 0 <= at_us <= LAST_STAMP:  # a log stamps with its clock: never before 1970
        raise ImportFileError(
            number,
            f"time {at_text} is outside the times a log stores "
            f"({iso_at(0)} to {iso_at(LAST_STAMP)})",
        )
    return at_us


def id_twice(event_id: str, first_line: int) -> str:
    """The problem of a line whose id an earlier line (``first_line``) holds."""
    return (
        f"event id {cut(event_id)} appears twice (also on line {first_line}): "
        "an id names one event of the run"
    )


class ExportChecker:
    """The import rule of an export, one line at a time (:meth:`check`), holding what
    the rule needs of the lines before and nothing of their rows: memory is one line's
    whatever the file holds. ``run`` is the run the rows are written to (``rename_to``,
    else the lines' own); ``count``, ``by_type`` and ``first`` describe the lines so far.
    """

    def __init__(self, codec: EventCodec, rename_to: str | None = None) -> None:
        self.codec = codec
        self.rename_to = rename_to
        self.lines_run: str | None = None
        self.config: FleetConfig | None = None
        self.count = 0
        self.by_type: Counter[str] = Counter()
        self.first: ImportRow | None = None
        self._last_at = 0
        self._ended_at_line: int | None = None

    @property
    def run(self) -> str:
        run = self.rename_to if self.rename_to is not None else self.lines_run
        if run is None:
            raise ImportFileError(1, NO_EVENTS)
        return run

    def rows(self, lines: Iterable[str | bytes]) -> Iterator[ImportRow]:
        """Each line checked (numbered from 1) as it is read; a file of no lines is refused."""
        for number, raw in enumerate(lines, start=1):
            yield self.check(number, raw)
        if self.count == 0:
            raise ImportFileError(1, NO_EVENTS)

    def check(self, number: int, raw: str | bytes) -> ImportRow:
        """Line ``number`` checked against the rule and the lines before it; its row."""
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
        run = self.lines_run
        if run is None:
            run = self.lines_run = line_run
        elif line_run != run:
            raise ImportFileError(
                number,
                f"run {_cut_repr(line_run)} differs from {_cut_repr(run)}: an export holds one run",
            )
        expected = self.count + 1
        if seq != expected:
            raise ImportFileError(number, f"seq {_cut_repr(seq)} out of order: expected {expected}")
        if self._ended_at_line is not None:
            raise ImportFileError(number, f"event after run_ended (line {self._ended_at_line})")
        at_us = _stamp(number, at_text)
        if at_us < self._last_at:
            raise ImportFileError(number, f"time {at_text} goes backwards")
        for reserved in ("id", "type"):
            if reserved in data:
                raise ImportFileError(number, f"'data' must not contain {reserved!r}")
        stored = json.dumps(data, separators=(",", ":"))
        payload = {"id": event_id, "type": type_, **data}
        try:
            event = self.codec.decode(run, seq, type_, version, payload)
        except EventDecodeError as exc:
            raise ImportFileError(number, exc.problem) from None
        if seq == 1:
            if not isinstance(event, RunStarted):
                raise ImportFileError(number, f"a run begins with run_started, not {type_!r}")
            self.config = event.config
        elif isinstance(event, RunStarted):
            raise ImportFileError(number, "a second run_started inside one run")
        config = self.config
        if config is None:  # seq 1 comes first (checked above), and it set the config
            raise ImportFileError(number, "an event before the run's run_started")
        try:
            config.check_event(event)
        except ValueError as exc:
            raise ImportFileError(number, f"{type_}: {exc}") from None
        if isinstance(event, RunEnded):
            self._ended_at_line = number
        self._last_at = at_us
        self.count = seq
        self.by_type[type_] += 1
        row = ImportRow(seq, event_id, at_us, type_, version, stored)
        if seq == 1:
            self.first = row
        return row
