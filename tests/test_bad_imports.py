"""Hostile import data: refused in one line naming where, in bounded memory, nothing written.

An import file, a bundle or a time option comes from someone else. Every case of the
table builds the ledger of ``tests/test_bad_input.py`` (runs r1 and r2), dumps every row,
feeds one hostile input to the ``fleetledger`` CLI and checks: exit status 2, exactly
one ``fleetledger: error:`` line naming what and where (line, member, option, id), no
traceback, every row as it was, and no file left behind (no partial run, no spool).

Then what a table cannot hold: the memory bound, measured on a real child process (a
1 GiB zip bomb and a 100 MB line, from a file and from a pipe: refused under 300 MB of
peak RSS, read from ``os.wait4``), a directory that lies about a member's size, and an
event id re-appended as another event, on SQLite and on the real PostgreSQL server.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from fleetledger.events import bundle as bundle_module
from fleetledger.events import jsonl as jsonl_module
from fleetledger.events.bundle import (
    CONFIG,
    EVENTS,
    MANIFEST,
    SUMMARY,
    BundleError,
    open_import,
)
from fleetledger.events.codec import MAX_JSON_DEPTH, EventCodec
from fleetledger.events.jsonl import ExportChecker
from fleetledger.events.models import (
    Event,
    RefitCompleted,
    RefitStarted,
    RestartRequested,
)
from fleetledger.store.errors import EventIdConflict
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok
from tests.cli_support import Child, file_chunks, invoke, run_child, run_cli
from tests.test_bad_input import (
    R1_HEAD,
    Ctx,
    Line,
    _build,
    assert_cli_error,
    dump,
    import_file,
)

# Far above what any refused import needs (~70 MB: the interpreter and its imports),
# far below what reading the hostile input whole takes (~450 MB to several GB).
PEAK_RSS_LIMIT_MB = 300
ZIP_BOMB_BYTES = 1 << 30
LONG_LINE_BYTES = 100_000_000


@pytest.fixture(autouse=True)
def _sandbox(cli_sandbox: None) -> None:
    """An empty working directory and no settings from the environment (conftest)."""


# ── hostile documents ─────────────────────────────────────────────────────────


def nested(depth: int) -> str:
    """A JSON array nested ``depth`` levels deep."""
    return "[" * depth + "]" * depth


def dumps(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def with_raw(line: dict[str, Any], where: str, raw: str) -> str:
    """``line`` as JSON with ``raw`` (any text, valid JSON or not) as the value at
    ``where`` ('data.config.settings.x'): what ``json.dumps`` would never write."""
    *parents, last = where.split(".")
    doc = json.loads(json.dumps(line))
    target = doc
    for key in parents:
        target = target[key]
    target[last] = "@@RAW@@"
    return dumps(doc).replace('"@@RAW@@"', raw)


SETTINGS = "data.config.settings.hostile"
# Depth of a value placed in settings: the line (1), data (2), config (3), settings (4).
SETTINGS_DEPTH = 4


def raw_at(index: int, where: str, raw: str) -> Callable[[list[dict[str, Any]]], list[Line]]:
    def mutate(lines: list[dict[str, Any]]) -> list[Line]:
        out: list[Line] = list(lines)
        out[index] = with_raw(lines[index], where, raw)
        return out

    return mutate


def line_at(index: int, text: str) -> Callable[[list[dict[str, Any]]], list[Line]]:
    def mutate(lines: list[dict[str, Any]]) -> list[Line]:
        out: list[Line] = list(lines)
        out[index] = text
        return out

    return mutate


def r1_line_2_with_seq_twice(lines: list[dict[str, Any]]) -> list[Line]:
    text = dumps(lines[1])
    assert text.count('"seq":2,') == 1
    return [lines[0], text.replace('"seq":2,', '"seq":2,"seq":2,'), *lines[2:]]


def r1_line_2_with_shard_twice(lines: list[dict[str, Any]]) -> list[Line]:
    text = dumps(lines[1])
    assert text.count('"data":{"shard":0}') == 1
    return [lines[0], text.replace('"data":{"shard":0}', '"data":{"shard":0,"shard":1}')]


def r1_with_a_line_past_the_limit(lines: list[dict[str, Any]]) -> list[Line]:
    long = json.loads(json.dumps(lines[2]))
    long["data"]["error"] = "x" * (1 << 20)
    return [lines[0], lines[1], dumps(long), *lines[3:]]


def r1_with_id_twice(lines: list[dict[str, Any]]) -> list[Line]:
    return [*lines[:3], {**lines[3], "id": lines[1]["id"]}, *lines[4:]]


def jsonl_import(
    mutate: Callable[[list[dict[str, Any]]], list[Line]], *options: str
) -> Callable[[Ctx], list[str]]:
    def prepare(c: Ctx) -> list[str]:
        return ["import", str(import_file(c, mutate)), *options]

    return prepare


def as_copy(mutate: Callable[[list[dict[str, Any]]], list[Line]]) -> Callable[[Ctx], list[str]]:
    return jsonl_import(mutate, "--run", "copy")


def unchanged(lines: list[dict[str, Any]]) -> list[Line]:
    return list(lines)


# ── hostile bundles ───────────────────────────────────────────────────────────

Members = list[tuple[str, bytes]]


def bundle_of_r1(c: Ctx) -> Members:
    """The members of a bundle of run r1, as ``export --bundle`` writes them."""
    path = c.tmp / "r1.zip"
    invoke("export", "r1", "--bundle", str(path), "--db", c.url)
    with zipfile.ZipFile(path) as archive:
        members = [(info.filename, archive.read(info)) for info in archive.infolist()]
    path.unlink()
    return members


def write_zip(path: Path, members: Members, method: int = zipfile.ZIP_DEFLATED) -> Path:
    written: set[str] = set()
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        for name, data in members:
            if name in written:  # what a hostile archiver does; zipfile only warns
                with pytest.warns(UserWarning, match="Duplicate name"):
                    archive.writestr(name, data)
            else:
                archive.writestr(name, data)
            written.add(name)
    return path


def replaced(members: Members, name: str, data: bytes) -> Members:
    return [(n, data if n == name else d) for n, d in members]


def with_events(members: Members, events: bytes) -> Members:
    """New events, and a manifest whose SHA-256 and count agree with them."""
    manifest = json.loads(dict(members)[MANIFEST])
    manifest["events_sha256"] = hashlib.sha256(events).hexdigest()
    manifest["events"] = events.count(b"\n")
    return replaced(replaced(members, EVENTS, events), MANIFEST, dumps(manifest).encode())


def events_line(members: Members, index: int, edit: Callable[[str], str]) -> Members:
    lines = dict(members)[EVENTS].decode().splitlines(keepends=True)
    lines[index] = edit(lines[index].rstrip("\n")) + "\n"
    return with_events(members, "".join(lines).encode())


def bundle_import(
    edit: Callable[[Members], Members], method: int = zipfile.ZIP_DEFLATED
) -> Callable[[Ctx], list[str]]:
    def prepare(c: Ctx) -> list[str]:
        path = write_zip(c.tmp / "hostile.zip", edit(bundle_of_r1(c)), method)
        return ["import", str(path), "--run", "copy"]

    return prepare


def manifest_with_format_twice(members: Members) -> Members:
    text = dict(members)[MANIFEST].decode()
    assert text.count('"format": "fleetledger-bundle"') == 1
    doubled = text.replace(
        '"format": "fleetledger-bundle"',
        '"format": "fleetledger-bundle", "format": "fleetledger-bundle"',
    )
    return replaced(members, MANIFEST, doubled.encode())


def config_with_nan(members: Members) -> Members:
    config = json.loads(dict(members)[CONFIG])
    return replaced(members, CONFIG, with_raw(config, "settings.hostile", "NaN").encode())


def summary_nested_100000(members: Members) -> Members:
    summary = json.loads(dict(members)[SUMMARY])
    return replaced(members, SUMMARY, with_raw(summary, "deep", nested(100_000)).encode())


def events_line_2_with_seq_twice(members: Members) -> Members:
    return events_line(members, 1, lambda t: t.replace('"seq":2,', '"seq":2,"seq":2,', 1))


def events_line_4_with_line_2s_id(members: Members) -> Members:
    """Line 4 under line 2's id, with a manifest and summary that agree (re-hashed)."""
    return events_line(members, 3, lambda t: t.replace('"id":"r1-4"', '"id":"r1-2"', 1))


