"""A run's history as a sequence of entries: what `replay` prints and `timeline` draws.

``History`` folds events through a ``FleetView`` and turns what changed into entries:
every shard transition (with its rule and evidence), every membership epoch change
(with the serving and absent sets and the rank layout the transports would build),
every refit (start to end, participants, outcome), restarts, decisions, stalls and the
end of the run. Probe results and adapter windows produce entries only through the
transitions they cause: a million healthy probes are not history.

Pure, like every projection: the same events give the same entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields
from typing import Any, Literal

from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeFailed,
    ProbeSucceeded,
    ProgressReported,
    RecordedEvent,
    RefitAborted,
    RefitCompleted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RunEnded,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
    datetime_from_us,
)
from fleetledger.projections.fleet_view import FleetView, OpenRefit
from fleetledger.projections.rank_layout import RankLayoutError
from fleetledger.projections.shard_states import Transition


def _iso(at_us: int) -> str:
    return datetime_from_us(at_us).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class Entry:
    """Base of every history entry: where in the run it happened."""

    seq: int
    at_us: int

    @property
    def kind(self) -> str:
        raise NotImplementedError

    @property
    def shards(self) -> tuple[int, ...]:
        """The shards this entry is about (for ``--shard`` filters)."""
        return ()

    def as_dict(self) -> dict[str, Any]:
        # Fields hold numbers, strings, tuples and at most a flat dict: a shallow copy
        # equals ``dataclasses.asdict`` and costs a tenth of its recursive deep copy.
        out: dict[str, Any] = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = dict(value) if isinstance(value, dict) else value
        out["at"] = _iso(self.at_us)
        return out


@dataclass(frozen=True, slots=True)
class TransitionEntry(Entry):
    shard: int
    before: str
    after: str
    input: str
    rule: str
    evidence: tuple[int, ...]

    @property
    def kind(self) -> str:
        return "transition"

    @property
    def shards(self) -> tuple[int, ...]:
        return (self.shard,)

    @classmethod
    def of(cls, t: Transition) -> TransitionEntry:
        return cls(
            t.seq,
            t.at_us,
            t.shard,
            t.before.value,
            t.after.value,
            t.input.value,
            t.rule,
            t.evidence,
        )


@dataclass(frozen=True, slots=True)
class EpochEntry(Entry):
    epoch: int
    serving: tuple[int, ...]
    absent: tuple[int, ...]
    world_size: int | None
    shard_prefixes: dict[int, int] | None
    layout_error: str | None

    @property
    def kind(self) -> str:
        return "epoch"

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(sorted({*self.serving, *self.absent}))


@dataclass(frozen=True, slots=True)
class RefitEntry(Entry):
    """One refit, entered when it ends (``seq``); ``outcome`` "open" if it never did."""

    started_seq: int
    started_at_us: int
    weight_version: int
    participants: tuple[int, ...]
    outcome: Literal["completed", "aborted", "open"]
    reason: str
    context_lost: bool

    @property
    def kind(self) -> str:
        return "refit"

    @property
    def shards(self) -> tuple[int, ...]:
        return self.participants

    @property
    def duration_us(self) -> int:
        return self.at_us - self.started_at_us

    def as_dict(self) -> dict[str, Any]:
        out = Entry.as_dict(self)
        out["started_at"] = _iso(self.started_at_us)
        out["duration_s"] = self.duration_us / 1e6
        return out


@dataclass(frozen=True, slots=True)
class RestartEntry(Entry):
    shard: int
    action: Literal["requested", "failed", "loaded"]
    detail: str

    @property
    def kind(self) -> str:
        return "restart"

    @property
    def shards(self) -> tuple[int, ...]:
        return (self.shard,)


@dataclass(frozen=True, slots=True)
class DecisionEntry(Entry):
    decision: Literal[
        "weights_partial", "condemned", "retired", "condemnation_refused", "fleet_exhausted"
    ]
    subjects: tuple[int, ...]
    detail: str

    @property
    def kind(self) -> str:
        return "decision"

    @property
    def shards(self) -> tuple[int, ...]:
        return self.subjects


@dataclass(frozen=True, slots=True)
class StallEntry(Entry):
    committed_groups: int
    train_steps: int
    idle_s: float
    in_flight: int
    action: str

    @property
    def kind(self) -> str:
        return "stall"


@dataclass(frozen=True, slots=True)
class EndEntry(Entry):
    outcome: str
    cause: str

    @property
    def kind(self) -> str:
        return "end"


# Events that are facts observed about shards, never decisions or refit boundaries: the
# general path of ``History.feed`` has no entry of their own for any of them.
_OBSERVATIONS: frozenset[type] = frozenset(
    {ProbeSucceeded, ProbeFailed, ActorDeathConfirmed, OutcomeWindowReported, ProgressReported}
)


def _epoch_entry(view: FleetView) -> EpochEntry:
    try:
        layout = view.layout()
        world, prefixes, error = layout.world_size, dict(layout.shard_prefixes), None
    except RankLayoutError as exc:
        world, prefixes, error = None, None, str(exc)
    return EpochEntry(
        view.seq, view.at_us, view.epoch, view.serving, view.absent, world, prefixes, error
    )


class History:
    """Feeds events to a view and says, per event, what belongs in the run's history."""

    def __init__(self, view: FleetView) -> None:
        self.view = view
        # The refit in progress as of the view's seq (restored from the view on resume).
        self._refit: OpenRefit | None = view.open_refit

    @classmethod
    def start(cls, first: RecordedEvent) -> tuple[History, list[Entry]]:
        """Begin at seq 1; the first entry is the starting membership (epoch 0)."""
        history = cls(FleetView.start(first))
        return history, [_epoch_entry(history.view)]

    def feed(self, recorded: RecordedEvent) -> list[Entry]:
        view = self.view
        epoch = view.epoch
        if type(recorded.event) in _OBSERVATIONS:
            # Fast path for the bulk of a run (a replay of a million events spends more
            # in the checks below than in the fold): an observation has no entry of its
            # own and opens or closes no refit, so its entries are its transitions and
            # the epoch change they may cause — exactly what the general path gives it.
            transitions = view.apply(recorded)
            if not transitions:
                return []
            observed: list[Entry] = [TransitionEntry.of(t) for t in transitions]
            if view.epoch != epoch:
                observed.append(_epoch_entry(view))
            return observed
        open_before = view.open_refit
        transitions = view.apply(recorded)
        seq, at = recorded.seq, recorded.at_us
        e = recorded.event
        entries: list[Entry] = []
        # Decisions and lifecycle first: they are the cause of the transitions below.
        if isinstance(e, RestartRequested):
            entries.append(RestartEntry(seq, at, e.shard, "requested", ""))
        elif isinstance(e, RestartFailed):
            entries.append(RestartEntry(seq, at, e.shard, "failed", e.error))
        elif isinstance(e, ReplacementLoaded):
            entries.append(RestartEntry(seq, at, e.shard, "loaded", e.base_url or ""))
        elif isinstance(e, WeightsMarkedPartial):
            subjects = tuple(t.shard for t in transitions)
            detail = f"refit at weight version {e.weight_version} aborted"
            entries.append(DecisionEntry(seq, at, "weights_partial", subjects, detail))
        elif isinstance(e, SilentParticipantCondemned):
            entries.append(DecisionEntry(seq, at, "condemned", (e.shard,), e.reason))
        elif isinstance(e, ShardRetired):
            entries.append(DecisionEntry(seq, at, "retired", (e.shard,), e.reason))
        elif isinstance(e, CondemnationRefused):
            entries.append(DecisionEntry(seq, at, "condemnation_refused", e.suspected, e.reason))
        elif isinstance(e, FleetExhausted):
            counts = ", ".join(f"{k} {v}" for k, v in e.counts.items() if v)
            detail = f"{e.serving} serving < min_healthy_shards {e.min_healthy_shards} ({counts})"
            entries.append(DecisionEntry(seq, at, "fleet_exhausted", (), detail))
        elif isinstance(e, StallDetected):
            entries.append(
                StallEntry(
                    seq, at, e.committed_groups, e.train_steps, e.idle_s, e.in_flight, e.action
                )
            )
        entries += [TransitionEntry.of(t) for t in transitions]
        if view.open_refit is not None and view.open_refit is not open_before:
            self._refit = view.open_refit
        elif isinstance(e, RefitCompleted | RefitAborted):
            entries.append(self._close_refit(e, seq, at))
        if view.epoch != epoch:
            entries.append(_epoch_entry(view))
        if isinstance(e, RunEnded):
            entries += self.finish()
            entries.append(EndEntry(seq, at, e.outcome, e.cause))
        return entries

    def _close_refit(self, e: RefitCompleted | RefitAborted, seq: int, at: int) -> RefitEntry:
        opened = self._refit
        self._refit = None
        if isinstance(e, RefitCompleted):
            participants = e.shards
            outcome: Literal["completed", "aborted"] = "completed"
            reason, lost = "", False
        else:
            participants = opened.shards if opened else ()
            outcome, reason, lost = "aborted", e.reason, e.context_lost
        # A completion without a recorded start (a promotion after recovery) lasts 0 s.
        started_seq, started_at = (opened.seq, opened.at_us) if opened else (seq, at)
        return RefitEntry(
            seq,
            at,
            started_seq,
            started_at,
            e.weight_version,
            participants,
            outcome,
            reason,
            lost,
        )

    def finish(self) -> list[Entry]:
        """Entries for what was still in progress where the events stop (an open refit)."""
        if self._refit is None:
            return []
        opened = self._refit
        self._refit = None
        return [
            RefitEntry(
                self.view.seq,
                self.view.at_us,
                opened.seq,
                opened.at_us,
                opened.weight_version,
                opened.shards,
                "open",
                "no completion or abort was recorded",
                False,
            )
        ]


def replay(events: Iterable[RecordedEvent], into: FleetView | None = None) -> Iterator[Entry]:
    """Every history entry of ``events`` (from seq 1, or onto a view at some seq)."""
    history: History | None = None if into is None else History(into)
    for recorded in events:
        if history is None:
            history, entries = History.start(recorded)
            yield from entries
        else:
            yield from history.feed(recorded)
    if history is not None and history.view.ended is None:
        yield from history.finish()
