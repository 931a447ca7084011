"""Partial weights only where a load may have begun: ``weights_marked_partial.shards``.

A refit that aborts has touched the shards whose load began, not the whole fleet; the
event names them, and the fold marks only those (STALE), leaving every other shard —
its state, its traffic, the epoch — as it was. Without ``shards`` (every row stored
before the field existed) it means what it always meant: every shard not absent, told
in the same words as before. Examples on ``projection_builders.Fleet``, properties over
the random runs of ``test_fold_properties``, and a real SQLite ledger for the append.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetledger.controller.ledger import Ledger
from fleetledger.events.codec import EventCodec
from fleetledger.events.errors import LedgerError
from fleetledger.events.models import RecordedEvent, WeightsMarkedPartial
from fleetledger.projections.explain import describe_event
from fleetledger.projections.fleet_view import ProjectionError, fold
from fleetledger.projections.history import DecisionEntry, replay
from fleetledger.projections.shard_states import ABSENT, SERVING, Input, ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config as ledger_fleet_config
from tests.projection_builders import Fleet, put_in, recorded
from tests.test_explain import shard_of
from tests.test_fold_properties import CHEAP_PROPERTY, runs

H, S, D, ST = ShardState.HEALTHY, ShardState.SUSPECT, ShardState.DEAD, ShardState.STALE


def partial(fleet: Fleet, version: int, shards: tuple[int, ...] | None) -> list:
    return fleet.apply(WeightsMarkedPartial(weight_version=version, shards=shards))


# ── the fold ───────────────────────────────────────────────────────────────────


def test_named_shards_go_stale_and_the_others_keep_their_state_and_traffic() -> None:
    fleet = Fleet(shard_count=4)
    fleet.probe_failed(3)  # SUSPECT, serving
    untouched = {i: fleet.copy_of(i) for i in (0, 2)}
    ts = partial(fleet, 7, (1, 3))
    assert [(t.shard, t.before, t.after) for t in ts] == [(1, H, ST), (3, S, ST)]
    rule = "weights partial: refit at version 7 aborted (marked: shards 1 and 3)"
    assert [t.rule for t in ts] == [rule, rule]
    assert fleet.view.serving == (0, 2)
    assert fleet.view.epoch == 1  # once, for the event
    assert fleet.view.absent_generation == 0  # STALE is not absent: the layout holds
    assert {i: fleet.shard(i) for i in (0, 2)} == untouched
    assert fleet.shard(3).state_before_partial is S  # still counted as a suspect
    assert fleet.view.suspected == (3,)


def test_naming_only_shards_that_are_already_stale_or_absent_moves_nothing() -> None:
    fleet = Fleet(shard_count=3)
    put_in(fleet, 1, D)
    put_in(fleet, 2, ST)
    before = fold(fleet.records)
    assert partial(fleet, 4, (1, 2)) == []
    assert fleet.view.serving == (0,) and fleet.view.epoch == before.epoch
    assert fleet.state(1) is D and fleet.state(2) is ST


def test_an_empty_list_marks_no_shard() -> None:
    fleet = Fleet(shard_count=2)
    assert partial(fleet, 4, ()) == []
    assert fleet.view.serving == (0, 1) and fleet.view.epoch == 0


def test_without_shards_every_shard_not_absent_is_marked_in_the_old_words() -> None:
    fleet = Fleet(shard_count=3)
    put_in(fleet, 2, D)
    ts = partial(fleet, 7, None)
    assert [(t.shard, t.after) for t in ts] == [(0, ST), (1, ST)]
    assert {t.rule for t in ts} == {"weights partial: refit at version 7 aborted"}


def test_a_named_shard_outside_the_fleet_is_refused_in_one_line_and_changes_nothing() -> None:
    fleet = Fleet(shard_count=3)
    before = fold(fleet.records)
    event = WeightsMarkedPartial(weight_version=2, shards=(0, 5))
    with pytest.raises(ProjectionError) as caught:
        fleet.view.apply(recorded(2, event))
    assert str(caught.value) == (
        "run 'run-under-test' seq 2: weights_marked_partial: shard 5 is out of range: this run "
        "has shard_count=3 (valid shards 0..2)"
    )
    assert "\n" not in str(caught.value)
    assert fleet.view == before  # shard 0 was not marked before the refusal


@pytest.mark.parametrize("shards", [(2, 1), (1, 1), (0, 2, 2)])
def test_shards_must_be_ascending_and_each_once(shards: tuple[int, ...]) -> None:
    with pytest.raises(ValidationError, match="shards must list shards in ascending order"):
        WeightsMarkedPartial(weight_version=1, shards=shards)


def test_a_negative_shard_is_refused_by_the_model() -> None:
    with pytest.raises(ValidationError):
        WeightsMarkedPartial(weight_version=1, shards=(-1,))


# ── stored rows ────────────────────────────────────────────────────────────────


def test_an_event_without_shards_is_stored_as_the_bytes_an_older_fleetledger_wrote() -> None:
    codec = EventCodec()
    # As an older fleetledger stored it (with its id, before schema revision 0003), and
    # as this one does: the same fields, without the id and type their columns hold.
    old_row = '{"id":"e-1","type":"weights_marked_partial","weight_version":3}'
    assert codec.encode(WeightsMarkedPartial(id="e-1", weight_version=3)) == (
        "weights_marked_partial",
        1,
        '{"weight_version":3}',
    )
    read = codec.decode("r", 9, "weights_marked_partial", 1, old_row)
    assert read == WeightsMarkedPartial(id="e-1", weight_version=3, shards=None)
    named = WeightsMarkedPartial(id="e-2", weight_version=3, shards=(0, 2))
    assert codec.encode(named)[2].endswith(',"shards":[0,2]}')
    assert codec.decode("r", 9, *codec.encode(named), named.id) == named


def test_the_ledger_passes_the_shards_through_in_order_and_the_log_checks_them(
    sqlite_url: str,
) -> None:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "r", ledger_fleet_config(4))
        ts = ledger.mark_weights_partial(3, shards=[2, 0])
        assert [(t.shard, t.after) for t in ts] == [(0, ST), (2, ST)]
        stored = [r.event for r in log.read("r")][-1]
        assert isinstance(stored, WeightsMarkedPartial) and stored.shards == (0, 2)
        assert ledger.view.serving == (1, 3)
        assert ledger.mark_weights_partial(3) != []  # None: every shard not absent
        assert ledger.view.serving == ()
        head = ledger.view.seq
        with pytest.raises(LedgerError, match="shard 4 is out of range"):
            ledger.mark_weights_partial(4, shards=[1, 4])
        assert [r.seq for r in log.read("r")][-1] == head  # nothing written


# ── the words ──────────────────────────────────────────────────────────────────


def test_replay_and_explain_say_which_shards_were_marked() -> None:
    fleet = Fleet(shard_count=3)
    fleet.refit_started(5)
    fleet.refit_aborted(5, "broadcast timed out")
    partial(fleet, 5, (0, 2))
    seq = fleet.last_seq
    assert describe_event(fleet.records[-1].event) == (
        "weights marked partial after the refit to weight version 5 aborted "
        "(marked: shards 0 and 2)"
    )
    decision = [e for e in replay(fleet.records) if isinstance(e, DecisionEntry)][-1]
    assert decision.subjects == (0, 2)
    assert decision.detail == "refit at weight version 5 aborted; marked: shards 0 and 2"
    stale = shard_of(fleet, 2)
    assert stale.because[0] == (
        f"the refit to weight version 5 aborted at seq {seq - 1} (broadcast timed out), and the "
        f"weights of shards 0 and 2 were marked partial at seq {seq}"
    )
    assert stale.rule == "weights partial: refit at version 5 aborted (marked: shards 0 and 2)"
    assert shard_of(fleet, 1).state == "HEALTHY"


def test_an_old_event_is_told_in_the_old_words() -> None:
    fleet = Fleet(shard_count=2)
    fleet.refit_started(5)
    fleet.refit_aborted(5, "broadcast timed out")
    partial(fleet, 5, None)
    seq = fleet.last_seq
    assert describe_event(fleet.records[-1].event) == (
        "weights marked partial after the refit to weight version 5 aborted"
    )
    decision = [e for e in replay(fleet.records) if isinstance(e, DecisionEntry)][-1]
    assert decision.detail == "refit at weight version 5 aborted"
    assert shard_of(fleet, 1).because[0] == (
        f"the refit to weight version 5 aborted at seq {seq - 1} (broadcast timed out), and the "
        f"weights of every shard not absent were marked partial at seq {seq}"
    )


# ── properties ─────────────────────────────────────────────────────────────────


@CHEAP_PROPERTY
@given(runs(), st.data())
def test_a_named_partial_moves_exactly_the_named_shards_that_were_alive(
    records: list[RecordedEvent], data: st.DataObject
) -> None:
    view = fold(records)
    if view.ended is not None:
        return
    n = view.config.shard_count
    named = tuple(sorted(data.draw(st.sets(st.integers(0, n - 1)), label="shards")))
    before = [(r.state, r.since_seq) for r in view.shards]
    serving_before = set(view.serving)
    copies = fold(records)
    ts = view.apply(recorded(view.seq + 1, WeightsMarkedPartial(weight_version=1, shards=named)))
    moved = {t.shard for t in ts}
    assert moved == {i for i in named if before[i][0] in {H, S}}
    assert all(t.input is Input.WEIGHTS_PARTIAL and t.after is ST for t in ts)
    for i in range(n):
        if i not in named or before[i][0] in ABSENT:
            assert view.shards[i] == copies.shards[i]
        else:
            assert view.shards[i].state is ST
    assert set(view.serving) == serving_before - set(named)
    assert view.epoch == copies.epoch + (set(view.serving) != serving_before)
    assert view.absent_generation == copies.absent_generation
    assert {view.shards[i].state for i in named} <= {ST} | ABSENT
    assert not set(view.serving) & set(named)
    assert {i for i in range(n) if view.shards[i].state in SERVING} == set(view.serving)


@CHEAP_PROPERTY
@given(runs())
def test_naming_every_shard_folds_as_the_old_event_does_but_for_its_words(
    records: list[RecordedEvent],
) -> None:
    view = fold(records)
    if view.ended is not None:
        return
    every = tuple(range(view.config.shard_count))
    old, new = fold(records), fold(records)
    seq = view.seq + 1
    old_ts = old.apply(recorded(seq, WeightsMarkedPartial(weight_version=1)))
    new_ts = new.apply(recorded(seq, WeightsMarkedPartial(weight_version=1, shards=every)))
    assert [(t.shard, t.before, t.after) for t in old_ts] == [
        (t.shard, t.before, t.after) for t in new_ts
    ]
    assert (old.serving, old.epoch, old.absent, old.absent_generation) == (
        new.serving,
        new.epoch,
        new.absent,
        new.absent_generation,
    )
    assert [r.state for r in old.shards] == [r.state for r in new.shards]
