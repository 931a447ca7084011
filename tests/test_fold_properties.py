"""Properties of the fold over random runs: pure hypothesis, no database.

A run is a random small fleet (1–5 shards, thresholds 1–4, restart budget 0–3, a
healthy floor within the fleet) and a random sequence of every event kind the models
define, as valid as the log would accept (shards in range, ``run_ended`` last if at
all). After every event the fold must keep its invariants; snapshots at any prefix plus
the tail must give the full fold; order, gaps and foreign snapshots must be refused.
(One test reads through a real SQLite log: a snapshot of the previous projection
version must be skipped and the run refolded.)
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
from collections import defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.controller.ledger import Ledger
from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    Contradiction,
    Event,
    FailureCount,
    FleetConfig,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeDeath,
    ProbeFailure,
    ProbeRound,
    ProgressReported,
    RecordedEvent,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RolloutFates,
    RunEnded,
    RunStarted,
    ShardOutcomes,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    VersionCount,
    WeightsMarkedPartial,
)
from fleetledger.projections.fleet_view import (
    FleetView,
    ProjectionError,
    fold,
    fold_pages,
    fold_with_transitions,
)
from fleetledger.projections.membership import membership_document
from fleetledger.projections.rank_layout import RankLayoutError, rank_layout
from fleetledger.projections.shard_states import Input, ShardRecord, ShardState
from fleetledger.projections.snapshot import PROJECTION_VERSION, from_snapshot, to_snapshot
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog
from tests.projection_builders import RUN, fleet_config, record_run, recorded

H, S, D, R, ST, RT = (
    ShardState.HEALTHY,
    ShardState.SUSPECT,
    ShardState.DEAD,
    ShardState.RESTARTING,
    ShardState.STALE,
    ShardState.RETIRED,
)
SERVING = {H, S}
ABSENT = {D, R, RT}

# Deterministic and bounded: the whole file runs in well under a minute.
PROPERTY = settings(
    max_examples=250,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
CHEAP_PROPERTY = settings(PROPERTY, max_examples=60)
MAX_EVENTS = 80

# Which inputs each event kind may turn into (anything else in a transition is a bug).
INPUTS_OF: dict[type[Event], set[Input]] = {
    ProbeRound: {Input.PROBE_OK, Input.PROBE_FAILED, Input.ACTOR_DIED, Input.ENGINE_DIED},
    ActorDeathConfirmed: {Input.ACTOR_DIED, Input.ENGINE_DIED},
    OutcomeWindowReported: {Input.REPORTED_SUCCESS, Input.REPORTED_FAILURE},
    RefitCompleted: {Input.REFIT_COMPLETED},
    WeightsMarkedPartial: {Input.WEIGHTS_PARTIAL},
    RestartRequested: {Input.RESTART_REQUESTED},
    RestartFailed: {Input.RESTART_FAILED},
    ReplacementLoaded: {Input.REPLACEMENT_LOADED},
    SilentParticipantCondemned: {Input.CONDEMNED},
    ShardRetired: {Input.RETIRE},
}


# ── strategies ─────────────────────────────────────────────────────────────────


@st.composite
def configs(draw: st.DrawFn) -> FleetConfig:
    shards = draw(st.integers(1, 5))
    return fleet_config(
        shards,
        workers_per_shard=draw(st.integers(1, 3)),
        train_world_size=draw(st.integers(1, 4)),
        unhealthy_threshold=draw(st.integers(1, 4)),
        healthy_threshold=draw(st.integers(1, 4)),
        max_restart_attempts_per_shard=draw(st.integers(0, 3)),
        min_healthy_shards=draw(st.integers(1, shards)),
    )


_failures = st.builds(
    FailureCount,
    category=st.sampled_from(["infra", "data"]),
    reason=st.sampled_from(["timeout", "502", "connection reset", "context length"]),
    count=st.integers(1, 4),
)


@st.composite
def _attested(draw: st.DrawFn, shard: int) -> ShardOutcomes:
    """A shard's outcomes, some successes attested by version (and some partial)."""
    successes = draw(st.integers(0, 6))
    versions = draw(st.lists(st.integers(0, 30), unique=True, max_size=3))
    counts, left = [], draw(st.integers(0, successes))
    for _ in versions:
        take = draw(st.integers(0, left))
        counts.append(take)
        left -= take
    return ShardOutcomes(
        shard=shard,
        successes=successes,
        failures=tuple(draw(st.lists(_failures, max_size=3))),
        versions=tuple(
            VersionCount(version=v, count=c) for v, c in zip(versions, counts, strict=True) if c
        ),
        partial=draw(st.integers(0, successes)),
        contradicted=tuple(
            Contradiction(version=v, recorded=v + 1 + d)
            for v, d in draw(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3)), max_size=2))
        ),
        fates=draw(
            st.none()
            | st.builds(
                RolloutFates,
                redispatched=st.integers(0, 3),
                dropped=st.integers(0, 2),
                ended_run=st.integers(0, 1),
            )
        ),
    )


