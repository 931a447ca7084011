"""Several router processes on one port: ``fleetledger router --workers N``.

Why: the router is Python, so one process is capped at one core however many the
machine has. N worker processes each listen on the same port (``SO_REUSEPORT``: every
worker has a socket of its own, and the kernel spreads new connections over them by a
hash of the connection's addresses), each follows the ledger itself and routes on its
own.

Theory of operation. The supervisor (this module, in the command's process) holds the
port bound but not listening, so a port that something else holds fails it before any
worker starts, and the port stays this router's while workers come and go. It starts N
workers (``python -m fleetledger.router.worker``, each a whole :class:`Router`), waits
until every one listens, then watches them: a worker that dies is said in one line and
started again on the same port. On stop each worker is sent SIGTERM and hands over its
last window of outcomes, as a single router does.

What the workers share, and what they do not:

- **The membership**: each folds the run's tail from the ledger, so all route by the
  same truth, each at most ``poll_s`` behind it.
- **Outcomes**: each worker writes its own windows, under its own adapter name
  (``NAME-0`` … ``NAME-{N-1}``), so ``explain`` can tell which process saw a failure,
  and the ledger applies each window's successes before its failures as always.
- **Least outstanding is per worker**: a worker counts only the requests it holds.
  Across workers it is approximate — the kernel spreads connections evenly, so each
  worker holds about 1/N of the load and balances its share over the same shards; a
  slow shard piles up requests in every worker alike, so every worker steers away from
  it. Ties (lowest shard first) and avoidance after a failure are exact within a worker.
- **Metrics**: ``/metrics`` answers the sum over every worker, whichever one the scrape
  reaches (:mod:`fleetledger.router.metrics`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

import structlog

from fleetledger.router.app import STOP_GRACE_S, RouterError
from fleetledger.router.listen import bind_listening
from fleetledger.router.metrics import MULTIPROC_DIR_ENV

__all__ = ["RouterWorkers", "WorkerSpec", "worker_name"]

_log = structlog.get_logger("fleetledger.router")

START_BOUND_S = 120.0  # a worker loads the run's view before it listens
WATCH_S = 0.2


def worker_name(name: str, index: int) -> str:
    """The adapter name worker ``index`` writes its outcome windows under."""
    return f"{name}-{index}"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker process is started with (its one command-line argument, JSON)."""

    db_url: str
    run: str
    host: str
    port: int
    name: str
    window_s: float
    poll_s: float


class RouterWorkers:
    """N router worker processes on one port (module docstring)."""

    def __init__(
        self,
        db_url: str,
        run: str,
        *,
        workers: int,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "router",
        window_s: float = 1.0,
        poll_s: float = 0.25,
    ) -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise RouterError(f"router: workers must be a whole number ≥ 1, got {workers!r}")
        if not 0 <= port <= 65535:
            raise RouterError(f"router: port {port} is not a TCP port (0..65535)")
        self._held = bind_listening(host, port, RouterError, shared=True, listen=False)
        self.port = int(self._held.getsockname()[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/v1"
        self._specs = [
            WorkerSpec(db_url, run, host, self.port, worker_name(name, i), window_s, poll_s)
            for i in range(workers)
        ]
        self._metrics_dir = tempfile.mkdtemp(prefix="fleetledger-router-metrics-")
        self._procs: list[subprocess.Popen[str] | None] = [None] * workers
        self._stopping = False
        try:
            for i in range(workers):
                self._procs[i] = self._start(i)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p is not None]

    def _start(self, index: int) -> subprocess.Popen[str]:
        spec = self._specs[index]
        env = {**os.environ, MULTIPROC_DIR_ENV: self._metrics_dir}
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleetledger.router.worker", json.dumps(asdict(spec))],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        line = _first_line(proc, START_BOUND_S)
        if line.startswith("ready "):
            return proc
        _reap(proc)
        why = line.removeprefix("error ").strip() or f"exited {proc.returncode} before listening"
        raise RouterError(why if why.startswith("router") else f"router worker {index}: {why}")

    def serve_forever(self, stop: threading.Event) -> None:
        """Watch the workers until ``stop`` is set; a worker that dies is started again;
        then every worker is stopped (each hands over its last window)."""
        try:
            while not stop.wait(WATCH_S):
                for i, proc in enumerate(self._procs):
                    if proc is not None and proc.poll() is not None and not self._stopping:
                        self._restart(i, proc)
        finally:
            self.close()

    def _restart(self, index: int, dead: subprocess.Popen[str]) -> None:
        _log.warning(
            "router worker died; starting it again",
            worker=index,
            pid=dead.pid,
            exit=dead.returncode,
        )
        _forget_worker(self._metrics_dir, dead.pid)
        try:
            self._procs[index] = self._start(index)
        except RouterError as exc:
            _log.warning("router worker could not start again", worker=index, error=str(exc))

    def close(self) -> None:
        """SIGTERM every worker, wait for them (they hand over their last windows), kill
        any still there past the grace; release the port. Idempotent."""
        self._stopping = True
        live = [p for p in self._procs if p is not None and p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S + 30.0
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _log.warning("router worker did not stop; killed", pid=proc.pid)
                _reap(proc)
        for proc in self._procs:
            if proc is not None and proc.stdout is not None:
                proc.stdout.close()
        self._procs = [None] * len(self._procs)
        self._held.close()
        shutil.rmtree(self._metrics_dir, ignore_errors=True)


def _first_line(proc: subprocess.Popen[str], bound_s: float) -> str:
    """The worker's first line on stdout (``ready URL`` or ``error MESSAGE``), or "" if
    it exits or says nothing within ``bound_s``."""
    got: list[str] = []
    if proc.stdout is None:
        return ""
    stdout = proc.stdout
    reader = threading.Thread(target=lambda: got.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(bound_s)
    return got[0] if got else ""


def _reap(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _forget_worker(metrics_dir: str, pid: int) -> None:
    from prometheus_client import multiprocess  # the metrics of a worker that died

    multiprocess.mark_process_dead(pid, metrics_dir)
