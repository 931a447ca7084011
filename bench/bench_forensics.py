"""Hand-run benchmark of the forensics commands on the cached 1,000,000-event run.

Run it by hand (it is not part of the test suite and asserts nothing about timing)::

    python bench/bench_forensics.py [--events N] [--db-dir DIR] [--profile]

It reuses the run ``bench/bench_ledger.py`` builds and caches in ``--db-dir`` (building
it first if it is missing, about 40 s on the 2-core machine) and prints:

1. ``fleetledger replay RUN --json`` end to end through the CLI code path (typer
   parsing, opening the ledger, reading, decoding, folding into history entries,
   writing JSON lines) into a null sink; then its parts, and the same command as a
   subprocess (interpreter start-up included). Target ≤ 3 s.
2. ``fleetledger membership RUN --at SEQ`` and ``--at TIME`` for random points, the
   median per call through the CLI code path. Target ≤ 100 ms. The run gets the
   snapshots a ``Ledger`` would have written (every 10,000 events) first: answering
   from the nearest snapshot is what makes ``--at`` fast, and the builder writes the
   run through ``EventLog.append``, which takes none.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select

# The sibling script: its cached run and builder, importable once its directory is on the path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_ledger import (
    DEFAULT_DB_DIR,
    RUN,
    bench_db_dir,
    build_replay_db,
    cached_head,
    line,
    note,
    print_profile,
    remove_db,
    replay_db_path,
    sqlite_url,
    verdict,
)

from fleetledger.cli import app
from fleetledger.controller.ledger import DEFAULT_SNAPSHOT_EVERY
from fleetledger.events.models import datetime_from_us
from fleetledger.projections.fleet_view import FleetView, ProjectionError, fold
from fleetledger.projections.snapshot import PROJECTION_VERSION, from_snapshot, to_snapshot
from fleetledger.queries import load_view, read_history
from fleetledger.store.log import EventLog
from fleetledger.store.schema import snapshots

TARGET_REPLAY_S = 3.0  # for 1,000,000 events
TARGET_AT_MS = 100.0


class NullSink(io.TextIOBase):
    """Stdout for the command: counts lines, keeps nothing, is not a terminal."""

    def __init__(self) -> None:
        self.lines = 0
        self.chars = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        self.chars += len(text)
        return len(text)


@contextmanager
def stdout_into(sink: io.TextIOBase) -> Iterator[None]:
    saved = sys.stdout
    sys.stdout = sink  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = saved


def cli(args: Sequence[str], sink: io.TextIOBase) -> None:
    """One command through typer, as the console script runs it, stdout into ``sink``."""
    with stdout_into(sink):
        status = app(list(args), standalone_mode=False)
    if status not in (None, 0):
        raise SystemExit(f"fleetledger {' '.join(args)} exited {status}")


def ensure_run(db_dir: Path, events: int, shards: int, seed: int) -> Path:
    path = replay_db_path(db_dir, events, shards, seed)
    head = cached_head(path)
    if head != events:
        if head is not None:
            note(f"cached {path.name} holds {head:,} events, not {events:,}; rebuilding")
        remove_db(path)
        build_replay_db(path, events, shards, seed)
    else:
        line("0", "cached run", f"{path} ({path.stat().st_size / 2**20:.0f} MiB)")
    return path


def ensure_snapshots(path: Path) -> int:
    """Snapshots every ``DEFAULT_SNAPSHOT_EVERY`` seqs, as a live ``Ledger`` leaves them.

    Idempotent: the log keeps one snapshot per (run, version, seq). bench_ledger.py
    replaces the run's snapshots with its own two, so they are added back here.
    """
    with EventLog.open(sqlite_url(path)) as log:
        head = log.head(RUN)
        drop_unreadable_snapshots(log)
        wanted = list(range(DEFAULT_SNAPSHOT_EVERY, head + 1, DEFAULT_SNAPSHOT_EVERY))
        missing = [s for s in wanted if not has_snapshot_at(log, s)]
        if missing:
            t0 = time.perf_counter()
            view: FleetView | None = None
            for page in log.read_pages(RUN):
                for recorded in page:
                    if view is None:
                        view = FleetView.start(recorded)
                    else:
                        view.apply(recorded)
                    if missing and view.seq == missing[0]:
                        log.save_snapshot(RUN, PROJECTION_VERSION, view.seq, to_snapshot(view))
                        missing.pop(0)
            line(
                "0",
                "snapshots added at the Ledger's cadence",
                f"{len(wanted)} in all, every {DEFAULT_SNAPSHOT_EVERY:,} events"
                f" ({time.perf_counter() - t0:.1f} s, not timed below)",
            )
        return head


def drop_unreadable_snapshots(log: EventLog) -> None:
    """Delete cached snapshots this code cannot load (written by an older fold).

    ``load_view`` ignores such a snapshot and folds from seq 1 instead, which would
    time a full replay where a snapshot + tail was meant.
    """
    with log.database.engine.connect() as conn:
        stored = conn.execute(
            select(snapshots.c.seq, snapshots.c.payload).where(
                snapshots.c.run_id == RUN, snapshots.c.projection_version == PROJECTION_VERSION
            )
        ).all()
    bad = []
    for seq, payload in stored:
        try:
            from_snapshot(payload)
        except ProjectionError:
            bad.append(seq)
    if bad:
        with log.database.write_connection() as conn, conn.begin():
            conn.execute(
                delete(snapshots).where(snapshots.c.run_id == RUN, snapshots.c.seq.in_(bad))
            )
        line("0", "unreadable cached snapshots dropped", f"{len(bad)} (seqs {bad})")


def has_snapshot_at(log: EventLog, seq: int) -> bool:
    stored = log.load_snapshot(RUN, PROJECTION_VERSION, seq)
    return stored is not None and stored[0] == seq


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def bench_replay(path: Path, events: int, repeat: int) -> None:
    """The CLI replay and its parts, interleaved round by round; best of ``repeat`` each.

    Interleaving gives each the same share of whatever else the machine is doing; CPU
    time is shown next to wall time because it stays comparable on a busy machine.
    """
    url = sqlite_url(path)
    args = ["replay", RUN, "--json", "--db", url]
    cli_runs: list[tuple[float, float]] = []
    history_runs: list[tuple[float, float]] = []
    fold_runs: list[tuple[float, float]] = []
    sink = NullSink()
    for _ in range(repeat):
        sink = NullSink()
        cli_runs.append(timed(lambda sink=sink: cli(args, sink)))
        with EventLog.open(url) as log:
            history_runs.append(timed(lambda log=log: sum(1 for _ in read_history(log, RUN))))
        with EventLog.open(url) as log:
            fold_runs.append(timed(lambda log=log: fold(log.read(RUN))))
    best, best_cpu = min(cli_runs)
    median = statistics.median(w for w, _ in cli_runs)
    per_million = best / events * 1_000_000
    line(
        "1",
        "replay RUN --json > null, CLI code path",
        f"{best:8.2f} s  (cpu {best_cpu:.2f} s; best of {repeat}, median {median:.2f} s;"
        f" {sink.lines:,} entries, {sink.chars / 2**20:.1f} MiB of JSON)",
    )
    line(
        "1",
        "replay time for 1,000,000 events"
        + ("" if events == 1_000_000 else f" (scaled from {events:,})"),
        f"{per_million:8.2f} s  (target ≤ {TARGET_REPLAY_S:.0f} s:"
        f" {verdict(per_million <= TARGET_REPLAY_S)})",
    )
    (history_s, history_cpu), (fold_s, fold_cpu) = min(history_runs), min(fold_runs)
    line(
        "1",
        "  read_history: read + decode + history, no output",
        f"{history_s:8.2f} s  (cpu {history_cpu:.2f} s)",
    )
    line(
        "1",
        "  fold(log.read(run)): read + decode + view fold",
        f"{fold_s:8.2f} s  (cpu {fold_cpu:.2f} s)",
    )
    line(
        "1",
        "  history entries, beyond the view fold",
        f"{history_s - fold_s:8.2f} s  (cpu {history_cpu - fold_cpu:.2f} s)",
    )
    line(
        "1",
        "  CLI, as_json, JSON and writing, beyond read_history",
        f"{best - history_s:8.2f} s  (cpu {best_cpu - history_cpu:.2f} s)",
    )

    # The command as a user runs it: a fresh interpreter, stdout to /dev/null.
    exe = Path(sys.executable).parent / "fleetledger"
    with open(os.devnull, "w") as devnull:
        t0 = time.perf_counter()
        subprocess.run([str(exe), *args], stdout=devnull, check=True)
        whole = time.perf_counter() - t0
        t0 = time.perf_counter()
        subprocess.run([str(exe), "--help"], stdout=devnull, check=True)
        startup = time.perf_counter() - t0
    line(
        "1",
        "fleetledger replay RUN --json > /dev/null (process)",
        f"{whole:8.2f} s  (of which ~{startup:.2f} s interpreter and imports: `--help`)",
    )


def bench_membership_at(path: Path, head: int, samples: int, seed: int) -> None:
    url = sqlite_url(path)
    rng = random.Random(seed)
    with EventLog.open(url) as log:
        first = next(iter(log.read(RUN, 0, 1))).at_us
        last = next(iter(log.read(RUN, head - 1, head))).at_us
        seqs = [rng.randint(1, head) for _ in range(samples)]
        times = [rng.randint(first, last) for _ in range(samples)]
        # The parts, on one open log: the bisection, and snapshot + tail.
        seq_at_ms = median_ms(lambda t: log.seq_at(RUN, t), times)
        load_ms = median_ms(lambda s: load_view(log, RUN, s), seqs)
    stamps = [datetime_from_us(t).isoformat(timespec="microseconds") for t in times]
    cli(["membership", RUN, "--at", str(seqs[0]), "--json", "--db", url], NullSink())  # warm
    for label, points in (("--at SEQ", [str(s) for s in seqs]), ("--at TIME", stamps)):
        ms = median_ms(
            lambda p: cli(["membership", RUN, "--at", p, "--json", "--db", url], NullSink()),
            points,
        )
        line(
            "2",
            f"membership RUN {label} --json, CLI code path",
            f"{ms:8.1f} ms  (median of {samples} random points; target ≤ {TARGET_AT_MS:.0f} ms:"
            f" {verdict(ms <= TARGET_AT_MS)})",
        )
    line("2", "  EventLog.seq_at (bisection over seqs)", f"{seq_at_ms:8.2f} ms  (median)")
    line(
        "2",
        "  load_view at a random seq (snapshot + tail)",
        f"{load_ms:8.2f} ms  (median; tails up to {DEFAULT_SNAPSHOT_EVERY - 1:,} events)",
    )


def median_ms(fn: Callable[[Any], Any], points: Sequence[Any]) -> float:
    took = []
    for p in points:
        t0 = time.perf_counter()
        fn(p)
        took.append(time.perf_counter() - t0)
    return statistics.median(took) * 1e3


def profile_replay(path: Path, db_dir: Path, limit: int) -> None:
    prof = cProfile.Profile()
    sink = NullSink()
    prof.enable()
    cli(["replay", RUN, "--json", "--db", sqlite_url(path)], sink)
    prof.disable()
    print_profile("replay RUN --json (CLI code path)", prof, db_dir / "replay-cli.prof", limit)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--db-dir", default=DEFAULT_DB_DIR)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20261129, help="bench_ledger.py's default")
    parser.add_argument("--repeat", type=int, default=3, help="end-to-end replays (best shown)")
    parser.add_argument("--samples", type=int, default=21, help="random --at points per kind")
    parser.add_argument("--profile", action="store_true", help="cProfile the replay afterwards")
    parser.add_argument("--profile-lines", type=int, default=30)
    args = parser.parse_args(argv)

    db_dir = bench_db_dir("fleetledger forensics bench", args.db_dir)
    path = ensure_run(db_dir, args.events, args.shards, args.seed)
    head = ensure_snapshots(path)
    bench_replay(path, head, args.repeat)
    bench_membership_at(path, head, args.samples, args.seed)
    if args.profile:
        profile_replay(path, db_dir, args.profile_lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
