"""A run as per-shard state intervals: what ``fleetledger timeline`` draws, as data.

``timeline`` draws one lane per shard, coloured by state over time, with the run's
refits, epoch changes, decisions and end on top. This module turns the run's history
entries (:mod:`fleetledger.projections.history`) into that picture's data, so the
renderers in the CLI only place shapes and never fold anything themselves: the picture
says what ``replay`` says, because both read the same entries.

Rules of this module:

- An interval is a maximal run of seqs during which a shard kept one state, as a fold
  would report it *after* each event: ``state`` holds for ``start_seq <= seq <
  end_seq``. When one event moves a shard twice (an outcome window's success, then its
  failure), only where the shard ended up counts — the fold never shows the middle
  state, so neither does the picture.
- A shard's intervals cover the run without gaps: the first starts at seq 1, each ends
  where the next starts, the last ends one past the run's last seq. Times follow the
  seqs (``end_us`` of the last interval is the time of the last event).
- Pure, like every projection: no I/O, no clock. The same events give the same lanes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fleetledger.events.models import FleetConfig, RecordedEvent, shard_outside
from fleetledger.projections.fleet_view import ProjectionError
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    EpochEntry,
    History,
    RefitEntry,
    StallEntry,
    TransitionEntry,
)
from fleetledger.projections.shard_states import ShardState

INITIAL_STATE = ShardState.HEALTHY  # FleetView.start: every shard begins HEALTHY
# Where a stopped run's states are summed up, the absent and failing shards come first.
STATE_ORDER: tuple[ShardState, ...] = (
    ShardState.DEAD,
    ShardState.RESTARTING,
    ShardState.RETIRED,
    ShardState.SUSPECT,
    ShardState.STALE,
    ShardState.HEALTHY,
)


def _ranges(shards: Sequence[int]) -> str:
    """Sorted shard indices as ranges: [0, 1, 2, 5, 7, 8] -> '0–2, 5, 7–8'."""
    parts: list[str] = []
    start = prev = shards[0]
    for shard in [*shards[1:], None]:
        if shard is not None and shard == prev + 1:
            prev = shard
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        if shard is not None:
            start = prev = shard
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Interval:
    """One shard in one state, from the event that put it there to the next change."""

    shard: int
    state: ShardState
    start_seq: int
    end_seq: int  # exclusive: the seq of the next change, or the run's last seq + 1
    start_us: int
    end_us: int
    rule: str  # why the shard entered this state (the transition's rule)

    def covers(self, seq: int) -> bool:
        return self.start_seq <= seq < self.end_seq


@dataclass(frozen=True, slots=True)
class Lanes:
    """Everything the timeline draws for one run."""

    run: str
    config: FleetConfig
    first_us: int
    last_seq: int
    last_us: int
    lanes: tuple[tuple[Interval, ...], ...]  # one tuple of intervals per shard, in order
    refits: tuple[RefitEntry, ...]
    epochs: tuple[EpochEntry, ...]  # the epoch-0 entry at seq 1 first
    decisions: tuple[DecisionEntry, ...]
    stalls: tuple[StallEntry, ...]
    end: EndEntry | None

    @property
    def shard_count(self) -> int:
        return len(self.lanes)

    def state_at(self, shard: int, seq: int) -> ShardState:
        """The shard's state after event ``seq`` (1 ≤ seq ≤ last_seq)."""
        for interval in self.lanes[shard]:
            if interval.covers(seq):
                return interval.state
        raise ValueError(f"seq {seq} is outside run {self.run!r} (seqs 1..{self.last_seq})")

    def final_states(self) -> tuple[ShardState, ...]:
        return tuple(lane[-1].state for lane in self.lanes)

    def describe_states(self) -> str:
        """The final states, grouped, the worst first: 'shard 17 DEAD · shards 0–16 HEALTHY'.

        Grouped because a 64-shard fleet listed shard by shard hides its one dead shard.
        """
        by_state: dict[ShardState, list[int]] = {}
        for shard, state in enumerate(self.final_states()):
            by_state.setdefault(state, []).append(shard)
        groups = []
        for state in STATE_ORDER:
            shards = by_state.get(state)
            if shards:
                noun = "shard" if len(shards) == 1 else "shards"
                groups.append(f"{noun} {_ranges(shards)} {state}")
        return " · ".join(groups)

    def end_label(self) -> str:
        """How the run ended, in one line: its recorded cause, else where it stopped.

        A run that never recorded ``run_ended`` (a crash, a wedge, a run still going)
        is labelled with the last state the log shows, because that is all a reader of
        the morning after has.
        """
        if self.end is not None:
            return f"run {self.end.outcome} at seq {self.end.seq}: {self.end.cause}"
        label = f"no run_ended recorded; last event seq {self.last_seq}: {self.describe_states()}"
        open_refits = [r for r in self.refits if r.outcome == "open"]
        if open_refits:
            r = open_refits[-1]
            label += f"; refit to v{r.weight_version} open since seq {r.started_seq}"
        return label


