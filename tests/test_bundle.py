"""Run bundles: ``export --bundle`` → ``import``, on real SQLite files and real PostgreSQL.

A bundle must carry a run to another ledger so that every answer about it is the same
there, and a bundle that is tampered with, truncated, from a newer format, or not a
bundle at all must be refused with a clear error — with the ledger's tables exactly as
they were before (each refusal compares a dump of every table).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine
from typer.testing import Result

from fleetledger.events.bundle import (
    BUNDLE_FORMAT,
    BUNDLE_FORMAT_VERSION,
    CONFIG,
    EVENTS,
    MANIFEST,
    SUMMARY,
    fleetledger_version,
)
from fleetledger.store.log import EventLog
from tests.builders import dump_tables
from tests.cli_support import invoke, run_cli
from tests.test_timeline import STORY_RUN, write_story

pytestmark = pytest.mark.usefixtures("cli_sandbox")

DEMO_EVENTS = 19
Members = dict[str, bytes]


def refused(*args: str, input: bytes | None = None) -> Result:
    result = run_cli(*args, input=input)
    assert result.exit_code == 2, (args, result.stdout, result.stderr, result.exception)
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result


def demo_run(url: str) -> str:
    invoke("demo", "--db", url)
    with EventLog.open(url) as log:
        (run,) = [s.run_id for s in log.runs()]
    return run


def tables(url: str) -> dict[str, list[tuple[Any, ...]]]:
    engine = create_engine(url)
    try:
        return dump_tables(engine)
    finally:
        engine.dispose()


def members(path: Path) -> Members:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def write_members(path: Path, contents: Members) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


def edit_manifest(contents: Members, **changes: Any) -> Members:
    manifest = json.loads(contents[MANIFEST])
    manifest.update(changes)
    return {**contents, MANIFEST: json.dumps(manifest).encode()}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def bundled(ledger_url: str, tmp_path: Path) -> tuple[str, str, Path]:
    """A ledger holding the demo run, and a bundle of it: (url, run, bundle path)."""
    run = demo_run(ledger_url)
    path = tmp_path / "demo.fleetledger.zip"
    assert invoke("export", run, "--bundle", str(path), "--db", ledger_url).stdout == ""
    return ledger_url, run, path


# ── round trip ─────────────────────────────────────────────────────────────────


def test_a_bundle_round_trip_reproduces_the_export_and_the_membership(
    bundled: tuple[str, str, Path],
) -> None:
    url, run, path = bundled
    summary = json.loads(invoke("import", str(path), "--run", "copy", "--json", "--db", url).stdout)
    assert (summary["run"], summary["events"]) == ("copy", DEMO_EVENTS)
    assert summary["bundle"]["run"] == run
    assert summary["bundle"]["format_version"] == BUNDLE_FORMAT_VERSION

    original = invoke("export", run, "--db", url).stdout.splitlines()
    copied = invoke("export", "copy", "--db", url).stdout.splitlines()
    assert len(original) == len(copied) == DEMO_EVENTS
    for before, after in zip(original, copied, strict=True):
        a, b = json.loads(before), json.loads(after)
        assert (a.pop("run"), b.pop("run")) == (run, "copy")
        assert a == b

    for at in ([], ["--at", "6"], ["--at", "16"]):
        head = json.loads(invoke("membership", run, "--json", "--db", url, *at).stdout)
        copy = json.loads(invoke("membership", "copy", "--json", "--db", url, *at).stdout)
        assert (head.pop("run"), copy.pop("run")) == (run, "copy")
        assert head == copy


def test_a_bundle_holds_the_export_the_config_and_a_summary(
    bundled: tuple[str, str, Path],
) -> None:
    url, run, path = bundled
    contents = members(path)
    assert set(contents) == {MANIFEST, EVENTS, CONFIG, SUMMARY}

    exported = invoke("export", run, "--db", url).stdout.encode()
    assert contents[EVENTS] == exported  # exactly the export format

    manifest = json.loads(contents[MANIFEST])
    assert manifest["format"] == BUNDLE_FORMAT
    assert manifest["format_version"] == BUNDLE_FORMAT_VERSION
    assert manifest["fleetledger_version"] == fleetledger_version()
    assert (manifest["run"], manifest["events"]) == (run, DEMO_EVENTS)
    assert manifest["events_sha256"] == sha256(exported)
    assert manifest["created"].endswith("Z")

    with EventLog.open(url) as log:
        config = log.config(run)
    assert json.loads(contents[CONFIG]) == config.model_dump(mode="json")

    summary = json.loads(contents[SUMMARY])
    membership = json.loads(invoke("membership", run, "--json", "--db", url).stdout)
    assert summary["membership"] == membership
    types = Counter(json.loads(line)["type"] for line in exported.decode().splitlines())
    assert summary["events_by_type"] == dict(types)
    assert summary["events_by_type"]["probe_round"] == 4


def test_a_bundle_is_recognised_by_content_and_read_from_stdin(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, run, path = bundled
    renamed = tmp_path / "run-for-review.dat"
    renamed.write_bytes(path.read_bytes())
    out = invoke("import", str(renamed), "--run", "renamed", "--db", url).stdout
    assert out.startswith(f"imported {DEMO_EVENTS} events as run renamed from bundle {renamed}")

    piped = invoke("import", "-", "--run", "piped", "--db", url, input=path.read_bytes())
    assert f"as run piped from bundle <stdin> (format 1, run {run}" in piped.stdout
    assert invoke("export", "piped", "--db", url).stdout == invoke(
        "export", run, "--db", url
    ).stdout.replace(f'"run":"{run}"', '"run":"piped"')


def test_a_bundle_of_a_longer_run_keeps_every_timeline_fact(
    ledger_url: str, tmp_path: Path
) -> None:
    write_story(ledger_url)
    path = tmp_path / "story.zip"
    invoke("export", STORY_RUN, "--bundle", str(path), "--db", ledger_url)
    other = f"sqlite:///{tmp_path}/elsewhere.db"
    invoke("import", str(path), "--db", other)  # same run id, another ledger
    pictures = []
    for url in (ledger_url, other):
        target = tmp_path / f"{len(pictures)}.html"
        invoke("timeline", STORY_RUN, "-o", str(target), "--db", url)
        pictures.append(target.read_text(encoding="utf-8"))
    assert pictures[0] == pictures[1]


# ── refusals: each leaves every table as it was ────────────────────────────────


def assert_refused_and_unchanged(url: str, path: Path, *expected: str) -> Result:
    before = tables(url)
    result = refused("import", str(path), "--run", "should-not-exist", "--db", url)
    for text in expected:
        assert text in result.stderr, (text, result.stderr)
    assert tables(url) == before
    return result


def test_tampered_events_are_refused_by_their_sha256(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, _, path = bundled
    contents = members(path)
    events = contents[EVENTS].replace(b'"kind":"timeout"', b'"kind":"error"', 1)
    assert events != contents[EVENTS]
    tampered = write_members(tmp_path / "tampered.zip", {**contents, EVENTS: events})
    result = assert_refused_and_unchanged(
        url, tampered, f"{tampered}: {EVENTS} has SHA-256 {sha256(events)}", "nothing was imported"
    )
    assert json.loads(contents[MANIFEST])["events_sha256"] in result.stderr


def test_a_wrong_event_count_is_refused(bundled: tuple[str, str, Path], tmp_path: Path) -> None:
    url, _, path = bundled
    wrong = write_members(
        tmp_path / "count.zip", edit_manifest(members(path), events=DEMO_EVENTS + 1)
    )
    assert_refused_and_unchanged(
        url,
        wrong,
        f"{EVENTS} holds {DEMO_EVENTS} event lines, but {MANIFEST} says {DEMO_EVENTS + 1}",
    )


def test_a_bundle_from_a_newer_format_asks_for_an_upgrade(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, _, _ = bundled
    # A newer format may change anything but the two keys that say which format it is.
    newer = {
        MANIFEST: json.dumps(
            {"format": BUNDLE_FORMAT, "format_version": 2, "fleetledger_version": "9.0.0"}
        ).encode(),
        "events.v2.parquet": b"\x00" * 64,
    }
    assert_refused_and_unchanged(
        url,
        write_members(tmp_path / "newer.zip", newer),
        "bundle format version 2 (written by fleetledger 9.0.0) is newer than version 1",
        f"this fleetledger {fleetledger_version()} reads",
        "upgrade fleetledger",
    )


def test_a_truncated_bundle_is_refused(bundled: tuple[str, str, Path], tmp_path: Path) -> None:
    url, _, path = bundled
    data = path.read_bytes()
    for size in (len(data) // 2, len(data) - 10, 10):
        truncated = tmp_path / f"truncated-{size}.zip"
        truncated.write_bytes(data[:size])
        assert_refused_and_unchanged(url, truncated, "truncated or corrupted")


def test_a_corrupted_member_is_caught_by_the_archive_crc(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, _, path = bundled
    stored = tmp_path / "stored.zip"
    # Uncompressed, so flipping one byte of the events changes text, not the deflate stream.
    with zipfile.ZipFile(stored, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members(path).items():
            archive.writestr(name, data)
    data = bytearray(stored.read_bytes())
    at = data.index(b'"kind":"timeout"')
    data[at + 9] ^= 0x20  # 't' -> 'T'
    stored.write_bytes(bytes(data))
    assert_refused_and_unchanged(url, stored, "truncated or corrupted", "CRC")


@pytest.mark.parametrize(
    ("name", "make", "expected"),
    [
        (
            "garbage.zip",
            lambda: b"this is not a bundle\n",
            "named like a bundle, but it is not a zip",
        ),
        ("binary.bin", lambda: bytes(range(200, 256)) * 4, "line 1: not UTF-8 text"),
        ("empty.zip", lambda: b"", "named like a bundle, but it is not a zip"),
    ],
)
def test_garbage_is_refused(
    bundled: tuple[str, str, Path],
    tmp_path: Path,
    name: str,
    make: Callable[[], bytes],
    expected: str,
) -> None:
    url, _, _ = bundled
    target = tmp_path / name
    target.write_bytes(make())
    assert_refused_and_unchanged(url, target, expected)


def test_a_zip_that_is_not_a_bundle_is_refused(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, _, _ = bundled
    other = write_members(tmp_path / "photos.zip", {"cat.jpg": b"\xff\xd8", "notes.txt": b"hi"})
    assert_refused_and_unchanged(
        url,
        other,
        "a zip archive, but not a fleetledger bundle: it has no manifest.json",
        "cat.jpg, notes.txt",
    )
    foreign = write_members(
        tmp_path / "foreign.zip",
        {MANIFEST: json.dumps({"format": "someone-elses-format"}).encode()},
    )
    assert_refused_and_unchanged(url, foreign, "format 'someone-elses-format'")


def test_a_bad_event_line_with_a_consistent_manifest_is_refused_by_line(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    """Someone rebuilt the bundle around a broken event: the import rule still holds."""
    url, _, path = bundled
    contents = members(path)
    lines = contents[EVENTS].decode().splitlines(keepends=True)
    line = json.loads(lines[5])
    line["data"]["ok"] = [0, 1, 99]  # seq 6 is the demo's third probe round
    lines[5] = json.dumps(line, separators=(",", ":")) + "\n"
    events = "".join(lines).encode()
    rebuilt = edit_manifest({**contents, EVENTS: events}, events_sha256=sha256(events))
    assert_refused_and_unchanged(
        url,
        write_members(tmp_path / "rebuilt.zip", rebuilt),
        f"{EVENTS} line 6: probe_round: shard 99 is out of range",
    )


def test_a_config_or_summary_that_disagrees_with_the_events_is_refused(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, _, path = bundled
    contents = members(path)
    config = json.loads(contents[CONFIG])
    config["unhealthy_threshold"] = 7
    wrong_config = {**contents, CONFIG: json.dumps(config).encode()}
    assert_refused_and_unchanged(
        url,
        write_members(tmp_path / "config.zip", wrong_config),
        f"{CONFIG} differs from the configuration in the run's run_started event",
    )
    summary = json.loads(contents[SUMMARY])
    summary["events_by_type"]["probe_round"] = 3
    wrong_summary = {**contents, SUMMARY: json.dumps(summary).encode()}
    assert_refused_and_unchanged(
        url, write_members(tmp_path / "summary.zip", wrong_summary), f"{SUMMARY} counts events"
    )


def test_a_bundle_of_a_run_already_here_is_refused_without_run(
    bundled: tuple[str, str, Path],
) -> None:
    url, run, path = bundled
    before = tables(url)
    result = refused("import", str(path), "--db", url)
    assert f"run {run!r} already exists here; import it under another name with --run" in (
        result.stderr
    )
    assert tables(url) == before


def test_export_bundle_refusals_write_no_file(sqlite_url: str, tmp_path: Path) -> None:
    run = demo_run(sqlite_url)
    both = refused(
        "export",
        run,
        "-o",
        str(tmp_path / "a.jsonl"),
        "--bundle",
        str(tmp_path / "b.zip"),
        "--db",
        sqlite_url,
    )
    assert "give -o (JSON Lines) or --bundle, not both" in both.stderr
    missing = refused(
        "export", "no-such-run", "--bundle", str(tmp_path / "c.zip"), "--db", sqlite_url
    )
    assert "no run 'no-such-run'" in missing.stderr
    nowhere = tmp_path / "absent" / "d.zip"
    result = refused("export", run, "--bundle", str(nowhere), "--db", sqlite_url)
    assert f"cannot write {nowhere}: there is no directory {nowhere.parent}" in result.stderr
    left = [p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.db")]
    assert left == [], left

    good = tmp_path / "run.zip"
    invoke("export", run, "--bundle", str(good), "--db", sqlite_url)
    with zipfile.ZipFile(io.BytesIO(good.read_bytes())) as archive:
        assert archive.testzip() is None  # every member's CRC checks out
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("ledger.db")] == ["run.zip"]


@pytest.mark.parametrize("damage", ["encrypted flag", "unknown compression"])
def test_a_bundle_member_that_zipfile_cannot_read_is_a_bundle_error(tmp_path, damage):
    """zipfile raises RuntimeError / NotImplementedError for these, not BadZipFile."""
    import io
    import zipfile

    from fleetledger.events.bundle import open_import, write_bundle
    from fleetledger.events.codec import EventCodec
    from fleetledger.events.errors import LedgerError
    from fleetledger.store.log import EventLog
    from tests.builders import run_started

    with EventLog.open(f"sqlite:///{tmp_path}/l.db") as log:
        log.append("r", [run_started()])
        with (tmp_path / "b.zip").open("wb") as stream:
            write_bundle(stream, "r", log.read_stored("r"), log.config("r"), {})
    good = (tmp_path / "b.zip").read_bytes()
    data = bytearray(good)
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        local = archive.getinfo("events.jsonl").header_offset
    central = data.find(b"PK\x01\x02")  # events.jsonl is the archive's first member
    if damage == "encrypted flag":
        data[local + 6] |= 1
        data[central + 8] |= 1
    else:
        data[local + 8 : local + 10] = (99).to_bytes(2, "little")
        data[central + 10 : central + 12] = (99).to_bytes(2, "little")
    with pytest.raises(LedgerError):
        with open_import(io.BytesIO(bytes(data)), "b.zip", EventCodec()) as opened:
            list(opened.rows)


def test_a_summary_time_written_with_plus_zero_is_the_same_instant(
    bundled: tuple[str, str, Path], tmp_path: Path
) -> None:
    """Older versions wrote the membership's ``at`` as ``+00:00``; this one writes ``Z``.
    The same instant is the same summary: no warning. A different instant still warns."""
    url, _, path = bundled
    contents = members(path)
    summary = json.loads(contents[SUMMARY])
    at = summary["membership"]["at"]
    assert at.endswith("Z")
    for name, written, warns in (
        ("older", at.replace("Z", "+00:00"), False),
        ("shifted", at.replace("Z", "+01:00"), True),
    ):
        summary["membership"]["at"] = written
        edited = {**contents, SUMMARY: json.dumps(summary).encode()}
        bundle = write_members(tmp_path / f"{name}.zip", edited)
        result = invoke("import", str(bundle), "--run", f"copy-{name}", "--db", url)
        assert (
            "differs from this fleetledger's fold of its events in at" in result.stderr
        ) is warns