@functools.cache
def _outcome(shard: int) -> st.SearchStrategy[ShardOutcomes]:
    return _attested(shard)


@functools.cache
def events_for(shard_count: int) -> st.SearchStrategy[Event]:
    # Half the shard-level events hit shard 0, so streaks grow long enough to cross
    # thresholds, and a shard goes round DEAD → RESTARTING → STALE → serving.
    shard = st.one_of(st.just(0), st.integers(0, shard_count - 1))
    version = st.integers(0, 30)
    shard_set = st.one_of(
        st.just(tuple(range(shard_count))),  # a refit over the whole fleet
        st.lists(st.integers(0, shard_count - 1), unique=True, max_size=shard_count).map(tuple),
    )
    windows = st.lists(
        st.integers(0, shard_count - 1), unique=True, min_size=1, max_size=shard_count
    ).flatmap(lambda shards: st.tuples(*(_outcome(s) for s in shards)))
    reason = st.sampled_from(["lone suspect", "operator", "budget"])
    failure = st.builds(
        ProbeFailure,
        shard=shard,
        kind=st.sampled_from(["timeout", "error"]),
        error=st.sampled_from(["", "connection refused"]),
    )
    # One shard's probe (what the pump records when it probes one, and what every v1
    # per-shard row reads as), and whole rounds of several results.
    probe_ok = st.builds(lambda s: ProbeRound(ok=(s,)), shard)
    probe_failed = st.builds(lambda f: ProbeRound(failed=(f,)), failure)
    results = st.dictionaries(
        shard,
        st.sampled_from(["ok", "ok", "timeout", "error", "died", "engine died"]),
        min_size=1,
        max_size=shard_count,
    )
    probe_round = results.map(
        lambda r: ProbeRound(
            ok=tuple(s for s in sorted(r) if r[s] == "ok"),
            failed=tuple(
                ProbeFailure(shard=s, kind=r[s], error="HTTP 503")  # type: ignore[arg-type]
                for s in sorted(r)
                if r[s] in ("timeout", "error")
            ),
            died=tuple(
                ProbeDeath(shard=s, error="ActorDiedError", what="actor")
                if r[s] == "died"
                else ProbeDeath(shard=s, error="engine core gone", what="engine")
                for s in sorted(r)
                if r[s] in ("died", "engine died")
            ),
        )
    )
    window = st.builds(
        OutcomeWindowReported, adapter=st.sampled_from(["a0", "a1"]), outcomes=windows
    )
    refit_completed = st.builds(RefitCompleted, weight_version=version, shards=shard_set)
    restart_requested = st.builds(RestartRequested, shard=shard)
    loaded = st.builds(
        ReplacementLoaded,
        shard=shard,
        base_url=st.sampled_from([None, "http://moved.test:1", "http://moved.test:2"]),
    )
    rare = [
        st.builds(
            ActorDeathConfirmed,
            shard=shard,
            error=st.sampled_from(["", "ActorDiedError"]),
            what=st.sampled_from(["actor", "engine"]),
        ),
        st.builds(RefitStarted, weight_version=version, shards=shard_set),
        st.builds(RefitAborted, weight_version=version, reason=reason, context_lost=st.booleans()),
        st.builds(RestartFailed, shard=shard, error=st.just("engine failed to start")),
        st.builds(SilentParticipantCondemned, shard=shard, reason=reason),
        st.builds(ShardRetired, shard=shard, reason=reason),
        st.builds(
            StallDetected,
            committed_groups=st.integers(0, 9),
            train_steps=st.integers(0, 9),
            idle_s=st.floats(0, 1e4, allow_nan=False),
            in_flight=st.integers(0, 9),
            action=st.sampled_from(["warn", "abort"]),
        ),
        st.builds(
            CondemnationRefused,
            suspected=st.lists(st.integers(0, shard_count - 1), unique=True).map(tuple),
            reason=st.sampled_from(["no suspect", "2 suspects"]),
        ),
        st.builds(
            ProgressReported,
            committed_groups=st.integers(0, 99),
            train_steps=st.integers(0, 9),
            in_flight=st.integers(0, 9),
        ),
        st.builds(
            FleetExhausted,
            serving=st.integers(0, shard_count),
            min_healthy_shards=st.integers(1, shard_count),
            counts=st.just({"DEAD": 1}),
        ),
    ]
    # Weighted by repetition: the facts of a real run are mostly probes and windows.
    kinds = [
        *[probe_ok] * 5,
        *[probe_failed] * 5,
        *[probe_round] * 3,
        *[window] * 4,
        *[refit_completed] * 3,
        *[restart_requested] * 2,
        *[loaded] * 2,
        *[st.builds(WeightsMarkedPartial, weight_version=version)] * 2,
        # Partial on the shards a refit's load may have reached (ascending, each once).
        st.builds(WeightsMarkedPartial, weight_version=version, shards=shard_set.map(sorted)),
        *rare,
    ]
    return st.sampled_from(kinds).flatmap(lambda kind: kind)


