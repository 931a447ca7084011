"""A run of any size travels: imported and exported in bounded memory, killed imports
leave nothing, and long transfers show their progress on a terminal only.

The large runs are generated on the fly, a thousand lines at a time, and fed to a real
``fleetledger`` process through a pipe: the test never holds them, and neither may the
command. Each command's peak memory is its own (``cli_support.run_child``).
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import sqlite3
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from fleetledger.cli.progress import LOOK_EVERY, Progress, Silent, progress_bar
from fleetledger.events.bundle import EVENTS
from fleetledger.events.models import FleetConfig, ProbeRound, RunStarted, iso_at
from fleetledger.store.log import EventLog
from tests.builders import dump_tables
from tests.cli_support import (
    Child,
    command_env,
    fleetledger_command,
    invoke,
    run_child,
    stderr_on_a_terminal,
    with_progress_after,
)

T0_US = 1_780_000_000_000_000
ROUND_US = 5_000_000
# The limits of the import before it streamed (docs/events.md, Limits, until 2026-12):
# 64 MiB of event text, 80 MiB of bundle. The large run goes past both.
OLD_EXPORT_LIMIT = 64 << 20
BIG_ROUNDS = 100_000  # of 256 shards: ~108 MB of export text
# Peak RSS of one command, generous: an import holds a page of rows and a line, about
# 80 MiB in all (Python, the packages, SQLite's cache); one that held the run would hold
# more than twice its 108 MB of text.
PEAK_RSS_BOUND_MB = 200


def healthy_run(run: str, rounds: int, shards: int) -> Iterator[bytes]:
    """An export of a healthy fleet's run — its run_started, then ``rounds`` rounds in
    which every shard answered — made a thousand lines at a time as it is read."""
    config = FleetConfig(
        shard_count=shards,
        train_world_size=8,
        base_urls=tuple(f"http://gen-{i}.travel:8000/v1" for i in range(shards)),
    )
    started = {
        "run": run,
        "seq": 1,
        "id": f"{run}-1",
        "at": iso_at(T0_US),
        "type": "run_started",
        "schema_version": RunStarted.SCHEMA_VERSION,
        "data": {"config": config.model_dump(mode="json")},
    }
    yield (json.dumps(started, separators=(",", ":")) + "\n").encode()
    ok = json.dumps(list(range(shards)), separators=(",", ":"))
    line = (
        f'{{"run":"{run}","seq":%d,"id":"{run}-%d","at":"%s","type":"probe_round",'
        f'"schema_version":{ProbeRound.SCHEMA_VERSION},"data":{{"ok":{ok},"failed":[],"died":[]}}}}\n'
    )
    batch: list[str] = []
    for seq in range(2, rounds + 2):
        batch.append(line % (seq, seq, iso_at(T0_US + (seq - 1) * ROUND_US)))
        if len(batch) == 1000:
            yield "".join(batch).encode()
            batch = []
    if batch:
        yield "".join(batch).encode()


class Counted:
    """Chunks passed through, their bytes counted."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self.chunks, self.bytes = chunks, 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self.chunks:
            self.bytes += len(chunk)
            yield chunk


def assert_clean(child: Child) -> None:
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    assert "Traceback" not in child.stdout + child.stderr
    assert child.peak_rss_mb < PEAK_RSS_BOUND_MB, f"peak RSS {child.peak_rss_mb:.0f} MiB"


# ── a run past the old limits, in bounded memory ───────────────────────────────


@dataclass(frozen=True)
class BigImport:
    url: str
    work: Path
    fed_bytes: int
    child: Child


@pytest.fixture(scope="module")
def big_import(tmp_path_factory: pytest.TempPathFactory) -> BigImport:
    """``fleetledger import - --run big`` of a 256-shard run past the old limit, fed on
    the fly through a pipe (a stream that cannot seek or be measured first)."""
    work = tmp_path_factory.mktemp("travel")
    url = f"sqlite:///{work}/ledger.db"
    fed = Counted(healthy_run("generated", BIG_ROUNDS, 256))
    child = run_child(["import", "-", "--run", "big", "--db", url, "--json"], work, fed)
    return BigImport(url, work, fed.bytes, child)


def test_a_run_past_the_old_limit_imports_from_a_pipe_in_bounded_memory(
    big_import: BigImport,
) -> None:
    child = big_import.child
    print(f"imported {big_import.fed_bytes:,} bytes, peak RSS {child.peak_rss_mb:.0f} MiB")
    assert big_import.fed_bytes > OLD_EXPORT_LIMIT * 1.3
    assert_clean(child)
    assert json.loads(child.stdout) == {"run": "big", "events": BIG_ROUNDS + 1, "epoch": 0}
    with EventLog.open(big_import.url, mode="read") as log:
        head = log.run_head("big")
        assert head.seq == BIG_ROUNDS + 1
        assert head.at_us == T0_US + BIG_ROUNDS * ROUND_US
    shown = json.loads(invoke("membership", "big", "--json", "--db", big_import.url).stdout)
    assert shown["serving"] == list(range(256))
    assert shown["seq"] == BIG_ROUNDS + 1


