"""A run's timeline as one backend-neutral scene: what is drawn, decided once for both files.

The PNG and the HTML painter used to compute the picture each on their own, and their
legends drifted apart. Every choice a reader could compare between the two files is
therefore made while the scene is built — where each mark sits along x, which labels are
shown and on which row, which decisions get a marker, the tooltips, the one legend, the
tables — and a painter only maps the scene to its own units (inches, pixels) and
primitives. Colours and wording come from :mod:`~fleetledger.timeline.palette` and
:mod:`~fleetledger.timeline.captions`, and reach the painters only through here.

Rules of this module:

- Pure: no I/O, no clock, no matplotlib. The same lanes give an equal scene (frozen
  dataclasses of tuples, so two builds compare with ``==``).
- x is in axis units (a readable time unit, or seqs). y is a row: a shard's lane, or the
  refits row above shard 0 (a mark whose ``shard`` is None). Pixels belong to painters.
- Text is plain text; the HTML painter escapes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from fleetledger.projections.history import DecisionEntry, StallEntry
from fleetledger.projections.lanes import Interval, Lanes
from fleetledger.projections.shard_states import ShardState
from fleetledger.timeline import captions
from fleetledger.timeline.captions import Table
from fleetledger.timeline.palette import (
    ABORTED_MARK,
    EPOCH_COLOUR,
    MARKED_DECISIONS,
    REFIT_LOOKS,
    STATE_COLOURS,
    Glyph,
    LegendItem,
    end_colour,
    legend,
    stall_colour,
)

AxisMode = Literal["time", "seq"]

# Text labels beyond these counts would overprint each other; the shapes stay.
MAX_LABELLED_REFITS = 40
MAX_LABELLED_EPOCHS = 30
LABEL_ROWS = 2  # rows of refit labels above the refits row, of epoch labels below the lanes
REFIT_LABEL_GAP = 0.035  # nearer neighbours than this (a fraction of the axis) change rows
EPOCH_LABEL_GAP = 0.6 * REFIT_LABEL_GAP  # "e7" is narrower than "v10 ✕"
REFITS_ROW_LABEL = "refits"


@dataclass(frozen=True, slots=True)
class Tick:
    at: float
    text: str


@dataclass(frozen=True, slots=True)
class Axis:
    """Where an event goes along x: time (in a readable unit) or seqs since the start.

    The axis runs a little past the last event (``end``) to ``hi``, so a state entered by
    the last event still has width; final intervals of a run that goes on are drawn to
    ``hi``, those of a run that ended stop at its end (:meth:`final_x`).
    """

    mode: AxisMode
    unit: str  # "h", "min", "s", "ms", or "seq"
    label: str
    first_us: int
    per_unit_s: float
    lo: float
    end: float  # x of the last event
    hi: float  # right edge of the drawing
    ticks: tuple[Tick, ...]

    @property
    def span(self) -> float:
        return self.hi - self.lo

    def final_x(self, lanes: Lanes) -> float:
        """Where what is still going at the last event is drawn to: the end marker of a
        run that ended (nothing happens after it: lanes drawn past it read as a run that
        went on), the drawing's edge for one that goes on."""
        return self.end if lanes.end is not None else self.hi

    def x(self, seq: int, at_us: int) -> float:
        if self.mode == "seq":
            return float(seq)
        return (at_us - self.first_us) / 1e6 / self.per_unit_s


@dataclass(frozen=True, slots=True)
class Span:
    """One coloured interval of a lane, in axis units."""

    x0: float
    x1: float
    state: ShardState
    colour: str
    tip: str


@dataclass(frozen=True, slots=True)
class Lane:
    shard: int
    label: str
    tip: str  # the shard's base URL at the start
    spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class RefitMark:
    """A bar in the refits row; an aborted one also ticks every lane, in its colour, at x1."""

    x0: float
    x1: float
    outcome: str
    glyph: Glyph
    colour: str
    ink: str  # outline and label colour
    label: str | None  # None when there are too many refits to label
    label_row: int
    tip: str
    # "start": the label begins at x0 (reads rightwards); "end": it ends at x0, for a
    # refit so near the run's end that its label would be struck through by the end line.
    label_anchor: Literal["start", "end"] = "start"

    @property
    def aborted(self) -> bool:
        return self.outcome == "aborted"


