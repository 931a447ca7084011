"""An engine core that dies under a live actor is its own fact: ``what="engine"``.

Ray's liveness sees only the actor's process; a vLLM engine core killed under it leaves
an actor that answers every call with ``EngineDead``. The shard is as dead as if its
actor had gone — the fold's transition is the same — but the ledger records whose death
it was (``actor_death_confirmed.what``, ``probe_round.died[].what``), and every word
about it says the engine died under its live actor, quoting the engine's own message,
never that "its actor is gone". Rows stored before the field read as actor deaths, in
the words they always had.

The Ray glue is exercised on the exceptions Ray raises (a task error carrying the
engine's ``EngineDead`` as its cause), built here without a cluster.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ray.exceptions import ActorDiedError, RayTaskError

from fleetledger.controller.ledger import Ledger, ProbeResult, round_event
from fleetledger.controller.ray_fleet import GenerationReports
from fleetledger.controller.runtime_deaths import (
    ActorDeath,
    ShardActorDied,
    actor_death_of,
    engine_death_of,
    probe_result_of,
)
from fleetledger.events.codec import EventCodec
from fleetledger.events.models import (
    ActorDeathConfirmed,
    ProbeDeath,
    ProbeRound,
)
from fleetledger.projections.explain import describe_event
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.shard_states import SERVING, Input, ShardState
from fleetledger.shards.contract import EngineDead
from fleetledger.store.log import EventLog
from tests.builders import fleet_config as ledger_fleet_config
from tests.projection_builders import Fleet, put_in, recorded
from tests.test_explain import shard_of
from tests.test_fold_properties import CHEAP_PROPERTY, runs

H, S, D, ST = ShardState.HEALTHY, ShardState.SUSPECT, ShardState.DEAD, ShardState.STALE
ENGINE_MESSAGE = "shard 1: the vLLM engine core is dead under a live actor: EngineCore died"
# What the ledger reads it as (events/causes.py): the engine's own words, without the
# shard's preamble that the explanation says anyway. Written out, not computed.
ENGINE_TOLD = "engine core died: EngineCore died"
KILLED_TOLD = "actor process ended by SIGKILL"  # what "ActorDiedError: SIGKILL" reads as


def engine_task_error(message: str = ENGINE_MESSAGE) -> RayTaskError:
    """What a call on an actor whose engine died raises: Ray's task error, an instance of
    the engine's exception class too, whose text is the remote traceback."""
    traceback = f'Traceback (most recent call last):\n  File "x.py"\nEngineDead: {message}'
    return RayTaskError("ShardActor.is_alive", traceback, EngineDead(message)).as_instanceof_cause()


# ── the fold and its words ─────────────────────────────────────────────────────


@pytest.mark.parametrize("state", [H, S, ST])
def test_an_engine_death_kills_a_serving_or_stale_shard_at_once_in_its_own_words(state) -> None:
    fleet = Fleet()
    put_in(fleet, 1, state)
    streak = fleet.shard(1).probe_failures
    (t,) = fleet.apply(ActorDeathConfirmed(shard=1, error=ENGINE_MESSAGE, what="engine"))
    assert (t.before, t.after, t.input) == (state, D, Input.ENGINE_DIED)
    assert t.rule == f"the engine died under its live actor: {ENGINE_TOLD}"
    assert "actor death" not in t.rule and "actor is gone" not in t.rule
    assert fleet.shard(1).probe_failures == streak  # conclusive, not counted
    assert fleet.shard(1).last_error == ENGINE_TOLD


