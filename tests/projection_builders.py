"""Build runs of ``RecordedEvent`` without a database, and fold them as they grow.

``Fleet`` is a recorder in miniature: it stamps each event with the next seq and a
time one second after the previous one, appends it to ``records`` and applies it to
a live ``FleetView`` at once, returning the transitions that event caused. Tests can
then assert on the live view, or fold ``records`` from scratch and compare.

``put_in`` drives one shard into a given state by the shortest path that touches no
other shard, so a test can be written once and parametrised over every state.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
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
    RunEnded,
    RunStarted,
    ShardOutcomes,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
)
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.shard_states import ShardRecord, ShardState, Transition

RUN = "run-under-test"
T0_US = 1_750_000_000_000_000  # an arbitrary fixed instant: folds never read a clock
STEP_US = 1_000_000


def base_urls(shard_count: int) -> tuple[str, ...]:
    return tuple(f"http://gen-{i}.test:8000" for i in range(shard_count))


def fleet_config(
    shard_count: int = 3,
    *,
    workers_per_shard: int = 1,
    train_world_size: int = 2,
    unhealthy_threshold: int = 3,
    healthy_threshold: int = 2,
    max_restart_attempts_per_shard: int = 5,
    min_healthy_shards: int = 1,
) -> FleetConfig:
    return FleetConfig(
        shard_count=shard_count,
        workers_per_shard=workers_per_shard,
        train_world_size=train_world_size,
        unhealthy_threshold=unhealthy_threshold,
        healthy_threshold=healthy_threshold,
        max_restart_attempts_per_shard=max_restart_attempts_per_shard,
        min_healthy_shards=min_healthy_shards,
        base_urls=base_urls(shard_count),
    )


def at_us_of(seq: int) -> int:
    return T0_US + (seq - 1) * STEP_US


def recorded(seq: int, event: Event, *, run: str = RUN, at_us: int | None = None) -> RecordedEvent:
    return RecordedEvent(run, seq, at_us_of(seq) if at_us is None else at_us, event)


def record_run(
    config: FleetConfig, events: Iterable[Event], *, run: str = RUN
) -> list[RecordedEvent]:
    """``run_started`` at seq 1, then ``events`` at seq 2, 3, …"""
    out = [recorded(1, RunStarted(config=config), run=run)]
    out += [recorded(seq, e, run=run) for seq, e in enumerate(events, start=2)]
    return out


# ── outcome windows ────────────────────────────────────────────────────────────


def outcome(
    shard: int,
    *,
    successes: int = 0,
    infra: int = 0,
    data: int = 0,
    infra_reason: str = "timeout",
    data_reason: str = "maximum context length",
) -> ShardOutcomes:
    failures: list[FailureCount] = []
    if infra:
        failures.append(FailureCount(category="infra", reason=infra_reason, count=infra))
    if data:
        failures.append(FailureCount(category="data", reason=data_reason, count=data))
    return ShardOutcomes(shard=shard, successes=successes, failures=tuple(failures))


def window(*outcomes: ShardOutcomes, adapter: str = "adapter-0") -> OutcomeWindowReported:
    return OutcomeWindowReported(adapter=adapter, outcomes=outcomes)


# ── the live fleet ─────────────────────────────────────────────────────────────


class Fleet:
    """A run being recorded and folded event by event."""

    def __init__(self, config: FleetConfig | None = None, *, run: str = RUN, **overrides: int):
        if config is None:
            config = fleet_config(**overrides)
        elif overrides:
            raise TypeError("give either a config or overrides, not both")
        self.config = config
        self.run = run
        self.records: list[RecordedEvent] = [recorded(1, RunStarted(config=config), run=run)]
        self.view = FleetView.start(self.records[0])
        self.transitions: list[Transition] = []

    # ── reading ────────────────────────────────────────────────────────────

    @property
    def last_seq(self) -> int:
        return self.records[-1].seq

    def shard(self, index: int) -> ShardRecord:
        return self.view.shards[index]

    def state(self, index: int) -> ShardState:
        return self.view.state_of(index)

    def copy_of(self, index: int) -> ShardRecord:
        """A detached copy of one shard's record, to compare with later."""
        return copy.deepcopy(self.view.shards[index])

    # ── writing ────────────────────────────────────────────────────────────

    def apply(self, event: Event) -> list[Transition]:
        rec = recorded(self.last_seq + 1, event, run=self.run)
        self.records.append(rec)
        out = self.view.apply(rec)
        self.transitions += out
        return out

    def _repeat(self, make: type[Event], times: int, **fields: object) -> list[Transition]:
        out: list[Transition] = []
        for _ in range(times):
            out += self.apply(make(**fields))
        return out

    def probe_ok(self, shard: int, times: int = 1) -> list[Transition]:
        """``times`` probe rounds in which only ``shard`` was probed, and answered."""
        return self._repeat(ProbeRound, times, ok=(shard,))

    def probe_failed(
        self, shard: int, times: int = 1, *, kind: str = "timeout", error: str = ""
    ) -> list[Transition]:
        """``times`` probe rounds in which only ``shard`` was probed, and failed."""
        failure = ProbeFailure(shard=shard, kind=kind, error=error)  # type: ignore[arg-type]
        return self._repeat(ProbeRound, times, failed=(failure,))

    def actor_died(
        self, shard: int, error: str = "ActorDiedError: worker exited"
    ) -> list[Transition]:
        return self.apply(ActorDeathConfirmed(shard=shard, error=error))

    def outcomes(self, *entries: ShardOutcomes, adapter: str = "adapter-0") -> list[Transition]:
        return self.apply(window(*entries, adapter=adapter))

    def reported_failure(
        self, shard: int, count: int = 1, *, reason: str = "timeout"
    ) -> list[Transition]:
        return self.outcomes(outcome(shard, infra=count, infra_reason=reason))

    def reported_success(self, shard: int, count: int = 1) -> list[Transition]:
        return self.outcomes(outcome(shard, successes=count))

    def refit_started(self, version: int, shards: Iterable[int] | None = None) -> list[Transition]:
        chosen = tuple(range(self.config.shard_count)) if shards is None else tuple(shards)
        return self.apply(RefitStarted(weight_version=version, shards=chosen))

    def refit_completed(
        self, version: int, shards: Iterable[int] | None = None
    ) -> list[Transition]:
        chosen = tuple(range(self.config.shard_count)) if shards is None else tuple(shards)
        return self.apply(RefitCompleted(weight_version=version, shards=chosen))

    def refit_aborted(
        self, version: int, reason: str = "refit aborted", *, context_lost: bool = False
    ) -> list[Transition]:
        return self.apply(
            RefitAborted(weight_version=version, reason=reason, context_lost=context_lost)
        )

    def weights_partial(self, version: int) -> list[Transition]:
        return self.apply(WeightsMarkedPartial(weight_version=version))

    def restart_requested(self, shard: int) -> list[Transition]:
        return self.apply(RestartRequested(shard=shard))

    def restart_failed(self, shard: int, error: str = "engine failed to start") -> list[Transition]:
        return self.apply(RestartFailed(shard=shard, error=error))

    def replacement_loaded(self, shard: int, base_url: str | None = None) -> list[Transition]:
        return self.apply(ReplacementLoaded(shard=shard, base_url=base_url))

    def condemned(
        self, shard: int, reason: str = "lone suspect of an aborted refit"
    ) -> list[Transition]:
        return self.apply(SilentParticipantCondemned(shard=shard, reason=reason))

    def retired(self, shard: int, reason: str = "operator retired it") -> list[Transition]:
        return self.apply(ShardRetired(shard=shard, reason=reason))

    def stall(self, action: str = "warn") -> list[Transition]:
        return self.apply(
            StallDetected(
                committed_groups=3, train_steps=1, idle_s=601.0, in_flight=0, action=action
            )
        )

    def exhausted(self) -> list[Transition]:
        return self.apply(
            FleetExhausted(
                serving=len(self.view.serving),
                min_healthy_shards=self.config.min_healthy_shards,
                counts=self.view.counts(),
            )
        )

    def run_ended(self, outcome: str = "completed", cause: str = "max steps") -> list[Transition]:
        return self.apply(RunEnded(outcome=outcome, cause=cause))


