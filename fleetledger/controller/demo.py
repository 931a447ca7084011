"""A scripted run, written through the real ingest facade into a real ledger.

It tells the two stories a first-time user needs to see: a shard that stops answering
probes is condemned, restarted, loaded and re-admitted only by the next refit; and a
refit that aborts with exactly one suspect condemns that suspect and retries over the
survivors. It stays until the live ``simulate`` command replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FailureCount, FleetConfig, ShardOutcomes
from fleetledger.projections.shard_states import Transition
from fleetledger.store.log import EventLog

DEMO_SHARDS = 4


@dataclass(frozen=True)
class DemoStep:
    title: str
    transitions: list[Transition]


def demo_config() -> FleetConfig:
    return FleetConfig(
        shard_count=DEMO_SHARDS,
        workers_per_shard=2,
        train_world_size=2,
        base_urls=tuple(f"http://127.0.0.1:{8000 + i}/v1" for i in range(DEMO_SHARDS)),
        settings={"source": "fleetledger demo"},
    )


def new_demo_run_id() -> str:
    return "demo-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


def run_demo(log: EventLog, run: str) -> Iterator[tuple[Ledger, DemoStep]]:
    """Write the scripted run step by step, yielding the ledger after each step."""
    ledger = Ledger.start(log, run, demo_config())
    yield ledger, DemoStep("run started: 4 shards × 2 workers, 2 trainer ranks", [])

    def step(title: str, action: Callable[[], list[Transition]]) -> tuple[Ledger, DemoStep]:
        return ledger, DemoStep(title, action())

    everyone_ok = {i: ProbeResult.ok() for i in range(DEMO_SHARDS)}
    yield step("refit to weight version 1 over the whole fleet", lambda: _refit(ledger, 1))
    for attempt in (1, 2, 3):
        yield step(
            f"probe round: shard 2 times out ({attempt}/3)",
            lambda: ledger.record_probes(
                {**everyone_ok, 2: ProbeResult("timeout", "no answer within probe_timeout_s=2")}
            ),
        )
    yield step(
        "adapter window: shards 0,1,3 served; shard 2 refused connections",
        lambda: ledger.report_outcomes(
            "demo-router",
            [
                ShardOutcomes(shard=0, successes=12),
                ShardOutcomes(shard=1, successes=11),
                ShardOutcomes(shard=3, successes=12),
                # Already DEAD: the fold records nothing more for it, but the log keeps it.
                ShardOutcomes(
                    shard=2,
                    failures=(FailureCount(category="infra", reason="ConnectionRefused", count=4),),
                ),
            ],
        ),
    )
    yield step("restart requested for shard 2", lambda: ledger.restart_requested(2))
    yield step(
        "replacement for shard 2 loaded at a new URL (stale weights)",
        lambda: ledger.replacement_loaded(2, "http://127.0.0.1:8012/v1"),
    )
    yield step("refit to weight version 2 includes shard 2: it rejoins", lambda: _refit(ledger, 2))
    yield step(
        "probe round: shard 1 fails once",
        lambda: ledger.record_probes({**everyone_ok, 1: ProbeResult("error", "HTTP 503")}),
    )
    yield step("refit to weight version 3 starts", lambda: ledger.refit_started(3))
    yield step(
        "refit 3 aborted: broadcast timed out",
        lambda: ledger.refit_aborted(3, "broadcast did not finish within refit_timeout_s=30"),
    )
    yield step("every shard's weights are now partial", lambda: ledger.mark_weights_partial(3))
    yield step(
        "exactly one suspect (shard 1): condemned as the silent participant",
        lambda: ledger.condemn_silent_participant(1, "the only SUSPECT shard when refit 3 aborted"),
    )
    yield step("refit 3 retried over the survivors", lambda: _refit(ledger, 3))
    yield step("run ends", lambda: ledger.end_run("completed", "demo script finished"))


def _refit(ledger: Ledger, version: int) -> list[Transition]:
    return ledger.refit_started(version) + ledger.refit_completed(version)
