"""A probe round is one event, and it folds exactly as its per-shard events did.

The same history is written twice into a real SQLite log: once the way older ledgers
hold it (one ``probe_succeeded`` / ``probe_failed`` v1 row per shard, and an
``actor_death_confirmed`` for a death, in shard order — imported whole from an old
export, rows kept as they were), once the way the ledger records it now (one
``probe_round`` per round, appended). Read back — the v1 rows through the codec's
upcasters, each as a one-shard round — and folded, the two give the same view after
every step: states, counters, streaks, epoch, absent generation, once the per-shard
log's seqs are translated to the round log's (every per-shard event of a round maps to
the round's seq, which is what evidence cites now).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.controller.ledger import ProbeResult, round_event
from fleetledger.events.ids import new_event_id
from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    FailureCount,
    OutcomeWindowReported,
    ProbeFailure,
    ProbeRound,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
    RunStarted,
    ShardOutcomes,
    WeightsMarkedPartial,
)
from fleetledger.projections.fleet_view import FleetView, ProjectionError, fold, fold_pages
from fleetledger.projections.snapshot import to_snapshot
from fleetledger.store.log import EventLog
from tests.legacy_rows import (
    Item,
    import_old_run,
    imported_form,
    insert_old_rows,
    probe_failed_v1,
    probe_ok_v1,
)
from tests.projection_builders import fleet_config

SHARDS = 4
RESULTS = st.sampled_from(
    [
        ProbeResult.ok(),
        ProbeResult.ok(),
        ProbeResult.ok(),
        ProbeResult("timeout", "no answer in 2 s"),
        ProbeResult("error", "HTTP 503"),
        ProbeResult("died", "ActorDiedError"),
    ]
)
ROUND = st.dictionaries(st.integers(0, SHARDS - 1), RESULTS, min_size=1, max_size=SHARDS)
SHARD = st.integers(0, SHARDS - 1)
EVERYONE = tuple(range(SHARDS))
OTHER = st.one_of(
    st.builds(RestartRequested, shard=SHARD),
    st.builds(ReplacementLoaded, shard=SHARD),
    st.just(RefitStarted(weight_version=2, shards=EVERYONE)),
    st.just(RefitCompleted(weight_version=2, shards=EVERYONE)),
    st.just(RefitAborted(weight_version=2, reason="broadcast timed out")),
    st.just(WeightsMarkedPartial(weight_version=2)),
    st.builds(
        lambda shard, ok: OutcomeWindowReported(
            adapter="router",
            outcomes=(
                ShardOutcomes(shard=shard, successes=1)
                if ok
                else ShardOutcomes(
                    shard=shard, failures=(FailureCount(category="infra", reason="reset"),)
                ),
            ),
        ),
        SHARD,
        st.booleans(),
    ),
)
# A step is a probe round (a {shard: result} mapping) or one other event.
STEPS = st.lists(st.one_of(ROUND, ROUND, OTHER), min_size=1, max_size=30)

# Every key of a snapshot that holds a seq (or a list of seqs).
_SEQ_KEYS = {"seq", "since_seq", "last_refit_seq", "last_stall_seq", "exhausted_seq"}
_SEQ_LISTS = {"probe_evidence", "reported_evidence"}


def _translated(doc: Any, seqs: dict[int, int]) -> Any:
    """A snapshot document with every seq of the per-shard log replaced by the round
    log's, and the run id and stamps dropped (the two runs differ in those only)."""
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            if key in ("run", "at_us", "last_ok_at_us", "since_at_us"):
                continue
            if key in _SEQ_KEYS and isinstance(value, int):
                out[key] = seqs[value]
            elif key in _SEQ_LISTS:
                out[key] = [seqs[s] for s in value]
            else:
                out[key] = _translated(value, seqs)
        return out
    if isinstance(doc, list):
        return [_translated(v, seqs) for v in doc]
    return doc


def _comparable(view: FleetView, seqs: dict[int, int] | None = None) -> Any:
    doc = json.loads(to_snapshot(view))
    return _translated(doc, seqs or {s: s for s in range(1, view.seq + 1)})


def per_shard(shard: int, result: ProbeResult) -> Item:
    """One probe result as an older ledger stored it: its own v1 event (a death: the
    ``actor_death_confirmed`` that is still current)."""
    if result.kind == "ok":
        return probe_ok_v1(shard)
    if result.kind == "died":
        return ActorDeathConfirmed(shard=shard, error=result.error)
    return probe_failed_v1(shard, result.kind, result.error)


