"""Hand-run: how long an import on SQLite holds a live writer of another run (issue 36).

    python bench/import_hold.py 200000     # events in the imported run

A run of N events is written and exported (``fleetledger export``); a writer appends to
another run of the same file every 10 ms while the export is imported (``fleetledger
import``); printed: the import's time and the live writer's longest append, beside its
median (docs/events.md quotes the figures). Asserts nothing; run by hand.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from fleetledger.events.models import FleetConfig, ProbeRound, RunStarted
from fleetledger.store.log import EventLog


def run_started(shards: int) -> RunStarted:
    urls = tuple(f"http://127.0.0.1:{8000 + i}/v1" for i in range(shards))
    return RunStarted(config=FleetConfig(shard_count=shards, train_world_size=1, base_urls=urls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("events", type=int, help="events in the imported run")
    n = parser.parse_args().events
    work = Path(tempfile.mkdtemp(prefix="fl-import-hold-"))
    db, export = f"sqlite:///{work}/ledger.db", work / "run.jsonl"
    with EventLog.open(db) as log:
        log.append("src", [run_started(3)])
        for _ in range(n // 1000):
            log.append("src", [ProbeRound(ok=(0, 1, 2)) for _ in range(1000)])
        log.append("live", [run_started(3)])
    command = str(Path(sys.executable).parent / "fleetledger")
    with export.open("w") as out:
        subprocess.run([command, "export", "src", "--db", db], stdout=out, check=True)
    waits: list[float] = []
    stop = threading.Event()

    def live_writer() -> None:
        with EventLog.open(db) as log:
            while not stop.is_set():
                started = time.monotonic()
                log.append("live", [ProbeRound(ok=(0, 1, 2))])
                waits.append(time.monotonic() - started)
                time.sleep(0.01)

    writer = threading.Thread(target=live_writer)
    writer.start()
    time.sleep(0.5)
    started = time.monotonic()
    subprocess.run(
        [command, "import", str(export), "--run", "copy", "--db", db],
        check=True,
        capture_output=True,
    )
    took = time.monotonic() - started
    time.sleep(0.5)
    stop.set()
    writer.join()
    print(
        f"{n} events: import {took:.1f} s; the live writer's longest append "
        f"{max(waits):.2f} s (median {statistics.median(waits) * 1e3:.1f} ms, "
        f"{len(waits)} appends)"
    )


if __name__ == "__main__":
    main()