@dataclass(frozen=True, slots=True)
class EpochMark:
    """A dotted line through every lane, its number below them."""

    x: float
    epoch: int
    colour: str
    label: str | None  # None when there are too many epochs to label
    label_row: int
    tip: str


@dataclass(frozen=True, slots=True)
class Mark:
    """A marker: on a shard's lane, or in the refits row when ``shard`` is None."""

    x: float
    glyph: Glyph
    colour: str
    shard: int | None
    tip: str


@dataclass(frozen=True, slots=True)
class Scene:
    title: str
    subtitle: str
    end_text: str  # "END · …" or "NOT ENDED · …" (live, or stopped without an end)
    end_label: str
    end_colour: str
    axis: Axis
    lanes: tuple[Lane, ...]
    refits_row_label: str
    refits: tuple[RefitMark, ...]
    epochs: tuple[EpochMark, ...]
    decisions: tuple[Mark, ...]
    stalls: tuple[Mark, ...]
    legend: tuple[LegendItem, ...]
    tables: tuple[Table, ...]


# ── the axis ───────────────────────────────────────────────────────────────────

_TIME_UNITS = ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (0.001, "ms"))


def _ticks(lo: float, end: float, hi: float, count: int = 8) -> tuple[Tick, ...]:
    """Round tick values across the axis (1, 2 or 5 × a power of ten apart), up to ``end``."""
    span = hi - lo
    if span <= 0:
        return (Tick(lo, f"{lo:g}"),)
    raw = span / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    out: list[Tick] = []
    value = math.ceil(lo / step) * step
    while value <= end + 1e-9 * span:
        at = round(value, 10)
        out.append(Tick(at, f"{at:g}"))
        value += step
    return tuple(out)


def _seq_axis(lanes: Lanes) -> Axis:
    end = float(lanes.last_seq)
    hi = end + max(1.0, 0.02 * end)
    label = "seq (event number in the run)"
    return Axis("seq", "seq", label, lanes.first_us, 1.0, 1.0, end, hi, _ticks(1.0, end, hi))


def _time_axis(lanes: Lanes) -> Axis:
    span_s = (lanes.last_us - lanes.first_us) / 1e6
    per_unit, unit = next(
        ((size, name) for size, name in _TIME_UNITS if span_s >= 2 * size), (0.001, "ms")
    )
    end = span_s / per_unit
    # A run whose events share one stamp still gets a drawable axis (one unit wide).
    hi = end * 1.03 if end > 0 else 1.0
    label = f"time since the run started ({unit})"
    return Axis("time", unit, label, lanes.first_us, per_unit, 0.0, end, hi, _ticks(0, end, hi))


AXES = {"seq": _seq_axis, "time": _time_axis}


def stagger(xs: list[float], min_gap: float, rows: int = LABEL_ROWS) -> list[int]:
    """A row for each label at ``xs`` (ascending) so that close neighbours do not overprint.

    Greedy: the first row whose last label is at least ``min_gap`` away, else the row
    whose last label is farthest (an unavoidable overlap goes where it hurts least).
    """
    last = [-math.inf] * rows
    out: list[int] = []
    for x in xs:
        row = next((i for i in range(rows) if x - last[i] >= min_gap), None)
        if row is None:
            row = min(range(rows), key=lambda i: last[i])
        last[row] = x
        out.append(row)
    return out


# ── the marks ──────────────────────────────────────────────────────────────────


def _span(lanes: Lanes, axis: Axis, interval: Interval) -> Span:
    x0 = axis.x(interval.start_seq, interval.start_us)
    last = interval.end_seq > lanes.last_seq
    x1 = axis.final_x(lanes) if last else axis.x(interval.end_seq, interval.end_us)
    tip = captions.interval_tip(lanes, interval)
    return Span(x0, x1, interval.state, STATE_COLOURS[interval.state], tip)


