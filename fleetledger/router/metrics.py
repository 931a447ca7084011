"""The router's Prometheus metrics, in a registry of its own (two routers in one process,
or a router beside the controller's metrics, never clash).

Added latency is the time a request spends in the router *minus the backend's own
wait*: from the request's arrival to the first byte of the answer written to the
client, less the time from sending the request to the backend until the backend's
response headers arrived. It is what the router costs a rollout before its first
byte; streaming the rest of the body is not included.

Several worker processes on one port (``fleetledger router --workers N``) answer
``/metrics`` with the sum over all of them, whichever worker the scrape reaches:
each worker writes its values to files in one directory
(``PROMETHEUS_MULTIPROC_DIR``, set by the supervisor before the worker starts), and
rendering reads them all. Counters and the histogram are summed (a worker that died
keeps its counts); the serving-backends gauge is the highest of the live workers'.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

__all__ = ["RouterMetrics"]

# Sub-millisecond to a second: a router's own cost, not a generation's.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0)


class RouterMetrics:
    """Requests, answers with no healthy backend, backend errors, serving backends and
    added latency of one router."""

    def __init__(self, run: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"run": run}
        self.requests = Counter(
            "fleetledger_router_requests",
            "Requests answered by the router, by route and status.",
            ["route", "status"],
            registry=self.registry,
        )
        self.no_healthy = Counter(
            "fleetledger_router_no_healthy",
            "Requests answered with the no-healthy status (no routable backend).",
            registry=self.registry,
        )
        self.ended_by_ledger = Counter(
            "fleetledger_router_ended_by_ledger",
            "Requests in flight ended because the ledger said their shard left the fleet.",
            registry=self.registry,
        )
        self.contradicted = Counter(
            "fleetledger_router_attestations_contradicted",
            "Answers whose engine attested weights older than the ledger recorded it load.",
            ["shard"],
            registry=self.registry,
        )
        self.resent = Counter(
            "fleetledger_router_resent",
            "Requests re-sent to another shard after theirs left before answering.",
            registry=self.registry,
        )
        self.backend_errors = Counter(
            "fleetledger_router_backend_errors",
            "Backend timeouts and connection errors, by shard.",
            ["shard"],
            registry=self.registry,
        )
        self.serving_backends = Gauge(
            "fleetledger_router_serving_backends",
            "Backends the router routes to now (serving, HTTP, not avoided).",
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.added_latency = Histogram(
            "fleetledger_router_added_latency_seconds",
            "Time to the client's first byte minus the backend's time to its headers.",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.info = Gauge(
            "fleetledger_router_info",
            "The run this router serves (value 1).",
            list(labels),
            registry=self.registry,
            multiprocess_mode="livemax",
        )
        self.info.labels(**labels).set(1)
        self._requests_by: dict[tuple[str, str], Any] = {}
        self._shared = os.environ.get(MULTIPROC_DIR_ENV) or None

    def count(self, *, route: str, status: str) -> None:
        """One request answered; the labelled child is looked up once per pair (the
        label lookup costs more than the increment, on every request)."""
        child = self._requests_by.get((route, status))
        if child is None:
            child = self._requests_by[(route, status)] = self.requests.labels(
                route=route, status=status
            )
        child.inc()

    def render(self) -> bytes:
        if self._shared is None:
            return generate_latest(self.registry)
        every_worker = CollectorRegistry()
        MultiProcessCollector(every_worker, self._shared)
        return generate_latest(every_worker)
