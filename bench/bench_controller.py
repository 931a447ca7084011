"""Hand-run benchmark of the live controller: probe rounds, detection, outcome ingest.

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_controller.py [--actors 64] [--rounds 20] [--outcomes 100000]

1. a probe round over ``--actors`` real Ray actors (simulated shards), all answering,
   then with one SIGSTOPped: wall time per round against ``probe_timeout_s + 50 ms``;
2. detection with the probe pump running (interval 0.5 s, timeout 0.25 s, threshold 3):
   SIGKILL → DEAD recorded, and SIGSTOP → DEAD recorded, against
   ``interval`` and ``probe_timeout + (threshold − 1) × interval``;
3. ingest of reported outcomes end to end (append + apply into the live view) on a
   SQLite ledger: 100k outcomes counted into windows the way an adapter does
   (one ``outcome_window_reported`` per 1,000 outcomes over 64 shards), then one window
   event per transaction, then 1,000 window events per transaction.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

from fleetledger.adapters.outcome_reporter import OutcomeWindow
from fleetledger.config import FleetHealthConfig
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.events.models import FleetConfig, OutcomeWindowReported, ShardOutcomes
from fleetledger.logs import configure_logging
from fleetledger.store.log import EventLog


def _config(shards: int, **health: float) -> FleetConfig:
    return FleetConfig(
        shard_count=shards,
        train_world_size=1,
        base_urls=tuple(f"ray://bench-{i}" for i in range(shards)),
        settings={"fleet_health": health},
    )


def _line(name: str, value: str, verdict: str = "") -> None:
    print(f"{name:<58} {value:>18}  {verdict}")


def bench_probe_rounds(actors: int, rounds: int, timeout_s: float, db_dir: Path) -> None:
    from fleetledger.controller.ray_fleet import RayShardFleet, local_ray
    from fleetledger.engines.simulated import simulated_shard_factory

    with local_ray():
        started = time.perf_counter()
        fleet = RayShardFleet.spawn(
            actors, simulated_shard_factory(f"bench-{os.getpid()}"), ready_timeout_s=300
        )
        _line(f"spawn {actors} shard actors", f"{time.perf_counter() - started:.1f} s")
        pids = fleet.pids()
        for label, frozen in (("all answering", None), ("one SIGSTOPped", actors // 2)):
            if frozen is not None:
                os.kill(pids[frozen], signal.SIGSTOP)
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                results = fleet.probe(range(actors), timeout_s)
                times.append(time.perf_counter() - t)
            timeouts = sum(r.kind == "timeout" for r in results.values())
            bound = timeout_s + 0.050
            verdict = (
                f"target ≤ {bound * 1000:.0f} ms: "
                f"{'met' if max(times) <= bound else 'MISSED'}; {timeouts} timed out"
            )
            _line(
                f"probe round, {actors} actors, {label} (p50 / max)",
                f"{statistics.median(times) * 1000:.1f} / {max(times) * 1000:.1f} ms",
                verdict,
            )
        os.kill(pids[actors // 2], signal.SIGCONT)
        fleet.shutdown()

        # Detection with the pump running.
        health = FleetHealthConfig(enabled=True, probe_interval_s=0.5, probe_timeout_s=0.25)
        # The signal lands anywhere inside an interval: the first round that can see it
        # starts up to one interval later, hence the interval in both bounds.
        interval, timeout = health.probe_interval_s, health.probe_timeout_s
        for action, sig, target in (
            ("SIGKILL", signal.SIGKILL, interval),
            ("SIGSTOP", signal.SIGSTOP, interval + timeout + 2 * interval),
        ):
            latencies = []
            for trial in range(5):
                fleet = RayShardFleet.spawn(
                    4, simulated_shard_factory(f"detect-{os.getpid()}-{action}-{trial}")
                )
                log = EventLog.open(f"sqlite:///{db_dir}/detect-{action}-{trial}.db")
                ledger = Ledger.start(log, "r", _config(4))
                pump = ProbePump(ledger, fleet, health)
                stop = threading.Event()
                thread = pump.start(stop)
                time.sleep(random.uniform(0.6, 1.1))  # land anywhere inside an interval
                pid = fleet.pids()[1]
                t = time.perf_counter()
                os.kill(pid, sig)
                while ledger.membership.states[1] != "DEAD":
                    time.sleep(0.002)
                latencies.append(time.perf_counter() - t)
                stop.set()
                thread.join(10)
                if sig == signal.SIGSTOP:
                    os.kill(pid, signal.SIGCONT)
                fleet.shutdown()
                log.close()
            _line(
                f"{action} → DEAD recorded, pump running (median / max of 5)",
                f"{statistics.median(latencies) * 1000:.0f} / {max(latencies) * 1000:.0f} ms",
                f"bound {target * 1000:.0f} ms (+50): "
                f"{'met' if max(latencies) <= target + 0.05 else 'MISSED'}",
            )


def bench_ingest(outcomes: int, db_dir: Path) -> None:
    shards = 64
    rng = random.Random(7)

    def fresh(name: str) -> tuple[EventLog, Ledger]:
        path = db_dir / f"{name}.db"
        path.unlink(missing_ok=True)
        log = EventLog.open(f"sqlite:///{path}")
        return log, Ledger.start(log, "r", _config(shards))

    # 1. Counted into windows the way an adapter does, one event per 1,000 outcomes.
    log, ledger = fresh("ingest-windowed")
    window = OutcomeWindow()
    t = time.perf_counter()
    for i in range(outcomes):
        shard = rng.randrange(shards)
        if rng.random() < 0.01:
            window.failure(shard, TimeoutError("generation timed out"))
        else:
            window.success(shard)
        if (i + 1) % 1000 == 0:
            ledger.report_outcomes("bench", window.take())
    if window:
        ledger.report_outcomes("bench", window.take())
    elapsed = time.perf_counter() - t
    assert ledger.view.seq == log.head("r")
    _line(
        f"ingest {outcomes:,} outcomes, windows of 1,000 (append+apply)",
        f"{outcomes / elapsed:,.0f} outcomes/s",
        f"({elapsed:.2f} s, {ledger.view.seq - 1} events)",
    )
    log.close()

    def one_outcome_windows(count: int) -> list[OutcomeWindowReported]:
        return [
            OutcomeWindowReported(
                adapter="bench", outcomes=(ShardOutcomes(shard=i % shards, successes=1),)
            )
            for i in range(count)
        ]

    # 2. One window event (one shard, one outcome) per durable transaction.
    events = one_outcome_windows(min(outcomes, 20_000))
    log, ledger = fresh("ingest-single")
    t = time.perf_counter()
    for e in events:
        ledger.record([e])
    elapsed = time.perf_counter() - t
    _line(
        f"ingest {len(events):,} window events, one per transaction",
        f"{len(events) / elapsed:,.0f} events/s",
    )
    log.close()

    # 3. Window events 1,000 per transaction.
    events = one_outcome_windows(outcomes)
    log, ledger = fresh("ingest-batched")
    t = time.perf_counter()
    for start in range(0, len(events), 1000):
        ledger.record(events[start : start + 1000])
    elapsed = time.perf_counter() - t
    _line(
        f"ingest {len(events):,} window events, 1,000 per transaction",
        f"{len(events) / elapsed:,.0f} events/s",
        "(each event one outcome: outcomes/s)",
    )
    log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--probe-timeout", type=float, default=0.5)
    parser.add_argument("--outcomes", type=int, default=100_000)
    parser.add_argument("--skip-ray", action="store_true", help="only the ingest figures")
    args = parser.parse_args()
    configure_logging("warning")
    with tempfile.TemporaryDirectory(prefix="fl-bench-") as tmp:
        db_dir = Path(tmp)
        bench_ingest(args.outcomes, db_dir)
        if not args.skip_ray:
            bench_probe_rounds(args.actors, args.rounds, args.probe_timeout, db_dir)


if __name__ == "__main__":
    main()
