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
- Everything is checked before anything is written: the archive's own CRCs, the events'
  SHA-256 and count against the manifest, every event line (the import rule of
  :func:`fleetledger.events.jsonl.parse_export`), the config against the run's
  ``run_started`` and the summary's counts against the events. The caller writes only
  what :func:`read_import` returns.
- Reading is bounded, because a bundle comes from someone else: the file's size, the
  directory's member count and size, each member's size and their sum, checked against
  the zip directory before zipfile reads it and again as members inflate, and JSON as
  strict as an event line's (limits in docs/events.md, "Limits").
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
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
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
from fleetledger.events.errors import EventDecodeError, ImportFileError, LedgerError
from fleetledger.events.jsonl import (
    MAX_EXPORT_BYTES,
    ParsedRun,
    export_lines,
    parse_export,
    read_lines,
)
from fleetledger.events.models import FleetConfig, RunStarted, iso_at, us_from_datetime

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
    """What a bundle holds besides its events (which come back as a ``ParsedRun``)."""

    manifest: BundleManifest
    config: FleetConfig
    summary: dict[str, Any]


@dataclass(frozen=True)
class Imported:
    """An import file, fully checked: the rows to write, and the bundle if it was one."""

    parsed: ParsedRun
    bundle: Bundle | None


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


# What one import reads of a bundle, at most (docs/events.md, "Limits"). A zip archive
# states its members' sizes in its directory, but a directory can lie and 400 KB can
# inflate to gigabytes: a member's size is checked against the directory before it is
# opened, and again on the bytes as they inflate.
MAX_MEMBERS = 64
MAX_DIRECTORY_BYTES = 1 << 20  # the zip's central directory, which zipfile reads whole
MAX_DOCUMENT_BYTES = 2 << 20  # manifest.json, config.json, summary.json: parsed whole
MAX_MEMBER_BYTES = MAX_EXPORT_BYTES  # events.jsonl, and members this version ignores
MAX_BUNDLE_BYTES = 80 << 20  # every member together, uncompressed
# The file itself: every member stored (not deflated), plus headers and the directory.
MAX_BUNDLE_FILE_BYTES = MAX_BUNDLE_BYTES + MAX_DIRECTORY_BYTES
DOCUMENTS = (MANIFEST, CONFIG, SUMMARY)
_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
# The end-of-central-directory record, and the zip64 locator and record before it.
_END = struct.Struct("<4s4H2LH")
_END64_LOCATOR = struct.Struct("<4sLQL")
_END64 = struct.Struct("<4sQ2H2L4Q")


def read_import(
    stream: IO[bytes], source: str, codec: EventCodec, rename_to: str | None = None
) -> Imported:
    """Check a whole import file — a bundle or a JSON Lines export — and return its rows.

    The kind is told from the first bytes. A bundle on a stream that cannot seek (stdin)
    is first copied to an anonymous temporary file, because a zip archive is read from
    its end; memory holds no more of it than of a bundle read from a file.
    """
    head = stream.read(SNIFF_BYTES)
    if looks_like_bundle(head):
        if stream.seekable():
            stream.seek(0)
            return read_bundle(stream, source, codec, rename_to)
        with tempfile.TemporaryFile() as spool:
            _spool(head, stream, spool, source)
            return read_bundle(spool, source, codec, rename_to)
    if source.lower().endswith(".zip"):
        raise BundleError(
            source,
            "named like a bundle, but it is not a zip archive (a bundle is what "
            "`fleetledger export RUN --bundle FILE` writes); the file is damaged or "
            "something else",
        )
    return Imported(parse_export(read_lines(stream, head=head), codec, rename_to), None)


def _spool(head: bytes, stream: IO[bytes], spool: IO[bytes], source: str) -> None:
    spool.write(head)
    size = len(head)
    while chunk := stream.read(1 << 20):
        size += len(chunk)
        if size > MAX_BUNDLE_FILE_BYTES:
            raise BundleError(
                source,
                f"the bundle goes on past {MAX_BUNDLE_FILE_BYTES:,} bytes, the largest file "
                "one import reads (docs/events.md, Limits); nothing was imported",
            )
        spool.write(chunk)
    spool.seek(0)


def read_bundle(
    archive_source: IO[bytes] | Path,
    source: str,
    codec: EventCodec,
    rename_to: str | None = None,
) -> Imported:
    """Check every part of a bundle; raises :class:`BundleError` naming the first problem."""
    if isinstance(archive_source, Path):
        with archive_source.open("rb") as stream:
            return read_bundle(stream, source, codec, rename_to)
    try:
        _check_extent(archive_source, source)
        with zipfile.ZipFile(archive_source) as archive:
            return _read_archive(archive, source, codec, rename_to)
    except _ARCHIVE_ERRORS as exc:
        raise BundleError(
            source,
            f"the bundle's zip archive is truncated or corrupted ({cut(str(exc))}); nothing "
            "was imported — export the run again",
        ) from None


