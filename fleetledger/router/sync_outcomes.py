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
  and its reset is lost; and a reset is seen only while the counter is below its old
  value: one that has counted back past it by the next scrape reads as plain growth,
  so that window undercounts by the old value.
- **Counts go to the shard that served at the URL for the whole window**, by
  ``sync_rule.credit``: a window's counts for a URL go to a shard only if it was serving at
  the URL when the window opened, still has the URL now, and the URL did not leave the
  serving set and come back within the window; otherwise they are dropped, said once
  per URL and reason. vllm-router keeps a URL's counters
  across a removal and a re-add, so the failures a dead engine drew would otherwise
  be handed over after its restarted successor at the same URL was re-admitted, and
  condemn it — the ledger ignores a DEAD or STALE shard's reports, and the window
  must not wait until it is neither. Counts for a URL that left once (its shard
  died) still go to that shard, as evidence: by the time they are appended the
  ledger has it out and ignores them. What a re-admitted shard's URL counts in the
  window it came back in is dropped, up to ``window_s`` of it.
- A failure is infrastructure (reason ``<router>_failure``): both routers count 5xx
  and connection errors as failures and 4xx as successes, so a prompt's 400 is a
  success here — the same counts the router's own circuit breaker would act on.
- A series growing by more than ``MAX_GROWTH`` in one window is not believed (no
  worker serves that much), and dropped, said once.
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
)
from fleetledger.router.sync_membership import Membership
from fleetledger.router.sync_rule import credit

__all__ = [
    "MAX_GROWTH",
    "CounterDeltas",
    "OutcomeScraper",
    "RouterCountedFailure",
    "WorkerCounts",
]

# Requests one worker can be counted for in one window, and believed: far above any
# engine's rate, low enough that handing a garbage jump over one by one cannot stall.
MAX_GROWTH = 1_000_000

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
        self._opened: Membership | None = None  # the membership at the last scrape
        self._dropped: set[tuple[str, str]] = set()

    def scrape(self, membership: Membership) -> dict[int, WorkerCounts]:
        """Scrape once and count the growth since the last scrape into the reporter's
        window, credited by :func:`credit`; returns it per shard. ``membership``: the
        run as it is now (the window closes under it, and the next one opens)."""
        kind = self.registry.kind
        text = fetch_metrics(kind, self.metrics_url)
        values = counter_samples(
            kind, self.metrics_url, text, OUTCOME_SAMPLES[kind], ("worker", "outcome")
        )
        grown = self._deltas.take(values)
        opened, self._opened = self._opened, membership
        if opened is None:
            return {}
        per_shard: dict[int, WorkerCounts] = {}
        for (url, outcome), count in sorted(grown.items()):
            shard, why = credit(url, opened, membership)
            if count > MAX_GROWTH:
                shard, why = None, f"grew by {count} in one window, more than any worker serves"
            if shard is None:
                self._drop(url, count, why)
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

    def _drop(self, url: str, count: int, why: str) -> None:
        if (url, why) not in self._dropped:
            self._dropped.add((url, why))
            _log.info(
                "router outcomes dropped",
                run=self.reporter.run,
                router=self.registry.kind,
                worker=url,
                outcomes=count,
                reason=why,
            )


def _label(kind: str) -> str:
    return kind.replace("-", "_")
