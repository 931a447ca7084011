"""Hand-run benchmark: ``fleetledger router`` side by side with SMG and vllm-router, in
front of the same backends, under the same load, in one run.

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_router.py                              # the defaults below
    python bench/bench_router.py --requests 2000 --rounds 1   # a quick look
    python bench/bench_router.py --workers 4 --skip vllm-router,direct

Options: ``--requests`` (20000), ``--concurrency`` (32), ``--rounds`` (2), ``--workers``
(2: the N of the N-worker fleetledger row), ``--payload-kb`` (16), ``--skip`` (names,
comma-separated, shell patterns allowed: ``direct``, ``fleetledger``,
``fleetledger-workers``, ``fleetledger-baseline``, ``smg``, ``vllm-router``),
``--baseline REV`` (also the router of git revision REV, the row
``fleetledger-baseline``: a change's cost measured against the release before it, in the
same run), ``--attesting`` (the backends send an engine's attestation headers, as
fleetledger's engines do: the router's pass-through path is what is measured). Needs
``hey`` and ``nginx`` (Debian ``hey``, ``nginx-light``), ``smg`` and ``vllm-router``
(``pip install smg vllm-router``), and the ``router`` extra; a missing router is one
line and its row is skipped, the rest still runs.

The backends: one nginx master (``worker_processes 1``, ``daemon off``, config, files,
pid, error log and temp paths in a temporary directory readable by www-data) listening
on three ports, each answering ``POST /v1/completions`` with the same fixed OpenAI
completion JSON of ``--payload-kb`` (``error_page 405 =200``: a static file answering
POSTs), ``GET /health`` with 200 (SMG and vllm-router probe it when they register a
worker) and ``GET /v1/models`` with model ``m`` (SMG registers a worker only once it
has found the worker's models there). ``keepalive_requests`` is raised so no client or
router is made to reconnect.

The targets, each measured against all three backends but the first:

- ``direct``: hey straight to one backend, the ceiling;
- ``fleetledger``: ``fleetledger router RUN --db sqlite:///... --port P --window-s 1``
  over a SQLite ledger whose run records the three backends as its shards (least
  outstanding, its only policy);
- ``fleetledger-workers``: the same with ``--workers N`` (several processes on one port);
  skipped, with a line saying so, when ``fleetledger router --help`` has no ``--workers``;
- ``smg``: ``smg launch --host 127.0.0.1 --port P --worker-urls U1 U2 U3 --policy
  round_robin --disable-health-check --disable-circuit-breaker --disable-retries
  --disable-load-monitoring --worker-startup-check-interval 1 --prometheus-host
  127.0.0.1 --prometheus-port Q --log-level error``;
- ``vllm-router``: ``vllm-router --host 127.0.0.1 --port P --worker-urls U1 U2 U3
  --policy round_robin --disable-circuit-breaker --disable-retries
  --worker-startup-check-interval 1 --prometheus-host 127.0.0.1 --prometheus-port Q
  --log-level error`` (it has no switch for health checks: it probes every 60 s).

Round-robin for the two others: with identical backends it spreads the load as least
outstanding does, at the least cost per request (their load-aware policies poll the
engines' load endpoints, which these backends do not have).

Each router is started fresh for each measurement and stopped after it (SIGTERM, then
SIGKILL of its process group after 15 s), so only the one measured runs, and it is
measured only once it has answered a request. A measurement: a warm-up of 1000 requests
at ``--concurrency``, then throughput (``hey -n REQUESTS -c CONCURRENCY``: requests/s,
hey's p50/p99 at that load, every status code), then latency at one request in flight
(``hey -n 2000 -c 1 -o csv``: p50, p99 and mean; hey writes each time to 0.1 ms). A
router's added latency is its figure minus direct's in the same round. ``--rounds``
rounds, every target once per round, the order rotated each round, so drift on the
shared machine hits all alike. Any answer that is not a 200, or a request hey could not
complete, is printed at once and again above the tables, and marks its figure with
``!``.

The fleetledger router is the code the ``fleetledger`` console script imports. To
measure another revision, unpack it beside the checkout and put it first on the path
(how ``results/router-2026-12-03-baseline.txt`` measured the router before the rewrite)::

    git archive REV fleetledger | tar -x -C /tmp/fl-REV
    PYTHONPATH=/tmp/fl-REV python bench/bench_router.py

The header prints which package the routers load. Ctrl-C or SIGTERM stops the bench
and every process it started.

Targets (printed in the footer): fleetledger router throughput >= 1.0x SMG's; added
p50 <= 0.5 ms at one request in flight.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import io
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

BIN = Path(sys.executable).parent
BODY = '{"model":"m","prompt":"p","max_tokens":1}'
PATH = "/v1/completions"
WARMUP = 1000
LATENCY_REQUESTS = 2000
STOP_GRACE_S = 15.0
READY_TIMEOUT_S = 90.0
RUN = "bench-router"


def _tool(name: str) -> str | None:
    """The venv's console script first, then PATH."""
    local = BIN / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


