"""A run's history as a sequence of entries: what ``replay`` prints and ``timeline`` draws.

``History`` folds events through a ``FleetView`` and turns what changed into entries:
every shard transition (with its rule and evidence), every membership epoch change
(with the serving and absent sets and the rank layout the transports would build),
every refit (start to end, participants, outcome), restarts, decisions, stalls and the
end of the run.

Rules of this file:

- What an event adds to the history is data: ``ENTRY_BUILDERS`` maps every event type
  to the method that builds its entries, and a test holds it to the event vocabulary
  (no type missing, none extra). Observations — probe rounds, adapter windows, actor
  deaths, progress, ``run_started`` — map to ``_no_entry_of_its_own``: they enter the history
  only through the transitions they cause, so a million healthy probes are not history.
- Entries of one event come in causal order: the event's own entry (a restart, a
  decision, a stall) first, then the transitions it caused, then what closes (a refit,
  the run), and last the epoch change the transitions add up to.
- Entries hold the fold's own types (``ShardState``, ``Input``), not their names; their
  JSON form is ``json_form``'s, with ``kind`` and the ISO times declared as derived keys.
- Pure, like every projection: the same events give the same entries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    Event,
    FleetExhausted,
    OutcomeWindowReported,
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
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
    iso_at,
)
from fleetledger.projections.fleet_view import FleetView, OpenRefit, ProjectionError
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.rank_layout import RankLayoutError
from fleetledger.projections.shard_states import Input, ShardState, Transition, shard_list

Observer = Callable[[RecordedEvent, list[Transition], FleetView], object]
"""Told each event that is not a quiet observation: its transitions, the view after it."""


@dataclass(frozen=True, slots=True)
class Entry(JsonForm):
    """Base of every history entry: where in the run it happened."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("kind", "at")
    kind: ClassVar[str]  # what ``--json`` calls this type of entry

    seq: int
    at_us: int

    @property
    def at(self) -> str:
        return iso_at(self.at_us)

    @property
    def shards(self) -> tuple[int, ...]:
        """The shards this entry is about (for ``--shard`` filters)."""
        return ()


@dataclass(frozen=True, slots=True)
class TransitionEntry(Entry):
    kind: ClassVar[str] = "transition"

    shard: int
    before: ShardState
    after: ShardState
    input: Input
    rule: str
    evidence: tuple[int, ...]
    cause: str = ""  # the death or failure cause the rule quotes ("" when it quotes none)

    @property
    def shards(self) -> tuple[int, ...]:
        return (self.shard,)

    @classmethod
    def of(cls, t: Transition) -> TransitionEntry:
        return cls(t.seq, t.at_us, t.shard, t.before, t.after, t.input, t.rule, t.evidence, t.cause)


@dataclass(frozen=True, slots=True)
class EpochEntry(Entry):
    """The membership and its rank layout, whenever the serving set (the epoch) or the
    absent set (the layout) changed. ``epoch_moved`` False: only the absent set did — a
    replacement loaded (RESTARTING → STALE) rejoins the layout before it serves."""

    kind: ClassVar[str] = "epoch"

    epoch: int
    serving: tuple[int, ...]
    absent: tuple[int, ...]
    world_size: int | None
    shard_prefixes: dict[int, int] | None
    layout_error: str | None
    epoch_moved: bool = True

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(sorted({*self.serving, *self.absent}))


