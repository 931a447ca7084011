"""The fleet as the log says it is: a fold of a run's events.

``FleetView`` turns each event into per-shard signals (see ``shard_states``), applies
them, and keeps what the run-level events say (open refit, last abort, stalls,
exhaustion, the end). Two integers, one per set a consumer acts on, so each compares one:

- the membership **epoch** advances once per event that changes the serving set —
  HEALTHY↔SUSPECT and DEAD→RESTARTING→STALE leave it alone — for the router and the
  selector;
- the **absent generation** advances once per event that changes the absent set, and so
  the refit communicator's rank layout — for the transports. They differ where it
  matters: a restarted shard re-admitted (RESTARTING→STALE) leaves the serving set, and
  the epoch, unchanged while the layout grows back; STALE→HEALTHY moves the epoch, not
  the layout.

Within an adapter's outcome window every success is applied before any failure: a
healthy shard with rare blips would otherwise be condemned eventually.

A probe round (``probe_round``) is one event holding every probed shard's result; it
folds one result at a time in shard order at the round's seq, and both numbers move
once per *result* that changes their set. That is how the per-shard probe events of
older ledgers (v1 ``probe_succeeded`` / ``probe_failed``) folded, and the codec reads
each of those as a one-shard round at its own seq, so this file has one way to take a
probe result and the two shapes of the same history fold to the same view (a property
test pins it). ``actor_death_confirmed`` is a death seen outside a probe round; a death
of either kind says whose it was (``what``: the actor, or the engine under a live actor),
which picks the input (``ACTOR_DIED`` / ``ENGINE_DIED``): one transition, two rule texts.

``apply_page`` is the replay's way in: the quiet observations that are most of a long
run (successful probes of HEALTHY shards, one shard's or a whole round's) are taken
there without a handler call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from fleetledger.errors import FleetledgerError
from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    Event,
    FleetConfig,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeRound,
    ProgressReported,
    RecordedColumns,
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
    shard_outside,
)
from fleetledger.projections.decisions import Exhaustion, decide_exhaustion
from fleetledger.projections.rank_layout import RankLayout, rank_layout
from fleetledger.projections.served_weights import ServedWeights
from fleetledger.projections.shard_states import (
    Input,
    ShardRecord,
    ShardState,
    Signal,
    Thresholds,
    Transition,
    all_healthy_probes_ok,
    failure_tally,
    healthy_probe_ok,
    reported_success_quiet,
    shard_list,
    step,
)

# Whose death an event records → the input it is for the shard: the same transition,
# each with its own rule text (an engine's death is never told as its actor's).
_DEATH_INPUT: dict[str, Input] = {"actor": Input.ACTOR_DIED, "engine": Input.ENGINE_DIED}


class ProjectionError(FleetledgerError, ValueError):
    """The events cannot be folded (out of order, wrong run, no run_started)."""


@dataclass(frozen=True, slots=True)
class OpenRefit:
    seq: int
    at_us: int  # when it started: a replay resumed mid-refit still dates it right
    weight_version: int
    shards: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RefitAbort:
    seq: int
    weight_version: int
    reason: str
    context_lost: bool


@dataclass(frozen=True, slots=True)
class Progress:
    seq: int
    committed_groups: int
    train_steps: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class Refusal:
    seq: int
    suspected: tuple[int, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class RunEnd:
    seq: int
    outcome: str
    cause: str


@dataclass
class FleetView:
    run: str
    config: FleetConfig
    shards: list[ShardRecord]
    seq: int = 1
    at_us: int = 0
    epoch: int = 0
    last_serving: frozenset[int] = frozenset()
    absent_generation: int = 0
    last_absent: frozenset[int] = frozenset()
    open_refit: OpenRefit | None = None
    last_refit_seq: int | None = None
    weight_version: int = 0  # the trainer's version at the last completed refit
    last_abort: RefitAbort | None = None
    stalls: int = 0
    last_stall_seq: int | None = None
    progress: Progress | None = None  # the last progress the watchdog reported
    last_refusal: Refusal | None = None
    exhausted_seq: int | None = None
    ended: RunEnd | None = None
    # The trainer's version: the highest a refit_started has pushed (step N pushes N).
    trainer_version: int = 0
    served: ServedWeights = field(default_factory=ServedWeights)  # rollouts by weights
    _thresholds: Thresholds = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.config
        self._thresholds = Thresholds(
            c.unhealthy_threshold, c.healthy_threshold, c.max_restart_attempts_per_shard
        )

    @classmethod
    def start(cls, first: RecordedEvent) -> FleetView:
        started = first.event
        if first.seq != 1 or not isinstance(started, RunStarted):
            raise ProjectionError(
                f"run {first.run!r} seq {first.seq}: a fold starts at seq 1 with run_started, "
                f"got {first.event.type!r}"
            )
        config = started.config
        shards = [
            ShardRecord(i, url, since_at_us=first.at_us) for i, url in enumerate(config.base_urls)
        ]
        return cls(
            run=first.run,
            config=config,
            shards=shards,
            seq=1,
            at_us=first.at_us,
            last_serving=frozenset(range(config.shard_count)),
        )

    # ── read side ───────────────────────────────────────────────────────────

    @property
    def serving(self) -> tuple[int, ...]:
        return tuple(r.index for r in self.shards if r.serving)

    @property
    def absent(self) -> tuple[int, ...]:
        return tuple(r.index for r in self.shards if r.absent)

    @property
    def suspected(self) -> tuple[int, ...]:
        return tuple(r.index for r in self.shards if r.suspected)

    def state_of(self, shard: int) -> ShardState:
        return self.shards[shard].state

    def counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in ShardState}
        for r in self.shards:
            counts[r.state.value] += 1
        return counts

    def exhaustion(self) -> Exhaustion | None:
        """The exhaustion decision's facts when it says exhausted (the rule lives there)."""
        decision = decide_exhaustion(self)
        return decision.exhaustion if decision.exhausted else None

    def layout(self) -> RankLayout:
        """The refit communicator's layout for the current absent set."""
        return self.layout_for(self.absent)

    def layout_for(self, absent: Iterable[int]) -> RankLayout:
        """The layout this fleet's communicator has with ``absent`` shards left out."""
        absent = set(absent)
        return rank_layout(
            survivors=[i for i in range(self.config.shard_count) if i not in absent],
            dp_size=self.config.shard_count,
            total_workers=self.config.total_workers,
            train_world_size=self.config.train_world_size,
        )

    # ── write side ──────────────────────────────────────────────────────────

    def apply(self, recorded: RecordedEvent) -> list[Transition]:
        """Fold one event; returns the state changes it caused, in order."""
        run, seq, at_us, event = recorded
        if run != self.run:
            raise ProjectionError(f"seq {seq} belongs to run {run!r}, not {self.run!r}")
        if seq != self.seq + 1:
            raise ProjectionError(
                f"run {self.run!r}: expected seq {self.seq + 1}, got {seq} "
                "(events must be folded in order, without gaps)"
            )
        handler = _HANDLERS.get(type(event))
        if handler is None:
            raise ProjectionError(f"run {self.run!r} seq {seq}: no fold rule for {event.type!r}")
        # A handler may still refuse the event (a second run_started): the view's
        # position moves only once the event has been folded.
        transitions = handler(self, event, seq, at_us)
        self.seq = seq
        self.at_us = at_us
        if transitions:
            self._note_membership()
        return transitions

    def _note_membership(self) -> None:
        """Move the epoch / absent generation if the serving / absent set changed."""
        serving = frozenset(self.serving)
        if serving != self.last_serving:
            self.last_serving = serving
            self.epoch += 1
        absent = frozenset(self.absent)
        if absent != self.last_absent:
            self.last_absent = absent
            self.absent_generation += 1

    def apply_page(
        self, page: Sequence[RecordedEvent]
    ) -> Iterator[tuple[RecordedEvent, list[Transition], int]]:
        """Fold a page of events; yields every event but the quiet observations, with the
        state changes it caused and the epoch before it.

        A quiet observation is the bulk of a long run: a round of nothing but successful
        probes of HEALTHY shards (a whole fleet's, or one shard's: every ``probe_succeeded``
        row of an older ledger reads as one, and such ledgers hold millions, so that case
        is written out inline). Its row of ``RULES`` is one
        unconditional "stay", so it is taken here without a handler, a Signal or a
        transition list; anything else goes through :meth:`apply`. The view is the same
        either way (a property test pins it); only what it costs differs. The page is
        walked by column (``RecordedColumns``, as a read for a fold decodes it; any other
        page is taken as columns up to where it changes run or skips a seq, and the rest
        goes through :meth:`apply`, which refuses it as it would one by one).
        """
        columns, rest = RecordedColumns.prefix_of(page)
        shards = self.shards
        count = len(shards)
        healthy = ShardState.HEALTHY
        page_run = columns.run
        ours = page_run == self.run
        # The position as of the last event folded; written back before anything else
        # reads it (``apply``, the caller after a yield) and at the end of the page.
        last_seq, last_at = self.seq, self.at_us
        # Run-folding: the quiet round folded last, and how many times it has come again
        # since, unfolded. A log read for a fold hands out one shared event per repeated
        # payload (``EventCodec.decode_contents``), so the same round again is the same
        # object; a quiet round changes no state, so its repeat is quiet too, and a run
        # of them moves nothing but each shard's count and last time: folded once, when
        # the run ends (a week of a healthy fleet is a handful of such runs).
        repeating: ProbeRound | None = None
        repeats, repeat_at = 0, 0
        # A page that does not go on from the view (another run, a gap, a repeat) folds
        # nothing quietly: its first event goes to ``apply``, which refuses it.
        follows = ours and columns.first_seq == last_seq + 1
        try:
            seq = columns.first_seq - 1
            for at_us, event in zip(columns.ats, columns.events, strict=True):
                seq += 1
                if follows:
                    if event is repeating:
                        repeats += 1
                        last_seq, last_at = seq, at_us
                        repeat_at = at_us
                        continue
                    if repeats:
                        self._fold_repeats(repeating, repeats, repeat_at)
                        repeats = 0
                    if type(event) is ProbeRound and not (event.failed or event.died):
                        # A round of successful probes of HEALTHY shards only: the rule
                        # (``shard_states.all_healthy_probes_ok``) inlined — its one
                        # inlined copy, because this loop is most of a replay
                        # (``python bench/bench_fold.py``; figures in bench/README.md).
                        ok = event.ok
                        for shard in ok:
                            if shard >= count or shards[shard].state is not healthy:
                                break
                        else:
                            for shard in ok:
                                r = shards[shard]
                                r.probe_failures = 0
                                r.probe_evidence = ()
                                r.probe_successes += 1
                                r.last_ok_at_us = at_us
                            repeating = event
                            last_seq, last_at = seq, at_us
                            continue
                repeating = None
                self.seq, self.at_us = last_seq, last_at
                epoch = self.epoch
                recorded = RecordedEvent(page_run, seq, at_us, event)
                transitions = self.apply(recorded)
                last_seq, last_at = self.seq, self.at_us
                yield recorded, transitions, epoch
            if repeats:
                self._fold_repeats(repeating, repeats, repeat_at)
                repeats = 0
            if rest:  # another run, or a gap: the rest, whose first event ``apply`` refuses
                self.seq, self.at_us = last_seq, last_at
                yield from self.apply_page(rest)
                last_seq, last_at = self.seq, self.at_us
        finally:  # the position is the last event folded, however the page ends
            if repeats:
                self._fold_repeats(repeating, repeats, repeat_at)
            self.seq, self.at_us = last_seq, last_at

    def _fold_repeats(self, round_: ProbeRound | None, repeats: int, last_at_us: int) -> None:
        """``repeats`` more of the quiet ``round_`` just folded, the last at ``last_at_us``:
        what folding each again would leave (the counts added, the last time moved)."""
        if round_ is None:
            raise ProjectionError(f"run {self.run!r}: repeats of no round to fold")
        for shard in round_.ok:
            r = self.shards[shard]
            r.probe_successes += repeats
            r.last_ok_at_us = last_at_us

    def _check_shards(
        self, seq: int, event: Event, shards: Iterable[int], *, what: str | None = None
    ) -> None:
        """Refuse, before anything changes, an event naming a shard this fleet lacks.

        The log never stores one; a hand-built or imported sequence might. ``what``
        names the event when its type may not be the row's (a lifted v1 row).
        """
        count = len(self.shards)
        for shard in shards:
            problem = shard_outside(shard, count)
            if problem is not None:
                raise ProjectionError(
                    f"run {self.run!r} seq {seq}: {what or event.type}: {problem}"
                )

    def _signal(self, shard: int, signal: Signal) -> list[Transition]:
        problem = shard_outside(shard, len(self.shards))
        if problem is not None:
            raise ProjectionError(f"run {self.run!r} seq {signal.seq}: {signal.input}: {problem}")
        t = step(self.shards[shard], signal, self._thresholds)
        return [] if t is None else [t]

    def _on_run_started(self, e: Event, seq: int, at: int) -> list[Transition]:
        raise ProjectionError(f"run {self.run!r} seq {seq}: the run has already started")

    def _on_actor_death(self, e: ActorDeathConfirmed, seq: int, at: int) -> list[Transition]:
        return self._signal(e.shard, Signal(_DEATH_INPUT[e.what], seq, at, text=e.told))

    def _on_probe_round(self, e: ProbeRound, seq: int, at: int) -> list[Transition]:
        """Each shard's result in shard order, at the round's seq, as its own event had it.

        The epoch and the absent generation move once per result that changes their set,
        as they did when each result was an event: a log written with rounds and one
        written with per-shard events fold to the same membership numbers.
        """
        ok = e.ok
        if not (e.failed or e.died):  # the healthy round: every result a "stay"
            if len(ok) == 1:  # one shard's probe (every v1 row of an older ledger)
                if ok[0] < len(self.shards) and healthy_probe_ok(self.shards[ok[0]], at):
                    return []
            elif all_healthy_probes_ok(self.shards, ok, at):
                return []
        # Worded for either row it may be: a round, or a v1 per-shard probe lifted to one.
        self._check_shards(seq, e, e.shards_named(), what="probe result")
        results: list[tuple[int, Signal | None]] = [(shard, None) for shard in ok]
        for f in e.failed:
            kind = f"deep {f.kind}" if f.deep else f.kind
            text = f"{kind}: {f.told}" if f.told else kind
            results.append((f.shard, Signal(Input.PROBE_FAILED, seq, at, text=text)))
        for d in e.died:
            results.append((d.shard, Signal(_DEATH_INPUT[d.what], seq, at, text=d.told)))
        results.sort(key=lambda result: result[0])
        out: list[Transition] = []
        for shard, signal in results:
            if signal is None:
                if healthy_probe_ok(self.shards[shard], at):
                    continue
                signal = Signal(Input.PROBE_OK, seq, at)
            moved = self._signal(shard, signal)
            if moved:
                out += moved
                self._note_membership()
        return out

    def _on_outcomes(self, e: OutcomeWindowReported, seq: int, at: int) -> list[Transition]:
        self._check_shards(seq, e, e.shards_named())
        self.served.add_window(e.outcomes, self.trainer_version)
        out: list[Transition] = []
        # Successes first, for every shard of the window, then failures.
        shards = self.shards
        for o in e.outcomes:
            if o.successes:
                reported_success_quiet(shards[o.shard])  # a "stay" in every state
        for o in e.outcomes:
            infra = [f for f in o.failures if f.category == "infra"]
            if infra:
                text = "; ".join(failure_tally(f) for f in infra)
                count = sum(f.count for f in infra)
                out += self._signal(
                    o.shard, Signal(Input.REPORTED_FAILURE, seq, at, count=count, text=text)
                )
        return out

    def _on_refit_started(self, e: RefitStarted, seq: int, at: int) -> list[Transition]:
        self._check_shards(seq, e, e.shards)
        self.open_refit = OpenRefit(seq, at, e.weight_version, e.shards)
        self.trainer_version = max(self.trainer_version, e.weight_version)
        return []

    def _on_refit_completed(self, e: RefitCompleted, seq: int, at: int) -> list[Transition]:
        self._check_shards(seq, e, e.shards)
        self.open_refit = None
        self.last_refit_seq = seq
        self.weight_version = max(self.weight_version, e.weight_version)
        out: list[Transition] = []
        for shard in e.shards:
            out += self._signal(
                shard, Signal(Input.REFIT_COMPLETED, seq, at, weight_version=e.weight_version)
            )
        return out

    def _on_refit_aborted(self, e: RefitAborted, seq: int, at: int) -> list[Transition]:
        self.open_refit = None
        self.last_abort = RefitAbort(seq, e.weight_version, e.reason, e.context_lost)
        return []

    def _on_partial(self, e: WeightsMarkedPartial, seq: int, at: int) -> list[Transition]:
        """Every shard not absent (absent ones ignore it), or only the shards it names:
        one whose load cannot have begun keeps its state, its traffic and the epoch."""
        if e.shards is None:
            marked: Iterable[int] = range(len(self.shards))
            text = ""
        else:
            self._check_shards(seq, e, e.shards)
            marked, text = e.shards, f"marked: {shard_list(e.shards)}"
        out: list[Transition] = []
        for shard in marked:
            out += self._signal(
                shard,
                Signal(Input.WEIGHTS_PARTIAL, seq, at, text=text, weight_version=e.weight_version),
            )
        return out

    def _on_restart_requested(self, e: RestartRequested, seq: int, at: int) -> list[Transition]:
        return self._signal(e.shard, Signal(Input.RESTART_REQUESTED, seq, at))

    def _on_restart_failed(self, e: RestartFailed, seq: int, at: int) -> list[Transition]:
        return self._signal(e.shard, Signal(Input.RESTART_FAILED, seq, at, text=e.told))

    def _on_loaded(self, e: ReplacementLoaded, seq: int, at: int) -> list[Transition]:
        return self._signal(
            e.shard, Signal(Input.REPLACEMENT_LOADED, seq, at, text=e.base_url or "")
        )

    def _on_condemned(self, e: SilentParticipantCondemned, seq: int, at: int) -> list[Transition]:
        return self._signal(e.shard, Signal(Input.CONDEMNED, seq, at, text=e.reason))

    def _on_retired(self, e: ShardRetired, seq: int, at: int) -> list[Transition]:
        return self._signal(e.shard, Signal(Input.RETIRE, seq, at, text=e.reason))

    def _on_refused(self, e: CondemnationRefused, seq: int, at: int) -> list[Transition]:
        self._check_shards(seq, e, e.suspected)
        self.last_refusal = Refusal(seq, e.suspected, e.reason)
        return []

    def _on_progress(self, e: ProgressReported, seq: int, at: int) -> list[Transition]:
        self.progress = Progress(seq, e.committed_groups, e.train_steps, e.in_flight)
        return []

    def _on_stall(self, e: StallDetected, seq: int, at: int) -> list[Transition]:
        self.stalls += 1
        self.last_stall_seq = seq
        return []

    def _on_exhausted(self, e: FleetExhausted, seq: int, at: int) -> list[Transition]:
        self.exhausted_seq = seq
        return []

    def _on_run_ended(self, e: RunEnded, seq: int, at: int) -> list[Transition]:
        self.ended = RunEnd(seq, e.outcome, e.cause)
        return []