@st.composite
def runs(draw: st.DrawFn, min_events: int = 0) -> list[RecordedEvent]:
    config = draw(configs())
    length = draw(st.integers(min_events, MAX_EVENTS))
    events = draw(st.lists(events_for(config.shard_count), min_size=length, max_size=length))
    if draw(st.integers(0, 4)) == 0:
        events.append(RunEnded(outcome="failed", cause="fleet exhausted"))
    return record_run(config, events)


# ── the invariants, after every event ──────────────────────────────────────────


@dataclass(frozen=True)
class Before:
    """What the view was before an event (records copied: their fields are immutable)."""

    shards: list[ShardRecord]
    serving: tuple[int, ...]
    epoch: int
    absent: tuple[int, ...]
    absent_generation: int

    @classmethod
    def of(cls, view: FleetView) -> Before:
        return cls(
            [copy.copy(r) for r in view.shards],
            view.serving,
            view.epoch,
            view.absent,
            view.absent_generation,
        )


def check_event(view: FleetView, rec: RecordedEvent, before: Before, ts: list) -> None:
    config = view.config
    n = config.shard_count
    states_before = [r.state for r in before.shards]
    states_after = [r.state for r in view.shards]

    assert view.seq == rec.seq
    assert view.at_us == rec.at_us

    # Serving and absent never overlap; STALE is neither.
    serving, absent = set(view.serving), set(view.absent)
    assert not serving & absent
    assert serving == {i for i, s in enumerate(states_after) if s in SERVING}
    assert absent == {i for i, s in enumerate(states_after) if s in ABSENT}
    assert view.last_serving == frozenset(serving)

    # Every transition belongs to this event, moves something, and chains per shard.
    chains: dict[int, list] = defaultdict(list)
    for t in ts:
        assert t.before is not t.after, t
        assert (t.seq, t.at_us) == (rec.seq, rec.at_us), t
        assert 0 <= t.shard < n
        assert t.input in INPUTS_OF.get(type(rec.event), set()), (t, rec.event)
        assert t.rule
        assert t.evidence and all(1 < e <= rec.seq for e in t.evidence), t
        assert t.evidence == tuple(sorted(set(t.evidence))), t
        chains[t.shard].append(t)
    for i in range(n):
        chain = chains.get(i, [])
        if not chain:
            assert states_after[i] is states_before[i], (i, rec.event)
            continue
        assert chain[0].before is states_before[i]
        for a, b in itertools.pairwise(chain):
            assert a.after is b.before
        assert chain[-1].after is states_after[i]
        assert view.shards[i].since_seq == rec.seq
        assert view.shards[i].since_rule == chain[-1].rule

    # Partial weights only where named: every other shard is left exactly as it was.
    event = rec.event
    if isinstance(event, WeightsMarkedPartial):
        marked = range(n) if event.shards is None else event.shards
        for i in range(n):
            if i not in marked or states_before[i] not in {H, S, ST}:
                assert view.shards[i] == before.shards[i], (i, event)
            else:
                assert states_after[i] is ST, (i, event)
        for t in ts:
            assert ("(marked: " in t.rule) is (event.shards is not None), t

    # A death is told as whose it was: an engine's is never its actor's.
    deaths = {event.shard: event.what} if isinstance(event, ActorDeathConfirmed) else {}
    if isinstance(event, ProbeRound):
        deaths = {d.shard: d.what for d in event.died}
    for t in ts:
        if t.input in {Input.ACTOR_DIED, Input.ENGINE_DIED}:
            assert t.after is D and t.before in {H, S, ST}, t
            engine = deaths[t.shard] == "engine"
            assert (t.input is Input.ENGINE_DIED) is engine, t
            assert ("engine died under its live actor" in t.rule) is engine, t
            assert ("actor death confirmed" in t.rule) is not engine, t

    # DEAD/RESTARTING/STALE reach the serving set only through a completed refit.
    for t in ts:
        if t.before in {D, R, ST} and t.after in SERVING:
            assert t.input is Input.REFIT_COMPLETED, t
            assert t.before is ST, t
            assert isinstance(rec.event, RefitCompleted)
            assert t.shard in rec.event.shards
    for i in range(n):
        if states_before[i] in {D, R, ST} and states_after[i] is H:
            assert isinstance(rec.event, RefitCompleted), (i, rec.event)

    # A restart request retires exactly when it goes over the budget.
    for t in ts:
        if t.input is Input.RESTART_REQUESTED:
            over = view.shards[t.shard].restart_attempts > config.max_restart_attempts_per_shard
            assert (t.after is RT) is over, t

    # RETIRED is terminal and frozen.
    for i in range(n):
        if states_before[i] is RT:
            assert view.shards[i] == before.shards[i], (i, rec.event)

    # The epoch moves by exactly one when, and only when, the serving set changes; a
    # probe round once per result that changes it (as when each result was an event).
    if isinstance(rec.event, ProbeRound):
        crossings = sum((t.before in SERVING) != (t.after in SERVING) for t in ts)
        assert view.epoch == before.epoch + crossings
    elif frozenset(serving) != frozenset(before.serving):
        assert view.epoch == before.epoch + 1
    else:
        assert view.epoch == before.epoch

    # The absent generation likewise, for the absent set (the rank layout): the integer
    # the transports compare. Neither implies the other (re-admission moves only this).
    assert view.last_absent == frozenset(absent)
    if isinstance(rec.event, ProbeRound):
        crossings = sum((t.before in ABSENT) != (t.after in ABSENT) for t in ts)
        assert view.absent_generation == before.absent_generation + crossings
    elif frozenset(absent) != frozenset(before.absent):
        assert view.absent_generation == before.absent_generation + 1
    else:
        assert view.absent_generation == before.absent_generation
    assert membership_document(view)["absent_generation"] == view.absent_generation

    # Per-shard bookkeeping stays coherent.
    for r in view.shards:
        assert r.probe_failures == len(r.probe_evidence)
        assert r.probe_failures == 0 or r.probe_successes == 0
        assert len(r.reported_evidence) <= r.reported_failures
        assert (r.reported_failures == 0) == (r.reported_evidence == ())
        assert r.state_before_partial is None or r.state is ST
        assert r.state_before_partial in {None, H, S}
        assert 0 <= r.restart_attempts
        if r.restart_attempts > config.max_restart_attempts_per_shard:
            assert r.state is RT
    assert set(view.suspected) == {
        r.index
        for r in view.shards
        if r.state is S or (r.state is ST and r.state_before_partial is S)
    }

    # The layout covers exactly the shards that are not absent.
    survivors = [i for i in range(n) if i not in absent]
    if survivors:
        lay = view.layout()
        assert lay.survivors == tuple(survivors)
        assert lay.world_size == config.train_world_size + len(survivors) * config.workers_per_shard
        ranks = [lay.rank_of(i, local) for i in survivors for local in range(lay.workers_per_shard)]
        assert ranks == list(range(config.train_world_size, lay.world_size))  # no holes
        assert lay == rank_layout(
            survivors=survivors,
            dp_size=n,
            total_workers=config.total_workers,
            train_world_size=config.train_world_size,
        )
    else:
        with pytest.raises(RankLayoutError):
            view.layout()

    # Exhaustion exactly below the floor, with counts that add up.
    exhaustion = view.exhaustion()
    if len(serving) >= config.min_healthy_shards:
        assert exhaustion is None
    else:
        assert exhaustion is not None
        assert exhaustion.serving == len(serving)
        assert sum(exhaustion.counts.values()) == n
        assert exhaustion.counts == view.counts()