def events_line_1_with_infinity(members: Members) -> Members:
    return events_line(members, 0, lambda t: with_raw(json.loads(t), SETTINGS, "Infinity"))


def a_hundred_more_members(members: Members) -> Members:
    return [*members, *((f"padding/{i}.txt", b"") for i in range(100))]


def manifest_twice(members: Members) -> Members:
    return [*members, (MANIFEST, dict(members)[MANIFEST])]


# ── the table ─────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class Case:
    name: str
    # Builds the input files under ctx.tmp; returns the command line (without --db).
    prepare: Callable[[Ctx], list[str]]
    fragments: tuple[str, ...]
    # (module, attribute, value): a limit lowered so a small input crosses it.
    patches: tuple[tuple[Any, str, Any], ...] = field(default=())


def _options(*args: str) -> Callable[[Ctx], list[str]]:
    return lambda _c: list(args)


CASES: list[Case] = [
    # ── JSON an import line must not hold ──
    Case(
        "line_nested_100000_deep",
        as_copy(raw_at(1, "data.deep", nested(100_000))),
        ("line 2: nested deeper than 64 levels",),
    ),
    Case(
        "line_nested_one_level_past_the_limit",
        as_copy(raw_at(0, SETTINGS, nested(MAX_JSON_DEPTH + 1 - SETTINGS_DEPTH))),
        (f"line 1: nested deeper than {MAX_JSON_DEPTH} levels",),
    ),
    Case(
        "integer_past_the_digit_limit",
        as_copy(raw_at(1, "data.shard", "1" + "0" * 5000)),
        (f"line 2: an integer has more than {sys.get_int_max_str_digits()} digits",),
    ),
    Case(
        "nan",
        as_copy(raw_at(0, SETTINGS, "NaN")),
        ("line 1: NaN is not a JSON number",),
    ),
    Case(
        "infinity",
        as_copy(raw_at(0, SETTINGS, "Infinity")),
        ("line 1: Infinity is not a JSON number",),
    ),
    Case(
        "minus_infinity",
        as_copy(raw_at(0, SETTINGS, "[1, -Infinity]")),
        ("line 1: -Infinity is not a JSON number",),
    ),
    Case(
        "number_that_overflows_a_float",
        as_copy(raw_at(0, SETTINGS, "1e999")),
        ("line 1: the number 1e999 overflows a float",),
    ),
    Case(
        "top_level_key_twice",
        as_copy(r1_line_2_with_seq_twice),
        ("line 2: duplicate key 'seq'",),
    ),
    Case(
        "data_key_twice",
        as_copy(r1_line_2_with_shard_twice),
        ("line 2: duplicate key 'shard'",),
    ),
    Case(
        "lone_surrogate_escape",
        as_copy(raw_at(0, SETTINGS, '"\\ud800"')),
        ("line 1: a \\u escape names a lone UTF-16 surrogate",),
    ),
    # ── sizes ──
    Case(
        "line_past_the_length_limit",
        as_copy(r1_with_a_line_past_the_limit),
        ("line 3: longer than 1,048,576 bytes", "docs/events.md"),
    ),
    # ── times and ids ──
    Case(
        "time_before_year_1_in_utc",
        as_copy(lambda ls: [{**ls[0], "at": "0001-01-01T00:00:00+14:00"}, *ls[1:]]),
        ("line 1: time 0001-01-01T00:00:00+14:00 is outside the times a log stores",),
    ),
    Case(
        "time_before_1970",
        as_copy(lambda ls: [{**ls[0], "at": "1969-12-31T23:59:59Z"}, *ls[1:]]),
        ("line 1: time 1969-12-31T23:59:59Z is outside the times a log stores",),
    ),
    Case(
        "id_twice_names_both_lines",
        as_copy(r1_with_id_twice),
        ("line 4: event id r1-2 appears twice (also on line 2)",),
    ),
    Case(
        "empty_run_option",
        jsonl_import(unchanged, "--run", ""),
        ("--run '': a run id must be 1..128 printable characters",),
    ),
    # ── bundle members ──
    Case(
        "bundle_manifest_key_twice",
        bundle_import(manifest_with_format_twice),
        (f"{MANIFEST}: duplicate key 'format'",),
    ),
    Case(
        "bundle_config_nan",
        bundle_import(config_with_nan),
        (f"{CONFIG}: NaN is not a JSON number",),
    ),
    Case(
        "bundle_summary_nested_100000_deep",
        bundle_import(summary_nested_100000),
        (f"{SUMMARY}: nested deeper than 64 levels",),
    ),
    Case(
        "bundle_events_key_twice",
        bundle_import(events_line_2_with_seq_twice),
        (f"{EVENTS} line 2: duplicate key 'seq'",),
    ),
    Case(
        "bundle_events_infinity",
        bundle_import(events_line_1_with_infinity),
        (f"{EVENTS} line 1: Infinity is not a JSON number",),
    ),
    Case(
        "bundle_with_too_many_members",
        bundle_import(a_hundred_more_members),
        ("the zip directory lists 104 members", "at most 64 members"),
    ),
    Case(
        "bundle_member_twice",
        bundle_import(manifest_twice),
        (f"more than one member named '{MANIFEST}'",),
    ),
    Case(
        "bundle_member_in_bzip2",
        bundle_import(lambda ms: ms, zipfile.ZIP_BZIP2),
        (f"{MANIFEST} is compressed with zip method 12", "stored or deflated"),
    ),
    Case(
        "bundle_member_inflating_past_the_ratio",
        bundle_import(lambda ms: ms),
        (f"{EVENTS} is ", "bytes uncompressed from ", "more than 2 times", "zip bomb"),
        patches=((bundle_module, "MAX_INFLATION", 2), (bundle_module, "INFLATION_FLOOR_BYTES", 0)),
    ),
    Case(
        "bundle_document_past_its_limit",
        bundle_import(lambda ms: ms),
        (f"{MANIFEST} is ", "bytes uncompressed, says the zip directory", "at most 100 "),
        patches=((bundle_module, "MAX_DOCUMENT_BYTES", 100),),
    ),
    Case(
        "bundle_events_id_twice",
        bundle_import(events_line_4_with_line_2s_id),
        (f"{EVENTS} line 4: event id r1-2 appears twice (also on line 2)",),
    ),
    # ── time options ──
    Case(
        "at_year_1_plus_14_hours",
        _options("membership", "r1", "--at", "0001-01-01T00:00:00+14:00"),
        ("--at '0001-01-01T00:00:00+14:00': in UTC that is outside the times",),
    ),
    Case(
        "at_year_9999_minus_14_hours",
        _options("membership", "r1", "--at", "9999-12-31T23:59:59-14:00"),
        ("--at '9999-12-31T23:59:59-14:00': in UTC that is outside the times",),
    ),
    Case(
        "until_year_1_plus_14_hours",
        _options("replay", "r1", "--until", "0001-01-01T00:00:00+14:00"),
        ("--until '0001-01-01T00:00:00+14:00': in UTC that is outside the times",),
    ),
    Case(
        "at_superscript_digit",
        _options("membership", "r1", "--at", "²"),
        ("--at '²' is not a seq (an integer) or an ISO 8601 time",),
    ),
    Case(
        "at_seq_of_5000_digits",
        _options("membership", "r1", "--at", "9" * 5000),
        ("--at 9999", f"is not a seq of run 'r1': it has seqs 1..{R1_HEAD}"),
    ),
]


