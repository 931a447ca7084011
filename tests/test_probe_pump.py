"""The probe pump's round: only serving shards, one ``probe_round`` event, nothing dropped.

The prober here is a scripted implementation of the ``Prober`` protocol (what a round
saw is the input under test); the real Ray prober is exercised in test_chaos_ray.py.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping

import pytest

from fleetledger.config import FleetHealthConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


class ScriptedProber:
    """Answers each round from a script of {shard: result}; records who was asked."""

    def __init__(self, script: list[Mapping[int, ProbeResult]]) -> None:
        self.script = list(script)
        self.asked: list[tuple[int, ...]] = []
        self.timeouts: list[float] = []
        self.deep: list[bool] = []

    def probe(
        self, shards: Iterable[int], timeout_s: float, *, deep: bool = False
    ) -> Mapping[int, ProbeResult]:
        shards = tuple(shards)
        self.asked.append(shards)
        self.timeouts.append(timeout_s)
        self.deep.append(deep)
        answers = self.script.pop(0) if self.script else {}
        return {s: answers.get(s, ProbeResult.ok()) for s in shards}


OK, TIMEOUT = ProbeResult.ok(), ProbeResult("timeout", "no answer")
DIED = ProbeResult("died", "ActorDiedError: gone")
HEALTH = FleetHealthConfig(enabled=True, probe_interval_s=1.0, probe_timeout_s=0.25)


@pytest.fixture
def ledger(sqlite_url):
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "r", fleet_config(3))
    log.close()


def test_a_round_is_one_event_holding_every_result_in_shard_order(ledger):
    prober = ScriptedProber([{1: TIMEOUT, 2: DIED}])
    pump = ProbePump(ledger, prober, HEALTH)
    probe_round = pump.probe_round()
    assert prober.asked == [(0, 1, 2)] and prober.timeouts == [0.25]
    (stored,) = list(ledger.log.read("r", 1))
    assert (stored.seq, stored.event.type) == (2, "probe_round")
    assert stored.event.ok == (0,)
    assert [(f.shard, f.kind, f.error) for f in stored.event.failed] == [
        (1, "timeout", "no answer")
    ]
    assert [(d.shard, d.error) for d in stored.event.died] == [(2, "ActorDiedError: gone")]
    # Both transitions cite the round's seq, in shard order.
    assert [(t.seq, t.shard, t.after) for t in probe_round.transitions] == [
        (2, 1, ShardState.SUSPECT),
        (2, 2, ShardState.DEAD),
    ]


def test_the_round_asks_the_prober_for_the_configured_depth(ledger):
    prober = ScriptedProber([])
    ProbePump(ledger, prober, HEALTH.model_copy(update={"deep_probe": True})).probe_round()
    ProbePump(ledger, prober, HEALTH).probe_round()
    assert prober.deep == [True, False]


def test_a_death_is_conclusive_and_the_dead_are_not_probed_again(ledger):
    prober = ScriptedProber([{2: DIED}, {}, {}])
    pump = ProbePump(ledger, prober, HEALTH)
    pump.probe_round()
    assert ledger.view.state_of(2) is ShardState.DEAD
    pump.probe_round()
    pump.probe_round()
    assert prober.asked[1:] == [(0, 1), (0, 1)]
    assert ledger.view.state_of(2) is ShardState.DEAD


def test_threshold_timeouts_condemn_in_exactly_that_many_rounds(ledger):
    prober = ScriptedProber([{0: TIMEOUT}] * 3)
    pump = ProbePump(ledger, prober, HEALTH)
    states = []
    for _ in range(3):
        pump.probe_round()
        states.append(ledger.view.state_of(0))
    assert states == [ShardState.SUSPECT, ShardState.SUSPECT, ShardState.DEAD]


def test_a_prober_that_drops_a_shard_records_a_failed_probe(ledger):
    class Forgetful(ScriptedProber):
        def probe(self, shards, timeout_s, *, deep=False):
            return {s: OK for s in shards if s != 1}

    ProbePump(ledger, Forgetful([]), HEALTH).probe_round()
    (recorded,) = list(ledger.log.read("r", 1))
    (failed,) = recorded.event.failed
    assert failed.shard == 1 and "no result" in failed.error


def test_a_prober_that_answers_for_strangers_is_refused(ledger):
    class Chatty(ScriptedProber):
        def probe(self, shards, timeout_s, *, deep=False):
            return {**{s: OK for s in shards}, 7: OK}

    with pytest.raises(ValueError, match="not asked about"):
        ProbePump(ledger, Chatty([]), HEALTH).probe_round()
    assert ledger.log.head("r") == 1


def test_the_pump_folds_other_writers_before_choosing_whom_to_probe(ledger, sqlite_url):
    other = EventLog.open(sqlite_url)
    Ledger.resume(other, "r").actor_died(0, "seen by an adapter in another process")
    prober = ScriptedProber([])
    ProbePump(ledger, prober, HEALTH).probe_round()
    assert prober.asked == [(1, 2)]
    other.close()


def test_the_loop_stops_when_the_run_ends(ledger):
    pump = ProbePump(
        ledger, ScriptedProber([]), HEALTH.model_copy(update={"probe_interval_s": 0.01})
    )
    ledger.end_run("completed", "done")
    thread = pump.start(threading.Event())
    thread.join(30)
    assert not thread.is_alive()
    assert pump.rounds == 0


def test_a_deep_probes_failure_says_it_was_deep(sqlite_url: str) -> None:
    """A wedged engine core answers /health but not a token: a failure of the deep probe
    says so in the round, the rule and the explanation; a plain one is stored as it
    always was (``deep`` left out of the payload)."""

    class Wedged:
        def probe(self, shards, timeout_s, *, deep=False):
            return {s: ProbeResult("timeout", "no token within 2s") for s in shards}

    with EventLog.open(sqlite_url) as log:
        for run, deep in (("deep", True), ("plain", False)):
            ledger = Ledger.start(log, run, fleet_config(1))
            config = FleetHealthConfig(enabled=True, deep_probe=deep)
            ProbePump(ledger, Wedged(), config).probe_round()
            (recorded,) = [r for r in log.read(run) if r.event.type == "probe_round"]
            (failure,) = recorded.event.failed
            assert failure.deep is deep
            stored = json.loads(recorded.event.model_dump_json())["failed"][0]
            assert ("deep" in stored) is deep
            rule = ledger.view.shards[0].since_rule
            assert rule == f"failed probe: {'deep ' if deep else ''}timeout: no token within 2s"
