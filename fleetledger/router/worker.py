"""One router worker process (``python -m fleetledger.router.worker SPEC``), started by
:class:`~fleetledger.router.workers.RouterWorkers`.

It speaks to its supervisor in one line on a pipe of their own (``SPEC.ready_fd``):
``ready URL`` once it listens, or ``error MESSAGE`` (one line, as the command would
print it) when it cannot serve — ``ended MESSAGE`` when that is because the run ended.
Not on stdout: its logs go to stderr, as the command's do, and a pipe that nobody reads
after the first line would fill with them and stop the worker mid-request. It serves
until SIGTERM (SIGINT is the supervisor's), then hands over its last window of
outcomes; on Linux it is sent SIGTERM if the supervisor dies, so a worker never
outlives the command that started it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from types import FrameType

from fleetledger.errors import FleetledgerError
from fleetledger.logs import defer_logging_from_env, structlog_ready


def _die_with_parent(parent: int) -> None:
    if sys.platform != "linux":
        return
    import ctypes  # Linux's prctl: only here

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str]) -> int:
    defer_logging_from_env()  # the supervisor said any warning about it already
    structlog_ready()
    from fleetledger.router.app import Router, RunNotLive  # after logging is configured
    from fleetledger.router.workers import WorkerSpec  # after logging is configured

    spec = WorkerSpec(**json.loads(argv[1]))
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    # Ctrl-C reaches the whole process group: the supervisor stops the workers itself
    # (SIGTERM), so one that stopped on its own is never taken for one that died.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(spec.supervisor_pid)
    with os.fdopen(spec.ready_fd, "w") as ready:
        try:
            router = Router(
                spec.db_url,
                spec.run,
                host=spec.host,
                port=spec.port,
                name=spec.name,
                window_s=spec.window_s,
                poll_s=spec.poll_s,
                shared_port=True,
            )
        except FleetledgerError as exc:
            kind = "ended" if isinstance(exc, RunNotLive) else "error"
            ready.write(f"{kind} {str(exc).splitlines()[0]}\n")
            return 2
        ready.write(f"ready {router.url}\n")
    router.serve_forever(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
