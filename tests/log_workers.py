"""Worker processes for the multi-process log tests; run as ``python -m tests.log_workers``.

Each worker opens its own :class:`EventLog` on the URL it is given, prints ``ready``
once the database is open, and then:

- ``concurrent URL RUN WORKER COUNT SEED``: waits for a line on stdin (the start
  barrier), appends COUNT events to RUN as single events and small batches, re-sends
  some batches (a retry must return the same seqs), and prints one JSON object
  ``{"batches": [[[event_id, seq], ...], ...]}`` at the end.
- ``crash URL RUN TRIAL SEED``: waits for a line on stdin (so a worker can be started
  ahead of its turn), then appends batches to RUN until it is killed, printing
  ``event_id seq`` pairs of each batch on one line, flushed right after ``append``
  returns. Every event is a one-shard round of a failed probe whose ``error`` is
  ``t<trial>:b<batch>:<index>:<size>``, so the parent can tell which batch a stored
  event belongs to.
"""

from __future__ import annotations

import json
import random
import sys

from fleetledger.events.models import RefitStarted
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok

SHARDS = 3  # the runs these workers append to are started with tests.builders.fleet_config()


def _concurrent(url: str, run: str, worker: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with EventLog.open(url) as log:
        print("ready", flush=True)
        sys.stdin.readline()
        batches: list[list[list[object]]] = []
        made = 0
        while made < count:
            size = min(rng.choice([1, 1, 1, 2, 3, 5]), count - made)
            batch = [
                rng.choice(
                    [
                        probe_ok((made + i) % SHARDS),
                        probe_failed(worker % SHARDS, "error", f"w{worker}"),
                        RefitStarted(weight_version=made + i, shards=(0, 1)),
                    ]
                )
                for i in range(size)
            ]
            seqs = log.append(run, batch)
            if rng.random() < 0.1:
                again = log.append(run, batch)
                if again != seqs:
                    raise SystemExit(f"worker {worker}: retry returned {again}, first {seqs}")
            batches.append([[event.id, seq] for event, seq in zip(batch, seqs, strict=True)])
            made += size
    print(json.dumps({"batches": batches}), flush=True)


def _crash(url: str, run: str, trial: int, seed: int) -> None:
    rng = random.Random(seed)
    log = EventLog.open(url)
    print("ready", flush=True)
    sys.stdin.readline()
    number = 0
    while True:
        size = rng.choice([1, 1, 1, 2, 3, 8, 40, 200])
        batch = [
            probe_failed((number + i) % SHARDS, "timeout", f"t{trial}:b{number}:{i}:{size}")
            for i in range(size)
        ]
        seqs = log.append(run, batch)
        sys.stdout.write(
            " ".join(f"{event.id} {seq}" for event, seq in zip(batch, seqs, strict=True)) + "\n"
        )
        sys.stdout.flush()
        number += 1


def main(argv: list[str]) -> None:
    mode, url, run, *rest = argv
    if mode == "concurrent":
        worker, count, seed = (int(x) for x in rest)
        _concurrent(url, run, worker, count, seed)
    elif mode == "crash":
        trial, seed = (int(x) for x in rest)
        _crash(url, run, trial, seed)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
