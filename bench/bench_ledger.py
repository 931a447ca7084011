"""Hand-run benchmark of the fleet ledger on SQLite: appends, replay, snapshots, queries.

Run it by hand (it is not part of the test suite and asserts nothing about timing)::

    python bench/bench_ledger.py [--events N] [--db-dir DIR] [--profile]

It prints one line per figure, with units, and for appends the ratio against raw
SQLAlchemy Core inserts of the same rows into an identical table in a separate SQLite
file opened with the same durability (WAL, ``synchronous=FULL``, ``BEGIN IMMEDIATE``,
one transaction per append). Both sides run interleaved, chunk by chunk, in the same
process, so a burst of load on the machine hits both alike.

1. durable single-event appends/s: ``EventLog.append(run, [event])`` vs raw inserts
   (then, for information, the same without fsync);
2. batched appends/s (batches of 100 and 1000) vs raw ``executemany`` per transaction;
3. replay of an N-event run (default 1,000,000): ``fold(log.read(run))`` end to end
   from a freshly opened ``EventLog``, then its parts: read rows, decode, fold;
4. ``load_view`` from a snapshot plus a short tail (and the worst tail the default
   snapshot cadence allows);
5. live membership queries on a current ``Ledger``'s view.

The N-event database is built once through ``EventLog.append`` in batches of 1000 and
cached in ``--db-dir`` under a name made of the generator's parameters; later runs
reuse it. Its probes are one-shard ``probe_round`` events (the generator probes shard by
shard); ``--v1-probes`` stores each as an older fleetledger did, one v1
``probe_succeeded`` / ``probe_failed`` row, so the replay figures are those of an old
ledger read through the codec's upcasters. ``--profile`` adds cProfile listings of the
replay and of batched appends.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import itertools
import os
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Engine,
    delete,
    event,
    insert,
    select,
)

from fleetledger.controller.ledger import Ledger
from fleetledger.events.legacy import ProbeFailedV1, ProbeSucceededV1
from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    FailureCount,
    FleetConfig,
    OutcomeWindowReported,
    ProbeFailure,
    ProbeRound,
    RecordedEvent,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RunStarted,
    ShardOutcomes,
    StallDetected,
    WeightsMarkedPartial,
)
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.membership import membership_document
from fleetledger.projections.shard_states import ShardState
from fleetledger.projections.snapshot import PROJECTION_VERSION, to_snapshot
from fleetledger.queries import load_view
from fleetledger.store.log import DECODE_PAGE, EventLog, wall_clock_us
from fleetledger.store.schema import events as events_table
from fleetledger.store.schema import metadata, runs, snapshots
from fleetledger.store.sqlite_engine import sqlite_engine, use_wal

# Bump when the generator's output changes: it is part of the cache file's name.
# 2: a probe is a one-shard probe_round, not a v1 per-shard event; 3: --v1-probes rows are
# stamped by the clock (2 gave every v1 row the run's first stamp)
GENERATOR_VERSION = 3
RUN = "bench-run"
DEFAULT_DB_DIR = "/tmp/fleetledger-bench"
BUILD_BATCH = 1000

# Targets from the brief; printed next to each figure, never asserted.
TARGET_SINGLE_RATIO = 0.9
TARGET_BATCH_RATIO = 0.75
TARGET_REPLAY_S = 2.0  # for 1,000,000 events
TARGET_SNAPSHOT_MS = 50.0


# ── output ─────────────────────────────────────────────────────────────────────


def line(section: str, label: str, value: str) -> None:
    print(f"[{section}] {label:<52} {value}", flush=True)


def note(text: str) -> None:
    print(f"    {text}", flush=True)


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def per_s(count: int, seconds: float) -> str:
    return f"{count / seconds:>12,.0f}"


# ── the workload: a realistic run ─────────────────────────────────────────────


def probe_ok(shard: int) -> ProbeRound:
    """One shard's answered probe: what one v1 ``probe_succeeded`` row reads as."""
    return ProbeRound(ok=(shard,))


def probe_failed(shard: int, kind: str, error: str) -> ProbeRound:
    """One shard's failed probe: what one v1 ``probe_failed`` row reads as."""
    return ProbeRound(failed=(ProbeFailure(shard=shard, kind=kind, error=error),))  # type: ignore[arg-type]


def v1_row(event: Event) -> tuple[str, int, str] | None:
    """(type, version, payload) of the v1 row an older ledger stored for ``event``, a
    one-shard probe; None for any other event (stored as today's ledger stores it)."""
    if not isinstance(event, ProbeRound) or event.died or len(event.shards_named()) != 1:
        return None
    if event.ok:
        return (
            "probe_succeeded",
            1,
            ProbeSucceededV1(id=event.id, shard=event.ok[0]).model_dump_json(),
        )
    f = event.failed[0]
    old = ProbeFailedV1(id=event.id, shard=f.shard, kind=f.kind, error=f.error)
    return "probe_failed", 1, old.model_dump_json()


