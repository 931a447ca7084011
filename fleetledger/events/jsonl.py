"""The JSON Lines export format of a run (documented in ``docs/events.md``).

One line per stored event, in seq order::

    {"run": "...", "seq": 1, "id": "...", "at": "2026-11-29T10:18:20.123456Z",
     "type": "run_started", "schema_version": 1, "data": {...}}

``data`` is the event's fields without ``id`` and ``type``, exactly as stored, at the
schema version it was stored with (an export does not upcast). An import checks every
line before writing any: a bad line names its number and the problem, and nothing is
written.

An import file comes from someone else, so reading one is bounded (the limits are in
``docs/events.md``, "Limits"): lines are read at most :data:`MAX_LINE_BYTES` at a
time, so a 100 MB line is refused after reading one megabyte, not after holding it;
a file holds at most :data:`MAX_EXPORT_BYTES` of events; each line is parsed by the
codec's strict :func:`~fleetledger.events.codec.load_json`. The checked rows are kept
by column (:class:`ImportRows`), not as one object per event.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any, overload

from fleetledger.events.codec import LAST_STAMP, EventCodec, JSONRefused, StoredRow, cut, load_json
from fleetledger.events.errors import EventDecodeError, ImportFileError
from fleetledger.events.models import RunEnded, RunStarted, iso_at, us_from_datetime

LINE_KEYS = ("run", "seq", "id", "at", "type", "schema_version", "data")
# The longest line an import reads (without its newline): a run_started line carries
# the run's configuration, settings included; every other event is far shorter.
MAX_LINE_BYTES = 1 << 20
# The most event text one import reads, plain or as a bundle's events.jsonl: the
# checked rows are held until they are written, so this bounds the import's memory
# (about 2.5 bytes held per byte read, for the smallest events).
MAX_EXPORT_BYTES = 64 << 20
READ_CHUNK = 1 << 20


@dataclass(frozen=True)
class ImportRow:
    """A stored event as an export file holds it, kept byte-for-byte on import."""

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


class ImportRows(Sequence[ImportRow]):
    """The checked rows of an import, kept by column; seq ``n`` is row ``n - 1``.

    One ``ImportRow`` per event costs ~300 bytes besides the event's own text, more than
    most events' text: a column each (ids, payloads, interned types, stamps and versions
    in arrays) keeps an import at the limit to a fraction of that.
    """

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._at = array("q")
        self._types: list[str] = []
        self._versions = array("q")
        self._payloads: list[str] = []

    def append(self, event_id: str, at_us: int, type_: str, version: int, payload: str) -> None:
        self._ids.append(event_id)
        self._at.append(at_us)
        self._types.append(sys.intern(type_))
        self._versions.append(version)
        self._payloads.append(payload)

    def line_of(self, event_id: str) -> int:
        """The line (= seq) an id is on; only for an error message (a linear search)."""
        return self._ids.index(event_id) + 1

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> ImportRow: ...
    @overload
    def __getitem__(self, index: slice) -> list[ImportRow]: ...
    def __getitem__(self, index: int | slice) -> ImportRow | list[ImportRow]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        i = range(len(self))[index]  # negative indices, IndexError
        return ImportRow(
            i + 1, self._ids[i], self._at[i], self._types[i], self._versions[i], self._payloads[i]
        )

    def __iter__(self) -> Iterator[ImportRow]:
        columns = zip(self._ids, self._at, self._types, self._versions, self._payloads, strict=True)
        for seq, (event_id, at_us, type_, version, payload) in enumerate(columns, start=1):
            yield ImportRow(seq, event_id, at_us, type_, version, payload)


@dataclass(frozen=True)
class ParsedRun:
    run: str
    rows: Sequence[ImportRow]


def read_lines(
    stream: IO[bytes], *, head: bytes = b"", limit: int | None = None
) -> Iterator[bytes]:
    """The lines of ``stream`` (after ``head``, bytes already read from it), without
    their newlines; at most ``limit`` bytes in all (default :data:`MAX_EXPORT_BYTES`)
    and :data:`MAX_LINE_BYTES` a line.

    Memory stays at one chunk and one line whatever the stream holds: a line is refused
    as soon as it outgrows the limit, before the rest of it is read.
    """
    limit = MAX_EXPORT_BYTES if limit is None else limit
    pending, number, total = head, 0, len(head)
    while True:
        chunk = stream.read(READ_CHUNK)
        if not chunk:
            break
        total += len(chunk)
        if total > limit:  # named: the line that holds the first byte past the limit
            within = chunk[: len(chunk) - (total - limit)]
            raise ImportFileError(
                number + within.count(b"\n") + 1,
                f"the file goes on past {limit:,} bytes, the most event text one import "
                "reads (docs/events.md, Limits); nothing was imported",
            )
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


def parse_export(
    lines: Iterable[str | bytes], codec: EventCodec, rename_to: str | None = None
) -> ParsedRun:
    """Validate a whole export; returns the rows to write. Raises on the first bad line.

    ``lines`` from a file should come through :func:`read_lines`, which bounds them.
    """
    rows = ImportRows()
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
                number,
                f"run {_cut_repr(line_run)} differs from {_cut_repr(run)}: an export holds one run",
            )
        expected = len(rows) + 1
        if seq != expected:
            raise ImportFileError(number, f"seq {_cut_repr(seq)} out of order: expected {expected}")
        if ended_at_line is not None:
            raise ImportFileError(number, f"event after run_ended (line {ended_at_line})")
        if event_id in ids:
            raise ImportFileError(
                number,
                f"event id {cut(event_id)} appears twice (also on line {rows.line_of(event_id)}): "
                "an id names one event of the run",
            )
        ids.add(event_id)
        at_us = _stamp(number, at_text)
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
        if config is None:  # seq 1 comes first (checked above), and it set the config
            raise ImportFileError(number, "an event before the run's run_started")
        try:
            config.check_event(event)
        except ValueError as exc:
            raise ImportFileError(number, f"{type_}: {exc}") from None
        if isinstance(event, RunEnded):
            ended_at_line = number
        rows.append(event_id, at_us, type_, version, json.dumps(payload, separators=(",", ":")))
    if run is None:
        raise ImportFileError(1, "the file holds no events")
    return ParsedRun(run if rename_to is None else rename_to, rows)