def test_the_run_bundles_and_its_bundle_imports_back_in_bounded_memory(
    big_import: BigImport,
) -> None:
    work, url = big_import.work, big_import.url
    bundle = work / "big.zip"
    exported = run_child(["export", "big", "--bundle", str(bundle), "--db", url], work)
    assert_clean(exported)
    with zipfile.ZipFile(bundle) as archive:
        events = archive.getinfo(EVENTS)
        assert events.file_size > OLD_EXPORT_LIMIT * 1.3  # past the old member limit
    imported = run_child(["import", str(bundle), "--run", "again", "--db", url, "--json"], work)
    assert_clean(imported)
    doc = json.loads(imported.stdout)
    assert (doc["run"], doc["events"], doc["bundle"]["run"]) == ("again", BIG_ROUNDS + 1, "big")
    print(
        f"bundle of {events.file_size:,} bytes ({bundle.stat().st_size:,} in the file): "
        f"export peak {exported.peak_rss_mb:.0f} MiB, import peak {imported.peak_rss_mb:.0f} MiB"
    )
    # The same events, read back from both runs.
    with EventLog.open(url, mode="read") as log:
        for first, second in zip(log.read_stored("big"), log.read_stored("again"), strict=True):
            assert [row[:] for row in first] == [row[:] for row in second]
    bundle.unlink()


# ── killed at random moments ────────────────────────────────────────────────────

KILL_ROUNDS = 40_000  # of 64 shards: a few seconds of import


def import_then_kill(url: str, run: str, after_s: float | None) -> int:
    """Import a generated run through a pipe, SIGKILLed ``after_s`` seconds in (None:
    let it finish); its exit status."""
    proc = subprocess.Popen(
        fleetledger_command("import", "-", "--run", run, "--db", url),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=command_env(),
    )
    assert proc.stdin is not None

    def feed() -> None:
        try:
            for chunk in healthy_run("generated", KILL_ROUNDS, 64):
                proc.stdin.write(chunk)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass  # killed: the pipe is gone

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        if after_s is not None:
            try:
                proc.wait(timeout=after_s)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
        status = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    feeder.join(timeout=30)
    return status


def test_an_import_killed_at_random_moments_leaves_no_run_behind(
    ledger_url: str, tmp_path: Path
) -> None:
    """SIGKILL at moments drawn uniformly over a whole import's length (the seed and each
    trial's moment and outcome are printed): each leaves the run absent (killed before
    its commit) or whole (after), never part of it; the run already there is untouched;
    the ledger reads, and SQLite's file passes its integrity check."""
    url = ledger_url
    backend = url.split(":", 1)[0]
    trials = 6 if backend == "sqlite" else 3
    kept = tmp_path / "kept.jsonl"
    kept.write_bytes(b"".join(healthy_run("kept", 100, 8)))
    invoke("import", str(kept), "--db", url)
    before = dump_tables_of(url)
    started = time.monotonic()
    assert import_then_kill(url, "whole", None) == 0
    length = time.monotonic() - started
    with EventLog.open(url, mode="read") as log:
        assert log.head("whole") == KILL_ROUNDS + 1
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    outcomes = []
    for trial in range(trials):
        moment = rng.uniform(0, length)
        run = f"killed-{trial}"
        status = import_then_kill(url, run, moment)
        with EventLog.open(url, mode="read") as log:
            held = {r.run_id: r.head_seq for r in log.runs()}
        # Killed after its commit (in the snapshot pass, or on its way out), a run is
        # whole; before, absent; never in part.
        outcome = "absent" if run not in held else "whole"
        if run in held:
            assert held[run] == KILL_ROUNDS + 1, f"seed {seed}: {run} holds {held[run]} events"
        outcomes.append((round(moment, 2), status, outcome))
    print(f"{backend}: seed {seed}, import {length:.1f} s, trials {outcomes}")
    assert sum(status == -signal.SIGKILL for _, status, _ in outcomes) >= 1
    after = dump_tables_of(url)
    for table, rows in before.items():  # the run there before, and its snapshots, untouched
        if table.startswith("fleetledger_") and "alembic" not in table:
            assert [r for r in after[table] if r[0] == "kept"] == rows, table
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def dump_tables_of(url: str) -> dict[str, list[tuple]]:
    engine = create_engine(url)
    try:
        return dump_tables(engine)
    finally:
        engine.dispose()