def bench_config(shards: int) -> FleetConfig:
    return FleetConfig(
        shard_count=shards,
        workers_per_shard=2,
        train_world_size=4,
        unhealthy_threshold=3,
        healthy_threshold=2,
        # A long run restarts each shard many times; the default budget of 5 would
        # retire the whole fleet a tenth of the way in and leave nothing to fold.
        max_restart_attempts_per_shard=1_000_000,
        min_healthy_shards=1,
        base_urls=tuple(f"http://gen-{i}.bench:8000/v1" for i in range(shards)),
        settings={"source": "bench/bench_ledger.py", "probe_interval_s": 5.0},
    )


class RunGenerator:
    """A controller in miniature: probe rounds, outcome windows, refits, incidents.

    It folds what it emits into a live ``FleetView`` and decides from that view, as the
    real controller does, so restarts follow deaths and refits name the shards that
    are present. Per probe round (one probe per shard that is up): an outcome window
    every 4th round; a refit started every ~100 events and completed (rarely aborted,
    with partial weights) the round after; incidents (a probe streak, an actor death,
    a streak of reported failures, a transient probe error) at a few per thousand
    rounds; restarts, failed restarts and replacement loads until the shard is back.
    """

    def __init__(self, shards: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.shards = shards
        self.config = bench_config(shards)
        self.seq = 0
        self.view: FleetView | None = None
        self.weight_version = 0
        self.since_refit = 0
        self.rounds = 0
        self.failing: dict[int, int] = {}  # shard -> probe rounds left that time out
        self.reporting_bad: dict[int, int] = {}  # shard -> windows left that report failures

    def _emit(self, out: list[Event], e: Event) -> None:
        self.seq += 1
        recorded = RecordedEvent(RUN, self.seq, self.seq, e)
        if self.view is None:
            self.view = FleetView.start(recorded)
        else:
            self.view.apply(recorded)
        self.since_refit += 1
        out.append(e)

    def events(self) -> Iterator[Event]:
        """Endless: the run_started event, then rounds."""
        out: list[Event] = []
        self._emit(out, RunStarted(config=self.config))
        while True:
            yield from out
            out = []
            self._round(out)

    def _round(self, out: list[Event]) -> None:
        rng, view = self.rng, self.view
        assert view is not None
        self.rounds += 1
        state = view.state_of

        # Incidents first: they decide how this round's probes and windows go.
        if rng.random() < 0.004:
            serving = list(view.serving)
            if len(serving) > 2:  # keep the fleet alive: the run stays interesting
                shard = rng.choice(serving)
                kind = rng.random()
                if kind < 0.6:
                    self.failing[shard] = 3
                elif kind < 0.8:
                    self._emit(out, ActorDeathConfirmed(shard=shard, error="worker exited 137"))
                else:
                    self.reporting_bad[shard] = 3

        # Recovery of shards that are down.
        for shard in range(self.shards):
            s = state(shard)
            if s is ShardState.DEAD:
                self.failing.pop(shard, None)
                self.reporting_bad.pop(shard, None)
                self._emit(out, RestartRequested(shard=shard))
            elif s is ShardState.RESTARTING:
                if rng.random() < 0.2:
                    self._emit(out, RestartFailed(shard=shard, error="engine failed to start"))
                else:
                    url = f"http://gen-{shard}-r{self.rounds}.bench:8000/v1"
                    self._emit(out, ReplacementLoaded(shard=shard, base_url=url))

        # The probe round: every shard that is up answers, or not.
        for shard in range(self.shards):
            if state(shard) not in (ShardState.HEALTHY, ShardState.SUSPECT, ShardState.STALE):
                continue
            left = self.failing.get(shard, 0)
            if left:
                self.failing[shard] = left - 1
                self._emit(out, probe_failed(shard, "timeout", "no answer within 5.0 s"))
            elif rng.random() < 0.003:
                self._emit(out, probe_failed(shard, "error", "HTTP 503"))
            else:
                self._emit(out, probe_ok(shard))

        # An adapter's outcome window, every 4th round, over the serving shards.
        if self.rounds % 4 == 0:
            outcomes = []
            for shard in view.serving:
                bad = self.reporting_bad.get(shard, 0)
                if bad:
                    self.reporting_bad[shard] = bad - 1
                    failures = (FailureCount(category="infra", reason="connection reset"),)
                    outcomes.append(ShardOutcomes(shard=shard, failures=failures))
                elif rng.random() < 0.01:
                    failures = (FailureCount(category="data", reason="reward parse error"),)
                    outcomes.append(
                        ShardOutcomes(shard=shard, successes=rng.randint(20, 60), failures=failures)
                    )
                else:
                    outcomes.append(ShardOutcomes(shard=shard, successes=rng.randint(20, 60)))
            if outcomes:
                self._emit(
                    out, OutcomeWindowReported(adapter="rollout-0", outcomes=tuple(outcomes))
                )

        # Refits: close an open one (rarely by an abort), or open one every ~100 events.
        refit = view.open_refit
        if refit is not None:
            if rng.random() < 0.01:
                self._emit(
                    out,
                    RefitAborted(weight_version=refit.weight_version, reason="broadcast timed out"),
                )
                self._emit(out, WeightsMarkedPartial(weight_version=refit.weight_version))
            else:
                self.weight_version = refit.weight_version
                self._emit(
                    out,
                    RefitCompleted(weight_version=refit.weight_version, shards=refit.shards),
                )
        elif self.since_refit >= 100:
            present = tuple(i for i in range(self.shards) if not view.shards[i].absent)
            if present:
                self.since_refit = 0
                self._emit(
                    out, RefitStarted(weight_version=self.weight_version + 1, shards=present)
                )

        if rng.random() < 0.0005:
            self._emit(
                out,
                StallDetected(
                    committed_groups=self.rounds,
                    train_steps=self.weight_version,
                    idle_s=121.5,
                    in_flight=0,
                    action="warn",
                ),
            )


def generate(count: int, shards: int, seed: int) -> tuple[RunStarted, list[Event]]:
    """The run_started event and the ``count`` events after it."""
    stream = RunGenerator(shards, seed).events()
    first = next(stream)
    assert isinstance(first, RunStarted)
    return first, list(itertools.islice(stream, count))


def probe_events(count: int, shards: int, seed: int) -> list[Event]:
    """Probe results only (about 3% failures), for the single-event appends."""
    rng = random.Random(seed)
    out: list[Event] = []
    for i in range(count):
        shard = i % shards
        if rng.random() < 0.03:
            out.append(probe_failed(shard, "timeout", "no answer within 5.0 s"))
        else:
            out.append(probe_ok(shard))
    return out


# ── databases ──────────────────────────────────────────────────────────────────


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def remove_db(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")


def raw_engine(path: Path) -> Engine:
    """A plain Core engine with the package's durability settings, written out again.

    WAL, ``synchronous=FULL``, the same busy timeout, driver transaction control off
    and ``BEGIN IMMEDIATE`` for every transaction (the raw side only writes).
    """
    # The package's own engine factory: the same durability by construction, not by copy.
    engine = sqlite_engine(path, {})
    use_wal(engine)

    # The very same table definitions the package's schema module describes (the events
    # table's primary key on (run_id, seq) and unique (run_id, event_id) included).
    metadata.create_all(engine, tables=[events_table, runs])
    return engine


def durability(engine: Engine) -> str:
    with engine.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
        conn.rollback()
    return f"journal_mode={mode} synchronous={ {0: 'OFF', 1: 'NORMAL', 2: 'FULL'}.get(sync, sync) }"


def raw_rows(encoded: Sequence[tuple[Event, str]], first_seq: int, at_us: int) -> list[dict]:
    """The rows the raw side inserts: the same ids, types, versions and payload strings."""
    return [
        {
            "run_id": RUN,
            "seq": first_seq + i,
            "event_id": e.id,
            "type": e.type,
            "schema_version": type(e).SCHEMA_VERSION,
            "at_us": at_us,
            "payload": payload,
        }
        for i, (e, payload) in enumerate(encoded)
    ]


@dataclass
class AppendPair:
    """A fresh ledger and a fresh raw table side by side, both with a started run."""

    log: EventLog
    raw: Engine
    raw_head: Engine  # a third file: raw statements that also keep a runs head row
    paths: tuple[Path, ...]

    @classmethod
    def create(
        cls, db_dir: Path, name: str, started: RunStarted, *, durable: bool = True
    ) -> AppendPair:
        paths = tuple(db_dir / f"{name}-{side}.sqlite" for side in ("ledger", "raw", "rawhead"))
        for path in paths:
            remove_db(path)
        log = EventLog.open(sqlite_url(paths[0]))
        engines = [raw_engine(path) for path in paths[1:]]
        if not durable:
            # Before the first append: the log keeps its write connection from then on.
            for engine in (log.database.engine, *engines):
                without_fsync(engine)
        log.append(RUN, [started])
        first = raw_rows([(started, started.model_dump_json())], 1, 0)
        for engine in engines:
            with engine.connect() as conn, conn.begin():
                conn.execute(insert(events_table), first)
        return cls(log, engines[0], engines[1], paths)

    def close(self) -> None:
        self.log.close()
        self.raw.dispose()
        self.raw_head.dispose()
        for path in self.paths:
            remove_db(path)


def encode_all(events: Sequence[Event]) -> list[tuple[Event, str]]:
    # What the codec stores as the payload (EventCodec.encode), computed ahead of time
    # for the raw side only.
    return [(e, e.model_dump_json()) for e in events]


# ── 1 and 2: appends ───────────────────────────────────────────────────────────


@dataclass
class Took:
    """Wall-clock and process CPU seconds spent by one side."""

    wall: float = 0.0
    cpu: float = 0.0


def interleave(
    sides: Sequence[Callable[[int], None]], units: int, warmup: int, chunk: int
) -> list[Took]:
    """Run unit ``i`` of every side, ``chunk`` units at a time, side after side.

    Interleaving in small chunks gives every side the same share of whatever else the
    machine is doing. The first ``warmup`` units (connections, statement caches) are
    not timed. CPU time is the whole process's: it leaves out waiting for fsync and for
    the other processes on the machine, so it stays comparable when the wall clock is not.
    """
    for i in range(warmup):
        for side in sides:
            side(i)
    took = [Took() for _ in sides]
    for lo in range(warmup, units, chunk):
        hi = min(lo + chunk, units)
        for side, t in zip(sides, took, strict=True):
            w0, c0 = time.perf_counter(), time.process_time()
            for i in range(lo, hi):
                side(i)
            t.wall += time.perf_counter() - w0
            t.cpu += time.process_time() - c0
    return took


def without_fsync(engine: Engine) -> None:
    """From now on, connections of ``engine`` run with ``synchronous=OFF`` (info runs only)."""

    @event.listens_for(engine, "connect")
    def _no_sync(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA synchronous=OFF")  # after the package's FULL

    engine.dispose()


def run_single(
    db_dir: Path, count: int, shards: int, seed: int, *, durable: bool
) -> tuple[Took, Took, Took]:
    """Raw, raw with a head read, ours: interleaved 50 appends at a time."""
    started = RunStarted(config=bench_config(shards))
    warmup = 20
    events = probe_events(count + warmup, shards, seed)
    rows = raw_rows(encode_all(events), 2, time.time_ns() // 1000)
    pair = AppendPair.create(db_dir, "single", started, durable=durable)
    # The log's extra statement: its head is the run's last event, one index lookup.
    head_sql = (
        select(events_table.c.seq, events_table.c.at_us, events_table.c.type)
        .where(events_table.c.run_id == RUN)
        .order_by(events_table.c.seq.desc())
        .limit(1)
    )
    stmt = insert(events_table)
    try:
        label = "" if durable else " (info run)"
        line("1", f"durability{label}, ledger file", durability(pair.log.database.engine))
        line("1", f"durability{label}, raw files", durability(pair.raw))
        with pair.raw.connect() as conn, pair.raw_head.connect() as conn2:
            with conn2.begin():
                conn2.execute(insert(runs).values(run_id=RUN, started_at_us=0))

            def raw(i: int) -> None:
                with conn.begin():
                    conn.execute(stmt, rows[i])

            def raw_head(i: int) -> None:
                with conn2.begin():
                    conn2.execute(head_sql).first()
                    conn2.execute(stmt, rows[i])

            def ours(i: int) -> None:
                pair.log.append(RUN, [events[i]])

            took = interleave((raw, raw_head, ours), count + warmup, warmup, chunk=50)
        assert pair.log.head(RUN) == count + warmup + 1
    finally:
        pair.close()
    return took[0], took[1], took[2]


def bench_single(db_dir: Path, count: int, shards: int, seed: int) -> None:
    """Durable single appends against raw inserts, then the same without fsync (info).

    The raw side is the baseline: one INSERT per transaction. A second raw side issues
    the statements the log itself needs per append (read the run's head, insert, move
    the head) without any of the log's Python: it splits the gap into what the design's
    SQL costs and what the Python around it costs. The info run repeats all three with
    ``synchronous=OFF`` on every file, which shows the per-append CPU cost that the
    fsync (fast on a quiet disk, slow on a busy one) otherwise hides or reveals.
    """
    raw_t, raw_head_t, ours_t = run_single(db_dir, count, shards, seed, durable=True)
    ratio = raw_t.wall / ours_t.wall

    def each(t: Took, n: int = count) -> str:
        return (
            f"  ({n:,} in {t.wall:.3f} s, {t.wall / n * 1e6:.0f} µs each,"
            f" cpu {t.cpu / n * 1e6:.0f} µs each)"
        )

    line(
        "1",
        "single append, EventLog.append(run, [e])",
        f"{per_s(count, ours_t.wall)} appends/s" + each(ours_t),
    )
    line(
        "1",
        "single append, raw Core INSERT + COMMIT",
        f"{per_s(count, raw_t.wall)} rows/s" + each(raw_t),
    )
    line(
        "1",
        "single append ratio ours/raw",
        f"{ratio:12.2f}×  (target ≥ {TARGET_SINGLE_RATIO}×:"
        f" {verdict(ratio >= TARGET_SINGLE_RATIO)})",
    )
    line(
        "1",
        "  (info) raw SELECT head + INSERT (the slow path)",
        f"{per_s(count, raw_head_t.wall)} rows/s" + each(raw_head_t),
    )
    line(
        "1",
        "  (info) ratio ours / raw slow-path statements",
        f"{raw_head_t.wall / ours_t.wall:12.2f}×  (a head read costs raw"
        f" {raw_t.wall / raw_head_t.wall:.2f}×; the log reads it only after a conflict)",
    )
    n = max(count // 2, 100)
    raw_t, raw_head_t, ours_t = run_single(db_dir, n, shards, seed + 1, durable=False)
    line(
        "1",
        "  (info) no fsync: EventLog.append(run, [e])",
        f"{per_s(n, ours_t.wall)} appends/s" + each(ours_t, n),
    )
    line(
        "1",
        "  (info) no fsync: raw Core INSERT + COMMIT",
        f"{per_s(n, raw_t.wall)} rows/s" + each(raw_t, n),
    )
    line(
        "1",
        "  (info) no fsync: ratio ours/raw",
        f"{raw_t.wall / ours_t.wall:12.2f}×  (raw with a head read:"
        f" {raw_head_t.wall / n * 1e6:.0f} µs each)",
    )


def bench_batched(db_dir: Path, batch: int, total: int, shards: int, seed: int) -> None:
    started, events = generate(total + batch, shards, seed)  # one batch of warm-up
    rows = raw_rows(encode_all(events), 2, time.time_ns() // 1000)
    pair = AppendPair.create(db_dir, f"batch{batch}", started)
    batches = [events[i : i + batch] for i in range(0, len(events), batch)]
    row_batches = [rows[i : i + batch] for i in range(0, len(rows), batch)]
    stmt = insert(events_table)
    try:
        with pair.raw.connect() as conn:

            def raw(i: int) -> None:
                with conn.begin():
                    conn.execute(stmt, row_batches[i])

            def ours(i: int) -> None:
                pair.log.append(RUN, batches[i])

            raw_t, ours_t = interleave((raw, ours), len(batches), warmup=1, chunk=1)
        assert pair.log.head(RUN) == len(events) + 1
    finally:
        pair.close()
    ratio = raw_t.wall / ours_t.wall
    label = f"batch {batch:>4}"

    def each(t: Took) -> str:
        return (
            f"  ({total // batch} batches in {t.wall:.3f} s, {t.wall / total * 1e6:.1f} µs"
            f" per event, cpu {t.cpu / total * 1e6:.1f} µs)"
        )

    line(
        "2",
        f"{label}, EventLog.append(run, batch)",
        f"{per_s(total, ours_t.wall)} events/s" + each(ours_t),
    )
    line(
        "2",
        f"{label}, raw Core executemany + commit",
        f"{per_s(total, raw_t.wall)} rows/s" + each(raw_t),
    )
    line(
        "2",
        f"{label} ratio ours/raw",
        f"{ratio:12.2f}×  (target ≥ {TARGET_BATCH_RATIO}×: {verdict(ratio >= TARGET_BATCH_RATIO)};"
        f" cpu ratio {raw_t.cpu / ours_t.cpu:.2f}×)",
    )


# ── 3: the big run ─────────────────────────────────────────────────────────────


def replay_db_path(db_dir: Path, events: int, shards: int, seed: int, *, v1: bool = False) -> Path:
    name = f"replay-g{GENERATOR_VERSION}-p{PROJECTION_VERSION}-n{events}-s{shards}-seed{seed}"
    return db_dir / f"{name}{'-v1probes' if v1 else ''}.sqlite"


def cached_head(path: Path) -> int | None:
    if not path.exists():
        return None
    try:
        with EventLog.open(sqlite_url(path)) as log:
            return log.head(RUN)
    except Exception as exc:  # a damaged or foreign file: rebuild it
        note(f"cached {path.name} is unusable ({type(exc).__name__}: {exc}); rebuilding")
        return None


def build_replay_db(path: Path, events: int, shards: int, seed: int, *, v1: bool = False) -> None:
    """Write the run through EventLog.append in batches of 1000, then move it in place.

    ``v1``: the ledger an older fleetledger left, its probes one v1 row per shard —
    inserted as that fleetledger's append stored them (today's log appends only
    rounds), the rest through ``EventLog.append``; the replay then reads every probe
    through the codec's upcasters.
    """
    tmp = path.with_name(f".building-{os.getpid()}-{path.name}")
    remove_db(tmp)
    t0 = time.perf_counter()
    stream = RunGenerator(shards, seed).events()
    with EventLog.open(sqlite_url(tmp)) as log:
        log.append(RUN, [next(stream)])
        written = 1
        while written < events:
            batch = list(itertools.islice(stream, min(BUILD_BATCH, events - written)))
            if v1:
                insert_as_older_ledger(log, written + 1, batch)
            else:
                log.append(RUN, batch)
            written += len(batch)
        with log.database.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.rollback()
    os.replace(tmp, path)
    remove_db(tmp)  # the emptied -wal/-shm the checkpoint left behind
    line(
        "3",
        "built the cached run",
        f"{events:,} events in {time.perf_counter() - t0:.1f} s"
        f" -> {path} ({path.stat().st_size / 2**20:.0f} MiB)",
    )


def insert_as_older_ledger(log: EventLog, first_seq: int, batch: Sequence[Event]) -> None:
    """``batch`` stored from ``first_seq`` on as an older fleetledger stored it (one-shard
    probe rounds as v1 per-shard rows), in one transaction."""
    # Stamped as ``append`` stamps: the wall clock, never behind the run's head.
    codec, at_us = log.codec, max(wall_clock_us(), log.run_head(RUN).at_us)
    rows = []
    for i, e in enumerate(batch):
        type_, version, payload = v1_row(e) or codec.encode(e)
        rows.append(
            {
                "run_id": RUN,
                "seq": first_seq + i,
                "event_id": e.id,
                "type": type_,
                "schema_version": version,
                "at_us": at_us,
                "payload": payload,
            }
        )
    with log.database.engine.begin() as conn:
        conn.execute(insert(events_table), rows)


def bench_db_dir(title: str, path: str) -> Path:
    """The bench's database directory, created; the header every bench prints first (the
    interpreter, the cores and the load its figures were measured under)."""
    db_dir = Path(path)
    db_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    print(
        f"{title}: python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, db dir {db_dir}"
    )
    return db_dir


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def timed_cpu(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    return time.perf_counter() - w0, time.process_time() - c0, value


def clocked(into: Took, fn: Callable[[], Any]) -> Any:
    w0, c0 = time.perf_counter(), time.process_time()
    value = fn()
    into.wall += time.perf_counter() - w0
    into.cpu += time.process_time() - c0
    return value


def bench_replay(
    db_dir: Path, n_events: int, shards: int, seed: int, repeat: int, v1: bool
) -> tuple[Path, str]:
    path = replay_db_path(db_dir, n_events, shards, seed, v1=v1)
    head = cached_head(path)
    if head != n_events:
        if head is not None:
            note(f"cached {path.name} holds {head:,} events, not {n_events:,}; rebuilding")
        remove_db(path)
        build_replay_db(path, n_events, shards, seed, v1=v1)
    else:
        line("3", "cached run", f"{path} ({path.stat().st_size / 2**20:.0f} MiB)")

    url = sqlite_url(path)
    ends: list[tuple[float, float]] = []
    reference: str | None = None
    for _ in range(repeat):
        gc.collect()
        open_s, log = timed(lambda: EventLog.open(url))
        with log:
            wall, cpu, view = timed_cpu(lambda log=log: fold(log.read(RUN)))
        ends.append((wall, cpu))
        reference = to_snapshot(view)
        del view
    best, best_cpu = min(ends)
    median = statistics.median(w for w, _ in ends)
    per_million = best / n_events * 1_000_000
    line(
        "3",
        "replay fold(log.read(run)), fresh EventLog",
        f"{per_s(n_events, best)} events/s  ({best:.2f} s for {n_events:,}, cpu {best_cpu:.2f} s;"
        f" best of {repeat}, median {median:.2f} s)",
    )
    line(
        "3",
        "replay time for 1,000,000 events"
        + ("" if n_events == 1_000_000 else f" (scaled from {n_events:,})"),
        f"{per_million:12.2f} s  (target ≤ {TARGET_REPLAY_S} s:"
        f" {verdict(per_million <= TARGET_REPLAY_S)};"
        f" EventLog.open {open_s * 1e3:.0f} ms, not counted)",
    )

    # The parts, timed separately inside one streaming pass that does what the replay
    # does (a page is read, decoded, folded, then dropped), so each part pays the same
    # garbage-collection and cache costs it pays inside the replay. The snapshots for
    # part 4 are taken on the way, untimed.
    with EventLog.open(url) as log:
        head = log.head(RUN)
        to_save = list(snapshot_seqs(head))
        saved: list[tuple[int, str]] = []
        mix: dict[str, int] = {}
        read_t, decode_t, fold_t = Took(), Took(), Took()
        view: FleetView | None = None
        gc.collect()
        reader = log.read_stored(RUN)
        while True:
            page = clocked(read_t, lambda: next(reader, None))
            if page is None:
                break
            for start in range(0, len(page), DECODE_PAGE):  # decoded as log.read decodes
                rows = page[start : start + DECODE_PAGE]
                decoded = clocked(decode_t, lambda rows=rows: log.codec.decode_rows(RUN, rows))
                for r in decoded:
                    mix[r.event.type] = mix.get(r.event.type, 0) + 1
                while to_save and to_save[0] <= decoded[-1].seq:  # split the page there
                    cut = to_save.pop(0) - decoded[0].seq + 1
                    view = clocked(fold_t, lambda d=decoded[:cut], v=view: fold(d, into=v))
                    saved.append((view.seq, to_snapshot(view)))
                    decoded = decoded[cut:]
                if decoded:
                    view = clocked(fold_t, lambda d=decoded, v=view: fold(d, into=v))
        assert view is not None and view.seq == head == n_events
        if to_snapshot(view) != reference:
            raise SystemExit("BUG in the benchmark: the split replay differs from the replay")
        parts = read_t.wall + decode_t.wall + fold_t.wall
        for label, unit, t in (
            ("  read rows only (log.read_stored)", "rows/s", read_t),
            ("  decode only (codec.decode_rows)", "events/s", decode_t),
            ("  fold only (fold of the decoded pages)", "events/s", fold_t),
        ):
            line(
                "3",
                label,
                f"{per_s(head, t.wall)} {unit}  ({t.wall:.2f} s, cpu {t.cpu:.2f} s,"
                f" {t.wall / head * 1e6:.2f} µs each, {t.wall / parts:.0%} of the parts)",
            )
        line("3", "  sum of the parts", f"{parts:12.2f} s")
        note(
            "event mix: "
            + ", ".join(f"{k} {v:,}" for k, v in sorted(mix.items(), key=lambda kv: -kv[1]))
        )
        note(
            f"final view: epoch {view.epoch}, weight_version {view.weight_version}, "
            f"states {view.counts()}"
        )

        # Snapshots for part 4: one 100 events before the head, one with the longest tail
        # the default cadence (Ledger snapshots every 10,000 events) leaves.
        with log.database.write_connection() as conn, conn.begin():
            conn.execute(delete(snapshots).where(snapshots.c.run_id == RUN))  # stale ones
        for seq, payload in saved:
            log.save_snapshot(RUN, PROJECTION_VERSION, seq, payload)
    return path, reference


SHORT_TAIL = 100
LONG_TAIL = 9_999


def snapshot_seqs(head: int) -> tuple[int, int]:
    near = head - SHORT_TAIL
    far = near - LONG_TAIL - 1000
    return far, near


# ── 4 and 5: snapshot load, live queries ───────────────────────────────────────


def median_of(fn: Callable[[], Any], samples: int) -> tuple[float, float, float]:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def bench_snapshot_load(path: Path, full: str, samples: int) -> None:
    """``full`` is the replay's view at the head, as a snapshot string."""
    with EventLog.open(sqlite_url(path)) as log:
        head = log.head(RUN)
        far, near = snapshot_seqs(head)
        stored = log.load_snapshot(RUN, PROJECTION_VERSION, at_most_seq=head)
        if stored is None or stored[0] != near:
            raise SystemExit(f"BUG in the benchmark: expected a snapshot at seq {near}")
        if to_snapshot(load_view(log, RUN)) != full:
            raise SystemExit("BUG: load_view(snapshot + tail) differs from the full fold")
        long_at = far + LONG_TAIL
        for at, tail, label in (
            (None, head - near, "load_view(log, run): snapshot + short tail"),
            (long_at, LONG_TAIL, "load_view(at_seq=…): snapshot + longest tail"),
        ):
            load_view(log, RUN, at)  # warm
            med, lo, hi = median_of(lambda at=at: load_view(log, RUN, at), samples)
            line(
                "4",
                label,
                f"{med * 1e3:12.2f} ms  (tail {tail:,} events; median of {samples},"
                f" min {lo * 1e3:.2f}, max {hi * 1e3:.2f}; target ≤ {TARGET_SNAPSHOT_MS:.0f} ms:"
                f" {verdict(med * 1e3 <= TARGET_SNAPSHOT_MS)})",
            )


def per_call_us(fn: Callable[[], Any], inner: int, samples: int) -> tuple[float, float]:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times) * 1e6, min(times) * 1e6


def bench_queries(path: Path) -> None:
    with EventLog.open(sqlite_url(path)) as log:
        ledger = Ledger.resume(log, RUN)
        view = ledger.view
        assert view.seq == log.head(RUN)
        note(f"live view at seq {view.seq:,}: serving {view.serving}, absent {view.absent}")
        for label, fn in (
            ("membership_document(ledger.view)", lambda: membership_document(ledger.view)),
            ("ledger.view.serving", lambda: ledger.view.serving),
            ("ledger.view.layout()", lambda: ledger.view.layout()),
        ):
            med, best = per_call_us(fn, inner=200, samples=51)
            line("5", label, f"{med:12.2f} µs  (median of 51 × 200 calls, min {best:.2f} µs)")


# ── profiles ───────────────────────────────────────────────────────────────────


def print_profile(title: str, prof: cProfile.Profile, out: Path, limit: int) -> None:
    prof.dump_stats(out)
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).strip_dirs().sort_stats(key).print_stats(limit)
        text = buf.getvalue()
        start = text.find("   ncalls")
        print(f"\n── profile: {title}, by {key} (full: {out}) ──")
        print(text[start:].rstrip())


def profile_all(db_dir: Path, replay_path: Path, shards: int, seed: int, limit: int) -> None:
    with EventLog.open(sqlite_url(replay_path)) as log:
        prof = cProfile.Profile()
        prof.enable()
        fold(log.read(RUN))
        prof.disable()
    print_profile("replay fold(log.read(run))", prof, db_dir / "replay.prof", limit)

    started, events = generate(50_000, shards, seed)
    batches = [events[i : i + 1000] for i in range(0, len(events), 1000)]
    pair = AppendPair.create(db_dir, "profile", started)
    try:
        pair.log.append(RUN, batches[0])
        prof = cProfile.Profile()
        prof.enable()
        for b in batches[1:]:
            pair.log.append(RUN, b)
        prof.disable()
    finally:
        pair.close()
    print_profile("batched appends (1000 per append)", prof, db_dir / "append1000.prof", limit)

    pair = AppendPair.create(db_dir, "profile", started)
    try:
        probes = probe_events(2000, shards, seed)
        pair.log.append(RUN, [probes[0]])
        prof = cProfile.Profile()
        prof.enable()
        for e in probes[1:]:
            pair.log.append(RUN, [e])
        prof.disable()
    finally:
        pair.close()
    print_profile("single appends", prof, db_dir / "append1.prof", limit)


# ── main ───────────────────────────────────────────────────────────────────────


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="events in the replay run (default 1,000,000)"
    )
    parser.add_argument(
        "--db-dir",
        default=DEFAULT_DB_DIR,
        help=f"where the databases live; the replay run is cached here (default {DEFAULT_DB_DIR})",
    )
    parser.add_argument(
        "--single", type=int, default=2000, help="single-event appends per side (default 2000)"
    )
    parser.add_argument(
        "--batched",
        type=int,
        default=50_000,
        help="events per side for each batch size (default 50,000)",
    )
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--repeat", type=int, default=3, help="end-to-end replays (best is shown)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, print cProfile listings of replay and appends",
    )
    parser.add_argument("--profile-lines", type=int, default=30)
    parser.add_argument(
        "--v1-probes",
        action="store_true",
        help="replay a run whose probes are stored as an older fleetledger stored them "
        "(one v1 probe_succeeded / probe_failed row per shard, lifted on read)",
    )
    args = parser.parse_args(argv)
    if args.events < 20_000:
        parser.error("--events must be at least 20,000 (the snapshots sit 11,099 before the head)")

    db_dir = bench_db_dir("fleetledger bench", args.db_dir)
    print("Figures from a shared 2-core machine: expect ±10–20 % between runs.")

    bench_single(db_dir, args.single, args.shards, args.seed)
    for batch in (100, 1000):
        bench_batched(db_dir, batch, args.batched, args.shards, args.seed + batch)
    path, full = bench_replay(
        db_dir, args.events, args.shards, args.seed, args.repeat, args.v1_probes
    )
    bench_snapshot_load(path, full, samples=21)
    bench_queries(path)
    if args.profile:
        profile_all(db_dir, path, args.shards, args.seed, args.profile_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