@pytest.fixture(scope="module")
def shared_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventLog]:
    path: Path = tmp_path_factory.mktemp("rounds") / "ledger.db"
    with EventLog.open(f"sqlite:///{path}") as log:
        yield log


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_per_shard_events_and_rounds_fold_to_the_same_view_after_every_round(
    shared_log: EventLog, steps: list[dict[int, ProbeResult] | Event]
) -> None:
    log = shared_log
    name = uuid.uuid4().hex[:12]
    old_run, rounds = f"per-shard-{name}", f"rounds-{name}"
    config = fleet_config(SHARDS, unhealthy_threshold=2, healthy_threshold=2)
    old: list[Item] = [RunStarted(config=config)]
    log.append(rounds, [RunStarted(config=config)])
    seqs = {1: 1}  # per-shard seq → round-log seq
    boundaries: list[tuple[int, int]] = []
    for step in steps:
        if isinstance(step, dict):
            these = [per_shard(shard, step[shard]) for shard in sorted(step)]
            new: Event = round_event(step)
        else:  # a fresh id: the strategies hand out one instance many times
            new = step.model_copy(update={"id": new_event_id()})
            these = [new.model_copy(update={"id": new_event_id()})]
        try:
            (new_seq,) = log.append(rounds, [new])
        except Exception:
            continue  # refused in both shapes alike (e.g. nothing after the end)
        for item in these:
            old.append(item)
            seqs[len(old)] = new_seq
        boundaries.append((len(old), new_seq))
    import_old_run(log, old_run, old)
    # Stored as the old ledger held them: per-shard v1 rows, not rewritten as rounds.
    stored = [row[3:] for page in log.read_stored(old_run) for row in page]
    assert stored == [imported_form(item) for item in old]
    # Read back from the log, and folded after every step: the same fleet each time.
    for old_seq, new_seq in boundaries:
        old_view = fold(log.read(old_run, 0, old_seq))
        new_view = fold(log.read(rounds, 0, new_seq))
        assert _comparable(old_view, seqs) == _comparable(new_view), (old_seq, new_seq)
        assert (old_view.epoch, old_view.absent_generation) == (
            new_view.epoch,
            new_view.absent_generation,
        )
    # The quiet-observation fast path folds both logs to what the plain fold gives.
    for run in (old_run, rounds):
        assert fold_pages(log.read_pages(run)) == fold(log.read(run))
        assert fold_pages(log.read_pages(run, ids=False)) == fold(log.read(run))


def test_a_failed_probe_inside_a_round_is_cited_by_the_rounds_seq(shared_log: EventLog) -> None:
    log = shared_log
    log.append("cited", [RunStarted(config=fleet_config(SHARDS))])
    timeout = ProbeResult("timeout", "no answer")
    for _ in range(3):
        log.append("cited", [round_event({0: ProbeResult.ok(), 1: timeout})])
    view = fold(log.read("cited"))
    shard = view.shards[1]
    assert (shard.state.value, shard.since_seq, shard.probe_evidence) == ("DEAD", 4, (2, 3, 4))
    assert view.shards[0].probe_successes == 3


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({}, "at least one shard's result"),
        ({"ok": (2, 1)}, "ascending order"),
        ({"ok": (1,), "failed": (ProbeFailure(shard=1, kind="timeout"),)}, "shards [1]"),
    ],
)
def test_a_malformed_round_is_refused_where_it_is_built(
    fields: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        ProbeRound(**fields)


def test_a_round_naming_a_shard_the_fleet_lacks_is_refused_by_the_log(
    shared_log: EventLog,
) -> None:
    shared_log.append("range", [RunStarted(config=fleet_config(2))])
    with pytest.raises(Exception, match="probe_round: shard 5 is out of range"):
        shared_log.append("range", [ProbeRound(ok=(0, 5))])
    assert shared_log.head("range") == 1


def test_a_damaged_v1_row_naming_a_shard_the_fleet_lacks_is_named_by_its_seq(
    shared_log: EventLog,
) -> None:
    """An old row the log never checked (written by hand, or damaged): the fold refuses
    it at its seq, worded for the probe result it is, not for the type it was lifted to."""
    run = "damaged-v1"
    insert_old_rows(
        shared_log.database.engine,
        run,
        [RunStarted(config=fleet_config(2)), probe_ok_v1(0), probe_ok_v1(9)],
    )
    stored = shared_log.read_stored(run)
    assert [row[3] for page in stored for row in page] == [
        "run_started",
        "probe_succeeded",
        "probe_succeeded",
    ]
    for pages in (
        lambda: fold(shared_log.read(run)),
        lambda: fold_pages(shared_log.read_pages(run, ids=False)),
    ):
        with pytest.raises(ProjectionError) as caught:
            pages()
        assert str(caught.value) == (
            f"run {run!r} seq 3: probe result: shard 9 is out of range: this run has "
            "shard_count=2 (valid shards 0..1)"
        )