# ── processes ───────────────────────────────────────────────────────────────


class Processes:
    """Every process this bench starts, each in a session of its own (a Ctrl-C at the
    terminal reaches only this script, which stops them in order)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.live: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with (
            (self.logs / f"{name}.out").open("wb") as out,
            (self.logs / f"{name}.err").open("wb") as err,
        ):
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=self.logs,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        self.live.append((name, proc))
        return proc

    def tail(self, name: str, stream: str = "err", lines: int = 8) -> str:
        try:
            text = (self.logs / f"{name}.{stream}").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        name = next((n for n, p in self.live if p is proc), "?")
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                print(f"  ({name} still running {STOP_GRACE_S:g} s after SIGTERM: killed)")
        try:  # whatever is left of its session: the leader if it hung, its children
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            pass
        else:
            if proc.poll() is not None:
                print(f"  !! {name} exited but left processes in its group: killed")
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        self.live = [(n, p) for n, p in self.live if p is not proc]

    def stop_all(self) -> None:
        for _, proc in reversed(list(self.live)):
            self.stop(proc)


def _post(url: str, timeout: float = 5.0) -> int:
    request = urllib.request.Request(
        url + PATH, data=BODY.encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            answer.read()
            return answer.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _wait_answers(procs: Processes, name: str, proc: subprocess.Popen[bytes], url: str) -> None:
    """Until ``url`` answers a completion with 200 (a router may listen before it has
    registered its workers)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {procs.tail(name)}")
        try:
            status = _post(url)
        except OSError as exc:
            last = str(exc)
        else:
            if status == 200:
                return
            last = f"status {status}"
        time.sleep(0.1)
    raise RuntimeError(f"{name} never answered 200 in {READY_TIMEOUT_S:g} s ({last})")


def _first_line(procs: Processes, name: str, proc: subprocess.Popen[bytes]) -> str:
    """The first line the process writes to stdout (fleetledger router: its URL, once
    every worker listens)."""
    out = procs.logs / f"{name}.out"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        text = out.read_text(errors="replace")
        if "\n" in text:
            return text.split("\n", 1)[0].strip()
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {procs.tail(name)}")
        time.sleep(0.05)
    raise RuntimeError(f"{name} printed no URL in {READY_TIMEOUT_S:g} s")


# ── the backends ────────────────────────────────────────────────────────────

NGINX_CONF = """\
worker_processes 1;
daemon off;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {work}/nginx-body;
    proxy_temp_path {work}/nginx-proxy;
    fastcgi_temp_path {work}/nginx-fastcgi;
    uwsgi_temp_path {work}/nginx-uwsgi;
    scgi_temp_path {work}/nginx-scgi;
    keepalive_requests 100000000;
    keepalive_timeout 300s;
    server {{
{listens}
        root {www};
        location = /v1/completions {{
            default_type application/json;
            alias {www}/completion.json;
            error_page 405 =200 /completion.json;
        }}
        location = /completion.json {{
            internal;
            default_type application/json;
{attest}
        }}
        location = /health {{ return 200; }}
        location = /v1/models {{ default_type application/json; alias {www}/models.json; }}
        location / {{ return 404; }}
    }}
}}
"""


# SMG registers a worker only once its /v1/models answers (and takes the model from it).
MODELS = '{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"bench"}]}'


