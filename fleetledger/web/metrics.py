"""The server's Prometheus metrics, on a registry of its own (``GET /metrics``).

The one the issue of a live page turns on is the stream's lag: from the moment an event
was stamped by its appender to the moment its entry was written to a subscriber. It is
observed for live entries only — a client catching up from an old id would report the
age of history, not the server's delay.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LAG_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ServeMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stream_lag = Histogram(
            "fleetledger_serve_stream_lag_seconds",
            "From an event's stamp (its append) to its entry written to a stream client",
            buckets=LAG_BUCKETS_S,
            registry=self.registry,
        )
        self.requests = Counter(
            "fleetledger_serve_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.stream_clients = Gauge(
            "fleetledger_serve_stream_clients",
            "Clients following a run's stream now",
            registry=self.registry,
        )
        self.dropped = Counter(
            "fleetledger_serve_stream_dropped",
            "Stream clients dropped because they fell too far behind (they resume by id)",
            registry=self.registry,
        )
        self.listening = Gauge(
            "fleetledger_serve_listening",
            "1 while appends are pushed (PostgreSQL LISTEN), 0 while the server polls",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
