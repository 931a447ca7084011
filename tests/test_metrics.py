"""Prometheus metrics: scraped over real HTTP, they say what the ledger says."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fleetledger.adapters.retry_policy import RolloutCounters
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.metrics import FleetMetrics, ProgressSample
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def key(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted({"run": "r", **labels}.items()))


@pytest.fixture
def ledger(sqlite_url):
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "r", fleet_config(3))
    log.close()


def test_a_scrape_over_http_matches_the_ledger(ledger):
    ledger.record_probes({0: ProbeResult.ok(), 1: ProbeResult("died", "gone"), 2: ProbeResult.ok()})
    counters = RolloutCounters(committed=7)
    counters.redispatched["actor_died"] += 2
    counters.data_failures["context_length"] += 1
    metrics = FleetMetrics(
        "r",
        lambda: ledger.membership,
        rollouts=counters.snapshot,
        progress=lambda: ProgressSample(committed_groups=7, train_steps=3, in_flight=2, idle_s=1.5),
    )
    server, _ = metrics.serve(0)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            samples = _samples(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()

    for shard, state in enumerate(ledger.membership.states):
        for candidate in ShardState:
            sample = samples[
                key("fleetledger_shard_state", shard=str(shard), state=candidate.value)
            ]
            assert sample == (1.0 if candidate.value == state else 0.0)
    assert samples[key("fleetledger_membership_epoch")] == ledger.view.epoch == 1
    assert samples[key("fleetledger_serving_shards")] == 2
    assert samples[key("fleetledger_shards", state="DEAD")] == 1
    assert samples[key("fleetledger_ledger_seq")] == ledger.view.seq
    assert samples[key("fleetledger_train_steps")] == 3
    assert samples[key("fleetledger_rollouts_in_flight")] == 2
    assert samples[key("fleetledger_idle_seconds")] == 1.5
    assert samples[key("fleetledger_rollouts_committed_total")] == 7
    assert samples[key("fleetledger_rollouts_redispatched_total", reason="actor_died")] == 2
    assert samples[key("fleetledger_rollouts_data_failures_total", reason="context_length")] == 1


def test_metrics_follow_the_ledger_without_a_copy(ledger):
    metrics = FleetMetrics("r", lambda: ledger.membership)
    before = _samples(metrics.render().decode())
    ledger.actor_died(2, "gone")
    after = _samples(metrics.render().decode())
    serving = key("fleetledger_serving_shards")
    assert (before[serving], after[serving]) == (3, 2)


def test_two_runs_in_one_process_do_not_clash(ledger, tmp_path):
    other_log = EventLog.open(f"sqlite:///{tmp_path}/other.db")
    other = Ledger.start(other_log, "r2", fleet_config(2))
    a = FleetMetrics("r", lambda: ledger.membership)
    b = FleetMetrics("r2", lambda: other.membership)
    assert b"r2" not in a.render() and b'run="r2"' in b.render()
    other_log.close()


def test_a_counter_that_is_not_a_number_is_an_error(ledger):
    metrics = FleetMetrics("r", lambda: ledger.membership, rollouts=lambda: {"committed": "7"})
    with pytest.raises(TypeError, match="not a number"):
        metrics.render()


def test_the_absent_generation_gauge_moves_with_the_rank_layout_not_the_epoch(ledger):
    """The transports' integer: a death moves it (and the epoch); a restarted shard's
    re-admission (RESTARTING → STALE) moves it alone — the layout grows back while the
    serving set, and so the epoch, stays put."""
    metrics = FleetMetrics("r", lambda: ledger.membership)

    def integers() -> tuple[float, float]:
        samples = _samples(metrics.render().decode())
        return (
            samples[key("fleetledger_membership_epoch")],
            samples[key("fleetledger_absent_generation")],
        )

    seen = [integers()]
    ledger.actor_died(1, "ActorDiedError: gone")
    seen.append(integers())
    ledger.restart_requested(1)
    seen.append(integers())
    ledger.replacement_loaded(1)
    seen.append(integers())
    assert seen == [(0, 0), (1, 1), (1, 1), (1, 2)]
    assert seen[-1][1] == ledger.membership.absent_generation == ledger.view.absent_generation
