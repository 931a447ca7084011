"""Hand-run benchmark of the router against the same backends reached directly.

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_router.py [--requests 2000] [--concurrency 32] [--payload-kb 64]

Everything in one run, side by side, on the same machine:

- two backends (one aiohttp process, two ports) answering ``/v1/completions`` with a
  fixed JSON body of ``--payload-kb`` (a completion with per-token logprobs is large);
- the router as its own process (``fleetledger router``) over a SQLite ledger whose run
  records both backends;
- the client in this process (aiohttp), alternating blocks of requests sent directly to
  a backend and through the router, so load from elsewhere hits both sides alike.

1. latency, one request at a time: p50 and p99 direct, routed, and the difference (the
   latency the router adds);
2. throughput at ``--concurrency`` requests in flight: requests/s direct (spread over
   both backends by the client itself) and through the router, and the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from fleetledger.controller.ledger import Ledger
from fleetledger.router.app import reserve_port
from fleetledger.simulate import simulation_config
from fleetledger.store.log import EventLog

CONSOLE = Path(sys.executable).parent / "fleetledger"

BACKEND = """
import sys
from aiohttp import web
text = b"x" * (int(sys.argv[3]) * 1024)
body = b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"' + text + b'"}]}'
async def completions(request):
    await request.read()
    return web.Response(body=body, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/completions", completions)
async def main():
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    for port in sys.argv[1:3]:
        await web.TCPSite(runner, "127.0.0.1", int(port)).start()
    print("ready", flush=True)
    import asyncio
    await asyncio.Event().wait()
import asyncio
asyncio.run(main())
"""


def _line(name: str, value: str, note: str = "") -> None:
    print(f"{name:<52} {value:>16}  {note}", flush=True)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _latency(
    session: aiohttp.ClientSession, direct: str, routed: str, n: int, block: int = 50
) -> tuple[list[float], list[float]]:
    payload = {"model": "m", "prompt": "p", "max_tokens": 1}
    times: dict[str, list[float]] = {direct: [], routed: []}
    for _ in range(n // block):
        for url in (direct, routed):
            for _ in range(block):
                started = time.perf_counter()
                async with session.post(f"{url}/completions", json=payload) as answer:
                    await answer.read()
                    assert answer.status == 200, answer.status
                times[url].append(time.perf_counter() - started)
    return times[direct], times[routed]


async def _throughput(session: aiohttp.ClientSession, urls: list[str], n: int, width: int) -> float:
    payload = {"model": "m", "prompt": "p", "max_tokens": 1}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for k in range(n):
        queue.put_nowait(k)

    async def worker(i: int) -> None:
        url = urls[i % len(urls)]
        while not queue.empty():
            queue.get_nowait()
            async with session.post(f"{url}/completions", json=payload) as answer:
                await answer.read()
                assert answer.status == 200, answer.status

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(width)))
    return n / (time.perf_counter() - started)


async def _client(direct: list[str], routed: str, args: argparse.Namespace) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _latency(session, direct[0], routed, 100)  # warm both paths
        d, r = await _latency(session, direct[0], routed, args.requests)
        print(f"\n1. latency, one request at a time ({args.requests} each, {args.payload_kb} KB)")
        for q, label in ((0.5, "p50"), (0.99, "p99")):
            dq, rq = _pct(d, q), _pct(r, q)
            _line(
                f"{label}: direct / through the router",
                f"{dq * 1e3:.2f} / {rq * 1e3:.2f} ms",
                f"added {(rq - dq) * 1e3:.2f} ms",
            )
        _line("mean: direct / through the router", f"{statistics.mean(d) * 1e3:.2f} / "
              f"{statistics.mean(r) * 1e3:.2f} ms")  # fmt: skip
        n = args.requests * 2
        direct_rps = await _throughput(session, direct, n, args.concurrency)
        routed_rps = await _throughput(session, [routed], n, args.concurrency)
        print(f"\n2. throughput, {args.concurrency} requests in flight, {n} requests")
        _line("direct (client spreads over both backends)", f"{direct_rps:,.0f} req/s")
        _line("through the router", f"{routed_rps:,.0f} req/s",
              f"{routed_rps / direct_rps:.2f}x of direct")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--payload-kb", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fl-bench-router-"))
    ports = [reserve_port(), reserve_port()]
    backend = subprocess.Popen(
        [sys.executable, "-c", BACKEND, *map(str, ports), str(args.payload_kb)],
        stdout=subprocess.PIPE,
        text=True,
    )
    router = None
    try:
        assert backend.stdout is not None and backend.stdout.readline().strip() == "ready"
        direct = [f"http://127.0.0.1:{p}/v1" for p in ports]
        db = f"sqlite:///{work}/ledger.db"
        log = EventLog.open(db)
        config = simulation_config()
        run = "bench-router"
        Ledger.start(log, run, config.fleet_config(shard_count=2, train_world_size=1,
                                                   base_urls=direct))  # fmt: skip
        log.close()
        port = reserve_port()
        router = subprocess.Popen(
            [str(CONSOLE), "router", run, "--db", db, "--port", str(port), "--window-s", "1"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "FLEETLEDGER_LOG": "error"},
        )
        assert router.stdout is not None
        routed = router.stdout.readline().strip()
        print(f"backends {direct}; router {routed} (its own process)")
        asyncio.run(_client(direct, routed, args))
    finally:
        if router is not None:
            router.send_signal(signal.SIGTERM)
            router.wait(timeout=30)
        backend.kill()
        backend.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