def files_under(directory: Path) -> dict[str, str]:
    """Relative path -> SHA-256 of every file (the ledger's own files excepted)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.name.startswith("ledger.db")
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_refused_in_one_line_and_changes_nothing(
    case: Case, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _build(sqlite_url)
    ctx = Ctx(sqlite_url, "sqlite", tmp_path)
    args = case.prepare(ctx)
    for module, name, value in case.patches:
        monkeypatch.setattr(module, name, value)
    rows_before, files_before = dump(sqlite_url), files_under(tmp_path)

    result: Result = run_cli(*args, "--db", sqlite_url)

    assert_cli_error(result, case.fragments)
    assert dump(sqlite_url) == rows_before, "the stored log changed"
    assert files_under(tmp_path) == files_before, "a file was left behind or changed"


def test_a_line_at_the_depth_and_length_limits_imports_and_one_past_either_does_not(
    sqlite_url: str, tmp_path: Path
) -> None:
    """The limits refuse what is past them, not what reaches them."""
    _build(sqlite_url)
    ctx = Ctx(sqlite_url, "sqlite", tmp_path)

    def line_1(depth: int, length: int) -> Callable[[list[dict[str, Any]]], list[Line]]:
        def mutate(lines: list[dict[str, Any]]) -> list[Line]:
            first = json.loads(json.dumps(lines[0]))
            first["data"]["config"]["settings"]["pad"] = ""
            text = with_raw(first, SETTINGS, nested(depth - SETTINGS_DEPTH))
            text = text.replace('"pad":""', '"pad":"' + "p" * (length - len(text)) + '"')
            assert len(text.encode()) == length
            return [text, *lines[1:]]

        return mutate

    def import_line_1(depth: int, length: int, run: str) -> Result:
        path = str(import_file(ctx, line_1(depth, length)))
        return run_cli("import", path, "--run", run, "--db", sqlite_url)

    depth, length = MAX_JSON_DEPTH, jsonl_module.MAX_LINE_BYTES
    assert import_line_1(depth, length, "at-both-limits").exit_code == 0
    with EventLog.open(sqlite_url) as log:
        assert log.head("at-both-limits") == R1_HEAD
    before = dump(sqlite_url)
    deeper = import_line_1(depth + 1, length, "deeper")
    assert_cli_error(deeper, [f"line 1: nested deeper than {depth} levels"])
    longer = import_line_1(depth, length + 1, "longer")
    assert_cli_error(longer, [f"line 1: longer than {length:,} bytes"])
    assert dump(sqlite_url) == before


# ── a directory that lies ─────────────────────────────────────────────────────


class LyingArchive:
    """A real archive whose directory understates one member's size."""

    def __init__(self, archive: zipfile.ZipFile, name: str, claimed: int) -> None:
        self._archive, self._name, self._claimed = archive, name, claimed

    def _lie(self, info: zipfile.ZipInfo) -> zipfile.ZipInfo:
        if info.filename != self._name:
            return info
        told = zipfile.ZipInfo(info.filename, info.date_time)
        told.compress_type, told.file_size = info.compress_type, self._claimed
        return told

    def infolist(self) -> list[zipfile.ZipInfo]:
        return [self._lie(info) for info in self._archive.infolist()]

    def getinfo(self, name: str) -> zipfile.ZipInfo:
        return self._lie(self._archive.getinfo(name))

    def open(self, info: zipfile.ZipInfo) -> Any:
        return self._archive.open(info.filename)  # the real member: it inflates past the lie


