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
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import re
import zipfile
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from fleetledger.events.codec import EventCodec, StoredRow, describe_validation_error
from fleetledger.events.errors import EventDecodeError, ImportFileError, LedgerError
from fleetledger.events.jsonl import ParsedRun, export_lines, parse_export
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
    try:
        return metadata.version("fleetledger")
    except metadata.PackageNotFoundError:  # running from a source tree, not installed
        return "unknown"


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
    path: Path,
    run: str,
    pages: Iterable[list[StoredRow]],
    config: FleetConfig,
    membership: Mapping[str, Any],
    *,
    created: datetime | None = None,
) -> BundleManifest:
    """Write ``run``'s stored rows (``pages``, from seq 1) as a bundle at ``path``.

    ``membership`` is the membership document at the last of those rows; the caller
    folds it (this layer does not). The file appears whole or not at all: it is written
    to a ``.partial`` sibling and renamed once complete.
    """
    counts: Counter[str] = Counter()

    def counted() -> Iterator[list[StoredRow]]:
        for page in pages:
            counts.update(row[2] for row in page)
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

    partial = path.with_name(path.name + ".partial")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            with archive.open(member(EVENTS), "w", force_zip64=True) as stream:
                for line in export_lines(run, counted()):
                    data = (line + "\n").encode("utf-8")
                    digest.update(data)
                    stream.write(data)
                    events += 1
            if events == 0:
                raise BundleError(str(path), f"run {run!r} has no events to bundle")
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
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return manifest


# ── reading ────────────────────────────────────────────────────────────────────


def looks_like_bundle(head: bytes) -> bool:
    """True when the first bytes of a file are a zip archive's (what a bundle is)."""
    return head[:SNIFF_BYTES] in ZIP_MAGIC


def read_import(
    stream: IO[bytes], source: str, codec: EventCodec, rename_to: str | None = None
) -> Imported:
    """Check a whole import file — a bundle or a JSON Lines export — and return its rows.

    The kind is told from the first bytes. A stream that cannot seek (stdin) is read
    whole when it is a bundle, because a zip archive is read from its end.
    """
    head = stream.read(SNIFF_BYTES)
    if looks_like_bundle(head):
        if stream.seekable():
            stream.seek(0)
            archive_source: IO[bytes] = stream
        else:
            archive_source = io.BytesIO(head + stream.read())
        return read_bundle(archive_source, source, codec, rename_to)
    if source.lower().endswith(".zip"):
        raise BundleError(
            source,
            "named like a bundle, but it is not a zip archive (a bundle is what "
            "`fleetledger export RUN --bundle FILE` writes); the file is damaged or "
            "something else",
        )
    # The first line, whole, then the rest of the stream line by line.
    lines = itertools.chain(io.BytesIO(head + stream.readline()), stream)
    return Imported(parse_export(lines, codec, rename_to), None)


def read_bundle(
    archive_source: IO[bytes] | Path,
    source: str,
    codec: EventCodec,
    rename_to: str | None = None,
) -> Imported:
    """Check every part of a bundle; raises :class:`BundleError` naming the first problem."""
    try:
        with zipfile.ZipFile(archive_source) as archive:
            return _read_archive(archive, source, codec, rename_to)
    except _ARCHIVE_ERRORS as exc:
        raise BundleError(
            source,
            f"the bundle's zip archive is truncated or corrupted ({exc}); nothing was "
            "imported — export the run again",
        ) from None


def _read_archive(
    archive: zipfile.ZipFile, source: str, codec: EventCodec, rename_to: str | None
) -> Imported:
    names = set(archive.namelist())
    if MANIFEST not in names:
        held = ", ".join(sorted(names)[:8]) or "nothing"
        raise BundleError(
            source,
            f"a zip archive, but not a fleetledger bundle: it has no {MANIFEST} (it holds {held})",
        )
    manifest = _manifest(_json_member(archive, MANIFEST, source), source)
    missing = [name for name in MEMBERS if name not in names]
    if missing:
        raise BundleError(source, f"the bundle lacks {', '.join(missing)}")

    digest = hashlib.sha256()
    lines = 0
    with archive.open(EVENTS) as member:  # the archive's CRC is checked at its end
        for chunk in iter(lambda: member.read(1 << 20), b""):
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

    with archive.open(EVENTS) as member:
        try:
            parsed = parse_export(member, codec)
        except ImportFileError as exc:
            raise BundleError(source, f"{EVENTS} line {exc.line}: {exc.problem}") from None
    if parsed.run != manifest.run:
        raise BundleError(
            source, f"{MANIFEST} names run {manifest.run!r}, but {EVENTS} holds run {parsed.run!r}"
        )

    config = _config(archive, source, codec, parsed)
    summary = _json_member(archive, SUMMARY, source)
    _check_summary(summary, parsed, source)
    return Imported(
        ParsedRun(rename_to or parsed.run, parsed.rows), Bundle(manifest, config, summary)
    )


def _json_member(archive: zipfile.ZipFile, name: str, source: str) -> dict[str, Any]:
    try:
        doc = json.loads(archive.read(name).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(source, f"{name} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BundleError(source, f"{name} must hold a JSON object, not {type(doc).__name__}")
    return doc


def _manifest(doc: dict[str, Any], source: str) -> BundleManifest:
    if doc.get("format") != BUNDLE_FORMAT:
        raise BundleError(
            source,
            f"{MANIFEST} says format {doc.get('format')!r}, not {BUNDLE_FORMAT!r}: "
            "not a fleetledger bundle",
        )
    version = doc.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise BundleError(source, f"{MANIFEST}: format_version {version!r} is not valid")
    if version > BUNDLE_FORMAT_VERSION:
        writer = doc.get("fleetledger_version")
        by = f" (written by fleetledger {writer})" if isinstance(writer, str) else ""
        raise BundleError(
            source,
            f"bundle format version {version}{by} is newer than version "
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
                source, f"{MANIFEST}: {key!r} must be a {kind.__name__}, got {value!r}"
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
    assert isinstance(started, RunStarted)  # parse_export checked seq 1 is run_started
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
            f"{SUMMARY} counts events by type as {by_type}, but {EVENTS} holds "
            f"{dict(sorted(actual.items()))}",
        )
