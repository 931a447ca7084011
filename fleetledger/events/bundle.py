"""Run bundles: one file that carries a run to someone else (documented in docs/events.md).

``fleetledger export RUN --bundle FILE`` writes a zip archive of four members:

- ``manifest.json`` — the bundle format's name and version, the fleetledger version that
  wrote it, the run id, the event count, the SHA-256 of ``events.jsonl``, and when it was
  written;
- ``events.jsonl`` — exactly what ``fleetledger export RUN`` prints (the stored events,
  each at the schema version it was stored with), so a bundle holds nothing a plain
  export does not, and every answer about the imported run is the same;
- ``config.json`` — the run's ``FleetConfig``, for a reader who wants the fleet's shape
  without decoding events;
- ``summary.json`` — the membership document at the last event and the count of events
  by type, for a reader without fleetledger (computed by the caller: this layer does
  not fold).

Reading rules, and why:

- A bundle is recognised by its content (a zip archive holding ``manifest.json``), not
  by its name: files get renamed on their way through chat and tickets.
- The format version is checked before anything else in the manifest, because a newer
  format may have changed everything but those two keys; a newer bundle is refused with
  both versions and the advice to upgrade, never read half-right.
- Everything is checked, and nothing is kept unless all of it passes: the archive's own
  CRCs, the events' SHA-256 and count against the manifest (before any row is read),
  every event line (the import rule, :class:`~fleetledger.events.jsonl.ExportChecker`),
  the config against the run's ``run_started`` and the summary's counts against the
  events. The rows come out as they are checked (:func:`open_import`), so a run of any
  size is written a page at a time, in one transaction that a refusal rolls back.
- Reading is bounded, because a bundle comes from someone else, but never by the run's
  size: the directory's member count and size are checked before zipfile reads it; a
  member may inflate only to what the directory says, and the directory may say only
  :data:`MAX_INFLATION` times what a member takes in the file (a zip bomb's thousandfold
  is refused before a byte of it inflates); the JSON documents are small and parsed as
  strictly as an event line (limits in docs/events.md, "Limits").
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import tempfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any

from pydantic import ValidationError

from fleetledger import __version__
from fleetledger.events.codec import (
    EventCodec,
    JSONRefused,
    StoredRow,
    cut,
    describe_validation_error,
    load_json,
)
from fleetledger.events.errors import ImportFileError, LedgerError
from fleetledger.events.jsonl import (
    ExportChecker,
    ImportRow,
    export_lines,
    id_twice,
    read_lines,
)
from fleetledger.events.models import FleetConfig, iso_at, us_from_datetime

BUNDLE_FORMAT = "fleetledger-bundle"
BUNDLE_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"
MEMBERS = (MANIFEST, EVENTS, CONFIG, SUMMARY)
# A zip archive starts with a local file header, or (empty) with the end-of-directory.
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
SNIFF_BYTES = 4
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Everything zipfile and zlib raise for a truncated, corrupted or tampered archive
# (RuntimeError: a member flagged encrypted; NotImplementedError: an unknown compression).
_ARCHIVE_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    zipfile.LargeZipFile,
    RuntimeError,
    NotImplementedError,
)


class BundleError(LedgerError):
    """A bundle cannot be written or imported; names the file and what is wrong with it."""

    def __init__(self, source: str, problem: str) -> None:
        super().__init__(f"{source}: {problem}")
        self.source = source
        self.problem = problem


def fleetledger_version() -> str:
    return __version__


@dataclass(frozen=True)
class BundleManifest:
    format_version: int
    fleetledger_version: str
    run: str
    events: int
    events_sha256: str
    created: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": BUNDLE_FORMAT,
            "format_version": self.format_version,
            "fleetledger_version": self.fleetledger_version,
            "run": self.run,
            "events": self.events,
            "events_sha256": self.events_sha256,
            "created": self.created,
        }


@dataclass(frozen=True)
class Bundle:
    """What a bundle holds besides its events (which come out as rows, ``ImportFile``)."""

    manifest: BundleManifest
    config: FleetConfig
    summary: dict[str, Any]


class ImportFile:
    """An import file opened and checked as far as it can be before its rows are read:
    a bundle's manifest, digest, config and first line; a plain export's first line.

    ``rows`` checks the rest as it is pulled: the caller writes each as it comes, inside
    one transaction, and anything raised (a line refused, a bundle's summary that
    disagrees, found at the end) must roll the write back. ``line_error`` is how a
    problem found while writing (an id on two lines) names its line in this file.
    """

    def __init__(
        self,
        source: str,
        checker: ExportChecker,
        rows: Iterator[ImportRow],
        bundle: Bundle | None,
        lines: int | None,
    ) -> None:
        self.source = source
        self.checker = checker
        self.rows = rows
        self.bundle = bundle
        self.lines = lines

    @property
    def run(self) -> str:
        """The run the rows are written to (``--run``, else the file's)."""
        return self.checker.run

    def line_error(self, line: int, problem: str) -> LedgerError:
        if self.bundle is None:
            return ImportFileError(line, problem)
        return BundleError(self.source, f"{EVENTS} line {line}: {problem}")

    def id_twice(self, event_id: str, line: int, first_line: int) -> LedgerError:
        return self.line_error(line, id_twice(event_id, first_line))


# ── writing ────────────────────────────────────────────────────────────────────


def _json_bytes(doc: Any) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_bundle(
    stream: IO[bytes],
    run: str,
    pages: Iterable[list[StoredRow]],
    config: FleetConfig,
    membership: Mapping[str, Any],
    *,
    created: datetime | None = None,
    name: str = "bundle",
) -> BundleManifest:
    """Write ``run``'s stored rows (``pages``, from seq 1) as a bundle into ``stream``.

    ``membership`` is the membership document at the last of those rows; the caller
    folds it (this layer does not). ``name`` is what an error calls the bundle. This
    layer writes no file: the caller owns the stream, and with it whether a file appears
    whole or not at all (the CLI's ``whole_file``: a private temporary file, renamed
    once complete, removed on any error raised here).
    """
    counts: Counter[str] = Counter()

    def counted() -> Iterator[list[StoredRow]]:
        for page in pages:
            counts.update(row[3] for row in page)
            yield page

    digest = hashlib.sha256()
    events = 0
    written = created or datetime.now(UTC)
    stamp = written.astimezone(UTC).timetuple()[:6]

    def member(name: str) -> zipfile.ZipInfo:
        # Every member carries the bundle's creation time (zipfile's default is 1980).
        info = zipfile.ZipInfo(name, date_time=stamp)
        info.compress_type = zipfile.ZIP_DEFLATED
        return info

    with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(member(EVENTS), "w", force_zip64=True) as events_member:
            for line in export_lines(run, counted()):
                data = (line + "\n").encode("utf-8")
                digest.update(data)
                events_member.write(data)
                events += 1
        if events == 0:
            raise BundleError(name, f"run {run!r} has no events to bundle")
        manifest = BundleManifest(
            format_version=BUNDLE_FORMAT_VERSION,
            fleetledger_version=fleetledger_version(),
            run=run,
            events=events,
            events_sha256=digest.hexdigest(),
            created=iso_at(us_from_datetime(written)),
        )
        archive.writestr(member(CONFIG), _json_bytes(config.model_dump(mode="json")))
        archive.writestr(
            member(SUMMARY),
            _json_bytes(
                {
                    "run": run,
                    "events": events,
                    "events_by_type": dict(sorted(counts.items())),
                    "membership": dict(membership),
                }
            ),
        )
        archive.writestr(member(MANIFEST), _json_bytes(manifest.as_dict()))
    return manifest


# ── reading ────────────────────────────────────────────────────────────────────


def looks_like_bundle(head: bytes) -> bool:
    """True when the first bytes of a file are a zip archive's (what a bundle is)."""
    return head[:SNIFF_BYTES] in ZIP_MAGIC


# What one import reads of a bundle's directory and documents, at most (docs/events.md,
# "Limits"). A zip archive states its members' sizes in its directory, but a directory
# can lie and 400 KB can inflate to gigabytes: a member's stated size is held to its
# compressed size before it is opened, and its bytes to its stated size as they inflate.
MAX_MEMBERS = 64
MAX_DIRECTORY_BYTES = 1 << 20  # the zip's central directory, which zipfile reads whole
MAX_DOCUMENT_BYTES = 2 << 20  # manifest.json, config.json, summary.json: parsed whole
# The most a member may inflate to, as a multiple of what it takes in the file. An
# export deflates 10-40 fold (36× for a 256-shard fleet's healthy rounds: bench_scale);
# a zip bomb's member a thousandfold. A member this small inflates to little either way.
MAX_INFLATION = 400
INFLATION_FLOOR_BYTES = 1 << 20
DOCUMENTS = (MANIFEST, CONFIG, SUMMARY)
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# The end-of-central-directory record, and the zip64 locator and record before it.
_END = struct.Struct("<4s4H2LH")
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


@contextmanager
def open_import(
    stream: IO[bytes], source: str, codec: EventCodec, rename_to: str | None = None
) -> Iterator[ImportFile]:
    """An import file — a bundle or a JSON Lines export, told apart by its first bytes —
    checked as far as it can be before its rows are read (:class:`ImportFile`).

    A bundle on a stream that cannot seek (stdin) is first copied to an anonymous
    temporary file, because a zip archive is read from its end; memory holds a chunk of
    it at a time either way.
    """
    head = stream.read(SNIFF_BYTES)
    checker = ExportChecker(codec, rename_to)
    if not looks_like_bundle(head):
        if source.lower().endswith(".zip"):
            raise BundleError(
                source,
                "named like a bundle, but it is not a zip archive (a bundle is what "
                "`fleetledger export RUN --bundle FILE` writes); the file is damaged or "
                "something else",
            )
        rows = checker.rows(read_lines(stream, head=head))
        first = next(rows, None)  # the run's name, before anything is written
        yield ImportFile(source, checker, _chain_first(first, rows), None, None)
        return
    with ExitStack() as stack:
        if stream.seekable():
            stream.seek(0)
            archive_stream = stream
        else:
            archive_stream = stack.enter_context(tempfile.TemporaryFile())
            _spool(head, stream, archive_stream)
        with _archive_errors(source):
            _check_extent(archive_stream, source)
            archive = stack.enter_context(zipfile.ZipFile(archive_stream))
            opened = _open_bundle(archive, source, checker, stack)
        yield opened


def _chain_first(first: ImportRow | None, rest: Iterator[ImportRow]) -> Iterator[ImportRow]:
    if first is not None:
        yield first
    yield from rest


@contextmanager
def _archive_errors(source: str) -> Iterator[None]:
    """What zipfile and zlib raise for a damaged archive, as one line about the bundle."""
    try:
        yield
    except _ARCHIVE_ERRORS as exc:
        raise BundleError(
            source,
            f"the bundle's zip archive is truncated or corrupted ({cut(str(exc))}); nothing "
            "was imported — export the run again",
        ) from None


def _spool(head: bytes, stream: IO[bytes], spool: IO[bytes]) -> None:
    spool.write(head)
    while chunk := stream.read(1 << 20):
        spool.write(chunk)
    spool.seek(0)


def _check_extent(stream: IO[bytes], source: str) -> None:
    """Refuse a file whose directory is too large to be a bundle's, before zipfile reads
    that directory whole (and makes an object of each of its entries)."""
    size = stream.seek(0, io.SEEK_END)
    end = _end_of_directory(stream, size)
    if end is not None:
        members, directory = end
        if members > MAX_MEMBERS or directory > MAX_DIRECTORY_BYTES:
            raise BundleError(
                source,
                f"the zip directory lists {members:,} members in {directory:,} bytes; a "
                f"bundle has at most {MAX_MEMBERS} members in {MAX_DIRECTORY_BYTES:,} bytes "
                "(docs/events.md, Limits); nothing was imported",
            )
    stream.seek(0)


def _end_of_directory(stream: IO[bytes], size: int) -> tuple[int, int] | None:
    """(member count, directory bytes) as zipfile will take them: from the record at the
    very end, else the last one in the 64 KiB comment window, and from the zip64 record
    when a locator precedes it. None when there is none (zipfile then refuses the file)."""
    if size < _END.size:
        return None
    stream.seek(size - _END.size)
    record = stream.read(_END.size)
    at = size - _END.size
    if not (record[:4] == b"PK\x05\x06" and record[-2:] == b"\0\0"):
        start = max(at - (1 << 16), 0)
        stream.seek(start)
        tail = stream.read()
        found = tail.rfind(b"PK\x05\x06")
        if found < 0 or len(tail) - found < _END.size:
            return None
        at, record = start + found, tail[found : found + _END.size]
    fields = _END.unpack(record)
    members, directory = fields[4], fields[5]
    if at >= _END64_LOCATOR.size + _END64.size:
        stream.seek(at - _END64_LOCATOR.size - _END64.size)
        zip64 = stream.read(_END64.size + _END64_LOCATOR.size)
        if zip64[_END64.size :][:4] == b"PK\x06\x07" and zip64[:4] == b"PK\x06\x06":
            fields = _END64.unpack(zip64[: _END64.size])
            members, directory = fields[7], fields[8]
    return members, directory


def _open_bundle(
    archive: zipfile.ZipFile, source: str, checker: ExportChecker, stack: ExitStack
) -> ImportFile:
    """Everything of a bundle that can be checked before its rows are read, and the rows
    (the events member read as they are pulled, closed with ``stack``)."""
    infos = archive.infolist()
    names = Counter(info.filename for info in infos)
    if len(infos) > MAX_MEMBERS:
        raise BundleError(
            source,
            f"the zip archive holds {len(infos):,} members; a bundle has at most {MAX_MEMBERS} "
            "(docs/events.md, Limits); nothing was imported",
        )
    twice = sorted(name for name, count in names.items() if count > 1)
    if twice:
        raise BundleError(
            source,
            f"the zip archive holds more than one member named {cut(repr(twice[0]))}: which "
            "one is the bundle's is anyone's guess; nothing was imported",
        )
    if MANIFEST not in names:
        held = cut(", ".join(sorted(names)[:8]) or "nothing")
        raise BundleError(
            source,
            f"a zip archive, but not a fleetledger bundle: it has no {MANIFEST} (it holds {held})",
        )
    manifest = _manifest(_json_member(archive, MANIFEST, source), source)
    missing = [name for name in MEMBERS if name not in names]
    if missing:
        raise BundleError(source, f"the bundle lacks {', '.join(missing)}")
    _check_sizes(infos, source)

    # The digest and the count first, in a pass of their own: a line refused in a bundle
    # whose events were changed after it was written is the change, not the line.
    digest = hashlib.sha256()
    lines = size = 0
    events_size = archive.getinfo(EVENTS).file_size
    with _open_member(archive, EVENTS, source) as member:  # its CRC is checked at its end
        for chunk in iter(lambda: member.read(1 << 20), b""):
            size += len(chunk)
            if size > events_size:
                raise _inflates_past(EVENTS, events_size, source)
            digest.update(chunk)
            lines += chunk.count(b"\n")
    if digest.hexdigest() != manifest.events_sha256:
        raise BundleError(
            source,
            f"{EVENTS} has SHA-256 {digest.hexdigest()}, but {MANIFEST} says "
            f"{manifest.events_sha256}: the events were changed after the bundle was "
            "written, or the bundle is damaged; nothing was imported",
        )
    if lines != manifest.events:
        raise BundleError(
            source,
            f"{EVENTS} holds {lines} event lines, but {MANIFEST} says {manifest.events}; "
            "nothing was imported",
        )

    member = stack.enter_context(_open_member(archive, EVENTS, source))
    rows = _bundle_rows(checker.rows(_zip_read(read_lines(member), source)), source)
    first = next(rows)  # the manifest says the member holds a line
    if checker.lines_run != manifest.run:
        raise BundleError(
            source,
            f"{MANIFEST} names run {cut(repr(manifest.run))}, but {EVENTS} holds run "
            f"{cut(repr(checker.lines_run))}",
        )
    config = _config(archive, source, checker, first)
    summary = _json_member(archive, SUMMARY, source)
    by_type = _summary_counts(summary, source)
    bundle = Bundle(manifest, config, summary)
    checked = _checked_to_the_end(first, rows, checker, by_type, source)
    return ImportFile(source, checker, checked, bundle, manifest.events)


def _zip_read(lines: Iterator[bytes], source: str) -> Iterator[bytes]:
    """The member's lines, a damaged archive found while inflating them (a CRC that does
    not match at the end) said as one line about the bundle."""
    with _archive_errors(source):
        yield from lines


def _bundle_rows(rows: Iterator[ImportRow], source: str) -> Iterator[ImportRow]:
    """A bundle's rows, a refused line named as the bundle's member's."""
    try:
        yield from rows
    except ImportFileError as exc:
        raise BundleError(source, f"{EVENTS} line {exc.line}: {exc.problem}") from None


def _checked_to_the_end(
    first: ImportRow,
    rows: Iterator[ImportRow],
    checker: ExportChecker,
    by_type: dict[str, Any],
    source: str,
) -> Iterator[ImportRow]:
    """The rows, and after the last one the summary's counts held to them."""
    yield first
    yield from rows
    if by_type != dict(checker.by_type):
        raise BundleError(
            source,
            f"{SUMMARY} counts events by type as {cut(str(by_type))}, but {EVENTS} holds "
            f"{dict(sorted(checker.by_type.items()))}",
        )


def _check_sizes(infos: list[zipfile.ZipInfo], source: str) -> None:
    """Every member's size as the zip directory states it: a document's at most
    ``MAX_DOCUMENT_BYTES``, any member's at most ``MAX_INFLATION`` times its compressed
    size (above ``INFLATION_FLOOR_BYTES``)."""
    for info in infos:
        name = cut(info.filename)
        if info.filename in DOCUMENTS and info.file_size > MAX_DOCUMENT_BYTES:
            raise BundleError(
                source,
                f"{name} is {info.file_size:,} bytes uncompressed, says the zip directory; "
                f"a bundle's {name} is at most {MAX_DOCUMENT_BYTES:,} (docs/events.md, "
                "Limits); nothing was imported",
            )
        if info.file_size > max(INFLATION_FLOOR_BYTES, MAX_INFLATION * info.compress_size):
            raise BundleError(
                source,
                f"{name} is {info.file_size:,} bytes uncompressed from {info.compress_size:,} "
                f"in the file, says the zip directory: more than {MAX_INFLATION} times, which "
                "no export deflates to; a zip bomb or a damaged archive (docs/events.md, "
                "Limits); nothing was imported",
            )


def _open_member(archive: zipfile.ZipFile, name: str, source: str) -> IO[bytes]:
    """A member to read, once its stated size and its compression are ones a bundle has."""
    info = archive.getinfo(name)
    _check_sizes([info], source)
    if info.compress_type not in _METHODS:
        raise BundleError(
            source,
            f"{name} is compressed with zip method {info.compress_type}; a bundle's members "
            "are stored or deflated; nothing was imported",
        )
    return archive.open(info)


def _inflates_past(name: str, stated: int, source: str) -> BundleError:
    return BundleError(
        source,
        f"{name} inflates past the {stated:,} bytes the zip directory says it holds: the "
        "archive is damaged or made to mislead; nothing was imported",
    )


def _json_member(archive: zipfile.ZipFile, name: str, source: str) -> dict[str, Any]:
    stated = archive.getinfo(name).file_size
    with _open_member(archive, name, source) as member:  # stated <= MAX_DOCUMENT_BYTES
        data = member.read(stated + 1)
    if len(data) > stated:
        raise _inflates_past(name, stated, source)
    try:
        doc = load_json(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError(
            source, f"{name} is not UTF-8 text: {exc.reason} at byte {exc.start + 1}"
        ) from None
    except JSONRefused as exc:
        raise BundleError(source, f"{name}: {exc.problem}") from None
    if not isinstance(doc, dict):
        raise BundleError(source, f"{name} must hold a JSON object, not {type(doc).__name__}")
    return doc


def _manifest(doc: dict[str, Any], source: str) -> BundleManifest:
    if doc.get("format") != BUNDLE_FORMAT:
        raise BundleError(
            source,
            f"{MANIFEST} says format {cut(repr(doc.get('format')))}, not {BUNDLE_FORMAT!r}: "
            "not a fleetledger bundle",
        )
    version = doc.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BundleError(source, f"{MANIFEST}: format_version {cut(repr(version))} is not valid")
    if version > BUNDLE_FORMAT_VERSION:
        writer = doc.get("fleetledger_version")
        by = f" (written by fleetledger {cut(writer)})" if isinstance(writer, str) else ""
        raise BundleError(
            source,
            f"bundle format version {cut(str(version))}{by} is newer than version "
            f"{BUNDLE_FORMAT_VERSION}, the newest this fleetledger {fleetledger_version()} "
            "reads; upgrade fleetledger to import it",
        )
    expected: dict[str, type] = {
        "fleetledger_version": str,
        "run": str,
        "events": int,
        "events_sha256": str,
        "created": str,
    }
    for key, kind in expected.items():
        value = doc.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise BundleError(
                source, f"{MANIFEST}: {key!r} must be a {kind.__name__}, got {cut(repr(value))}"
            )
    if doc["events"] < 1:
        raise BundleError(source, f"{MANIFEST}: 'events' must be >= 1, got {doc['events']}")
    if not _SHA256.fullmatch(doc["events_sha256"]):
        raise BundleError(source, f"{MANIFEST}: 'events_sha256' is not 64 lowercase hex digits")
    return BundleManifest(
        version,
        doc["fleetledger_version"],
        doc["run"],
        doc["events"],
        doc["events_sha256"],
        doc["created"],
    )


def _config(
    archive: zipfile.ZipFile, source: str, checker: ExportChecker, first: ImportRow
) -> FleetConfig:
    doc = _json_member(archive, CONFIG, source)
    try:
        config = FleetConfig.model_validate(doc)
    except ValidationError as exc:
        raise BundleError(
            source, f"{CONFIG} is not a fleet configuration: {describe_validation_error(exc)}"
        ) from None
    if checker.config is None:  # the checker refuses a first line that is not run_started
        raise BundleError(source, f"the run's first event is {first.type!r}, not run_started")
    if checker.config != config:
        raise BundleError(
            source, f"{CONFIG} differs from the configuration in the run's run_started event"
        )
    return config


def _summary_counts(summary: dict[str, Any], source: str) -> dict[str, Any]:
    """The summary's count of events by type (held to the rows once they are all read)."""
    by_type = summary.get("events_by_type")
    if not isinstance(summary.get("membership"), dict) or not isinstance(by_type, dict):
        raise BundleError(
            source, f"{SUMMARY} must hold a 'membership' object and an 'events_by_type' object"
        )
    return by_type
