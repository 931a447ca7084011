"""``router-sync``'s Prometheus metrics, in a registry of its own (a sync beside a router
or the controller's metrics in one process never clash), optionally served on a port.

The lag is what the sync exists for: from the recorded time of the ledger event that
took a URL out of the serving set (a death, a condemnation, partial weights) to the
moment the external router's listing confirmed it takes no new request *and* the
router holds no add of it that could still land (an SMG add pending when the shard
left keeps the lag running until it lands and is removed, or is given up). The event's
time is the recorder's wall clock, so across hosts the figure includes their skew; a
negative one is counted as zero.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import start_http_server

__all__ = ["SyncMetrics"]

# 5 ms to a minute: a poll of the tail and two calls to the router, up to an outage.
_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0)


class SyncMetrics:
    """Removal lag, changes made and failing parties of one sync."""

    def __init__(self, run: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.lag = Histogram(
            "fleetledger_router_sync_lag_seconds",
            "From a leaving event's recorded time to the router's confirmed removal "
            "(listed as taking no new request, with no add of it pending).",
            ["router"],
            buckets=_LAG_BUCKETS,
            registry=self.registry,
        )
        self.changes = Counter(
            "fleetledger_router_sync_changes",
            "Adds and removals an external router accepted (2xx answers; a 409, listed "
            "already or an add under way, is not one).",
            ["router", "action"],
            registry=self.registry,
        )
        self.failing = Gauge(
            "fleetledger_router_sync_failing",
            "1 while a party (the ledger, a router) cannot be read or written, else 0.",
            ["party"],
            registry=self.registry,
        )
        self.info = Gauge(
            "fleetledger_router_sync_info",
            "The run this sync follows (value 1).",
            ["run"],
            registry=self.registry,
        )
        self.info.labels(run=run).set(1)
        self._server: WSGIServer | None = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``host:port`` from a thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def stop_serving(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