_HANDLERS: dict[type[Event], Callable[[FleetView, Event, int, int], list[Transition]]] = {
    RunStarted: FleetView._on_run_started,
    ActorDeathConfirmed: FleetView._on_actor_death,
    ProbeRound: FleetView._on_probe_round,
    OutcomeWindowReported: FleetView._on_outcomes,
    RefitStarted: FleetView._on_refit_started,
    RefitCompleted: FleetView._on_refit_completed,
    RefitAborted: FleetView._on_refit_aborted,
    WeightsMarkedPartial: FleetView._on_partial,
    RestartRequested: FleetView._on_restart_requested,
    RestartFailed: FleetView._on_restart_failed,
    ReplacementLoaded: FleetView._on_loaded,
    SilentParticipantCondemned: FleetView._on_condemned,
    ShardRetired: FleetView._on_retired,
    CondemnationRefused: FleetView._on_refused,
    ProgressReported: FleetView._on_progress,
    StallDetected: FleetView._on_stall,
    FleetExhausted: FleetView._on_exhausted,
    RunEnded: FleetView._on_run_ended,
}  # type: ignore[dict-item]


def fold_with_transitions(
    events: Iterable[RecordedEvent], into: FleetView | None = None
) -> tuple[FleetView, list[Transition]]:
    """Fold ``events`` (from seq 1, or onto ``into``); also returns every state change."""
    view = into
    transitions: list[Transition] = []
    for recorded in events:
        if view is None:
            view = FleetView.start(recorded)
        else:
            transitions += view.apply(recorded)
    if view is None:
        raise ProjectionError("nothing to fold: a run needs at least its run_started event")
    return view, transitions


def fold(events: Iterable[RecordedEvent], into: FleetView | None = None) -> FleetView:
    return fold_with_transitions(events, into)[0]


def fold_pages(
    pages: Iterable[Sequence[RecordedEvent]], into: FleetView | None = None
) -> FleetView:
    """``fold`` of pages of events (as the log reads them), through the quiet fast path."""
    view = into
    for page in pages:
        if not page:
            continue
        if view is None:
            view = FleetView.start(page[0])
            page = page[1:]
        for _ in view.apply_page(page):
            pass
    if view is None:
        raise ProjectionError("nothing to fold: a run needs at least its run_started event")
    return view