def every_event_naming(shard: int, shard_count: int) -> list[Event]:
    """One event of every kind, each touching ``shard`` where the kind names a shard."""
    everyone = tuple(range(shard_count))
    return [
        ActorDeathConfirmed(shard=shard, error="ActorDiedError"),
        ProbeRound(ok=(shard,)),
        ProbeRound(failed=(ProbeFailure(shard=shard, kind="timeout"),)),
        ProbeRound(failed=(ProbeFailure(shard=shard, kind="error", error="connection refused"),)),
        ProbeRound(died=(ProbeDeath(shard=shard, error="ActorDiedError"),)),
        window(outcome(shard, successes=4)),
        window(outcome(shard, infra=9)),
        window(outcome(shard, data=9)),
        window(outcome(shard, successes=2, infra=9, data=1)),
        RefitStarted(weight_version=11, shards=everyone),
        RefitAborted(weight_version=11, reason="refit aborted"),
        WeightsMarkedPartial(weight_version=11),
        RefitCompleted(weight_version=12, shards=everyone),
        RestartRequested(shard=shard),
        RestartFailed(shard=shard, error="engine failed to start"),
        ReplacementLoaded(shard=shard, base_url="http://elsewhere.test:9000"),
        ReplacementLoaded(shard=shard),
        SilentParticipantCondemned(shard=shard, reason="lone suspect"),
        ShardRetired(shard=shard, reason="again"),
        StallDetected(committed_groups=1, train_steps=1, idle_s=700.0, in_flight=0, action="warn"),
        CondemnationRefused(suspected=(shard,), reason="two suspects"),
        ProgressReported(committed_groups=4, train_steps=2, in_flight=1),
        FleetExhausted(serving=0, min_healthy_shards=1, counts={"RETIRED": 1}),
    ]


def put_in(fleet: Fleet, shard: int, state: ShardState) -> None:
    """Drive ``shard`` (only it) from HEALTHY into ``state``."""
    if fleet.state(shard) is not ShardState.HEALTHY:
        raise ValueError(f"shard {shard} starts {fleet.state(shard)}, expected HEALTHY")
    if state is ShardState.HEALTHY:
        pass
    elif state is ShardState.SUSPECT:
        fleet.probe_failed(shard)
    elif state is ShardState.DEAD:
        fleet.actor_died(shard)
    elif state is ShardState.RESTARTING:
        fleet.actor_died(shard)
        fleet.restart_requested(shard)
    elif state is ShardState.STALE:
        fleet.actor_died(shard)
        fleet.restart_requested(shard)
        fleet.replacement_loaded(shard)
    elif state is ShardState.RETIRED:
        fleet.retired(shard)
    if fleet.state(shard) is not state:
        raise AssertionError(
            f"could not drive shard {shard} into {state}: it is {fleet.state(shard)}"
        )
