"""The probe pump: every ``probe_interval_s``, probe the serving shards and record the round.

A round probes every serving shard concurrently and is bounded as a whole by
``probe_timeout_s`` (``probe_timeout_s < probe_interval_s`` is a validator), so one
frozen engine — which Ray never reports — costs one timeout, not one timeout per shard,
whatever the fleet size. The whole round is appended as one batch, in shard order.

Only serving shards are probed (docs/reference.md §6): a DEAD, RESTARTING or STALE shard ignores
probe successes anyway, and a RETIRED one never moves again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from fleetledger.config import FleetHealthConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.errors import LedgerError
from fleetledger.projections.shard_states import Transition
from fleetledger.store.errors import RunAlreadyEnded

__all__ = ["ProbePump", "ProbeRoundReport", "Prober"]

_log = structlog.get_logger("fleetledger.probe")


class Prober(Protocol):
    """Probes shards concurrently; the call returns within ``timeout_s`` (plus overhead).
    ``deep``: prove each engine can generate, not only that it answers."""

    def probe(
        self, shards: Iterable[int], timeout_s: float, *, deep: bool = False
    ) -> Mapping[int, ProbeResult]: ...


@dataclass(frozen=True)
class ProbeRoundReport:
    """What one round probed, what it saw and what the ledger made of it: the pump's
    report to its caller (the ledger records the round as a ``ProbeRound`` event)."""

    probed: tuple[int, ...]
    results: Mapping[int, ProbeResult]
    transitions: tuple[Transition, ...]
    elapsed_s: float


class ProbePump:
    """Runs probe rounds against one run's fleet, on a thread of its own or one at a time."""

    def __init__(
        self,
        ledger: Ledger,
        prober: Prober,
        config: FleetHealthConfig,
        *,
        after_round: Callable[[ProbeRoundReport], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._prober = prober
        self._config = config
        self._after_round = after_round
        self._clock = clock
        self.rounds = 0

    def probe_round(self) -> ProbeRoundReport:
        """Probe every serving shard once and record the round as one batch."""
        started = self._clock()
        # Other processes may have condemned or re-admitted shards: fold their events
        # before choosing whom to probe.
        self._ledger.catch_up()
        membership = self._ledger.membership
        if membership.ended:
            return ProbeRoundReport((), {}, (), 0.0)
        shards = membership.serving
        results = (
            dict(
                self._prober.probe(
                    shards, self._config.probe_timeout_s, deep=self._config.deep_probe
                )
            )
            if shards
            else {}
        )
        if self._config.deep_probe:  # a failure says what kind of probe it failed
            results = {
                s: replace(r, deep=True) if r.kind in ("timeout", "error") else r
                for s, r in results.items()
            }
        unknown = set(results) - set(shards)
        if unknown:
            raise ValueError(f"the prober answered for shards it was not asked about: {unknown}")
        missing = set(shards) - set(results)
        for shard in missing:  # a prober that drops a shard must not make it look fine
            results[shard] = ProbeResult("error", "the prober returned no result for this shard")
        transitions = tuple(self._ledger.record_probes(results)) if results else ()
        self.rounds += 1
        probe_round = ProbeRoundReport(shards, results, transitions, self._clock() - started)
        if self._after_round is not None:
            self._after_round(probe_round)
        return probe_round

    def run(self, stop: threading.Event) -> None:
        """Probe every ``probe_interval_s`` until ``stop`` is set or the run ends.

        Rounds start on a fixed cadence (a slow round shortens the wait, it does not
        shift every later round). A ledger error is logged and the next round tried:
        a probe pump that dies silently is the failure this project exists to remove.
        """
        interval = self._config.probe_interval_s
        next_at = self._clock()
        while not stop.is_set():
            try:
                self.probe_round()  # folds the tail first: an ended run is seen here
            except RunAlreadyEnded as ended:
                self._ledger.late_reports.count("probe round", ended)
            except LedgerError as exc:
                _log.error("probe round not recorded", run=self._ledger.run, problem=str(exc))
            except Exception:  # a runtime hiccup must not end probing for the rest of the run
                _log.exception("probe round failed", run=self._ledger.run)
            if self._ledger.membership.ended:
                return
            next_at += interval
            now = self._clock()
            if next_at < now:  # fell behind (a stopped process, a slow disk): skip, don't burst
                next_at = now
            stop.wait(next_at - now)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run, args=(stop,), name=f"probe-pump-{self._ledger.run}", daemon=True
        )
        thread.start()
        return thread