def test_a_probe_round_records_an_engine_death_beside_an_actor_death() -> None:
    fleet = Fleet(shard_count=3)
    round_ = ProbeRound(
        ok=(0,),
        died=(
            ProbeDeath(shard=1, error=ENGINE_MESSAGE, what="engine"),
            ProbeDeath(shard=2, error="ActorDiedError: SIGKILL"),
        ),
    )
    ts = fleet.apply(round_)
    assert [(t.shard, t.input, t.rule) for t in ts] == [
        (1, Input.ENGINE_DIED, f"the engine died under its live actor: {ENGINE_TOLD}"),
        (2, Input.ACTOR_DIED, f"actor death confirmed by the runtime: {KILLED_TOLD}"),
    ]
    assert fleet.view.epoch == 2  # once per result, as ever
    assert describe_event(round_, 1) == (
        f"the engine of shard 1 died under its live actor: {ENGINE_TOLD}"
    )
    assert describe_event(round_, 2) == (
        f"actor death of shard 2 confirmed by the runtime: {KILLED_TOLD}"
    )


@pytest.mark.parametrize("in_a_round", [False, True])
def test_explain_says_the_engine_died_under_its_live_actor_never_that_the_actor_is_gone(
    in_a_round: bool,
) -> None:
    fleet = Fleet()
    if in_a_round:
        fleet.apply(ProbeRound(died=(ProbeDeath(shard=1, error=ENGINE_MESSAGE, what="engine"),)))
    else:
        fleet.apply(ActorDeathConfirmed(shard=1, error=ENGINE_MESSAGE, what="engine"))
    seq = fleet.last_seq
    e = shard_of(fleet, 1)
    assert e.because[0] == (
        f"the engine died under its live actor (seq {seq}: {ENGINE_TOLD}); an engine's death "
        "is as conclusive as its actor's, so it went HEALTHY → DEAD at once, without counting "
        "failures"
    )
    assert "actor is gone" not in e.text and "actor death" not in e.text
    assert e.evidence[-1].what == f"the engine of shard 1 died under its live actor: {ENGINE_TOLD}"
    assert e.input is Input.ENGINE_DIED


def test_an_actor_death_keeps_its_words() -> None:
    fleet = Fleet()
    fleet.actor_died(1, "ActorDiedError: SIGKILL")
    e = shard_of(fleet, 1)
    assert e.because[0].startswith(
        f"the runtime confirmed its actor is gone (seq {fleet.last_seq}: {KILLED_TOLD})"
    )
    assert e.rule == f"actor death confirmed by the runtime: {KILLED_TOLD}"


def test_stored_actor_deaths_are_the_bytes_they_were_and_read_as_actor_deaths() -> None:
    codec = EventCodec()
    # As an older fleetledger stored them (with the id, before schema revision 0003),
    # and as this one does: the same bytes after the id and type their columns hold.
    old_row = '{"id":"e-1","type":"actor_death_confirmed","shard":1,"error":"gone"}'
    old_fields = '{"shard":1,"error":"gone"}'
    assert codec.encode(ActorDeathConfirmed(id="e-1", shard=1, error="gone"))[2] == old_fields
    read = codec.decode("r", 4, "actor_death_confirmed", 1, old_row)
    assert read == ActorDeathConfirmed(id="e-1", shard=1, error="gone", what="actor")
    assert codec.decode("r", 4, "actor_death_confirmed", 1, old_fields, "e-1") == read
    old_round = '{"ok":[],"failed":[],"died":[{"shard":1,"error":""}]}'
    assert codec.encode(ProbeRound(id="e-2", died=(ProbeDeath(shard=1),)))[2] == old_round
    engine = ActorDeathConfirmed(id="e-3", shard=1, error="x", what="engine")
    assert codec.encode(engine)[2].endswith(',"what":"engine"}')
    assert codec.decode("r", 5, *codec.encode(engine), engine.id) == engine


@CHEAP_PROPERTY
@given(runs(), st.integers(0, 4), st.sampled_from(["actor", "engine"]))
def test_whose_death_changes_the_words_never_the_fold(records, index, what) -> None:
    view = fold(records)
    if view.ended is not None:
        return
    shard = index % view.config.shard_count
    seq = view.seq + 1
    actor, engine = fold(records), fold(records)
    a = actor.apply(recorded(seq, ActorDeathConfirmed(shard=shard, error="boom")))
    e = engine.apply(recorded(seq, ActorDeathConfirmed(shard=shard, error="boom", what=what)))
    assert [(t.before, t.after) for t in a] == [(t.before, t.after) for t in e]
    assert [r.state for r in actor.shards] == [r.state for r in engine.shards]
    assert (actor.epoch, actor.absent_generation) == (engine.epoch, engine.absent_generation)
    for t in e:
        assert t.before in SERVING | {ST} and t.after is D
        if what == "engine":
            assert t.rule == "the engine died under its live actor: boom"
        else:
            assert t.rule == "actor death confirmed by the runtime: boom"


