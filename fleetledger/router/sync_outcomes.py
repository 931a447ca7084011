"""What an external router saw per worker, handed to the ledger as outcome windows.

SMG and vllm-router count every dispatched request's outcome per worker URL on their
Prometheus page (``external.OUTCOME_SAMPLES``). Each window, ``router-sync`` scrapes the
page, takes the counters' growth since the last scrape (:class:`CounterDeltas`), maps
each worker URL to the shard whose base URL it is now, and hands the window to the
ledger through the adapters' :class:`OutcomeReporter`, so ``explain`` cites the
router's evidence beside the probes'.

Rules, and why:

- **The first scrape is a baseline**, never reported: the counters hold everything
  since the router started, which a restarted sync would otherwise report again.
- **A counter that went down, or a series that appeared, restarted from zero** (the
  router restarted, or removed the worker and added it again — SMG drops a removed
  worker's series): its growth is its value. What it counted between the last scrape
  and its reset is lost, and only that.
- **A URL that no shard has now is dropped**, said once per URL: an engine replaced
  while the window was open says nothing about its replacement.
- A failure is infrastructure (reason ``<router>_failure``): both routers count 5xx
  and connection errors as failures and 4xx as successes, so a prompt's 400 is a
  success here — the same counts the router's own circuit breaker would act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from fleetledger.adapters.failure_taxonomy import GenerationUnavailable
from fleetledger.adapters.outcome_reporter import OutcomeReporter
from fleetledger.router.external import (
    OUTCOME_SAMPLES,
    Registry,
    counter_samples,
    fetch_metrics,
    worker_url,
)

__all__ = ["CounterDeltas", "OutcomeScraper", "RouterCountedFailure", "WorkerCounts"]

_log = structlog.get_logger("fleetledger.router_sync")


class RouterCountedFailure(GenerationUnavailable):
    """A failed request an external router counted for a worker: infrastructure (its
    5xx or a connection error), by the router's word."""


@dataclass(frozen=True, slots=True)
class WorkerCounts:
    successes: int = 0
    failures: int = 0


class CounterDeltas:
    """Growth of ``(worker, outcome)`` counters between scrapes (rules in the module
    docstring). Pure: give it each scrape's values."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, ...], float] | None = None

    def take(self, values: Mapping[tuple[str, ...], float]) -> dict[tuple[str, ...], int]:
        """Growth per key since the previous call; empty on the first (the baseline)."""
        last, self._last = self._last, dict(values)
        if last is None:
            return {}
        grown = {}
        for key, value in values.items():
            before = last.get(key, 0.0)
            delta = value - before if value >= before else value
            if delta >= 1:
                grown[key] = int(delta)
        return grown


class OutcomeScraper:
    """One external router's outcome windows for one run."""

    def __init__(self, registry: Registry, reporter: OutcomeReporter) -> None:
        if registry.metrics_url is None:
            raise ValueError("an outcome scraper needs the router's metrics URL")
        self.registry = registry
        self.metrics_url: str = registry.metrics_url
        self.reporter = reporter
        self._deltas = CounterDeltas()
        self._dropped: set[str] = set()

    def scrape(self, shard_of: Mapping[str, int]) -> dict[int, WorkerCounts]:
        """Scrape once and count the growth into the reporter's window; returns it per
        shard. ``shard_of``: worker URL → the shard whose base URL it is now."""
        kind = self.registry.kind
        text = fetch_metrics(kind, self.metrics_url)
        values = counter_samples(kind, self.metrics_url, text, OUTCOME_SAMPLES[kind])
        per_shard: dict[int, WorkerCounts] = {}
        for (worker, outcome, *_), count in sorted(self._deltas.take(values).items()):
            url = worker_url(worker)
            shard = shard_of.get(url)
            if shard is None:
                self._drop(url, count)
                continue
            counts = per_shard.get(shard, WorkerCounts())
            if outcome == "success":
                self.reporter.success(shard, count)
                counts = WorkerCounts(counts.successes + count, counts.failures)
            elif outcome == "failure":
                failure = RouterCountedFailure(
                    f"{kind} counted a failed request to {url}", reason=f"{_label(kind)}_failure"
                )
                for _ in range(count):
                    self.reporter.failure(shard, failure)
                counts = WorkerCounts(counts.successes, counts.failures + count)
            per_shard[shard] = counts
        return per_shard

    def _drop(self, url: str, count: int) -> None:
        if url not in self._dropped:
            self._dropped.add(url)
            _log.info(
                "router outcomes dropped: no shard of the run has this URL now",
                run=self.reporter.run,
                router=self.registry.kind,
                worker=url,
                outcomes=count,
            )


def _label(kind: str) -> str:
    return kind.replace("-", "_")