def _lanes(lanes: Lanes, axis: Axis) -> tuple[Lane, ...]:
    return tuple(
        Lane(
            shard,
            f"shard {shard}",
            lanes.config.base_urls[shard],
            tuple(_span(lanes, axis, interval) for interval in lane),
        )
        for shard, lane in enumerate(lanes.lanes)
    )


def _refits(lanes: Lanes, axis: Axis) -> tuple[RefitMark, ...]:
    labelled = len(lanes.refits) <= MAX_LABELLED_REFITS
    starts = [axis.x(r.started_seq, r.started_at_us) for r in lanes.refits]
    rows = stagger(starts, REFIT_LABEL_GAP * axis.span)
    marks = []
    for r, x0, row in zip(lanes.refits, starts, rows, strict=True):
        look = REFIT_LOOKS[r.outcome]
        x1 = axis.final_x(lanes) if r.outcome == "open" else axis.x(r.seq, r.at_us)
        label = f"v{r.weight_version}" + (ABORTED_MARK if r.outcome == "aborted" else "")
        near_end = lanes.end is not None and axis.end - x0 < REFIT_LABEL_GAP * axis.span
        marks.append(
            RefitMark(
                x0,
                x1,
                r.outcome,
                look.glyph,
                look.colour,
                look.ink,
                label if labelled else None,
                row,
                captions.refit_tip(r),
                "end" if near_end else "start",
            )
        )
    return tuple(marks)


def _epochs(lanes: Lanes, axis: Axis) -> tuple[EpochMark, ...]:
    changes = lanes.epochs[1:]  # epoch 0 is the start, not a change
    labelled = len(changes) <= MAX_LABELLED_EPOCHS
    xs = [axis.x(e.seq, e.at_us) for e in changes]
    rows = stagger(xs, EPOCH_LABEL_GAP * axis.span)
    return tuple(
        EpochMark(
            x,
            e.epoch,
            EPOCH_COLOUR,
            f"e{e.epoch}" if labelled else None,
            row,
            captions.epoch_tip(lanes, e),
        )
        for e, x, row in zip(changes, xs, rows, strict=True)
    )


def _decision_marks(lanes: Lanes, axis: Axis, d: DecisionEntry) -> tuple[Mark, ...]:
    look = MARKED_DECISIONS.get(d.decision)
    if look is None:  # a decision its state colour already shows
        return ()
    x = axis.x(d.seq, d.at_us)
    tip = captions.decision_tip(lanes, d, look.tip)
    rows: tuple[int | None, ...] = d.subjects if look.on_subjects else (None,)
    return tuple(Mark(x, look.glyph, look.colour, row, tip) for row in rows)


def _stall(lanes: Lanes, axis: Axis, s: StallEntry) -> Mark:
    x = axis.x(s.seq, s.at_us)
    return Mark(x, "stall", stall_colour(s.action), None, captions.stall_tip(lanes, s))


def build_scene(lanes: Lanes, mode: AxisMode = "time") -> Scene:
    """Everything a painter draws for this run, along an axis of time or of seqs."""
    axis = AXES[mode](lanes)
    colour = end_colour(lanes)
    return Scene(
        title=captions.title(lanes),
        subtitle=captions.subtitle(lanes),
        end_text=captions.end_text(lanes),
        end_label=lanes.end_label(),
        end_colour=colour,
        axis=axis,
        lanes=_lanes(lanes, axis),
        refits_row_label=REFITS_ROW_LABEL,
        refits=_refits(lanes, axis),
        epochs=_epochs(lanes, axis),
        decisions=tuple(m for d in lanes.decisions for m in _decision_marks(lanes, axis, d)),
        stalls=tuple(_stall(lanes, axis, s) for s in lanes.stalls),
        legend=legend(colour),
        tables=captions.tables(lanes),
    )