@dataclass(frozen=True, slots=True)
class RefitEntry(Entry):
    """One refit, entered when it ends (``seq``); ``outcome`` "open" if it never did."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = (*Entry.JSON_DERIVED, "started_at", "duration_s")
    kind: ClassVar[str] = "refit"

    started_seq: int
    started_at_us: int
    weight_version: int
    participants: tuple[int, ...]
    outcome: Literal["completed", "aborted", "open"]
    reason: str
    context_lost: bool

    @property
    def shards(self) -> tuple[int, ...]:
        return self.participants

    @property
    def started_at(self) -> str:
        return iso_at(self.started_at_us)

    @property
    def duration_us(self) -> int:
        return self.at_us - self.started_at_us

    @property
    def duration_s(self) -> float:
        return self.duration_us / 1e6


@dataclass(frozen=True, slots=True)
class RestartEntry(Entry):
    kind: ClassVar[str] = "restart"

    shard: int
    action: Literal["requested", "failed", "loaded"]
    detail: str

    @property
    def shards(self) -> tuple[int, ...]:
        return (self.shard,)


@dataclass(frozen=True, slots=True)
class DecisionEntry(Entry):
    kind: ClassVar[str] = "decision"

    decision: Literal[
        "weights_partial", "condemned", "retired", "condemnation_refused", "fleet_exhausted"
    ]
    subjects: tuple[int, ...]
    detail: str

    @property
    def shards(self) -> tuple[int, ...]:
        return self.subjects


@dataclass(frozen=True, slots=True)
class StallEntry(Entry):
    kind: ClassVar[str] = "stall"

    committed_groups: int
    train_steps: int
    idle_s: float
    in_flight: int
    action: str


@dataclass(frozen=True, slots=True)
class EndEntry(Entry):
    kind: ClassVar[str] = "end"

    outcome: str
    cause: str


# Every type of entry a history holds (what ``replay`` must have words for).
ENTRY_TYPES: tuple[type[Entry], ...] = (
    TransitionEntry,
    EpochEntry,
    RefitEntry,
    RestartEntry,
    DecisionEntry,
    StallEntry,
    EndEntry,
)


def _epoch_entry(view: FleetView, *, epoch_moved: bool = True) -> EpochEntry:
    try:
        layout = view.layout()
        world, prefixes, error = layout.world_size, dict(layout.shard_prefixes), None
    except RankLayoutError as exc:
        world, prefixes, error = None, None, str(exc)
    return EpochEntry(
        view.seq,
        view.at_us,
        view.epoch,
        view.serving,
        view.absent,
        world,
        prefixes,
        error,
        epoch_moved,
    )


class History:
    """Feeds events to a view and says, per event, what belongs in the run's history."""

    def __init__(self, view: FleetView, observer: Observer | None = None) -> None:
        """``observer``: also told every event that is not a quiet observation, with the
        transitions it caused and the view right after it (``FaultCosts.observe``)."""
        self.view = view
        self._observer = observer
        # The refit in progress as of the view's seq (restored from the view on resume).
        self._refit: OpenRefit | None = view.open_refit
        self._absent = view.absent  # as the last membership entry showed it

    @classmethod
    def start(
        cls, first: RecordedEvent, observer: Observer | None = None
    ) -> tuple[History, list[Entry]]:
        """Begin at seq 1; the first entry is the starting membership (epoch 0)."""
        history = cls(FleetView.start(first), observer)
        return history, [_epoch_entry(history.view)]

    def feed(self, recorded: RecordedEvent) -> list[Entry]:
        view = self.view
        epoch = view.epoch
        event = recorded.event
        build = ENTRY_BUILDERS.get(type(event))
        if build is None:
            raise ProjectionError(
                f"run {view.run!r} seq {recorded.seq}: no history rule for {event.type!r}"
            )
        transitions = view.apply(recorded)
        if self._observer is not None:
            self._observer(recorded, transitions, view)
        if not transitions and build is _OBSERVED:
            # Fast path for the bulk of a run (a replay of a million events spends more
            # building entries than folding): an observation that moved no shard has no
            # entry, and without a transition the epoch cannot have moved either.
            return []
        entries = build(
            self, event, recorded.seq, recorded.at_us, [TransitionEntry.of(t) for t in transitions]
        )
        entries += self._membership_moved(epoch)
        return entries

    def _membership_moved(self, epoch_before: int) -> list[Entry]:
        """The membership entry, when an event that moved a shard changed the serving
        set or the absent set (the layout the next refit builds)."""
        view = self.view
        moved = view.epoch != epoch_before
        if not moved and view.absent == self._absent:
            return []
        self._absent = view.absent
        return [_epoch_entry(view, epoch_moved=moved)]

    def feed_page(self, page: Sequence[RecordedEvent]) -> list[Entry]:
        """``feed`` of every event of ``page``, in order: the entries they add.

        The view's quiet observations (``FleetView.apply_page``) add nothing, as ``feed``
        would say of them; every other event is built exactly as ``feed`` builds it.
        """
        view = self.view
        out: list[Entry] = []
        observer = self._observer
        for recorded, transitions, epoch in view.apply_page(page):
            if observer is not None:
                observer(recorded, transitions, view)
            event = recorded.event
            build = ENTRY_BUILDERS.get(type(event))
            if build is None:
                raise ProjectionError(
                    f"run {view.run!r} seq {recorded.seq}: no history rule for {event.type!r}"
                )
            if not transitions and build is _OBSERVED:
                continue
            entries = build(
                self,
                event,
                recorded.seq,
                recorded.at_us,
                [TransitionEntry.of(t) for t in transitions],
            )
            entries += self._membership_moved(epoch)
            out += entries
        return out

    # ── what each event adds: (event, seq, at, its transitions) → its entries ──────

    def _no_entry_of_its_own(
        self, e: Event, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [*moved]

    def _on_restart_requested(
        self, e: RestartRequested, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [RestartEntry(seq, at, e.shard, "requested", ""), *moved]

    def _on_restart_failed(
        self, e: RestartFailed, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [RestartEntry(seq, at, e.shard, "failed", e.told), *moved]

    def _on_loaded(
        self, e: ReplacementLoaded, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [RestartEntry(seq, at, e.shard, "loaded", e.base_url or ""), *moved]

    def _on_partial(
        self, e: WeightsMarkedPartial, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        subjects = tuple(t.shard for t in moved)
        detail = f"refit at weight version {e.weight_version} aborted"
        if e.shards is not None:  # only these may have begun to load (older rows: all)
            detail += f"; marked: {shard_list(e.shards)}"
        return [DecisionEntry(seq, at, "weights_partial", subjects, detail), *moved]

    def _on_condemned(
        self, e: SilentParticipantCondemned, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [DecisionEntry(seq, at, "condemned", (e.shard,), e.reason), *moved]

    def _on_retired(
        self, e: ShardRetired, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [DecisionEntry(seq, at, "retired", (e.shard,), e.reason), *moved]

    def _on_refused(
        self, e: CondemnationRefused, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [DecisionEntry(seq, at, "condemnation_refused", e.suspected, e.reason), *moved]

    def _on_exhausted(
        self, e: FleetExhausted, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        counts = ", ".join(f"{k} {v}" for k, v in e.counts.items() if v)
        detail = f"{e.serving} serving < min_healthy_shards {e.min_healthy_shards} ({counts})"
        return [DecisionEntry(seq, at, "fleet_exhausted", (), detail), *moved]

    def _on_stall(
        self, e: StallDetected, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        stall = StallEntry(
            seq, at, e.committed_groups, e.train_steps, e.idle_s, e.in_flight, e.action
        )
        return [stall, *moved]

    def _on_refit_started(
        self, e: RefitStarted, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        # Remembered here, not read back from the view at the end: the view forgets the
        # refit when it closes, and its entry needs the start.
        self._refit = self.view.open_refit
        return [*moved]

    def _on_refit_closed(
        self,
        e: RefitCompleted | RefitAborted,
        seq: int,
        at: int,
        moved: Sequence[TransitionEntry],
    ) -> list[Entry]:
        return [*moved, self._close_refit(e, seq, at)]

    def _on_run_ended(
        self, e: RunEnded, seq: int, at: int, moved: Sequence[TransitionEntry]
    ) -> list[Entry]:
        return [*moved, *self.finish(), EndEntry(seq, at, e.outcome, e.cause)]

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


EntryBuilder = Callable[[History, Any, int, int, Sequence[TransitionEntry]], list[Entry]]

_OBSERVED: EntryBuilder = History._no_entry_of_its_own

# Event type → the method that says what the event adds to the history.
ENTRY_BUILDERS: dict[type[Event], EntryBuilder] = {
    RunStarted: _OBSERVED,  # the fold refuses a second one; the first is ``History.start``
    ActorDeathConfirmed: _OBSERVED,
    ProbeRound: _OBSERVED,
    OutcomeWindowReported: _OBSERVED,
    ProgressReported: _OBSERVED,
    RefitStarted: History._on_refit_started,
    RefitCompleted: History._on_refit_closed,
    RefitAborted: History._on_refit_closed,
    WeightsMarkedPartial: History._on_partial,
    RestartRequested: History._on_restart_requested,
    RestartFailed: History._on_restart_failed,
    ReplacementLoaded: History._on_loaded,
    SilentParticipantCondemned: History._on_condemned,
    ShardRetired: History._on_retired,
    CondemnationRefused: History._on_refused,
    StallDetected: History._on_stall,
    FleetExhausted: History._on_exhausted,
    RunEnded: History._on_run_ended,
}


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