# ── progress ────────────────────────────────────────────────────────────────────


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_waits_a_second_then_redraws_at_most_five_times_a_second() -> None:
    clock, screen = Clock(), io.StringIO()
    progress = Progress("importing r", 10_000, screen, clock)
    progress.advance(LOOK_EVERY * 2)
    clock.now += 0.9
    progress.advance(LOOK_EVERY)
    assert screen.getvalue() == ""  # under a second: nothing, however much is done
    clock.now += 0.2
    progress.advance(LOOK_EVERY)  # 2,048 of 10,000 in 1.1 s
    drawn = screen.getvalue()
    assert drawn == "\r\x1b[K" + "importing r: 2,048 of 10,000 events (20%) · 1,862/s · 4 s left"
    clock.now += 0.1
    progress.advance(LOOK_EVERY)
    assert screen.getvalue() == drawn  # redrawn at most every REDRAW_S
    clock.now += 0.15
    progress.update(10_000, 10_000)  # 1.35 s in
    assert screen.getvalue().endswith("10,000 of 10,000 events (100%) · 7,407/s · 0 s left")
    progress.erase()
    assert screen.getvalue().endswith("\r\x1b[K")


def test_progress_without_a_total_says_what_is_done_and_how_fast() -> None:
    clock, screen = Clock(), io.StringIO()
    counted = Progress("importing r", None, screen, clock)
    clock.now += 2
    assert list(counted.count(range(LOOK_EVERY))) == list(range(LOOK_EVERY))
    assert screen.getvalue() == "\r\x1b[K" + "importing r: 512 events · 256/s"


def test_a_total_known_on_demand_is_asked_for_once_when_shown() -> None:
    asked: list[int] = []

    def total() -> int:
        asked.append(1)
        return 4_096

    clock, screen = Clock(), io.StringIO()
    progress = Progress("exporting r", total, screen, clock)
    progress.advance(LOOK_EVERY)
    assert asked == []  # not shown yet: not asked
    clock.now += 1.5
    progress.advance(LOOK_EVERY)
    clock.now += 0.5
    progress.advance(LOOK_EVERY)
    assert asked == [1]
    assert "1,536 of 4,096 events" in screen.getvalue()


def test_off_a_terminal_or_with_json_progress_is_silent() -> None:
    with progress_bar("importing r", 10, quiet=True) as quiet:
        assert isinstance(quiet, Silent)
        items = [1, 2, 3]
        assert list(quiet.count(items)) == items
    # pytest's captured stderr is not a terminal
    with progress_bar("importing r", 10) as piped:
        assert isinstance(piped, Silent)


@pytest.fixture(scope="module")
def small_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A ledger holding run ``small`` (3,001 events), and its export."""
    work = tmp_path_factory.mktemp("small")
    url = f"sqlite:///{work}/ledger.db"
    path = work / "small.jsonl"
    path.write_bytes(b"".join(healthy_run("small", 3_000, 8)))
    invoke("import", str(path), "--db", url)
    return url, path


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (("import", "{file}", "--run", "copy-{n}", "--db", "{url}"), "importing copy-{n}: "),
        (("export", "small", "--db", "{url}", "-o", "{out}"), "exporting small: "),
        (("export", "small", "--db", "{url}", "--bundle", "{out}.zip"), "bundling small: "),
        (("import", "{file}", "--run", "json-{n}", "--db", "{url}", "--json"), None),
        # its lines go to a reader that may be the terminal (`export RUN | less`)
        (("export", "small", "--db", "{url}"), None),
    ],
    ids=["import", "export", "bundle", "import_json", "export_to_a_pipe"],
)
def test_import_and_export_show_progress_on_a_terminal_only(
    small_export: tuple[str, Path], tmp_path: Path, args: tuple[str, ...], shown: str | None
) -> None:
    url, file = small_export
    n = tmp_path.name
    values = {"file": str(file), "url": url, "out": str(tmp_path / "out"), "n": n}
    argv = [a.format(**values) for a in args]
    _stdout, drawn = stderr_on_a_terminal(with_progress_after(0.0, *argv))
    if shown is None:
        assert "events" not in drawn
    else:
        total = sum(1 for _ in file.open())
        assert shown.format(n=n) in drawn
        assert f" of {total:,} events (" in drawn


def test_a_sqlite_import_holds_no_write_lock_while_its_lines_are_read(tmp_path: Path) -> None:
    """SQLite admits one writer at a time: an import reading a slow pipe must not keep a
    live run's appends to the same ledger waiting. The import is fed 5 MB and left
    waiting for more (a write to a pipe returns only once the reader has taken all but
    its last 64 KiB, so the import is well past its first line); an append with a
    0.2 s busy timeout to another run then succeeds, and the import completes after."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    live = tmp_path / "live.jsonl"
    live.write_bytes(b"".join(healthy_run("live", 10, 8)))
    invoke("import", str(live), "--db", url)
    proc = subprocess.Popen(
        fleetledger_command("import", "-", "--run", "slow", "--db", url),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=command_env(),
    )
    assert proc.stdin is not None
    chunks = healthy_run("generated", 20_000, 64)
    try:
        fed = 0
        for chunk in chunks:
            proc.stdin.write(chunk)
            fed += len(chunk)
            if fed > 5 << 20:
                break
        proc.stdin.flush()
        assert proc.poll() is None  # still reading: the pipe is open
        with EventLog.open(f"{url}?timeout=0.2") as log:
            (seq,) = log.append("live", [ProbeRound(ok=(0, 1))])
        assert seq == 12
        for chunk in chunks:
            proc.stdin.write(chunk)
        proc.stdin.close()
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("imported 20001 events as run slow")


