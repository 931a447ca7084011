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
started again on the same port — after a pause that doubles with each failed start (to
``RESTART_BACKOFF_MAX_S``), and never once the run has ended (no router serves an ended
run; the workers left answer its requests with the no-healthy status). On stop each
worker is sent SIGTERM and hands over its last window of outcomes, as a single router
does; on Linux a worker is also sent SIGTERM when the supervisor dies, so none outlives
it. Workers log to stderr, as the command does; they answer their supervisor on a pipe
of their own (:mod:`fleetledger.router.worker`).

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
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import IO

import structlog

from fleetledger.router.app import STOP_GRACE_S, RouterError, RunNotLive
from fleetledger.router.listen import bind_listening
from fleetledger.router.metrics import MULTIPROC_DIR_ENV

__all__ = ["RouterWorkers", "WorkerSpec", "worker_name"]

_log = structlog.get_logger("fleetledger.router")

START_BOUND_S = 120.0  # a worker loads the run's view before it listens
WATCH_S = 0.2
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0


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
    supervisor_pid: int = 0
    ready_fd: int = -1


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
        stop: threading.Event | None = None,
    ) -> None:
        """Start the workers; returns once every one listens. ``stop``, set while they
        start (a signal), ends the waiting: the workers started so far are stopped by
        :meth:`serve_forever` or :meth:`close`."""
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
        self._procs: list[subprocess.Popen[bytes] | None] = [None] * workers
        self._retry_at = [0.0] * workers  # monotonic time a dead worker is started again
        self._backoff = [RESTART_BACKOFF_S] * workers
        self._given_up: set[int] = set()
        self._stop = stop or threading.Event()
        self._stopping = False
        try:
            for i in range(workers):
                if self._stop.is_set():
                    break
                self._procs[i] = self._start(i)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [p.pid for p in self._procs if p is not None]

    def _start(self, index: int) -> subprocess.Popen[bytes] | None:
        """Start worker ``index`` and wait until it listens; its refusal, in one line,
        as :class:`RouterError` (:class:`RunNotLive` when the run has ended); None when
        the supervisor was stopped meanwhile."""
        read_end, write_end = os.pipe()
        spec = {**asdict(self._specs[index]), "supervisor_pid": os.getpid(), "ready_fd": write_end}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fleetledger.router.worker", json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={**os.environ, MULTIPROC_DIR_ENV: self._metrics_dir},
                pass_fds=(write_end,),
            )
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as answers:
            line = self._first_line(proc, answers)
        if line.startswith("ready "):
            return proc
        _reap(proc)
        if self._stop.is_set():
            return None
        kind, _, why = line.partition(" ")
        why = why.strip() or f"exited {proc.returncode} before listening"
        if kind == "ended":
            raise RunNotLive(why)
        raise RouterError(why if why.startswith("router") else f"router worker {index}: {why}")

    def _first_line(self, proc: subprocess.Popen[bytes], answers: IO[bytes]) -> str:
        """The worker's line (``ready URL``, ``error …``, ``ended …``), or "" if it exits
        without one, takes longer than ``START_BOUND_S``, or the supervisor is stopped."""
        deadline = time.monotonic() + START_BOUND_S
        got = b""
        while time.monotonic() < deadline and not self._stop.is_set():
            readable, _, _ = select.select([answers], [], [], WATCH_S)
            if readable:
                piece = os.read(answers.fileno(), 4096)
                got += piece
                if not piece or b"\n" in got:
                    break
            elif proc.poll() is not None:
                break
        return got.decode("utf-8", errors="replace").partition("\n")[0]

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Watch the workers until ``stop`` (default: the one given at construction) is
        set; a worker that dies is started again (module docstring); then every worker
        is stopped (each hands over its last window)."""
        self._stop = stop = stop or self._stop
        try:
            while not stop.wait(WATCH_S):
                for i, proc in enumerate(self._procs):
                    if i in self._given_up or self._stopping:
                        continue
                    if proc is not None and proc.poll() is not None:
                        _log.warning(
                            "router worker died; starting it again",
                            worker=i,
                            pid=proc.pid,
                            exit=proc.returncode,
                        )
                        _forget_worker(self._metrics_dir, proc.pid)
                        self._procs[i] = None
                    if self._procs[i] is None and time.monotonic() >= self._retry_at[i]:
                        self._restart(i)
        finally:
            self.close()

    def _restart(self, index: int) -> None:
        try:
            self._procs[index] = self._start(index)
        except RunNotLive as exc:
            self._given_up.add(index)
            _log.warning("router worker not started again: the run has ended", worker=index,
                         reason=str(exc))  # fmt: skip
            return
        except RouterError as exc:
            if self._stop.is_set():
                return
            delay = self._backoff[index]
            self._backoff[index] = min(RESTART_BACKOFF_MAX_S, delay * 2)
            self._retry_at[index] = time.monotonic() + delay
            _log.warning("router worker could not start again", worker=index, error=str(exc),
                         retry_in_s=delay)  # fmt: skip
            return
        self._backoff[index] = RESTART_BACKOFF_S

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
        self._procs = [None] * len(self._procs)
        self._held.close()
        shutil.rmtree(self._metrics_dir, ignore_errors=True)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _forget_worker(metrics_dir: str, pid: int) -> None:
    from prometheus_client import multiprocess  # the metrics of a worker that died

    multiprocess.mark_process_dead(pid, metrics_dir)
