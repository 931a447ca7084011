"""``fleetledger router``: the one stable URL in front of a run's fleet, as its own process.

A writing command (it appends the run's outcome windows), so it may load the
controller; it does so only when it runs, because importing this module registers the
command for every invocation, the read-only ones included.
"""

# No `from __future__ import annotations` in a command module: typer reads every
# command's annotations at start-up, and a string annotation costs it a compile (cli.app).

import signal
import sys
import threading
from types import FrameType
from typing import Annotated

import typer

from fleetledger.cli.app import DbOption, app, cli_errors
from fleetledger.cli.output import CommandLineError, say
from fleetledger.logs import structlog_ready
from fleetledger.store.urls import resolve_db_url


@app.command()
@cli_errors
def router(
    run: Annotated[str, typer.Argument(help="The run whose serving shards to route to.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one (printed).")] = 0,
    window_s: Annotated[
        float, typer.Option("--window-s", help="Seconds per outcome window handed to the ledger.")
    ] = 1.0,
    poll_s: Annotated[
        float, typer.Option("--poll-s", help="Seconds between reads of the run's tail.")
    ] = 0.25,
    name: Annotated[str, typer.Option(help="Adapter name its outcome windows carry.")] = "router",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Processes serving the one port (SO_REUSEPORT); with N > 1 each writes its "
            "outcome windows as NAME-0 … NAME-{N-1}.",
        ),
    ] = 1,
    db: DbOption = None,
) -> None:
    """Serve http://HOST:PORT/v1 over the run's serving shards, membership from the ledger.

    Prints the URL once listening (every worker); runs until SIGTERM or SIGINT, then
    hands the last window of outcomes to the ledger and exits 0. Refuses an unknown or
    ended run.
    """
    structlog_ready()  # the router logs through structlog itself: configured before it loads
    try:
        from fleetledger.router.app import Router
        from fleetledger.router.workers import RouterWorkers
    except ImportError as exc:
        raise CommandLineError(
            f"router needs {exc.name}, which is not installed: pip install 'fleetledger[router]'"
        ) from None
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # Before anything starts: a signal while workers start stops them, never orphans them.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    common = {"host": host, "port": port, "name": name, "window_s": window_s, "poll_s": poll_s}
    served: Router | RouterWorkers
    if workers == 1:
        served = Router(resolve_db_url(db), run, **common)
    else:
        served = RouterWorkers(resolve_db_url(db), run, workers=workers, stop=stop, **common)
    if not stop.is_set():
        say(served.url)
        sys.stdout.flush()
    served.serve_forever(stop)