@PROPERTY
@given(runs())
def test_the_fold_keeps_its_invariants_after_every_event(records):
    view = FleetView.start(records[0])
    assert view.epoch == 0 and view.absent_generation == 0
    transitions = []
    for rec in records[1:]:
        before = Before.of(view)
        ts = view.apply(rec)
        check_event(view, rec, before, ts)
        transitions += ts
    # The live view is the fold of the log it has read, transitions included.
    assert fold_with_transitions(records) == (view, transitions)


@PROPERTY
@given(runs())
def test_a_snapshot_at_any_prefix_plus_the_tail_is_the_full_fold(records):
    full, all_transitions = fold_with_transitions(records)
    view = FleetView.start(records[0])
    for k in range(1, len(records) + 1):
        if k > 1:
            view.apply(records[k - 1])
        payload = to_snapshot(view)
        restored = from_snapshot(payload)
        assert restored == view
        assert to_snapshot(restored) == payload  # the encoding is stable
        resumed, tail = fold_with_transitions(records[k:], into=restored)
        assert resumed == full
        assert tail == [t for t in all_transitions if t.seq > records[k - 1].seq]
    assert view == full


@CHEAP_PROPERTY
@given(
    runs(),
    st.data(),
)
def test_a_snapshot_of_another_projection_version_is_refused(records, data):
    k = data.draw(st.integers(1, len(records)))
    body = json.loads(to_snapshot(fold(records[:k])))
    other = data.draw(
        st.one_of(
            st.integers().filter(lambda v: v != PROJECTION_VERSION),
            st.none(),
            st.just(str(PROJECTION_VERSION)),
            st.just("missing"),
        )
    )
    if other == "missing":
        del body["projection_version"]
    else:
        body["projection_version"] = other
    with pytest.raises(ProjectionError, match="projection version"):
        from_snapshot(json.dumps(body))