def completion_json(payload_kb: int) -> bytes:
    """An OpenAI completion of ``payload_kb`` KiB (the text padded to the size)."""
    doc = {
        "id": "cmpl-bench",
        "object": "text_completion",
        "created": 1764763200,
        "model": "m",
        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    bare = len(json.dumps(doc, separators=(",", ":")))
    doc["choices"][0]["text"] = "x" * max(0, payload_kb * 1024 - bare)
    return json.dumps(doc, separators=(",", ":")).encode()


ATTEST = """\
            add_header x-fleetledger-weight-version 7 always;
            add_header x-fleetledger-weight-version-end 7 always;"""
"""What ``--attesting`` backends add to every answer: an engine's word on its weights."""


def start_backends(
    procs: Processes, nginx: str, work: Path, payload_kb: int, attesting: bool = False
) -> tuple[list[str], int]:
    www = work / "www"
    www.mkdir()
    body = completion_json(payload_kb)
    (www / "completion.json").write_bytes(body)
    (www / "models.json").write_text(MODELS)
    for path in (work, www):
        path.chmod(0o755)
    for path in www.iterdir():
        path.chmod(0o644)
    ports = [_free_port() for _ in range(3)]
    listens = "\n".join(f"        listen 127.0.0.1:{p} backlog=4096;" for p in ports)
    conf = work / "nginx.conf"
    attest = ATTEST if attesting else ""
    conf.write_text(NGINX_CONF.format(work=work, www=www, listens=listens, attest=attest))
    proc = procs.start(
        "nginx", [nginx, "-c", str(conf), "-p", f"{work}/", "-e", str(work / "nginx-error.log")]
    )
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    for url in urls:
        _wait_answers(procs, "nginx", proc, url)
    return urls, len(body)


def create_ledger(work: Path, backends: list[str], name: str = "ledger") -> str:
    """A fresh ledger whose run records the backends as its shards. One per router
    started: each appends its own windows, and a router of an older revision cannot
    read a newer one's (its models refuse fields it does not know)."""
    from fleetledger.config import ControllerConfig
    from fleetledger.controller.ledger import Ledger
    from fleetledger.store.log import EventLog

    db = f"sqlite:///{work}/{name}.db"
    log = EventLog.open(db)
    try:
        config = ControllerConfig.model_validate({"fleet_health": {"enabled": True}})
        fleet = config.fleet_config(
            shard_count=len(backends),
            train_world_size=1,
            base_urls=[f"{url}/v1" for url in backends],
        )
        Ledger.start(log, RUN, fleet)
    finally:
        log.close()
    return db


def unpack_revision(rev: str, work: Path) -> Path:
    """The ``fleetledger`` package of git revision ``rev``, unpacked under ``work``."""
    tree = work / f"rev-{rev}"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", rev, "fleetledger"],
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


# ── the targets ─────────────────────────────────────────────────────────────


@dataclass
class Target:
    name: str
    label: str
    # None: the first backend, nothing to start. Else: (argv, env, prints its URL first).
    launch: Callable[[], tuple[list[str], dict[str, str], str | None]] | None
    skipped: str | None = None


def targets(args: argparse.Namespace, backends: list[str], db: str | None) -> list[Target]:
    fleetledger, smg, vllm = _tool("fleetledger"), _tool("smg"), _tool("vllm-router")
    found: list[Target] = [Target("direct", "direct, one backend (the ceiling)", None)]

    def fleet(
        workers: int | None, tree: Path | None = None
    ) -> Callable[[], tuple[list[str], dict[str, str], str | None]]:
        def launch() -> tuple[list[str], dict[str, str], str | None]:
            port = _free_port()
            fresh = create_ledger(Path(str(db).removeprefix("sqlite:///")).parent, backends,
                                  f"ledger-{port}")  # fmt: skip
            argv = [str(fleetledger), "router", RUN, "--db", fresh, "--port", str(port)]
            argv += ["--window-s", "1"]
            if workers is not None:
                argv += ["--workers", str(workers)]
            env = {"FLEETLEDGER_LOG": "error"}
            if tree is not None:  # another revision, first on the path
                env["PYTHONPATH"] = str(tree)
            return argv, env, f"http://127.0.0.1:{port}/v1"

        return launch

    def smg_launch() -> tuple[list[str], dict[str, str], str | None]:
        argv = [str(smg), "launch", "--host", "127.0.0.1", "--port", str(_free_port())]
        argv += ["--worker-urls", *backends, "--policy", "round_robin"]
        argv += ["--disable-health-check", "--disable-circuit-breaker", "--disable-retries"]
        argv += ["--disable-load-monitoring", "--worker-startup-check-interval", "1"]
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        argv += ["--log-level", "error"]
        return argv, {"RUST_LOG": "error"}, None

    def vllm_launch() -> tuple[list[str], dict[str, str], str | None]:
        argv = [str(vllm), "--host", "127.0.0.1", "--port", str(_free_port())]
        argv += ["--worker-urls", *backends, "--policy", "round_robin"]
        argv += ["--disable-circuit-breaker", "--disable-retries"]
        argv += ["--worker-startup-check-interval", "1"]
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        argv += ["--log-level", "error"]
        return argv, {"RUST_LOG": "error"}, None

    version = _version("fleetledger")
    if fleetledger is None or db is None:
        why = "fleetledger is not installed" if fleetledger is None else "no ledger"
        found.append(Target("fleetledger", "fleetledger router", None, why))
        found.append(Target("fleetledger-workers", "fleetledger router", None, why))
    else:
        found.append(Target("fleetledger", f"fleetledger {version} router, 1 worker", fleet(None)))
        if args.baseline is not None:
            rev, tree = args.baseline
            label = f"fleetledger at {rev} (the release before), 1 worker"
            found.append(Target("fleetledger-baseline", label, fleet(None, tree)))
        label = f"fleetledger {version} router, {args.workers} workers"
        helped = subprocess.run(
            [fleetledger, "router", "--help"],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        if "--workers" in helped.stdout:
            found.append(Target("fleetledger-workers", label, fleet(args.workers)))
        else:
            why = "`fleetledger router --help` has no --workers option (not in this version)"
            found.append(Target("fleetledger-workers", label, None, why))
    found.append(
        Target("smg", f"SMG {_version('smg')}, round_robin", smg_launch)
        if smg
        else Target("smg", "SMG", None, "not installed (pip install smg)")
    )
    found.append(
        Target("vllm-router", f"vllm-router {_version('vllm-router')}, round_robin", vllm_launch)
        if vllm
        else Target(
            "vllm-router",
            "vllm-router",
            None,
            "not installed (pip install vllm-router)",
        )
    )
    for target in found:
        if target.skipped is None and any(fnmatch.fnmatch(target.name, p) for p in args.skip):
            target.skipped = "--skip"
    return found


# ── hey ─────────────────────────────────────────────────────────────────────


@dataclass
class Load:
    rps: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    mean_ms: float = float("nan")
    bad: list[str] = field(default_factory=list)  # non-200 codes, errors


def _hey(argv: list[str], requests: int) -> str:
    done = subprocess.run(
        ["hey", *argv], capture_output=True, text=True, timeout=120 + requests / 50
    )
    if done.returncode != 0:
        raise RuntimeError(f"hey exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return done.stdout


def _post_args(url: str) -> list[str]:
    return ["-m", "POST", "-T", "application/json", "-d", BODY, url + PATH]


def hey_summary(url: str, requests: int, concurrency: int) -> Load:
    out = _hey(["-n", str(requests), "-c", str(concurrency), *_post_args(url)], requests)
    load = Load()
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    load.rps = float(found.group(1)) if found else 0.0
    pct = dict(re.findall(r"^\s*(\d+)% in ([\d.]+) secs", out, re.M))
    load.p50_ms = float(pct.get("50", "nan")) * 1e3
    load.p99_ms = float(pct.get("99", "nan")) * 1e3
    found = re.search(r"Average:\s+([\d.]+) secs", out)
    load.mean_ms = float(found.group(1)) * 1e3 if found else float("nan")
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    load.bad = [f"{n} x HTTP {c}" for c, n in sorted(codes.items()) if c != 200]
    errors = re.findall(r"\[(\d+)\]\s+(.*)", out.partition("Error distribution:")[2])
    load.bad += [f"{n} x {what.strip()[:160]}" for n, what in errors]
    sent = requests // concurrency * concurrency  # hey: each of -c workers sends n // c
    missing = sent - sum(codes.values()) - sum(int(n) for n, _ in errors)
    if missing > 0:
        load.bad.append(f"{missing} requests missing from hey's counts")
    return load


def hey_latency(url: str, requests: int) -> Load:
    """One request in flight; every request's time from ``-o csv`` (hey leaves a request
    that failed without an answer out of it: counted as missing)."""
    out = _hey(["-n", str(requests), "-c", "1", "-o", "csv", *_post_args(url)], requests)
    rows = list(csv.DictReader(io.StringIO(out)))
    times = sorted(float(row["response-time"]) * 1e3 for row in rows)
    codes: dict[str, int] = {}
    for row in rows:
        codes[row["status-code"]] = codes.get(row["status-code"], 0) + 1
    load = Load(rps=0.0)
    load.bad = [f"{n} x HTTP {c}" for c, n in sorted(codes.items()) if c != "200"]
    if len(rows) < requests:
        load.bad.append(f"{requests - len(rows)} requests failed without an answer")
    if times:
        load.p50_ms = times[len(times) // 2]
        load.p99_ms = times[min(len(times) - 1, int(0.99 * len(times)))]
        load.mean_ms = statistics.fmean(times)
    return load


# ── one measurement ─────────────────────────────────────────────────────────


@dataclass
class Measure:
    throughput: Load
    latency: Load
    cpu_us_per_request: float = float("nan")  # the router's own CPU, throughput run


def _cpu_s(proc: subprocess.Popen[bytes] | None) -> float:
    """CPU seconds (user + system) of ``proc`` and its children so far: what a request
    costs the router itself, which a shared, noisy machine moves far less than
    throughput (nan for a target with no process of its own)."""
    if proc is None:
        return float("nan")
    import psutil

    try:
        root = psutil.Process(proc.pid)
        total = 0.0
        for p in (root, *root.children(recursive=True)):
            times = p.cpu_times()
            total += times.user + times.system
        return total
    except psutil.Error:
        return float("nan")


def measure(
    procs: Processes, target: Target, backends: list[str], args: argparse.Namespace
) -> Measure:
    proc = None
    try:
        if target.launch is None:
            url = backends[0]
        else:
            argv, env, printed = target.launch()
            proc = procs.start(target.name, argv, env)
            if printed is not None:  # fleetledger router: its URL once listening
                said = _first_line(procs, target.name, proc)
                if said != printed:
                    raise RuntimeError(f"{target.name} printed {said!r}, expected {printed!r}")
                url = printed.removesuffix("/v1")
            else:
                url = "http://127.0.0.1:" + argv[argv.index("--port") + 1]
            _wait_answers(procs, target.name, proc, url)
        warm = hey_summary(url, WARMUP, args.concurrency)
        if warm.bad:
            _loud(f"{target.name} warm-up", warm.bad)
        before = _cpu_s(proc)
        throughput = hey_summary(url, args.requests, args.concurrency)
        cpu = (_cpu_s(proc) - before) / args.requests * 1e6
        latency = hey_latency(url, LATENCY_REQUESTS)
        if proc is not None and proc.poll() is not None:
            throughput.bad.append(f"{target.name} exited {proc.returncode} during the run")
        return Measure(throughput, latency, cpu)
    finally:
        if proc is not None:
            procs.stop(proc)


PROBLEMS: list[str] = []


def _loud(where: str, bad: list[str]) -> None:
    line = f"!! {where}: NOT ALL 200: " + "; ".join(bad)
    PROBLEMS.append(line)
    print(line, flush=True)


# ── the tables ──────────────────────────────────────────────────────────────


def _cell(value: float, fmt: str, bad: bool, width: int) -> str:
    text = "-" if value != value else format(value, fmt)  # NaN: no figure
    return f"{text + ('!' if bad else ''):>{width}}"


def report(
    found: list[Target], results: dict[str, list[Measure | None]], args: argparse.Namespace
) -> None:
    rounds = range(args.rounds)
    width = max(len(t.label) for t in found) + 2
    measured = [t for t in found if t.skipped is None]
    smg = results.get("smg")
    direct = results.get("direct")

    def per_round(name: str) -> list[Measure | None]:
        return results.get(name, [None] * args.rounds)

    heads = "".join(f"{'round ' + str(r + 1):>10}" for r in rounds)
    print(f"\n1. throughput: hey -n {args.requests} -c {args.concurrency}, requests/s")
    print(f"{'':<{width}}{heads}{'mean':>10}   x SMG, per round")
    for t in found:
        if t.skipped is not None:
            print(f"{t.label:<{width}}skipped: {t.skipped}")
            continue
        ms = per_round(t.name)
        cells = "".join(
            _cell(m.throughput.rps, ",.0f", bool(m.throughput.bad), 10) if m else f"{'-':>10}"
            for m in ms
        )
        rates = [m.throughput.rps for m in ms if m]
        mean = statistics.fmean(rates) if rates else float("nan")
        ratios = []
        for r in rounds:
            mine, theirs = ms[r], smg[r] if smg else None
            if mine and theirs and theirs.throughput.rps:
                ratios.append(f"{mine.throughput.rps / theirs.throughput.rps:.2f}x")
            else:
                ratios.append("-")
        print(f"{t.label:<{width}}{cells}{_cell(mean, ',.0f', False, 10)}   {' '.join(ratios)}")
    print("\n   the router's own CPU per request during that run, µs (user + system)")
    for t in measured:
        if t.name == "direct":
            continue
        ms = per_round(t.name)
        cells = "".join(
            _cell(m.cpu_us_per_request, ".1f", False, 10) if m else f"{'-':>10}" for m in ms
        )
        costs = [m.cpu_us_per_request for m in ms if m]
        mean = statistics.fmean(costs) if costs else float("nan")
        print(f"{t.label:<{width}}{cells}{_cell(mean, '.1f', False, 10)}")
    print(f"\n   latency at {args.concurrency} in flight (hey's), p50 / p99 ms")
    for t in measured:
        ms = per_round(t.name)
        cells = "".join(
            f"{m.throughput.p50_ms:>6.1f} /{m.throughput.p99_ms:>5.1f}" if m else f"{'-':>13}"
            for m in ms
        )
        print(f"{t.label:<{width}}{cells}")

    print(f"\n2. one request in flight: hey -n {LATENCY_REQUESTS} -c 1, ms (hey: 0.1 ms steps)")
    heads = "".join(f"{'p50 r' + str(r + 1):>9}" for r in rounds)
    heads += "".join(f"{'p99 r' + str(r + 1):>9}" for r in rounds)
    heads += "".join(f"{'mean r' + str(r + 1):>9}" for r in rounds)
    print(f"{'':<{width}}{heads}")
    for t in measured:
        ms = per_round(t.name)
        cells = ""
        for key in ("p50_ms", "p99_ms", "mean_ms"):
            cells += "".join(
                _cell(getattr(m.latency, key), ".2f", bool(m.latency.bad), 9) if m else f"{'-':>9}"
                for m in ms
            )
        print(f"{t.label:<{width}}{cells}")
    print("\n   added: through the router minus direct, the same round")
    print(f"{'':<{width}}{heads}")
    added: dict[str, list[float]] = {}
    for t in measured:
        if t.name == "direct":
            continue
        if direct is None:
            print(f"{t.label:<{width}}- (direct was not measured)")
            continue
        ms = per_round(t.name)
        cells = ""
        for key in ("p50_ms", "p99_ms", "mean_ms"):
            for r in rounds:
                mine, base = ms[r], direct[r]
                if mine and base:
                    value = getattr(mine.latency, key) - getattr(base.latency, key)
                    bad = bool(mine.latency.bad or base.latency.bad)
                    cells += _cell(value, "+.2f", bad, 9)
                    added.setdefault(f"{t.name}:{key}", []).append(value)
                else:
                    cells += f"{'-':>9}"
        print(f"{t.label:<{width}}{cells}")

    if PROBLEMS:
        print(f"\n!! {len(PROBLEMS)} MEASUREMENT(S) WITH ANSWERS THAT WERE NOT 200 (marked !):")
        for line in PROBLEMS:
            print(line)

    print(
        "\ntargets: fleetledger router throughput >= 1.0x SMG's; "
        "added p50 <= 0.5 ms at one request in flight"
    )
    for t in found:
        if not t.name.startswith("fleetledger"):
            continue
        if t.skipped is not None:
            print(f"  {t.label}: skipped ({t.skipped})")
            continue
        ms = per_round(t.name)
        pairs = [
            (m.throughput.rps, s.throughput.rps)
            for m, s in zip(ms, smg or [], strict=False)
            if m and s and s.throughput.rps
        ]
        if pairs:
            ratio = statistics.fmean(a for a, _ in pairs) / statistics.fmean(b for _, b in pairs)
            verdict = "met" if ratio >= 1.0 else "NOT met"
            throughput = f"{ratio:.2f}x SMG over the rounds ({verdict})"
        else:
            throughput = "no SMG figure"
        p50s = added.get(f"{t.name}:p50_ms")
        if p50s:
            p50 = statistics.fmean(p50s)
            latency = f"added p50 {p50:+.2f} ms ({'met' if p50 <= 0.5 else 'NOT met'})"
        else:
            latency = "no added-latency figure"
        print(f"  {t.label}: {throughput}; {latency}")


# ── main ────────────────────────────────────────────────────────────────────


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--payload-kb", type=int, default=16)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure the fleetledger router of git revision REV (git archive, unpacked "
        "beside the checkout, first on its PYTHONPATH): the row fleetledger-baseline",
    )
    parser.add_argument(
        "--attesting",
        action="store_true",
        help="the backends answer as fleetledger's engines do, with their attestation headers",
    )
    parser.add_argument(
        "--skip",
        type=lambda s: [p.strip() for p in s.split(",") if p.strip()],
        default=[],
        help="targets to leave out: direct, fleetledger, fleetledger-workers, smg, vllm-router",
    )
    args = parser.parse_args()

    def _interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM stop the bench through its finally: every process it started is
    # reaped (and SIGINT is honoured even where a shell started this in the background).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)

    nginx = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    missing = [name for name, path in (("hey", shutil.which("hey")), ("nginx", nginx)) if not path]
    if missing:
        raise SystemExit(
            f"{' and '.join(missing)} not installed (apt-get install hey nginx-light): "
            "nothing can be measured"
        )
    load = os.getloadavg()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}  cores (os.cpu_count): {os.cpu_count()}  "
        f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}  python {sys.version.split()[0]}"
    )
    work = Path(tempfile.mkdtemp(prefix="fl-bench-router-"))
    procs = Processes(work)
    if args.baseline is not None:
        args.baseline = (args.baseline, unpack_revision(args.baseline, work))
    try:
        backends, size = start_backends(procs, nginx, work, args.payload_kb, args.attesting)
        try:
            db: str | None = create_ledger(work, backends)
        except ImportError as exc:
            print(f"fleetledger rows skipped: cannot create a ledger ({exc})")
            db = None
        found = targets(args, backends, db)
        if db is not None:
            where = subprocess.run(
                [sys.executable, "-c", "import fleetledger; print(fleetledger.__file__)"],
                capture_output=True,
                text=True,
                cwd=work,
            ).stdout.strip()
            print(f"fleetledger package: {Path(where).parent} (the router's, unless its "
                  "console script runs another interpreter)")  # fmt: skip
        version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip()
        ports = " ".join(b.rsplit(":", 1)[1] for b in backends)
        print(
            f"backends: {version}, one master, 1 worker process, ports {ports}, "
            f"{size:,} byte answers"
        )
        print(
            f"load: hey, {WARMUP} warm-up requests at {args.concurrency} in flight, then "
            f"-n {args.requests} -c {args.concurrency}, then -n {LATENCY_REQUESTS} -c 1; "
            f"{args.rounds} round(s), order rotated; each router started fresh per measurement"
        )
        for t in found:
            if t.skipped is not None:
                print(f"skipped: {t.name}: {t.skipped}")
        active = [t for t in found if t.skipped is None]
        results: dict[str, list[Measure | None]] = {t.name: [None] * args.rounds for t in active}
        for r in range(args.rounds):
            order = active[r % len(active) :] + active[: r % len(active)] if active else []
            for t in order:
                started = time.monotonic()
                try:
                    m = measure(procs, t, backends, args)
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    line = f"!! round {r + 1} {t.name}: FAILED: {exc}"
                    PROBLEMS.append(line)
                    print(line, flush=True)
                    continue
                results[t.name][r] = m
                for what, load_ in (("throughput", m.throughput), ("1 in flight", m.latency)):
                    if load_.bad:
                        _loud(f"round {r + 1} {t.name} {what}", load_.bad)
                print(
                    f"round {r + 1}  {t.name:<20} {m.throughput.rps:>9,.0f} req/s  "
                    f"p50/p99 {m.throughput.p50_ms:.1f}/{m.throughput.p99_ms:.1f} ms;  "
                    f"1 in flight p50/p99 {m.latency.p50_ms:.2f}/{m.latency.p99_ms:.2f} ms  "
                    f"({time.monotonic() - started:.0f} s)",
                    flush=True,
                )
        report(found, results, args)
    except KeyboardInterrupt:
        print("\ninterrupted: stopping every process started", flush=True)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not stop the reaping
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        procs.stop_all()
        errors = (
            (work / "nginx-error.log").read_text(errors="replace").strip()
            if (work / "nginx-error.log").exists()
            else ""
        )
        if errors:
            print(f"nginx error log:\n{errors[-1500:]}")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
