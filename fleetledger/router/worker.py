"""One router worker process (``python -m fleetledger.router.worker SPEC``), started by
:class:`~fleetledger.router.workers.RouterWorkers`.

It speaks to its supervisor in one line on stdout: ``ready URL`` once it listens, or
``error MESSAGE`` (one line, as the command would print it) when it cannot serve. It
serves until SIGTERM (SIGINT is the supervisor's), then hands over its last window of outcomes.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from types import FrameType

from fleetledger.errors import FleetledgerError
from fleetledger.logs import structlog_ready


def main(argv: list[str]) -> int:
    structlog_ready()
    from fleetledger.router.app import Router  # after logging is configured
    from fleetledger.router.workers import WorkerSpec  # after logging is configured

    try:
        spec = WorkerSpec(**json.loads(argv[1]))
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
        print(f"error {str(exc).splitlines()[0]}", flush=True)
        return 2
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    # Ctrl-C reaches the whole process group: the supervisor stops the workers itself
    # (SIGTERM), so one that stopped on its own is never taken for one that died.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"ready {router.url}", flush=True)
    router.serve_forever(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
