"""Hand-run benchmark: reading at the speed of the raw store, a ledger that grows with
probe rounds, not shards, and runs of any size that travel. Every figure is printed
beside what it is compared with, measured in the same run (interleaved where both sides
are timed).

Run it by hand (it asserts nothing about timing)::

    pip install -e '.[bench]'          # eventsourcing, the comparison
    python bench/bench_scale.py [--events N] [--days D] [--db-dir DIR] [--skip-week]

1. **Replay of an imported 1M-event schema-version-1 run** (per-shard probe events, as
   ledgers written before probe rounds hold them, read through the codec's upcasters;
   the run ``bench_ledger.py --v1-probes`` builds and caches), exported and imported
   into a fresh ledger through the CLI (``export -o``, then ``import``: streamed, page
   by page, with its snapshot pass), its bytes per event stored with and without ids:
   ``fleetledger replay RUN --json`` (CLI code path, in process, into a null sink; and
   as a process) and the library fold (``fold_pages`` of ``read_pages(ids=False)``),
   against eventsourcing's raw notification read of the same events
   (``SQLiteApplicationRecorder.select_notifications`` in pages of 1000, the same
   payloads stored as the events' state). Targets: ≥ 2.0× and ≥ 2.0×.
2. ``membership`` of the imported run, at the head and ``--at`` random seqs (median,
   CLI code path): target ≤ 100 ms plus start-up; start-up (``fleetledger --version``,
   as a process): target ≤ 250 ms; ``membership`` as a process (of the imported run, of
   a one-event run), start-up included: target ≤ 350 ms.
3. Batches of 100 appended: ``EventLog.append`` vs eventsourcing's ``insert_events``,
   the same rows, both SQLite in WAL with ``synchronous=FULL`` (read back and printed),
   interleaved batch by batch: target ≥ 1.0×.
4. Storage per probed shard, healthy 256-shard fleet: 1,000 rounds written as
   ``probe_round`` events vs as the per-shard v1 rows older ledgers hold: target ≥ 10×
   smaller.
5. **A week of a 256-shard fleet** probed every 5 s (120,960 rounds), written through
   ``Ledger.record_probes`` — the normal append path, one durable transaction per round —
   on a compressed clock, with an incident a day (a failing shard, a death, a restart, a
   replacement and the refit that re-admits it): ledger size (≤ 1 GB), full
   ``replay --json`` (≤ 10 s) and ``membership --at`` a random time (≤ 100 ms).
6. **The week travels**: ``export -o``, ``export --bundle``, and ``import`` of each into
   a fresh ledger, each as a process: file size, seconds, peak RSS (the old limits,
   64 MiB of event text and 80 MiB of bundle, would have refused both).
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_forensics import NullSink, cli
from bench_ledger import (
    DEFAULT_DB_DIR,
    RUN,
    bench_db_dir,
    build_replay_db,
    cached_head,
    generate,
    line,
    note,
    remove_db,
    replay_db_path,
    sqlite_url,
    verdict,
)
from sqlalchemy import insert

from fleetledger.controller.ledger import Ledger, ProbeResult, round_event
from fleetledger.events.bundle import MAX_INFLATION
from fleetledger.events.legacy import ProbeSucceededV1
from fleetledger.events.models import FleetConfig, RunStarted, iso_at
from fleetledger.projections.fleet_view import fold_pages
from fleetledger.projections.snapshot import to_snapshot
from fleetledger.store.log import EventLog
from fleetledger.store.schema import events as events_table

FLEETLEDGER = str(Path(sys.executable).parent / "fleetledger")
# Processes keep their bytecode in a temporary cache, as an installed package's is kept,
# even where the shell sets PYTHONDONTWRITEBYTECODE (every process would compile every
# module again); none of the shell's fleetledger settings.
PROCESS_ENV = {
    **{
        k: v
        for k, v in os.environ.items()
        if k != "PYTHONDONTWRITEBYTECODE" and not k.startswith("FLEETLEDGER_")
    },
    "PYTHONPYCACHEPREFIX": tempfile.mkdtemp(prefix="fleetledger-bench-pyc-"),
}
STARTUP_TARGET_S = 0.25
READ_TARGET_S = STARTUP_TARGET_S + 0.1  # a read command: ≤ 100 ms plus start-up
IMPORTED = "imported"
WEEK_RUN = "week"
ROUND_S = 5.0


def best_of(repeat: int, sides: Sequence[Callable[[], Any]]) -> list[float]:
    """Each side ``repeat`` times, side after side (interleaved); the best wall time each."""
    best = [float("inf")] * len(sides)
    for _ in range(repeat):
        for i, side in enumerate(sides):
            gc.collect()
            t0 = time.perf_counter()
            side()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def process_s(args: Sequence[str], samples: int = 5) -> float:
    """Median wall time of the installed command as a process, stdout to /dev/null,
    after one run that is not timed (bytecode, the disk cache)."""
    times = []
    with open(os.devnull, "w") as devnull:
        for sample in range(samples + 1):
            t0 = time.perf_counter()
            subprocess.run([FLEETLEDGER, *args], stdout=devnull, check=True, env=PROCESS_ENV)
            if sample:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ratio_line(section: str, label: str, ours: float, theirs: float, target: float) -> None:
    ratio = theirs / ours
    line(
        section,
        label,
        f"{ratio:8.2f}×  (ours {ours:.2f} s, eventsourcing {theirs:.2f} s; target ≥ {target}×: "
        f"{verdict(ratio >= target)})",
    )


# ── 1, 2: the imported 1M-event run ───────────────────────────────────────────


def ensure_v1_run(db_dir: Path, events: int) -> Path:
    """The run ``bench_ledger.py --v1-probes`` caches: its probes v1 rows, one per shard."""
    path = replay_db_path(db_dir, events, 8, 20261129, v1=True)
    if cached_head(path) != events:
        remove_db(path)
        build_replay_db(path, events, 8, 20261129, v1=True)
    return path


def import_run(source: Path, target: Path) -> tuple[float, float]:
    """The source run exported and imported under ``IMPORTED`` through the CLI, streamed
    (the import's snapshot pass included); (export seconds, import seconds)."""
    remove_db(target)
    export = target.with_suffix(".jsonl")
    t0 = time.perf_counter()
    cli(["export", RUN, "--db", sqlite_url(source), "-o", str(export)], NullSink())
    t1 = time.perf_counter()
    cli(["import", str(export), "--run", IMPORTED, "--db", sqlite_url(target)], NullSink())
    t2 = time.perf_counter()
    export.unlink()
    return t1 - t0, t2 - t1


def payload_bytes(url: str, run: str) -> tuple[float, float]:
    """Mean payload bytes per event as stored (without ids), and as the same payloads
    were stored before schema revision 0003 (with ``{"id":"…","type":"…",`` in front)."""
    stored = with_ids = events = 0
    with EventLog.open(url, mode="read") as log:
        for page in log.read_stored(run):
            for _seq, _at, event_id, type_, _version, payload in page:
                events += 1
                stored += len(payload)
                if payload.startswith('{"id":"'):
                    with_ids += len(payload)
                else:
                    opening = len('{"id":"') + len(event_id) + len('","type":"') + len(type_)
                    with_ids += opening + len('",') + len(payload) - 1
    return stored / events, with_ids / events


def eventsourcing_store(source: Path, target: Path) -> Any:
    """The same events in eventsourcing's SQLite application recorder."""
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    if not target.exists():
        remove_db(target)
        tmp = target.with_name(f".building-{target.name}")
        remove_db(tmp)
        recorder = SQLiteApplicationRecorder(SQLiteDatastore(str(tmp)))
        recorder.create_table()
        originator = uuid.uuid4()
        with EventLog.open(sqlite_url(source), mode="read") as src:
            for page in src.read_stored(RUN):
                for lo in range(0, len(page), 1000):
                    recorder.insert_events(
                        [
                            StoredEvent(originator, seq, type_, payload.encode())
                            for seq, _at, _id, type_, _v, payload in page[lo : lo + 1000]
                        ]
                    )
        del recorder
        os.replace(tmp, target)
        remove_db(tmp)
    return SQLiteApplicationRecorder(SQLiteDatastore(str(target)))


def read_all_notifications(recorder: Any) -> int:
    count, start = 0, 1
    while True:
        page = recorder.select_notifications(start, 1000)
        if not page:
            return count
        count += len(page)
        start = page[-1].id + 1


def bench_imported(db_dir: Path, events: int, repeat: int, samples: int) -> None:
    source = ensure_v1_run(db_dir, events)
    target = db_dir / f"imported-v1-{events}.sqlite"
    export_s, import_s = import_run(source, target)
    url = sqlite_url(target)
    with EventLog.open(url, mode="read") as log:
        head = log.head(IMPORTED)
    line(
        "1",
        "imported run (CLI export, then import)",
        f"{head:,} events: export {export_s:.1f} s, import + snapshots {import_s:.1f} s "
        f"-> {target} ({target.stat().st_size / head:.0f} B/event on disk)",
    )
    stored, with_ids = payload_bytes(url, IMPORTED)
    line(
        "1",
        "payload per event, stored without / with ids",
        f"{stored:8.1f} B vs {with_ids:.1f} B ({with_ids / stored:.1f}× smaller)",
    )
    recorder = eventsourcing_store(source, db_dir / f"eventsourcing-{events}.sqlite")
    assert read_all_notifications(recorder) == head

    def library_fold() -> None:
        with EventLog.open(url, mode="read") as log:
            fold_pages(log.read_pages(IMPORTED, ids=False))

    sink = NullSink()
    ours_cli, ours_fold, theirs = best_of(
        repeat,
        [
            lambda: cli(["replay", IMPORTED, "--json", "--db", url], sink),
            library_fold,
            lambda: read_all_notifications(recorder),
        ],
    )
    scale = "" if events == 1_000_000 else f" (scaled from {events:,})"
    ratio_line("1", f"replay --json (CLI code path) vs raw read{scale}", ours_cli, theirs, 2.0)
    ratio_line("1", "library fold vs raw read", ours_fold, theirs, 2.0)
    whole = process_s(["replay", IMPORTED, "--json", "--db", url], samples=1)
    ratio_line("1", "replay --json as a process (start-up included)", whole, theirs, 1.0)

    # 2: membership of the imported run, through the CLI code path.
    def median_ms(args: Sequence[str], points: Sequence[str | None]) -> float:
        times = []
        for point in points:
            at = [] if point is None else ["--at", point]
            t0 = time.perf_counter()
            cli(["membership", IMPORTED, "--json", "--db", url, *at], NullSink())
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e3

    rng = random.Random(14)
    at_head = median_ms([], [None] * samples)
    at_seq = median_ms([], [str(rng.randint(1, head)) for _ in range(samples)])
    startup = process_s(["--version"])
    line(
        "2",
        "membership of the imported run (head, CLI code path)",
        f"{at_head:8.1f} ms  (median of {samples}; target ≤ 100 ms + start-up: "
        f"{verdict(at_head <= 100)})",
    )
    line("2", "membership --at a random seq", f"{at_seq:8.1f} ms  ({verdict(at_seq <= 100)})")
    whole = process_s(["membership", IMPORTED, "--db", url])
    line(
        "2",
        "membership of the imported run, as a process",
        f"{whole * 1e3:8.1f} ms  (target ≤ {READ_TARGET_S * 1e3:.0f} ms, 100 ms + start-up: "
        f"{verdict(whole <= READ_TARGET_S)}; `fleetledger --version`: {startup * 1e3:.0f} ms)",
    )


def bench_startup(db_dir: Path) -> None:
    tiny = db_dir / "tiny.sqlite"
    remove_db(tiny)
    with EventLog.open(sqlite_url(tiny)) as log:
        Ledger.start(log, "tiny", week_config(4))
    base = statistics.median(_time_process([sys.executable, "-c", "pass"]) for _ in range(5))
    version = process_s(["--version"])
    membership = process_s(["membership", "tiny", "--db", sqlite_url(tiny)])
    line(
        "2",
        "start-up: fleetledger --version (process)",
        f"{version * 1e3:8.0f} ms  (target ≤ {STARTUP_TARGET_S * 1e3:.0f} ms: "
        f"{verdict(version <= STARTUP_TARGET_S)}; a bare interpreter: {base * 1e3:.0f} ms)",
    )
    line(
        "2",
        "start-up: membership of a one-event run (process)",
        f"{membership * 1e3:8.0f} ms  (target ≤ {READ_TARGET_S * 1e3:.0f} ms, 100 ms + "
        f"start-up: {verdict(membership <= READ_TARGET_S)})",
    )


def _time_process(argv: Sequence[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, env=PROCESS_ENV)
    return time.perf_counter() - t0


# ── 3: batches of 100 ──────────────────────────────────────────────────────────


def bench_batches(db_dir: Path, batches: int) -> None:
    from eventsourcing.persistence import StoredEvent
    from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

    started, events = generate(batches * 100, 8, 100)
    ours_path, theirs_path = db_dir / "append-ours.sqlite", db_dir / "append-es.sqlite"
    for path in (ours_path, theirs_path):
        remove_db(path)
    log = EventLog.open(sqlite_url(ours_path))
    log.append(RUN, [started])
    recorder = SQLiteApplicationRecorder(SQLiteDatastore(str(theirs_path)))
    recorder.create_table()
    originator = uuid.uuid4()
    # The same rows: eventsourcing stores the payloads our codec stores (the fields
    # without id and type, which both keep in columns of their own), encoded in its timed
    # part as its mapper would (``append`` takes events and encodes them too).
    encode = log.codec.encode
    ours_t = theirs_t = 0.0

    def ours(b: int) -> None:
        log.append(RUN, events[b * 100 : (b + 1) * 100])

    def theirs(b: int) -> None:
        recorder.insert_events(
            [
                StoredEvent(originator, b * 100 + i + 1, e.type, encode(e)[2].encode())
                for i, e in enumerate(events[b * 100 : (b + 1) * 100])
            ]
        )

    for b in range(batches):
        # Side after side, the first side alternating: neither always follows the
        # other's fsync.
        took = {}
        for side in (ours, theirs) if b % 2 == 0 else (theirs, ours):
            t0 = time.perf_counter()
            side(b)
            took[side] = time.perf_counter() - t0
        if b:  # the first batch of each warms connections and caches
            ours_t += took[ours]
            theirs_t += took[theirs]
    assert log.head(RUN) == batches * 100 + 1
    with log.database.engine.connect() as conn:
        ours_mode = (
            conn.exec_driver_sql("PRAGMA journal_mode").scalar(),
            conn.exec_driver_sql("PRAGMA synchronous").scalar(),
        )
        conn.rollback()
    log.close()
    import sqlite3

    es = sqlite3.connect(str(theirs_path))
    theirs_mode = (
        es.execute("PRAGMA journal_mode").fetchone()[0],
        es.execute("PRAGMA synchronous").fetchone()[0],
    )
    es.close()
    n = (batches - 1) * 100
    ratio = theirs_t / ours_t
    line(
        "3",
        "batch 100: EventLog.append vs insert_events",
        f"{ratio:8.2f}×  (ours {n / ours_t:,.0f} events/s, eventsourcing {n / theirs_t:,.0f}"
        f" events/s; target ≥ 1.0×: {verdict(ratio >= 1.0)})",
    )
    note(f"durability read back: ours journal_mode/synchronous {ours_mode}, eventsourcing "
         f"{theirs_mode} (synchronous 2 = FULL)")  # fmt: skip


# ── 4, 5: probe rounds ─────────────────────────────────────────────────────────


def week_config(shards: int) -> FleetConfig:
    return FleetConfig(
        shard_count=shards,
        train_world_size=8,
        base_urls=tuple(f"http://gen-{i}.bench:8000/v1" for i in range(shards)),
    )


class CompressedClock:
    """The recorder's clock, moved by the bench: a week in minutes."""

    def __init__(self) -> None:
        self.now_us = 1_780_000_000_000_000

    def __call__(self) -> int:
        return self.now_us


def insert_v1_round(log: EventLog, first_seq: int, shards: int) -> None:
    """A healthy round as an older fleetledger stored it: one ``probe_succeeded`` v1 row
    per shard, in one transaction (today's log appends rounds only)."""
    at_us = log.run_head("r").at_us
    rows = []
    for shard in range(shards):
        old = ProbeSucceededV1(shard=shard)
        rows.append(
            {
                "run_id": "r",
                "seq": first_seq + shard,
                "event_id": old.id,
                "type": old.type,
                "schema_version": 1,
                "at_us": at_us,
                "payload": old.model_dump_json(),
            }
        )
    with log.database.engine.begin() as conn:
        conn.execute(insert(events_table), rows)


def bench_storage(db_dir: Path, shards: int, rounds: int) -> None:
    ok = {shard: ProbeResult.ok() for shard in range(shards)}
    sizes = []
    for shape in ("rounds", "per-shard"):
        path = db_dir / f"storage-{shape}.sqlite"
        remove_db(path)
        with EventLog.open(sqlite_url(path)) as log:
            log.append("r", [RunStarted(config=week_config(shards))])
            for i in range(rounds):
                if shape == "rounds":
                    log.append("r", [round_event(ok)])
                else:  # as older ledgers stored a round: one v1 row per shard
                    insert_v1_round(log, 2 + i * shards, shards)
            with log.database.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
                conn.rollback()
        sizes.append(path.stat().st_size)
        remove_db(path)
    per_probe = [size / (rounds * shards) for size in sizes]
    line(
        "4",
        f"storage per probed shard, healthy {shards}-shard fleet",
        f"{per_probe[0]:8.1f} B as rounds vs {per_probe[1]:.1f} B per-shard: "
        f"{per_probe[1] / per_probe[0]:.1f}× smaller (target ≥ 10×: "
        f"{verdict(per_probe[1] / per_probe[0] >= 10)})",
    )


def write_week(path: Path, shards: int, days: float, seed: int) -> int:
    """A week of rounds through ``Ledger.record_probes``, with an incident a day."""
    rng = random.Random(seed)
    clock = CompressedClock()
    rounds = int(days * 86_400 / ROUND_S)
    remove_db(path)
    t0 = time.perf_counter()
    with EventLog.open(sqlite_url(path), clock_us=clock) as log:
        ledger = Ledger.start(log, WEEK_RUN, week_config(shards))
        incident_every = int(86_400 / ROUND_S)
        victim: int | None = None
        for number in range(rounds):
            clock.now_us += int(ROUND_S * 1e6)
            serving = ledger.membership.serving
            results = {shard: ProbeResult.ok() for shard in serving}
            if number % incident_every == incident_every // 2:
                victim = rng.choice(serving)
            if victim is not None and victim in results:
                results[victim] = (
                    ProbeResult("died", "ActorDiedError: worker exited 137")
                    if rng.random() < 0.3
                    else ProbeResult("timeout", f"no answer within {ROUND_S / 2} s")
                )
            if results:
                ledger.record_probes(results)
            if victim is not None and ledger.view.shards[victim].absent:
                ledger.restart_requested(victim)
                ledger.replacement_loaded(victim)
                ledger.refit_started(ledger.view.weight_version + 1)
                ledger.refit_completed(ledger.view.weight_version + 1)
                victim = None
            if number and number % 20_000 == 0:
                note(f"  week: {number:,} of {rounds:,} rounds ({time.perf_counter() - t0:.0f} s)")
        head = log.head(WEEK_RUN)
        with log.database.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.rollback()
    line(
        "5",
        f"wrote {days:g} days of a {shards}-shard fleet",
        f"{rounds:,} rounds, {head:,} events in {time.perf_counter() - t0:.0f} s "
        "(Ledger.record_probes, one durable append per round)",
    )
    return head


def bench_week(db_dir: Path, shards: int, days: float, samples: int) -> None:
    path = db_dir / f"week-{shards}-{days:g}d.sqlite"
    head = write_week(path, shards, days, seed=5)
    size = path.stat().st_size
    scale = 7 / days
    line(
        "5",
        "ledger size" + ("" if days == 7 else f" (×{scale:.1f} for a week)"),
        f"{size * scale / 2**20:8.0f} MiB  (target ≤ 1 GB: {verdict(size * scale <= 2**30)})",
    )
    url = sqlite_url(path)
    sink = NullSink()
    (replay_s,) = best_of(1, [lambda: cli(["replay", WEEK_RUN, "--json", "--db", url], sink)])
    line(
        "5",
        "full replay --json (CLI code path)" + ("" if days == 7 else " (scaled)"),
        f"{replay_s * scale:8.2f} s  ({replay_s:.2f} s measured; target ≤ 10 s: "
        f"{verdict(replay_s * scale <= 10)})",
    )
    with EventLog.open(url, mode="read") as log:
        first = next(iter(log.read(WEEK_RUN, 0, 1))).at_us
        last = log.run_head(WEEK_RUN).at_us
    rng = random.Random(7)
    times = []
    for _ in range(samples):
        at = iso_at(rng.randint(first, last))
        t0 = time.perf_counter()
        cli(["membership", WEEK_RUN, "--json", "--at", at, "--db", url], NullSink())
        times.append(time.perf_counter() - t0)
    at_ms = statistics.median(times) * 1e3
    line(
        "5",
        "membership --at a random time (CLI code path)",
        f"{at_ms:8.1f} ms  (median of {samples}; target ≤ 100 ms: {verdict(at_ms <= 100)})",
    )
    with EventLog.open(url, mode="read") as log:
        check = fold_pages(log.read_pages(WEEK_RUN, ids=False))
        assert check.seq == head
        note(f"final view: epoch {check.epoch}, {check.counts()}; {len(to_snapshot(check)):,} B")
    bench_travel(db_dir, path, head)


# A child's ru_maxrss counts the high-water mark of the process it was forked from, so
# a small parent starts each command and reports the command's own peak.
MEASURING_PARENT = (
    "import os, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "print(time.perf_counter() - t0, usage.ru_maxrss)\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def measured(args: Sequence[str]) -> tuple[float, float]:
    """``fleetledger ARGS`` as a process: (seconds, peak RSS in MiB)."""
    done = subprocess.run(
        [sys.executable, "-c", MEASURING_PARENT, FLEETLEDGER, *args],
        env=PROCESS_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, peak_kb = done.stdout.split()
    return float(seconds), int(peak_kb) / 1024


def bench_travel(db_dir: Path, path: Path, head: int) -> None:
    """The week exported, bundled and imported back, each as a process."""
    url = sqlite_url(path)
    plain, bundle = db_dir / "week.jsonl", db_dir / "week.zip"
    for stale in (plain, bundle):
        stale.unlink(missing_ok=True)
    steps = [("export -o", "-o", plain), ("export --bundle", "--bundle", bundle)]
    for label, option, out in steps:
        seconds, peak = measured(["export", WEEK_RUN, "--db", url, option, str(out)])
        line(
            "6",
            label,
            f"{out.stat().st_size / 2**20:8.0f} MiB in {seconds:.1f} s, peak RSS {peak:.0f} MiB "
            f"({head / seconds:,.0f} events/s)",
        )
    ratio = plain.stat().st_size / bundle.stat().st_size
    note(f"bundle deflates the export {ratio:.1f}× (a member past {MAX_INFLATION}× is refused)")
    for label, source in (("import week.jsonl", plain), ("import week.zip", bundle)):
        target = db_dir / f"week-imported-{source.suffix[1:]}.sqlite"
        remove_db(target)
        seconds, peak = measured(["import", str(source), "--run", "w", "--db", sqlite_url(target)])
        with EventLog.open(sqlite_url(target), mode="read") as log:
            assert log.head("w") == head
        line(
            "6",
            label,
            f"{seconds:8.1f} s, peak RSS {peak:.0f} MiB ({head / seconds:,.0f} events/s, "
            "snapshot pass included)",
        )
        remove_db(target)
    plain.unlink()
    bundle.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=7.0, help="of the 256-shard fleet")
    parser.add_argument("--shards", type=int, default=256)
    parser.add_argument("--db-dir", default=DEFAULT_DB_DIR)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=21)
    parser.add_argument("--batches", type=int, default=300, help="batches of 100 per side")
    parser.add_argument("--skip-week", action="store_true")
    args = parser.parse_args(argv)
    db_dir = bench_db_dir("fleetledger bench_scale", args.db_dir)
    bench_imported(db_dir, args.events, args.repeat, args.samples)
    bench_startup(db_dir)
    bench_batches(db_dir, args.batches)
    bench_storage(db_dir, args.shards, 1000)
    if not args.skip_week:
        bench_week(db_dir, args.shards, args.days, args.samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())