@CHEAP_PROPERTY
@given(runs(min_events=2), st.data())
def test_folding_out_of_order_or_with_a_gap_is_refused_and_changes_nothing(records, data):
    # records[0] is run_started (seq 1); misplace the event at index k ≥ 1.
    last = len(records) - 1  # ≥ 2
    how = data.draw(st.sampled_from(["gap", "swap", "repeat", "other run", "back"]), label="how")
    if how in ("gap", "swap"):  # both need an event after k
        k = data.draw(st.integers(1, last - 1), label="k")
    else:
        k = data.draw(st.integers(1, last), label="k")
    if how == "gap":
        bad = [*records[:k], *records[k + 1 :]]
    elif how == "swap":
        bad = [*records[:k], records[k + 1], records[k], *records[k + 2 :]]
    elif how == "repeat":
        bad = [*records[: k + 1], records[k], *records[k + 1 :]]
    elif how == "other run":
        foreign = RecordedEvent("another-run", records[k].seq, records[k].at_us, records[k].event)
        bad = [*records[:k], foreign, *records[k + 1 :]]
    else:  # an event from before the view's seq
        bad = [*records[: k + 1], records[max(k - 1, 1)]]
    with pytest.raises(ProjectionError):
        fold(bad)

    # Applied one by one: the first misplaced event is refused and the view is untouched.
    view = FleetView.start(bad[0])
    for rec in bad[1:]:
        if rec.run == RUN and rec.seq == view.seq + 1:
            view.apply(rec)
            continue
        before = copy.deepcopy(view)
        with pytest.raises(ProjectionError):
            view.apply(rec)
        assert view == before
        break
    else:
        pytest.fail("no misplaced event was found")


