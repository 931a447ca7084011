"""``fleetledger serve`` measured: stream lag from append to client, and membership
requests per second, on SQLite and PostgreSQL, side by side in one run.

Run by hand (asserts nothing):

    python bench/bench_serve.py                      # both backends
    python bench/bench_serve.py --backends sqlite --events 2000 --requests 20000

For each backend: a fresh ledger, ``fleetledger serve`` started as its own process, a
client following one run's stream (``http.client``, in a thread of this process), and a
writer (this process) appending one event at a time, each making history entries, every
``--interval-ms``. The lag of an entry is the client's clock when the entry's line was
read minus the event's stamp (the appender's clock, same machine), so it includes the
commit, the server's poll or notification, the fold and the socket. Then ``hey`` sends
``--requests`` requests, ``--concurrency`` at a time, to the membership endpoint; the
peer is what "queried for current membership" meant before the server: one
``fleetledger membership RUN --json`` process per question, timed over ``--cli-runs``.
The server's own lag histogram (``/metrics``) is printed beside the client's figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetledger.events.models import (  # noqa: E402
    FleetConfig,
    ProbeFailure,
    ProbeRound,
    RunEnded,
    RunStarted,
)
from fleetledger.store.log import EventLog  # noqa: E402

CONSOLE = Path(sys.executable).parent / "fleetledger"
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
SHARDS = 4


def start_server(db: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [str(CONSOLE), "serve", "--port", "0", "--db", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://"):
        proc.kill()
        raise SystemExit(f"the server did not start ({db})")
    return proc, url


class Follower(threading.Thread):
    """Reads the stream; for each entry, the seconds from its stamp to its line read."""

    def __init__(self, url: str, run: str) -> None:
        super().__init__(daemon=True)
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
        self.conn.request("GET", f"/api/v1/runs/{run}/stream?after=1")
        self.response = self.conn.getresponse()
        self.lags: list[float] = []

    def run(self) -> None:
        while True:
            line = self.response.readline()
            if not line:
                return
            if line.startswith(b'data: {"id"'):
                at_us = json.loads(line[6:])["at_us"]
                self.lags.append(time.time() - at_us / 1e6)
            elif line.startswith(b"event: ended"):
                return


def events(n: int) -> list[ProbeRound]:
    """Rounds that each move a shard (fail, heal): every event makes an entry."""
    out = []
    for i in range(n):
        shard = i // 2 % SHARDS
        if i % 2 == 0:
            out.append(ProbeRound(failed=(ProbeFailure(shard=shard, kind="timeout"),)))
        else:
            out.append(ProbeRound(ok=(shard,)))
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def hey(url: str, requests: int, concurrency: int) -> float:
    done = subprocess.run(
        ["hey", "-n", str(requests), "-c", str(concurrency), url],
        capture_output=True,
        text=True,
        check=True,
    )
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    statuses = re.findall(r"\[(\d{3})\]\s+(\d+) responses", done.stdout)
    if not found or any(code != "200" for code, _ in statuses):
        raise SystemExit(f"hey: {done.stdout[-600:]}")
    return float(found.group(1))


def cli_per_second(db: str, run: str, runs: int) -> float:
    started = time.perf_counter()
    for _ in range(runs):
        subprocess.run(
            [str(CONSOLE), "membership", run, "--json", "--db", db],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return runs / (time.perf_counter() - started)


def server_lag_count(url: str) -> tuple[float, float]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    total = float(re.search(r"fleetledger_serve_stream_lag_seconds_sum (\S+)", text).group(1))
    count = float(re.search(r"fleetledger_serve_stream_lag_seconds_count (\S+)", text).group(1))
    return count, (total / count if count else 0.0)


def measure(backend: str, db: str, args: argparse.Namespace) -> dict[str, float]:
    run = f"bench-{uuid.uuid4().hex[:8]}"
    config = FleetConfig(
        shard_count=SHARDS,
        train_world_size=1,
        base_urls=tuple(f"http://127.0.0.1:{9000 + i}/v1" for i in range(SHARDS)),
        healthy_threshold=1,  # one success heals: every round moves a shard
        settings={"policy": "bench"},
    )
    with EventLog.open(db) as log:
        log.append(run, [RunStarted(config=config)])
        server, url = start_server(db)
        try:
            follower = Follower(url, run)
            follower.start()
            time.sleep(0.5)  # the stream is open and caught up before the first append
            interval = args.interval_ms / 1000
            next_at = time.perf_counter()
            for event in events(args.events):
                log.append(run, [event])
                next_at += interval
                time.sleep(max(0.0, next_at - time.perf_counter()))
            log.append(run, [RunEnded(outcome="completed", cause="bench done")])
            follower.join(timeout=60)
            lags = follower.lags
            served_count, served_mean = server_lag_count(url)
            rps = hey(f"{url}api/v1/runs/{run}/membership", args.requests, args.concurrency)
            cli = cli_per_second(db, run, args.cli_runs)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return {
        "entries": len(lags),
        "p50_ms": percentile(lags, 0.50) * 1000,
        "p99_ms": percentile(lags, 0.99) * 1000,
        "max_ms": max(lags) * 1000,
        "server_count": served_count,
        "server_mean_ms": served_mean * 1000,
        "rps": rps,
        "cli_per_s": cli,
    }


def postgres_database() -> tuple[str, str]:
    import psycopg

    name = f"fl_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    subprocess.run([str(CONSOLE), "migrate", "--db", url], check=True, capture_output=True)
    return name, url


def drop_postgres(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--cli-runs", type=int, default=20)
    args = parser.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("hey is not installed: apt-get install hey")
    results: dict[str, dict[str, float]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="fl-bench-serve-"))
    for backend in args.backends.split(","):
        if backend == "sqlite":
            results[backend] = measure(backend, f"sqlite:///{scratch}/serve.db", args)
        else:
            name, url = postgres_database()
            try:
                results[backend] = measure(backend, url, args)
            finally:
                drop_postgres(name)
    shutil.rmtree(scratch, ignore_errors=True)
    print(
        f"{os.cpu_count()} cores; {args.events} events appended one at a time every "
        f"{args.interval_ms:g} ms, each making an entry; hey -n {args.requests} "
        f"-c {args.concurrency}"
    )
    header = (
        f"{'backend':<11} {'entries':>7} {'lag p50':>9} {'lag p99':>9} {'lag max':>9} "
        f"{'server mean':>11} {'membership req/s':>16} {'CLI membership/s':>16} {'ratio':>7}"
    )
    print(header)
    for backend, r in results.items():
        print(
            f"{backend:<11} {r['entries']:>7.0f} {r['p50_ms']:>7.1f}ms {r['p99_ms']:>7.1f}ms "
            f"{r['max_ms']:>7.1f}ms {r['server_mean_ms']:>9.1f}ms {r['rps']:>16,.0f} "
            f"{r['cli_per_s']:>16.1f} {r['rps'] / r['cli_per_s']:>6.0f}×"
        )


if __name__ == "__main__":
    main()