def _check_extent(stream: IO[bytes], source: str) -> None:
    """Refuse a file too large to be a bundle, or one whose directory is, before zipfile
    reads that directory whole (and makes an object of each of its entries)."""
    size = stream.seek(0, io.SEEK_END)
    if size > MAX_BUNDLE_FILE_BYTES:
        raise BundleError(
            source,
            f"the file is {size:,} bytes; a bundle is at most {MAX_BUNDLE_FILE_BYTES:,} "
            "(docs/events.md, Limits); nothing was imported",
        )
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


def _read_archive(
    archive: zipfile.ZipFile, source: str, codec: EventCodec, rename_to: str | None
) -> Imported:
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

    digest = hashlib.sha256()
    lines = size = 0
    with _open_member(archive, EVENTS, source) as member:  # its CRC is checked at its end
        for chunk in iter(lambda: member.read(1 << 20), b""):
            size += len(chunk)
            if size > MAX_MEMBER_BYTES:
                raise _inflates_past(archive, EVENTS, MAX_MEMBER_BYTES, source)
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

    with _open_member(archive, EVENTS, source) as member:
        try:
            parsed = parse_export(read_lines(member, limit=MAX_MEMBER_BYTES), codec)
        except ImportFileError as exc:
            raise BundleError(source, f"{EVENTS} line {exc.line}: {exc.problem}") from None
    if parsed.run != manifest.run:
        raise BundleError(
            source,
            f"{MANIFEST} names run {cut(repr(manifest.run))}, but {EVENTS} holds run "
            f"{cut(repr(parsed.run))}",
        )

    config = _config(archive, source, codec, parsed)
    summary = _json_member(archive, SUMMARY, source)
    _check_summary(summary, parsed, source)
    run = parsed.run if rename_to is None else rename_to
    return Imported(ParsedRun(run, parsed.rows), Bundle(manifest, config, summary))


def _limit(name: str) -> int:
    return MAX_DOCUMENT_BYTES if name in DOCUMENTS else MAX_MEMBER_BYTES


def _check_sizes(infos: list[zipfile.ZipInfo], source: str) -> None:
    """Every member's size, and their sum, as the zip directory states them."""
    for info in infos:
        if info.file_size > _limit(info.filename):
            raise BundleError(
                source,
                f"{cut(info.filename)} is {info.file_size:,} bytes uncompressed, says the zip "
                f"directory; a bundle's {cut(info.filename)} is at most "
                f"{_limit(info.filename):,} (docs/events.md, Limits); nothing was imported",
            )
    total = sum(info.file_size for info in infos)
    if total > MAX_BUNDLE_BYTES:
        raise BundleError(
            source,
            f"the members are {total:,} bytes uncompressed, says the zip directory; a bundle "
            f"holds at most {MAX_BUNDLE_BYTES:,} (docs/events.md, Limits); nothing was imported",
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


def _inflates_past(archive: zipfile.ZipFile, name: str, limit: int, source: str) -> BundleError:
    return BundleError(
        source,
        f"{name} inflates past {limit:,} bytes, though the zip directory says "
        f"{archive.getinfo(name).file_size:,}: the archive is damaged or made to mislead; "
        "nothing was imported",
    )


def _json_member(archive: zipfile.ZipFile, name: str, source: str) -> dict[str, Any]:
    with _open_member(archive, name, source) as member:
        data = member.read(MAX_DOCUMENT_BYTES + 1)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise _inflates_past(archive, name, MAX_DOCUMENT_BYTES, source)
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
    archive: zipfile.ZipFile, source: str, codec: EventCodec, parsed: ParsedRun
) -> FleetConfig:
    doc = _json_member(archive, CONFIG, source)
    try:
        config = FleetConfig.model_validate(doc)
    except ValidationError as exc:
        raise BundleError(
            source, f"{CONFIG} is not a fleet configuration: {describe_validation_error(exc)}"
        ) from None
    first = parsed.rows[0]
    try:
        started = codec.decode(
            parsed.run, first.seq, first.type, first.schema_version, first.payload
        )
    except EventDecodeError as exc:  # parse_export accepted it: only a codec change gets here
        raise BundleError(source, str(exc)) from None
    if not isinstance(started, RunStarted):  # parse_export checked it: only a codec change
        raise BundleError(source, f"the run's first event is {first.type!r}, not run_started")
    if started.config != config:
        raise BundleError(
            source, f"{CONFIG} differs from the configuration in the run's run_started event"
        )
    return config


def _check_summary(summary: dict[str, Any], parsed: ParsedRun, source: str) -> None:
    by_type = summary.get("events_by_type")
    if not isinstance(summary.get("membership"), dict) or not isinstance(by_type, dict):
        raise BundleError(
            source, f"{SUMMARY} must hold a 'membership' object and an 'events_by_type' object"
        )
    actual = Counter(row.type for row in parsed.rows)
    if by_type != dict(actual):
        raise BundleError(
            source,
            f"{SUMMARY} counts events by type as {cut(str(by_type))}, but {EVENTS} holds "
            f"{dict(sorted(actual.items()))}",
        )