@CHEAP_PROPERTY
@given(runs(min_events=1))
def test_a_fold_must_begin_with_run_started_at_seq_one(records):
    with pytest.raises(ProjectionError):
        fold(records[1:])
    shifted = [RecordedEvent(r.run, r.seq + 1, r.at_us, r.event) for r in records]
    with pytest.raises(ProjectionError):
        fold(shifted)


def test_an_empty_sequence_cannot_be_folded():
    with pytest.raises(ProjectionError, match="nothing to fold"):
        fold([])


def test_a_second_run_started_is_refused_and_leaves_the_view_unchanged():
    records = record_run(
        fleet_config(2), [ProbeRound(failed=(ProbeFailure(shard=0, kind="timeout"),))]
    )
    view = fold(records)
    before = copy.deepcopy(view)
    again = recorded(3, RunStarted(config=fleet_config(2)))
    with pytest.raises(ProjectionError, match="already started"):
        view.apply(again)
    # A refused event must not move the view: otherwise seq 3 is silently skipped and
    # the next event (seq 4) folds as if nothing were wrong.
    assert view == before
    with pytest.raises(ProjectionError):
        view.apply(recorded(4, ProbeRound(ok=(0,))))


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "not json",
        "{}",
        '{"projection_version": 1}',
        "[]",
        "null",
        "42",
        '"a string"',
    ],
)
def test_a_damaged_snapshot_is_refused_with_a_projection_error(payload):
    with pytest.raises(ProjectionError):
        from_snapshot(payload)


def test_a_snapshot_with_a_damaged_field_is_refused_with_a_projection_error():
    body = json.loads(to_snapshot(fold(record_run(fleet_config(2), []))))
    body["shards"][0]["state"] = "ZOMBIE"
    with pytest.raises(ProjectionError, match="damaged"):
        from_snapshot(json.dumps(body))
    body = json.loads(to_snapshot(fold(record_run(fleet_config(2), []))))
    del body["shards"][1]["reported_evidence"]
    with pytest.raises(ProjectionError, match="damaged"):
        from_snapshot(json.dumps(body))


