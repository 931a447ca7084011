"""Builders shared by the tests: valid configurations, varied events, table dumps."""

from __future__ import annotations

import itertools
from typing import Any

from sqlalchemy import Engine, inspect, text

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    FailureCount,
    FleetConfig,
    OutcomeWindowReported,
    ProbeFailure,
    ProbeRound,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
    RunEnded,
    RunStarted,
    ShardOutcomes,
    StallDetected,
)


def fleet_config(shards: int = 3, **overrides: Any) -> FleetConfig:
    """A valid configuration: one base URL per shard, thresholds at their defaults."""
    fields: dict[str, Any] = {
        "shard_count": shards,
        "train_world_size": 2,
        "base_urls": tuple(f"http://127.0.0.1:{8000 + i}/v1" for i in range(shards)),
        "settings": {"policy": "test", "probe_interval_s": 0.5},
    }
    fields.update(overrides)
    return FleetConfig(**fields)


def run_started(shards: int = 3, **overrides: Any) -> RunStarted:
    return RunStarted(config=fleet_config(shards, **overrides))


def run_ended(outcome: str = "completed") -> RunEnded:
    return RunEnded(outcome=outcome, cause="the trainer finished")


def probe_ok(shard: int, **fields: Any) -> ProbeRound:
    """One shard's successful probe: a round of that shard (what the pump records)."""
    return ProbeRound(ok=(shard,), **fields)


def probe_failed(shard: int, kind: str = "timeout", error: str = "", **fields: Any) -> ProbeRound:
    """One shard's failed probe: a round of that shard (what the pump records)."""
    failure = ProbeFailure(shard=shard, kind=kind, error=error)  # type: ignore[arg-type]
    return ProbeRound(failed=(failure,), **fields)


def mixed_events(n: int, shards: int = 3) -> list[Event]:
    """``n`` events of varied types and payload shapes, all valid for ``shards`` shards."""
    makers = [
        lambda i: probe_ok(i % shards),
        lambda i: probe_failed(i % shards, "timeout", f"probe {i} timed out"),
        lambda i: OutcomeWindowReported(
            adapter="rollout-adapter",
            outcomes=(
                ShardOutcomes(
                    shard=i % shards,
                    successes=i,
                    failures=(FailureCount(category="infra", reason="connection reset", count=2),),
                ),
            ),
        ),
        lambda i: RefitStarted(weight_version=i, shards=tuple(range(shards))),
        lambda i: RefitCompleted(weight_version=i, shards=tuple(range(shards))),
        lambda i: RestartRequested(shard=i % shards),
        lambda i: ReplacementLoaded(shard=i % shards, base_url=f"http://127.0.0.1:{9000 + i}/v1"),
        lambda i: ActorDeathConfirmed(shard=i % shards, error="ActorDiedError: ünïcödé ✓"),
        lambda i: StallDetected(
            committed_groups=i, train_steps=i // 2, idle_s=1.25, in_flight=3, action="warn"
        ),
    ]
    return [maker(i) for i, maker in zip(range(n), itertools.cycle(makers), strict=False)]


def ledger_tables(engine: Engine) -> list[str]:
    """The fleetledger tables (version table included) present in the database."""
    return sorted(t for t in inspect(engine).get_table_names() if t.startswith("fleetledger_"))


def dump_tables(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every fleetledger table, in a stable order: the whole stored state."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in ledger_tables(engine):
            rows = conn.execute(text(f"SELECT * FROM {table}")).all()
            out[table] = sorted((tuple(r) for r in rows), key=repr)
    return out