def test_the_progress_total_never_reads_a_pipe_twice(tmp_path: Path) -> None:
    """A named pipe (as ``<(zcat run.jsonl.gz)`` is) has no total: counting its lines
    would take the lines the import reads. The pipe is held open for reading and
    writing here (Linux: neither end then waits for the other), lines written into it,
    and after ``lines_of`` they are all still there to read."""
    from fleetledger.cli.progress import lines_of

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(held, b"a\nb\n")
        assert lines_of(str(fifo)) is None
        assert os.read(held, 100) == b"a\nb\n"
    finally:
        os.close(held)
    regular = tmp_path / "regular"
    regular.write_bytes(b"a\nb\nc\n")
    assert lines_of(str(regular)) == 3


# ── an id on two lines, across pages and within one ─────────────────────────────


@pytest.mark.parametrize("spooled", [True, False], ids=["sqlite_spool", "streamed"])
def test_the_first_line_repeating_an_id_is_named_whichever_page_holds_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spooled: bool
) -> None:
    """Pages of five rows: line 7 repeats line 2's id (an earlier page's), and lines 8
    and 10 share one (within a page). Line 7 comes first, so it is the one named; the
    in-page repeat waits for the rows before it to meet the database's unique key."""
    import fleetledger.store.log as log_module
    from fleetledger.events.codec import EventCodec
    from fleetledger.events.jsonl import ExportChecker
    from fleetledger.store.errors import ImportedIdTwice

    monkeypatch.setattr(log_module, "READ_PAGE", 5)
    lines = [json.loads(line) for line in b"".join(healthy_run("r", 12, 4)).splitlines()]
    lines[6]["id"] = lines[1]["id"]
    lines[9]["id"] = lines[7]["id"]
    text = [json.dumps(line) for line in lines]
    url = f"sqlite:///{tmp_path}/ledger.db"
    with EventLog.open(url) as log:
        if not spooled:  # what PostgreSQL does: rows written as they are checked
            monkeypatch.setattr(log.database, "backend", "streamed-here")
        with pytest.raises(ImportedIdTwice) as caught:
            log.import_run("r", ExportChecker(EventCodec()).rows(text))
        assert (caught.value.seq, caught.value.first_seq) == (7, 2)
        assert [r.run_id for r in log.runs()] == []


def test_a_spool_gives_back_every_row_in_order_across_pages_cut_by_rows_and_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetledger.events.jsonl import ImportRow
    from fleetledger.store import import_spool

    monkeypatch.setattr(import_spool, "SPOOL_PAGE", 7)
    monkeypatch.setattr(import_spool, "SPOOL_PAGE_BYTES", 100)
    rows = [
        ImportRow(i, f"id-{i}", 1000 + i, "probe_round", 2, "x" * (i % 40)) for i in range(1, 200)
    ]
    with import_spool.RowSpool(tmp_path) as spool:
        spool.fill(iter(rows))
        assert spool.count == len(rows)
        assert list(spool.rows()) == rows
        assert list(tmp_path.iterdir()) == []  # anonymous: nothing named beside the ledger


def test_a_progress_line_is_cut_to_one_row_of_the_terminal() -> None:
    clock, screen = Clock(), io.StringIO()
    progress = Progress("importing " + "r" * 128, 10, screen, clock)
    progress.width = 40
    clock.now += 2
    progress.update(5, 10)
    drawn = screen.getvalue().removeprefix("\r\x1b[K")
    assert len(drawn) == 39 and drawn.startswith("importing rrr")
