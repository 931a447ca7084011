"""Which weights the rollouts came from, and how stale: the fold's counts equal a
brute-force recount from per-rollout facts, over random interleavings of refits (started,
completed, aborted), loads, outcome windows and faults."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given
from hypothesis import strategies as st

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    OutcomeWindowReported,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
    ShardOutcomes,
    VersionCount,
    WeightsMarkedPartial,
)
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.membership import membership_document
from fleetledger.projections.snapshot import from_snapshot, to_snapshot
from tests.projection_builders import fleet_config, record_run

SHARDS = 3

# One rollout: the shard that served it, the version its engine attested (None: nobody
# did), and whether the engine said its weights were partial.
rollout = st.tuples(
    st.just("rollout"), st.integers(0, SHARDS - 1), st.none() | st.integers(0, 12), st.booleans()
)
step = st.one_of(
    rollout,
    rollout,
    rollout,
    st.tuples(st.just("flush")),
    st.tuples(st.just("refit"), st.integers(0, 2), st.sampled_from(["completed", "aborted"])),
    st.tuples(st.just("death"), st.integers(0, SHARDS - 1)),
    st.tuples(st.just("restart"), st.integers(0, SHARDS - 1)),
)


def _window(pending: list[tuple[int, int | None, bool]]) -> OutcomeWindowReported:
    outcomes = []
    for shard in sorted({s for s, _, _ in pending}):
        mine = [(v, p) for s, v, p in pending if s == shard]
        versions = Counter(v for v, _ in mine if v is not None)
        outcomes.append(
            ShardOutcomes(
                shard=shard,
                successes=len(mine),
                versions=tuple(VersionCount(version=v, count=n) for v, n in versions.items()),
                partial=sum(p for _, p in mine),
            )
        )
    return OutcomeWindowReported(adapter="loop", outcomes=tuple(outcomes))


@given(st.lists(step, max_size=80))
def test_rollouts_by_version_and_staleness_equal_a_recount_of_every_rollout(script):
    events: list[Event] = []
    pending: list[tuple[int, int | None, bool]] = []
    trainer = 0
    facts: list[tuple[int | None, bool, int]] = []  # per rollout: version, partial, trainer
    for action in script:
        if action[0] == "rollout":
            pending.append(action[1:])
        elif action[0] == "flush" and pending:
            events.append(_window(pending))
            facts += [(v, p, trainer) for _, v, p in pending]
            pending = []
        elif action[0] == "refit":
            trainer += action[1]
            events.append(RefitStarted(weight_version=trainer, shards=tuple(range(SHARDS))))
            if action[2] == "completed":
                events.append(RefitCompleted(weight_version=trainer, shards=tuple(range(SHARDS))))
            else:
                events.append(RefitAborted(weight_version=trainer, reason="a peer died"))
                events.append(WeightsMarkedPartial(weight_version=trainer))
        elif action[0] == "death":
            events.append(ActorDeathConfirmed(shard=action[1], error="killed"))
        elif action[0] == "restart":
            events += [RestartRequested(shard=action[1]), ReplacementLoaded(shard=action[1])]
    records = record_run(fleet_config(SHARDS), events)
    view = fold(records)
    served = view.served

    by_version = Counter(v for v, _, _ in facts if v is not None)
    staleness: defaultdict[int, Counter[int]] = defaultdict(Counter)
    for v, _, t in facts:
        if v is not None:
            staleness[t][t - v] += 1
    assert served.by_version == dict(by_version)
    assert served.unknown == sum(v is None for v, _, _ in facts)
    assert served.partial == sum(p for _, p, _ in facts)
    assert served.staleness == {t: dict(c) for t, c in staleness.items()}
    assert served.unknown_at == dict(Counter(t for v, _, t in facts if v is None))
    assert served.attested + served.unknown == len(facts)
    assert view.trainer_version == trainer
    # Kept whole through a snapshot and in the membership document.
    assert from_snapshot(to_snapshot(view)).served == served
    assert membership_document(view)["served"]["unknown"] == served.unknown