class _LaneBuilder:
    """Intervals of one shard, closed as changes arrive (one change per seq at most)."""

    def __init__(self, shard: int, first_us: int) -> None:
        self.shard = shard
        self.closed: list[Interval] = []
        self.state: ShardState = INITIAL_STATE
        self.start_seq = 1
        self.start_us = first_us
        self.rule = "run started"

    def change(self, entry: TransitionEntry) -> None:
        if entry.seq < self.start_seq:
            raise ProjectionError(
                f"shard {self.shard}: transition at seq {entry.seq} arrives after one at seq "
                f"{self.start_seq}; history entries must be in seq order"
            )
        if entry.seq == self.start_seq:
            # A second move within the same event: the fold shows only where it ended,
            # and if that is where the shard was before the event, nothing changed.
            self.state, self.rule = entry.after, entry.rule
            if self.closed and self.closed[-1].state == self.state:
                previous = self.closed.pop()
                self.start_seq, self.start_us = previous.start_seq, previous.start_us
                self.rule = previous.rule
            return
        if entry.after == self.state:
            return
        self.closed.append(
            Interval(
                self.shard,
                self.state,
                self.start_seq,
                entry.seq,
                self.start_us,
                entry.at_us,
                self.rule,
            )
        )
        self.state, self.rule = entry.after, entry.rule
        self.start_seq, self.start_us = entry.seq, entry.at_us

    def finish(self, last_seq: int, last_us: int) -> tuple[Interval, ...]:
        last = Interval(
            self.shard, self.state, self.start_seq, last_seq + 1, self.start_us, last_us, self.rule
        )
        return (*self.closed, last)


def build_lanes(
    run: str, config: FleetConfig, entries: Sequence[Entry], *, last_seq: int, last_us: int
) -> Lanes:
    """Lanes from a whole run's history entries (seq 1 to ``last_seq``, in order).

    ``last_seq``/``last_us`` say where the events stop: most events (probes, windows that
    change nothing) leave no entry, so the entries alone cannot say how long the final
    states lasted.
    """
    if not entries or not isinstance(entries[0], EpochEntry) or entries[0].seq != 1:
        raise ProjectionError(
            f"run {run!r}: lanes are drawn from a whole history, which begins with the "
            "epoch-0 entry at seq 1"
        )
    first_us = entries[0].at_us
    builders = [_LaneBuilder(i, first_us) for i in range(config.shard_count)]
    refits: list[RefitEntry] = []
    epochs: list[EpochEntry] = []
    decisions: list[DecisionEntry] = []
    stalls: list[StallEntry] = []
    end: EndEntry | None = None
    for entry in entries:
        if entry.seq > last_seq:
            raise ProjectionError(
                f"run {run!r}: a history entry at seq {entry.seq} is past the last seq {last_seq}"
            )
        if isinstance(entry, TransitionEntry):
            problem = shard_outside(entry.shard, config.shard_count)
            if problem is not None:
                raise ProjectionError(f"run {run!r} seq {entry.seq}: transition: {problem}")
            builders[entry.shard].change(entry)
        elif isinstance(entry, RefitEntry):
            refits.append(entry)
        elif isinstance(entry, EpochEntry):
            if entry.epoch_moved:  # a layout-only entry is no new epoch on the timeline
                epochs.append(entry)
        elif isinstance(entry, DecisionEntry):
            decisions.append(entry)
        elif isinstance(entry, StallEntry):
            stalls.append(entry)
        elif isinstance(entry, EndEntry):
            end = entry
    return Lanes(
        run=run,
        config=config,
        first_us=first_us,
        last_seq=last_seq,
        last_us=last_us,
        lanes=tuple(b.finish(last_seq, last_us) for b in builders),
        refits=tuple(refits),
        epochs=tuple(epochs),
        decisions=tuple(decisions),
        stalls=tuple(stalls),
        end=end,
    )


def lanes_of(events: Iterable[RecordedEvent]) -> Lanes:
    """Fold a whole run (from seq 1) through its history and draw up its lanes.

    A run that stops without ``run_ended`` keeps its open refit, as ``replay`` shows it:
    an open span up to the last event.
    """
    history: History | None = None
    entries: list[Entry] = []
    for recorded in events:
        if history is None:
            history, first = History.start(recorded)
            entries += first
        else:
            entries += history.feed(recorded)
    if history is None:
        raise ProjectionError("nothing to draw: a run needs at least its run_started event")
    view = history.view
    if view.ended is None:
        entries += history.finish()
    return build_lanes(view.run, view.config, entries, last_seq=view.seq, last_us=view.at_us)