@pytest.mark.parametrize("member", [EVENTS, SUMMARY])
def test_a_member_that_inflates_past_what_the_directory_says_is_refused_while_streaming(
    member: str, sqlite_url: str, tmp_path: Path
) -> None:
    _build(sqlite_url)
    members = bundle_of_r1(Ctx(sqlite_url, "sqlite", tmp_path))
    claimed = len(dict(members)[member]) - 1  # one byte short: the lie is found at its end
    path = write_zip(tmp_path / "lying.zip", members)
    with zipfile.ZipFile(path) as real, ExitStack() as stack, pytest.raises(BundleError) as info:
        lying: Any = LyingArchive(real, member, claimed=claimed)
        bundle_module._open_bundle(lying, "lying.zip", ExportChecker(EventCodec()), stack)
    assert f"{member} inflates past the {claimed:,} bytes the zip directory says it holds" in str(
        info.value
    )


def test_a_bundle_opened_without_the_command_is_held_to_the_inflation_ratio(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _build(sqlite_url)
    path = write_zip(tmp_path / "b.zip", bundle_of_r1(Ctx(sqlite_url, "sqlite", tmp_path)))
    monkeypatch.setattr(bundle_module, "MAX_INFLATION", 1)
    monkeypatch.setattr(bundle_module, "INFLATION_FLOOR_BYTES", 0)
    with pytest.raises(BundleError, match="more than 1 times"):
        with path.open("rb") as stream, open_import(stream, "b.zip", EventCodec()) as opened:
            list(opened.rows)


# ── memory, on a real child process ───────────────────────────────────────────


def assert_refused_in_bounded_memory(child: Child, fragments: tuple[str, ...]) -> None:
    assert child.returncode == 2, (child.returncode, child.stderr[-2000:])
    assert "Traceback" not in child.stdout + child.stderr
    assert child.stdout == ""
    lines = child.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("fleetledger: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert child.peak_rss_mb < PEAK_RSS_LIMIT_MB, f"peak RSS {child.peak_rss_mb:.0f} MB"


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bundle whose events.jsonl is one 1 GiB line of zeros, deflated to ~1 MB, with
    a manifest that agrees with it (SHA-256, one line): only its size is wrong. Built
    streaming, so the test holds one megabyte of it at a time."""
    path = tmp_path_factory.mktemp("bomb") / "bomb.zip"
    digest = hashlib.sha256()
    chunk = b"0" * (1 << 20)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open(EVENTS, "w") as member:
            for _ in range(ZIP_BOMB_BYTES // len(chunk)):
                member.write(chunk)
                digest.update(chunk)
            member.write(b"\n")
            digest.update(b"\n")
        manifest = {
            "format": "fleetledger-bundle",
            "format_version": 1,
            "fleetledger_version": "0",
            "run": "bomb",
            "events": 1,
            "events_sha256": digest.hexdigest(),
            "created": "2026-11-29T10:18:20.000000Z",
        }
        archive.writestr(MANIFEST, dumps(manifest))
        archive.writestr(CONFIG, "{}")
        archive.writestr(SUMMARY, "{}")
    assert path.stat().st_size < 4 << 20
    return path


@pytest.fixture(scope="module")
def long_line(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSON Lines file whose first line is 100 MB: a string that never ends."""
    path = tmp_path_factory.mktemp("long") / "long.jsonl"
    with path.open("wb") as fh:
        fh.write(b'{"run":"r","seq":1,"id":"')
        for _ in range(LONG_LINE_BYTES // (1 << 20)):
            fh.write(b"x" * (1 << 20))
        fh.write(b'"}\n')
    return path


@pytest.mark.parametrize("via", ["file", "pipe"])
@pytest.mark.parametrize(
    ("hostile", "fragments"),
    [
        (
            "zip_bomb",
            (f"{EVENTS} is 1,073,741,825 bytes uncompressed from ", "more than 400 times"),
        ),
        ("long_line", ("line 1: longer than 1,048,576 bytes",)),
    ],
)
def test_hostile_input_is_refused_in_bounded_memory(
    hostile: str,
    fragments: tuple[str, ...],
    via: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    source: Path = request.getfixturevalue(hostile)
    work = tmp_path / "work"
    work.mkdir()
    url = f"sqlite:///{work}/ledger.db"
    _build(url)
    before, files = dump(url), files_under(work)
    file_arg, stdin_from = (str(source), None) if via == "file" else ("-", file_chunks(source))

    child = run_child(["import", file_arg, "--run", "copy", "--db", url], work, stdin_from)

    print(f"{hostile} via {via}: peak RSS {child.peak_rss_mb:.0f} MB")
    assert_refused_in_bounded_memory(child, fragments)
    assert dump(url) == before
    assert files_under(work) == files


# ── an event id is one event ──────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (
            lambda: RestartRequested(id="r1-2", shard=0),
            "as a 'probe_succeeded' event, not 'restart_requested'",
        ),
        (
            lambda: probe_failed(0, "timeout", "no answer", id="r1-2"),
            "as a 'probe_succeeded' event (read as 'probe_round') with other failed, ok",
        ),
        (
            lambda: probe_ok(1, id="r1-2"),
            "as a 'probe_succeeded' event (read as 'probe_round') with other ok",
        ),
    ],
    ids=["another_type", "another_result", "another_shard"],
)
def test_a_stored_id_is_a_retry_only_with_the_same_content(
    ledger_url: str, other: Callable[[], Event], named: str
) -> None:
    """r1-2 is a v1 ``probe_succeeded`` row of shard 0 at seq 2, read as the one-shard
    round it means: resent as that round, it is a retry (its seq, nothing written);
    resent as another event, it is refused naming the id, the seq and the stored type,
    and the batch's other, new event is not written either."""
    _build(ledger_url)
    before = dump(ledger_url)
    with EventLog.open(ledger_url) as log:
        with pytest.raises(EventIdConflict) as info:
            log.append("r1", [probe_ok(2, id="new-1"), other()])
        assert (info.value.event_id, info.value.stored_seq, info.value.index) == ("r1-2", 2, 1)
        assert f"event id r1-2 is already stored at seq 2 {named}" in str(info.value)
        assert "run 'r1', event #1 of the batch" in str(info.value)
        assert dump(ledger_url) == before

        assert log.append("r1", [probe_ok(0, id="r1-2")]) == [2]
        read_back = [r.event for r in log.read("r1", 1, 3)]
        assert log.append("r1", read_back) == [2, 3]  # what was read, resent: a retry
    with EventLog.open(ledger_url) as fresh:  # another process: no cached head or config
        assert fresh.append("r1", [probe_ok(0, id="r1-2")]) == [2]
        with pytest.raises(EventIdConflict):
            fresh.append("r1", [other()])
    assert dump(ledger_url) == before


def stored_rows(log: EventLog, run: str, first: int, last: int) -> list[tuple[Any, ...]]:
    return [tuple(row) for page in log.read_stored(run, first - 1, last) for row in page]


def test_a_retry_of_a_whole_batch_with_one_changed_event_is_refused(ledger_url: str) -> None:
    _build(ledger_url)
    before = dump(ledger_url)
    batch: list[Event] = [
        RefitStarted(id="r1-4", weight_version=1, shards=(0, 1, 2)),
        RefitCompleted(id="r1-5", weight_version=2, shards=(0, 1, 2)),
    ]
    with EventLog.open(ledger_url) as log:
        with pytest.raises(EventIdConflict, match="at seq 5 as a 'refit_completed' event with "):
            log.append("r1", batch)
        batch[1] = RefitCompleted(id="r1-5", weight_version=1, shards=(0, 1, 2))
        assert log.append("r1", batch) == [4, 5]
    assert dump(ledger_url) == before


def test_an_imported_run_recognises_a_retry_by_content_not_by_bytes(
    ledger_url: str, tmp_path: Path
) -> None:
    """An import keeps the file's key order and escapes, which the codec does not write:
    the same event still compares equal, and another one is still refused."""
    _build(ledger_url)
    error = "no answer from 127.0.0.1 — 5 s"
    with EventLog.open(ledger_url) as log:
        log.append("r1", [probe_failed(2, "error", error, id="r1-7")])
    ctx = Ctx(ledger_url, "sqlite", tmp_path)

    def reordered(lines: list[dict[str, Any]]) -> list[Line]:
        last = lines[-1]
        last["data"] = dict(reversed(list(last["data"].items())))
        return [*lines[:-1], json.dumps(last, ensure_ascii=True)]

    invoke("import", str(import_file(ctx, reordered)), "--run", "copy", "--db", ledger_url)
    with EventLog.open(ledger_url) as log:
        stored = [r for r in dump(ledger_url)["fleetledger_events"] if r[:2] == ("copy", 7)]
        assert "\\u2014" in stored[0][6], "the import kept the file's escapes"
        before = dump(ledger_url)
        same = probe_failed(2, "error", error, id="r1-7")
        assert log.append("copy", [same]) == [7]
        with pytest.raises(EventIdConflict, match="with other failed"):
            log.append("copy", [probe_failed(2, "error", "other", id="r1-7")])
        # The copy holds r1's v1 probe rows as they were; the rounds they read as, resent,
        # are retries too.
        assert [row[3:5] for row in stored_rows(log, "copy", 2, 3)] == [
            ("probe_succeeded", 1),
            ("probe_failed", 1),
        ]
        old = [probe_ok(0, id="r1-2"), probe_failed(1, "timeout", "no answer", id="r1-3")]
        assert log.append("copy", old) == [2, 3]
    assert dump(ledger_url) == before