# ── the Ray glue: from what a call raised to what the ledger records ───────────


def test_the_engine_death_found_in_a_task_error_is_the_engines_own_exception() -> None:
    raised = engine_task_error()
    found = engine_death_of(raised)
    assert found is not None and found is raised.cause
    assert found.message == ENGINE_MESSAGE
    assert engine_death_of(ActorDiedError()) is None


def test_a_probe_that_met_an_engine_death_is_the_engines_death_with_its_message() -> None:
    result = probe_result_of(engine_task_error(), incarnation=2)
    assert (result.kind, result.what, result.error, result.incarnation) == (
        "died",
        "engine",
        ENGINE_MESSAGE,
        2,
    )
    assert "Traceback" not in result.error and "\n" not in result.error
    actor = probe_result_of(ActorDiedError())
    assert (actor.kind, actor.what) == ("died", "actor")
    event = round_event({1: result, 2: actor, 0: ProbeResult.ok()})
    assert event.died == (  # read into a cause as recorded, the raw text kept in it
        ProbeDeath(shard=1, what="engine", **ProbeDeath.said(ENGINE_MESSAGE)),
        ProbeDeath(shard=2, what="actor", **ProbeDeath.said(actor.error)),
    )
    assert event.died[0].error == ENGINE_TOLD
    assert event.died[0].cause is not None and event.died[0].cause.raw == ENGINE_MESSAGE


def test_an_engine_message_of_several_lines_is_recorded_by_its_first() -> None:
    result = probe_result_of(engine_task_error("engine core died\n  at step 4\n"))
    assert result.error == "engine core died"


def test_a_rollout_that_met_an_engine_death_reports_the_engines_death() -> None:
    through_generate = ShardActorDied(shard=1, incarnation=3, death="EngineDead: ignored")
    through_generate.__cause__ = engine_task_error()
    assert actor_death_of(through_generate) == ActorDeath(ENGINE_MESSAGE, 3, "engine")
    assert actor_death_of(engine_task_error()) == ActorDeath(ENGINE_MESSAGE, None, "engine")
    killed = ShardActorDied(shard=1, incarnation=3, death="ActorDiedError: SIGKILL")
    assert actor_death_of(killed) == ActorDeath("ActorDiedError: SIGKILL", 3, "actor")


def test_generation_reports_record_an_engine_death_as_the_engines(sqlite_url: str) -> None:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "r", ledger_fleet_config(3))
        reports = GenerationReports(ledger, "test.rollouts")
        failure = ShardActorDied(shard=1, incarnation=0, death="EngineDead: ignored")
        failure.__cause__ = engine_task_error()
        reports.failure(1, failure)
        event = [r.event for r in log.read("r")][-1]
        assert event == ActorDeathConfirmed(
            id=event.id, shard=1, what="engine", **ActorDeathConfirmed.said(ENGINE_MESSAGE)
        )
        assert ledger.view.shards[1].since_rule == (
            f"the engine died under its live actor: {ENGINE_TOLD}"
        )


def test_a_probe_round_through_the_ledger_records_the_engines_death(sqlite_url: str) -> None:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "r", ledger_fleet_config(3))
        ledger.record_probes({1: probe_result_of(engine_task_error()), 0: ProbeResult.ok()})
        recorded_round = [r.event for r in log.read("r")][-1]
        assert isinstance(recorded_round, ProbeRound)
        assert recorded_round.died == (
            ProbeDeath(shard=1, what="engine", **ProbeDeath.said(ENGINE_MESSAGE)),
        )
        assert ledger.view.state_of(1) is D
