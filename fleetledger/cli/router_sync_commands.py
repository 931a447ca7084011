"""``fleetledger router-sync``: SMG's or vllm-router's worker set driven by the ledger.

A writing command (it appends the routers' outcome windows); it loads the router part
only when it runs, because importing this module registers the command for every
invocation, the read-only ones included.
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


@app.command("router-sync")
@cli_errors
def router_sync(
    run: Annotated[str, typer.Argument(help="The run whose serving set the routers follow.")],
    smg: Annotated[
        str | None, typer.Option(help="SMG's address (http://host:port) to drive.")
    ] = None,
    vllm_router: Annotated[
        str | None,
        typer.Option("--vllm-router", help="vllm-router's address (http://host:port) to drive."),
    ] = None,
    smg_metrics: Annotated[
        str | None,
        typer.Option(
            "--smg-metrics", help="SMG's Prometheus address (its --prometheus-port): outcomes."
        ),
    ] = None,
    vllm_router_metrics: Annotated[
        str | None,
        typer.Option(
            "--vllm-router-metrics",
            help="vllm-router's Prometheus address: outcomes and the workers it ejected.",
        ),
    ] = None,
    poll_s: Annotated[
        float | None,
        typer.Option(
            "--poll-s",
            help="Seconds between reads of the run's tail (default: 0.02 on SQLite, 0.5 on "
            "PostgreSQL, where an append wakes it).",
        ),
    ] = None,
    window_s: Annotated[
        float, typer.Option("--window-s", help="Seconds per outcome window handed to the ledger.")
    ] = 1.0,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", help="Serve the sync's /metrics on this port (0: free)."),
    ] = None,
    metrics_host: Annotated[
        str,
        typer.Option(
            "--metrics-host",
            help="Address to serve the sync's /metrics on (0.0.0.0: every interface).",
        ),
    ] = "127.0.0.1",
    name: Annotated[
        str | None,
        typer.Option(help="Adapter name its windows carry (default: smg / vllm-router)."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Keep SMG's and/or vllm-router's workers equal to the run's serving set.

    Removes a worker the moment the ledger records its shard leaving the serving set,
    adds a shard's URL when it serves (a restarted one after the refit that re-admits
    it), repopulates a restarted router, and hands the routers' per-worker outcomes to
    the ledger. Runs until SIGTERM or SIGINT (or the run ends), exit 0; stopping takes
    up to 10 s more while an add the router cannot cancel is still pending for a shard
    the ledger has out.
    """
    if smg is None and vllm_router is None:
        raise CommandLineError("router-sync: give at least one of --smg URL or --vllm-router URL")
    structlog_ready()  # the sync logs through structlog itself: configured before it loads
    from fleetledger.router.sync import RouterSync

    sync = RouterSync(
        resolve_db_url(db),
        run,
        smg=smg,
        vllm_router=vllm_router,
        smg_metrics=smg_metrics,
        vllm_router_metrics=vllm_router_metrics,
        name=name,
        poll_s=poll_s,
        window_s=window_s,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
    )
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if sync.metrics_url is not None:
        say(sync.metrics_url)
        sys.stdout.flush()
    sync.serve_forever(stop)