_DEATH_AND_RESTART = [
    ActorDeathConfirmed(shard=1, error="ActorDiedError"),
    RestartRequested(shard=1),
    ReplacementLoaded(shard=1),
    RefitCompleted(weight_version=2, shards=(0, 1, 2)),
]


def test_the_absent_generation_moves_on_a_death_and_on_a_re_admission_not_the_epoch():
    """DEAD → RESTARTING stays absent (no move); RESTARTING → STALE leaves the absent set
    (the layout grows back) while the serving set, and so the epoch, stays put; STALE →
    HEALTHY moves the epoch and not the layout."""
    records = record_run(fleet_config(3), _DEATH_AND_RESTART)
    views = [fold(records[:k]) for k in range(1, len(records) + 1)]
    assert [(v.epoch, v.absent_generation) for v in views] == [
        (0, 0),  # started
        (1, 1),  # the death: out of both sets
        (1, 1),  # DEAD → RESTARTING: absent either way
        (1, 2),  # RESTARTING → STALE: the layout grows back, nothing serves more
        (2, 2),  # STALE → HEALTHY: serving again, the layout unchanged
    ]


def test_a_snapshot_of_the_previous_projection_version_is_skipped_and_refolded(sqlite_url):
    """A run whose snapshot predates the absent generation (projection version 1): the
    log is asked for this version's snapshots only, so the view is refolded from the
    events and the generation counted from the start."""
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, RUN, fleet_config(3))
        ledger.record(_DEATH_AND_RESTART[:3])
        old = json.loads(to_snapshot(ledger.view))
        old["projection_version"] = 1
        del old["absent_generation"], old["last_absent"]  # what version 1 wrote
        log.save_snapshot(RUN, 1, ledger.view.seq, json.dumps(old))
        with pytest.raises(ProjectionError, match="projection version 1"):
            from_snapshot(json.dumps(old))
        view = load_view(log, RUN)
        assert view == fold(log.read(RUN)) == ledger.view
        assert view.absent_generation == 2
        assert Ledger.resume(log, RUN).membership.absent_generation == 2


@given(runs(min_events=1), st.lists(st.integers(1, 7), max_size=40))
def test_folding_in_pages_through_the_quiet_fast_path_is_the_plain_fold(records, cuts):
    """``fold_pages`` takes quiet probe rounds of HEALTHY shards through an inlined copy
    of the probe-success rule: wherever the pages are cut, it must equal ``fold``."""
    assert fold_pages(_cut(records, cuts)) == fold(records)


@given(
    runs(min_events=1),
    st.lists(st.integers(0, 4), max_size=60),
    st.lists(st.integers(1, 7), max_size=40),
)
def test_repeated_rounds_read_as_one_shared_event_fold_as_each_would(records, repeats, cuts):
    """A read for a fold hands out one shared event per repeated payload, and
    ``apply_page`` folds a run of the same quiet round at once (run-folding). With every
    round shared by content, each repeated a drawn number of times in a row, and the
    pages cut anywhere, the view is the plain fold of the same events one by one."""
    shared: dict[tuple, ProbeRound] = {}
    extra = iter(repeats)
    out: list[RecordedEvent] = []
    for r in records:
        event = r.event
        copies = 1
        if isinstance(event, ProbeRound):
            key = (event.ok, event.failed, event.died)
            event = shared.setdefault(key, event.model_copy(update={"id": ""}))
            copies += next(extra, 0)
        for _ in range(copies):
            out.append(RecordedEvent(r.run, len(out) + 1, r.at_us, event))
    assert fold_pages(_cut(out, cuts)) == fold(out)


def _cut(records: list[RecordedEvent], sizes: list[int]) -> list[list[RecordedEvent]]:
    """``records`` in pages of ``sizes``, then a last page of what is left."""
    pages, at = [], 0
    for size in sizes:
        pages.append(records[at : at + size])
        at += size
    pages.append(records[at:])
    return pages
