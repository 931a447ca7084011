"""Prometheus metrics of a live run, computed at scrape time from what the controller holds.

Nothing here keeps a second copy of the fleet's state: every scrape reads the ledger's
consistent :class:`~fleetledger.controller.ledger.Membership`, the rollout counters and
the watchdog's progress sample, so a metric can never disagree with the ledger for
longer than one scrape. Rollout counters are exported as Prometheus counters (they only
grow within a process); a restarted controller starts them from zero, as Prometheus
expects of a restarted target.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetledger.controller.ledger import Membership
from fleetledger.projections.shard_states import ShardState

__all__ = ["FleetMetrics", "ProgressSample"]


@dataclass(frozen=True, slots=True)
class ProgressSample:
    """The training loop's progress as the watchdog last saw it."""

    committed_groups: int = 0
    train_steps: int = 0
    in_flight: int = 0
    idle_s: float = 0.0


class FleetMetrics(Collector):
    """One run's metrics in a registry of their own (two runs in a process do not clash)."""

    def __init__(
        self,
        run: str,
        membership: Callable[[], Membership],
        *,
        rollouts: Callable[[], Mapping[str, object]] | None = None,
        progress: Callable[[], ProgressSample] | None = None,
    ) -> None:
        self.run = run
        self._membership = membership
        self._rollouts = rollouts
        self._progress = progress
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        m = self._membership()
        run = [self.run]

        state = GaugeMetricFamily(
            "fleetledger_shard_state",
            "1 for the state each shard is in, 0 for the others",
            labels=["run", "shard", "state"],
        )
        for shard, current in enumerate(m.states):
            for candidate in ShardState:
                state.add_metric(
                    [self.run, str(shard), candidate.value],
                    1.0 if candidate.value == current else 0.0,
                )
        yield state

        per_state = GaugeMetricFamily(
            "fleetledger_shards", "Shards per state", labels=["run", "state"]
        )
        for name, count in m.counts().items():
            per_state.add_metric([self.run, name], count)
        yield per_state

        yield _gauge("fleetledger_membership_epoch", "Membership epoch", run, m.epoch)
        yield _gauge(
            "fleetledger_absent_generation",
            "Generation of the absent set: moves when the refit rank layout changes",
            run,
            m.absent_generation,
        )
        yield _gauge("fleetledger_serving_shards", "Shards serving", run, len(m.serving))
        yield _gauge("fleetledger_ledger_seq", "Last seq folded into the live view", run, m.seq)

        restarts = GaugeMetricFamily(
            "fleetledger_shard_restart_attempts", "Restart attempts", labels=["run", "shard"]
        )
        versions = GaugeMetricFamily(
            "fleetledger_shard_weight_version", "Weight version held", labels=["run", "shard"]
        )
        for shard, (attempts, version) in enumerate(
            zip(m.restart_attempts, m.weight_versions, strict=True)
        ):
            restarts.add_metric([self.run, str(shard)], attempts)
            versions.add_metric([self.run, str(shard)], version)
        yield restarts
        yield versions

        # A counter of this process (from zero after a restart), as the rollout ones are:
        # the deaths reported for a shard already absent, which the ledger did not record.
        collapsed = CounterMetricFamily(
            "fleetledger_shard_deaths_collapsed",
            "Deaths reported for a shard already absent: counted, not recorded",
            labels=["run", "shard"],
        )
        for shard in range(len(m.states)):
            count = m.collapsed_deaths[shard] if shard < len(m.collapsed_deaths) else 0
            collapsed.add_metric([self.run, str(shard)], float(count))
        yield collapsed

        if self._progress is not None:
            p = self._progress()
            yield _gauge("fleetledger_train_steps", "Completed train steps", run, p.train_steps)
            yield _gauge(
                "fleetledger_committed_groups", "Committed rollout groups", run, p.committed_groups
            )
            yield _gauge("fleetledger_rollouts_in_flight", "Rollouts in flight", run, p.in_flight)
            yield _gauge("fleetledger_idle_seconds", "Seconds since progress", run, p.idle_s)

        if self._rollouts is not None:
            yield from _rollout_families(self.run, self._rollouts())

    def render(self) -> bytes:
        """The exposition text, as a scrape would get it."""
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[WSGIServer, threading.Thread]:
        """Serve ``/metrics`` on ``addr:port`` (0 picks a free port) from a daemon thread."""
        server, thread = start_http_server(port, addr=addr, registry=self.registry)
        return server, thread


def _gauge(name: str, doc: str, run: list[str], value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["run"])
    family.add_metric(run, value)
    return family


def _rollout_families(run: str, snapshot: Mapping[str, object]) -> Iterator[Metric]:
    committed = CounterMetricFamily(
        "fleetledger_rollouts_committed", "Rollout groups committed", labels=["run"]
    )
    committed.add_metric([run], float(_number(snapshot.get("committed", 0))))
    yield committed
    cancelled = CounterMetricFamily(
        "fleetledger_rollouts_cancelled", "Rollout attempts cancelled", labels=["run"]
    )
    cancelled.add_metric([run], float(_number(snapshot.get("cancelled", 0))))
    yield cancelled
    for key, doc in (
        ("consecutive_dropped", "Prompts dropped in a row now"),
        ("max_consecutive_dropped", "The longest streak of dropped prompts so far"),
    ):
        yield _gauge(f"fleetledger_rollouts_{key}", doc, [run], _number(snapshot.get(key, 0)))
    for key, doc in (
        ("redispatched", "Rollouts re-dispatched to another shard, per reason"),
        ("data_failures", "Data failures of rollout attempts, per reason"),
        ("skipped", "Prompts skipped (data budget spent), per reason"),
        ("dropped", "Prompts dropped (infrastructure budget spent), per reason"),
        ("exhausted", "Exhausted budgets, per budget"),
    ):
        family = CounterMetricFamily(f"fleetledger_rollouts_{key}", doc, labels=["run", "reason"])
        per_reason = snapshot.get(key, {})
        if isinstance(per_reason, Mapping):
            for reason, count in sorted(per_reason.items()):
                family.add_metric([run, str(reason)], float(_number(count)))
        yield family


def _number(value: object) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"rollout counter is not a number: {value!r}")
