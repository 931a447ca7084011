"""Drawing a run's lanes: a PNG through matplotlib, or one self-contained HTML file.

Presentation only. What is drawn — intervals, refits, epochs, decisions, the end — comes
from :func:`fleetledger.projections.lanes.lanes_of`, the same history ``replay`` prints;
this module only decides where the shapes go and what they look like. Both renderers
share the palette, the axis and the labels below, so the PNG and the HTML of one run
tell the same story.

Two rules the files must keep:

- The HTML opens offline, forever: inline SVG and inline CSS, no script, no link, no
  ``url(…)``, no web font. The only ``http`` text in it is data (the shards' base URLs)
  shown as text. Tooltips are SVG ``<title>`` elements, which every browser shows
  without code.
- matplotlib is an optional extra. It is imported only when a PNG is asked for, and
  only its Agg canvas is used (no pyplot, no global backend switch), so a headless
  machine renders exactly what a laptop does.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fleetledger.events.models import datetime_from_us
from fleetledger.projections.history import DecisionEntry, RefitEntry, StallEntry
from fleetledger.projections.lanes import Interval, Lanes

AxisMode = Literal["time", "seq"]

PLOT_EXTRA_HINT = "pip install 'fleetledger[plot]'"

# One colour per state, distinguishable in print and by most colour-blind readers:
# the two alarming states are the warm ones, the recovering ones cool, the terminal grey.
STATE_COLOURS: dict[str, str] = {
    "HEALTHY": "#2f9e44",
    "SUSPECT": "#f59f00",
    "STALE": "#4c8ee8",
    "DEAD": "#d63031",
    "RESTARTING": "#8e5bd0",
    "RETIRED": "#8d8d8d",
}
STATE_MEANING: dict[str, str] = {
    "HEALTHY": "serving, current weights",
    "SUSPECT": "serving, failing",
    "STALE": "alive, old or partial weights",
    "DEAD": "absent, quarantined",
    "RESTARTING": "absent, replacement coming up",
    "RETIRED": "absent for good",
}
REFIT_COLOURS = {"completed": "#37474f", "aborted": "#d63031", "open": "#ffffff"}
EPOCH_COLOUR = "#5f6b7a"
OUTCOME_COLOURS = {"completed": "#2f9e44", "failed": "#d63031", "aborted": "#e67700"}
NOT_ENDED_COLOUR = "#5f6b7a"
DECISION_LABELS = {
    "condemned": "condemned as silent participant",
    "condemnation_refused": "condemnation refused",
    "fleet_exhausted": "fleet exhausted",
}
# Text labels beyond these counts would overprint each other; the shapes stay.
MAX_LABELLED_REFITS = 40
MAX_LABELLED_EPOCHS = 30


class PlotUnavailable(Exception):
    """PNG output was asked for, but matplotlib (the ``plot`` extra) is not installed."""


def require_matplotlib() -> None:
    """Fail before any work when PNG output cannot be written."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable(
            f"writing a PNG needs matplotlib, which is not installed: {PLOT_EXTRA_HINT} "
            "(or write .html, which needs nothing)"
        ) from None


# ── the axis both renderers share ──────────────────────────────────────────────

_TIME_UNITS = ((3600.0, "h"), (60.0, "min"), (1.0, "s"), (0.001, "ms"))


@dataclass(frozen=True)
class Axis:
    """Where an event goes along x: seconds (in a readable unit) or seqs since the start.

    The axis runs a little past the last event so a state entered by the last event
    still has width; final intervals are drawn to the axis' end.
    """

    mode: AxisMode
    first_us: int
    unit: str  # "h", "min", "s", "ms", or "seq"
    per_unit_s: float
    end: float  # x of the last event
    hi: float  # right edge of the drawing

    @classmethod
    def of(cls, lanes: Lanes, mode: AxisMode) -> Axis:
        if mode == "seq":
            end = float(lanes.last_seq)
            return cls(mode, lanes.first_us, "seq", 1.0, end, end + max(1.0, 0.02 * end))
        span_s = (lanes.last_us - lanes.first_us) / 1e6
        per_unit, unit = next(
            ((size, name) for size, name in _TIME_UNITS if span_s >= 2 * size), (0.001, "ms")
        )
        end = span_s / per_unit
        # A run whose events share one stamp still gets a drawable axis (one unit wide).
        return cls(mode, lanes.first_us, unit, per_unit, end, end * 1.03 if end > 0 else 1.0)

    @property
    def lo(self) -> float:
        return 1.0 if self.mode == "seq" else 0.0

    def x(self, seq: int, at_us: int) -> float:
        if self.mode == "seq":
            return float(seq)
        return (at_us - self.first_us) / 1e6 / self.per_unit_s

    def interval_span(self, interval: Interval, last_seq: int) -> tuple[float, float]:
        start = self.x(interval.start_seq, interval.start_us)
        if interval.end_seq > last_seq:
            return start, self.hi
        return start, self.x(interval.end_seq, interval.end_us)

    def label(self) -> str:
        if self.mode == "seq":
            return "seq (event number in the run)"
        return f"time since the run started ({self.unit})"

    def ticks(self, count: int = 8) -> list[float]:
        """Round tick values across the axis (1, 2 or 5 × a power of ten apart)."""
        span = self.hi - self.lo
        if span <= 0:
            return [self.lo]
        raw = span / count
        power = 10 ** math.floor(math.log10(raw))
        step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
        first = math.ceil(self.lo / step) * step
        out: list[float] = []
        value = first
        while value <= self.end + 1e-9 * span:
            out.append(round(value, 10))
            value += step
        return out


def _iso(at_us: int) -> str:
    return datetime_from_us(at_us).isoformat(timespec="seconds").replace("+00:00", "Z")


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def title(lanes: Lanes) -> str:
    return f"fleetledger timeline · run {lanes.run}"


def subtitle(lanes: Lanes) -> str:
    c = lanes.config
    span = (lanes.last_us - lanes.first_us) / 1e6
    return (
        f"{plural(lanes.last_seq, 'event')} · {_iso(lanes.first_us)} → {_iso(lanes.last_us)} "
        f"({_duration(span)}) · {plural(c.shard_count, 'shard')} × "
        f"{plural(c.workers_per_shard, 'rank')} + "
        f"{plural(c.train_world_size, 'trainer rank')} · {plural(len(lanes.refits), 'refit')} · "
        f"{plural(len(lanes.epochs) - 1, 'epoch change')}"
    )


def end_colour(lanes: Lanes) -> str:
    if lanes.end is None:
        return NOT_ENDED_COLOUR
    return OUTCOME_COLOURS.get(lanes.end.outcome, NOT_ENDED_COLOUR)


def _marked_decisions(lanes: Lanes) -> Iterator[tuple[DecisionEntry, tuple[int, ...]]]:
    """Decisions drawn as markers: those a state colour alone does not show.

    A condemnation looks like any other death in colour; a refusal and an exhaustion
    change no state at all. (Retirements and partial weights are their own colours.)
    """
    for d in lanes.decisions:
        if d.decision in ("condemned", "condemnation_refused"):
            yield d, d.subjects
        elif d.decision == "fleet_exhausted":
            yield d, ()


def stagger(xs: list[float], min_gap: float, rows: int = 2) -> list[int]:
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


def stall_colour(stall: StallEntry) -> str:
    return "#d63031" if stall.action == "abort" else "#e67700"


def _refit_label(r: RefitEntry) -> str:
    return f"v{r.weight_version}"


def _refit_text(r: RefitEntry) -> str:
    where = f"seq {r.started_seq}–{r.seq}"
    shards = ",".join(map(str, r.participants)) or "none"
    took = _duration(r.duration_us / 1e6)
    text = f"refit to v{r.weight_version} {r.outcome} ({where}, {took}, shards {shards})"
    if r.reason:
        text += f": {r.reason}"
    if r.context_lost:
        text += " [context lost]"
    return text


# ── PNG ────────────────────────────────────────────────────────────────────────


def render_png(lanes: Lanes, path: Path, mode: AxisMode = "time") -> None:
    """Draw the run with matplotlib's Agg canvas into ``path`` (PNG, written whole)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    axis = Axis.of(lanes, mode)
    n = lanes.shard_count
    lane_h = 0.38 if n <= 16 else max(0.14, 6.0 / n)
    top_in, bottom_in = 1.1, 0.95
    height = top_in + bottom_in + lane_h * (n + 2.3)
    fig = Figure(figsize=(12.5, height), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.085, bottom_in / height, 0.895, 1 - (top_in + bottom_in) / height))
    colour = end_colour(lanes)
    end_text = ("END · " if lanes.end else "STOPPED · ") + lanes.end_label()
    for offset_in, text, style in (
        (0.22, title(lanes), {"fontsize": 13, "weight": "bold"}),
        (0.52, subtitle(lanes), {"fontsize": 8.5, "color": "#444444"}),
        (0.76, _ellipsis(end_text, 120), {"fontsize": 9.5, "weight": "bold", "color": colour}),
    ):
        fig.text(0.085, 1 - offset_in / height, text, va="top", **style)
    label_gap = (axis.hi - axis.lo) * 0.035

    refit_row = n + 0.35  # y of the refits row, above shard 0
    min_w = (axis.hi - axis.lo) * 0.0025

    # Shard lanes: shard 0 at the top, like a table.
    for lane in lanes.lanes:
        for interval in lane:
            x0, x1 = axis.interval_span(interval, lanes.last_seq)
            y = n - 1 - interval.shard
            ax.broken_barh(
                [(x0, max(x1 - x0, min_w))],
                (y + 0.12, 0.76),
                facecolors=STATE_COLOURS[interval.state],
                edgecolors="none",
                zorder=2,
            )

    # Refits: one bar each in the top row; aborted ones red and hatched, open outlined.
    label_refits = len(lanes.refits) <= MAX_LABELLED_REFITS
    refit_rows = stagger([axis.x(r.started_seq, r.started_at_us) for r in lanes.refits], label_gap)
    for r, label_row in zip(lanes.refits, refit_rows, strict=True):
        x0 = axis.x(r.started_seq, r.started_at_us)
        x1 = axis.hi if r.outcome == "open" else axis.x(r.seq, r.at_us)
        width = max(x1 - x0, min_w * 1.6)
        style: dict[str, Any] = {"facecolors": REFIT_COLOURS[r.outcome], "zorder": 3}
        if r.outcome == "aborted":
            style.update(edgecolors="#7f1d1d", hatch="////", linewidth=0.6)
        elif r.outcome == "open":
            style.update(edgecolors="#37474f", linestyle="--", linewidth=1.0)
        else:
            style.update(edgecolors="none")
        ax.broken_barh([(x0, width)], (refit_row - 0.3, 0.6), **style)
        if label_refits:
            ax.text(
                x0,
                refit_row + 0.4 + 0.42 * label_row,
                _refit_label(r) + (" ✕" if r.outcome == "aborted" else ""),
                fontsize=7,
                color="#7f1d1d" if r.outcome == "aborted" else "#37474f",
                ha="left",
                va="bottom",
            )
        if r.outcome == "aborted":
            # The participants felt it: a thin red tick where the refit died.
            ax.vlines(x1, -0.05, n - 0.05, colors="#d63031", linewidth=0.8, alpha=0.55, zorder=4)

    # Epoch changes: dotted lines through every lane, numbered below the axis frame.
    label_epochs = len(lanes.epochs) - 1 <= MAX_LABELLED_EPOCHS
    epoch_rows = stagger([axis.x(e.seq, e.at_us) for e in lanes.epochs[1:]], label_gap * 0.6)
    for e, label_row in zip(lanes.epochs[1:], epoch_rows, strict=True):
        x = axis.x(e.seq, e.at_us)
        ax.vlines(x, -0.05, n - 0.05, colors=EPOCH_COLOUR, linestyles=":", linewidth=1.1, zorder=5)
        if label_epochs:
            ax.text(
                x,
                -0.1 - 0.36 * label_row,
                f"e{e.epoch}",
                fontsize=7,
                color=EPOCH_COLOUR,
                ha="center",
                va="top",
            )

    # Decisions a colour cannot show, and stalls, as markers.
    for d, subjects in _marked_decisions(lanes):
        x = axis.x(d.seq, d.at_us)
        if d.decision == "condemned":
            for s in subjects:
                ax.plot(x, n - 1 - s + 0.5, marker="X", ms=8, color="black", mec="white", zorder=6)
        elif d.decision == "condemnation_refused":
            for s in subjects:
                ax.plot(x, n - 1 - s + 0.5, marker="D", ms=6, color="white", mec="black", zorder=6)
        else:
            ax.plot(x, refit_row, marker="*", ms=12, color="#d63031", mec="black", zorder=6)
    for s in lanes.stalls:
        x = axis.x(s.seq, s.at_us)
        ax.plot(x, refit_row, marker="v", ms=8, color=stall_colour(s), mec="black", zorder=6)

    # The end: a solid line at the last event, the cause in the outcome's colour.
    ax.axvline(axis.end, color=colour, linewidth=2.0, zorder=7)
    ax.set_xlim(axis.lo, axis.hi)
    ax.set_ylim(-0.85, n + 1.35)
    ax.set_yticks([n - 1 - i + 0.5 for i in range(n)] + [refit_row])
    ax.set_yticklabels([f"shard {i}" for i in range(n)] + ["refits"], fontsize=8.5)
    ax.tick_params(axis="y", length=0)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(axis.label(), fontsize=8.5, labelpad=4)
    ax.axhline(n + 0.0, color="#cccccc", linewidth=0.8, zorder=1)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#eeeeee", zorder=0)

    handles: list[Any] = [Patch(facecolor=STATE_COLOURS[s], label=s.lower()) for s in STATE_COLOURS]
    handles += [
        Patch(facecolor=REFIT_COLOURS["completed"], label="refit completed"),
        Patch(
            facecolor=REFIT_COLOURS["aborted"],
            edgecolor="#7f1d1d",
            hatch="////",
            label="refit aborted",
        ),
        Patch(facecolor="white", edgecolor="#37474f", linestyle="--", label="refit open"),
        Line2D([], [], color=EPOCH_COLOUR, linestyle=":", label="epoch change (e#)"),
        Line2D([], [], marker="X", color="black", linestyle="", label="condemned"),
        Line2D(
            [], [], marker="D", mfc="white", mec="black", linestyle="", label="condemnation refused"
        ),
        Line2D(
            [],
            [],
            marker="v",
            color="#e67700",
            mec="black",
            linestyle="",
            label="stall (red: abort)",
        ),
        Line2D(
            [], [], marker="*", color="#d63031", mec="black", linestyle="", label="fleet exhausted"
        ),
        Line2D([], [], color=colour, linewidth=2, label="end"),
    ]
    fig.legend(
        handles=handles,
        loc="lower center",
        ncol=8,
        fontsize=7.5,
        frameon=False,
        bbox_to_anchor=(0.53, 0.04 / height),
        handlelength=1.6,
        columnspacing=1.2,
    )
    fig.savefig(path, format="png", dpi=110)


def _ellipsis(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ── HTML ───────────────────────────────────────────────────────────────────────

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #222; margin: 24px auto; max-width: 1240px; padding: 0 16px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 28px 0 8px; }
.sub { color: #555; margin: 0 0 4px; font-size: 13px; }
.end { font-weight: 700; margin: 0 0 14px; }
svg { width: 100%; height: auto; display: block; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.lane-label, .row-label { font-size: 12px; fill: #333; }
.tick { font-size: 11px; fill: #555; }
.axis-label { font-size: 12px; fill: #444; }
.grid { stroke: #eee; }
.epoch { stroke: #5f6b7a; stroke-width: 1.2; stroke-dasharray: 2 3; }
.epoch-label { font-size: 10px; fill: #5f6b7a; }
.refit-label { font-size: 10px; fill: #37474f; }
.refit-label.aborted { fill: #7f1d1d; }
.refit.aborted { stroke: #7f1d1d; stroke-width: 1; }
.refit.open { stroke: #37474f; stroke-width: 1.2; stroke-dasharray: 4 3; }
.abort-tick { stroke: #d63031; stroke-width: 1; opacity: 0.6; }
.end-line { stroke-width: 2.5; }
rect:hover, polygon:hover, path:hover { opacity: 0.8; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 10px 0 0; font-size: 12px; }
.legend span.sw { display: inline-block; width: 14px; height: 10px; margin-right: 5px;
                  vertical-align: -1px; border: 1px solid transparent; }
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { text-align: left; padding: 3px 10px 3px 0; border-bottom: 1px solid #eee;
         vertical-align: top; }
th { color: #555; font-weight: 600; }
td.num { font-variant-numeric: tabular-nums; }
code { font-size: 12px; }
"""

_W = 1200.0
_LEFT = 92.0
_RIGHT = 16.0
_LANE = 30.0
_REFIT_ROW = 26.0
_LABEL_ROW = 13.0


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _tick_text(value: float) -> str:
    return f"{value:g}"


def _at(lanes: Lanes, at_us: int) -> str:
    offset = (at_us - lanes.first_us) / 1e6
    stamp = datetime_from_us(at_us).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return f"{stamp} (+{_duration(offset)})"


def _star(cx: float, cy: float, r: float) -> str:
    points = []
    for k in range(10):
        radius = r if k % 2 == 0 else r * 0.45
        angle = -math.pi / 2 + k * math.pi / 5
        points.append(
            f"{_num(cx + radius * math.cos(angle))},{_num(cy + radius * math.sin(angle))}"
        )
    return " ".join(points)


def render_html(lanes: Lanes, path: Path, mode: AxisMode = "time") -> None:
    """Write the run as one self-contained HTML file: inline SVG, inline CSS, no script."""
    path.write_text(timeline_html(lanes, mode), encoding="utf-8")


def timeline_html(lanes: Lanes, mode: AxisMode = "time") -> str:
    axis = Axis.of(lanes, mode)
    n = lanes.shard_count
    plot_w = _W - _LEFT - _RIGHT
    span = axis.hi - axis.lo

    def px(x: float) -> float:
        return _LEFT + (x - axis.lo) / span * plot_w

    min_w = 1.5
    label_gap = 0.035 * span
    refit_top = 2 * _LABEL_ROW + 6
    lanes_top = refit_top + _REFIT_ROW + 8
    lanes_bottom = lanes_top + n * _LANE
    epoch_labels_bottom = lanes_bottom + 2 * _LABEL_ROW + 6
    axis_y = epoch_labels_bottom + 4
    height = axis_y + 44
    svg: list[str] = [
        f'<svg viewBox="0 0 {_num(_W)} {_num(height)}" role="img" aria-label="{_e(title(lanes))}">'
    ]

    # Grid and ticks.
    for tick in axis.ticks():
        x = px(tick)
        svg.append(
            f'<line class="grid" x1="{_num(x)}" y1="{_num(refit_top)}" x2="{_num(x)}" '
            f'y2="{_num(axis_y)}"/>'
            f'<line stroke="#999" x1="{_num(x)}" y1="{_num(axis_y)}" x2="{_num(x)}" '
            f'y2="{_num(axis_y + 5)}"/>'
            f'<text class="tick" x="{_num(x)}" y="{_num(axis_y + 18)}" '
            f'text-anchor="middle">{_e(_tick_text(tick))}</text>'
        )
    svg.append(
        f'<line stroke="#333" x1="{_num(_LEFT)}" y1="{_num(axis_y)}" x2="{_num(_W - _RIGHT)}" '
        f'y2="{_num(axis_y)}"/>'
        f'<text class="axis-label" x="{_num(_LEFT + plot_w / 2)}" y="{_num(axis_y + 36)}" '
        f'text-anchor="middle">{_e(axis.label())}</text>'
    )

    # Shard lanes, one <g> each, shard 0 at the top.
    for index, lane in enumerate(lanes.lanes):
        y = lanes_top + index * _LANE
        url = lanes.config.base_urls[index]
        svg.append(
            f'<g class="lane" data-shard="{index}"><text class="lane-label" x="{_num(_LEFT - 8)}" '
            f'y="{_num(y + _LANE / 2 + 4)}" text-anchor="end">shard {index}'
            f"<title>{_e(url)}</title></text>"
        )
        for interval in lane:
            x0, x1 = axis.interval_span(interval, lanes.last_seq)
            left, right = px(x0), px(x1)
            end = (
                "the last event"
                if interval.end_seq > lanes.last_seq
                else f"seq {interval.end_seq} at {_at(lanes, interval.end_us)}"
            )
            tip = (
                f"shard {index}: {interval.state} from seq {interval.start_seq} at "
                f"{_at(lanes, interval.start_us)} until {end} — {interval.rule}"
            )
            svg.append(
                f'<rect class="interval" data-state="{interval.state}" x="{_num(left)}" '
                f'y="{_num(y + 4)}" width="{_num(max(right - left, min_w))}" '
                f'height="{_num(_LANE - 8)}" fill="{STATE_COLOURS[interval.state]}">'
                f"<title>{_e(tip)}</title></rect>"
            )
        svg.append("</g>")
    svg.append(
        f'<text class="row-label" x="{_num(_LEFT - 8)}" y="{_num(refit_top + _REFIT_ROW / 2 + 4)}" '
        f'text-anchor="end">refits</text>'
        f'<line stroke="#ccc" x1="{_num(_LEFT)}" y1="{_num(lanes_top - 4)}" '
        f'x2="{_num(_W - _RIGHT)}" y2="{_num(lanes_top - 4)}"/>'
    )

    # Refits in the top row.
    label_refits = len(lanes.refits) <= MAX_LABELLED_REFITS
    rows = stagger([axis.x(r.started_seq, r.started_at_us) for r in lanes.refits], label_gap)
    for r, row in zip(lanes.refits, rows, strict=True):
        x0 = px(axis.x(r.started_seq, r.started_at_us))
        x1 = px(axis.hi) if r.outcome == "open" else px(axis.x(r.seq, r.at_us))
        fill = REFIT_COLOURS[r.outcome]
        svg.append(
            f'<g class="refit-mark" data-outcome="{r.outcome}">'
            f'<rect class="refit {r.outcome}" x="{_num(x0)}" y="{_num(refit_top + 3)}" '
            f'width="{_num(max(x1 - x0, 3.0))}" height="{_num(_REFIT_ROW - 6)}" fill="{fill}">'
            f"<title>{_e(_refit_text(r))}</title></rect>"
        )
        if label_refits:
            label = _refit_label(r) + (" ✕" if r.outcome == "aborted" else "")
            svg.append(
                f'<text class="refit-label {r.outcome}" x="{_num(x0)}" '
                f'y="{_num(refit_top - 4 - row * _LABEL_ROW)}">{_e(label)}</text>'
            )
        if r.outcome == "aborted":
            svg.append(
                f'<line class="abort-tick" x1="{_num(x1)}" y1="{_num(lanes_top)}" '
                f'x2="{_num(x1)}" y2="{_num(lanes_bottom)}"/>'
            )
        svg.append("</g>")

    # Epoch changes through every lane.
    label_epochs = len(lanes.epochs) - 1 <= MAX_LABELLED_EPOCHS
    rows = stagger([axis.x(e.seq, e.at_us) for e in lanes.epochs[1:]], label_gap * 0.6)
    for e, row in zip(lanes.epochs[1:], rows, strict=True):
        x = px(axis.x(e.seq, e.at_us))
        world = e.world_size if e.world_size is not None else f"none ({e.layout_error})"
        tip = (
            f"epoch {e.epoch} at seq {e.seq}, {_at(lanes, e.at_us)}: serving "
            f"{list(e.serving)}, absent {list(e.absent)}, refit world size {world}"
        )
        svg.append(
            f'<g class="epoch-mark" data-epoch="{e.epoch}"><line class="epoch" x1="{_num(x)}" '
            f'y1="{_num(lanes_top)}" x2="{_num(x)}" y2="{_num(lanes_bottom)}">'
            f"<title>{_e(tip)}</title></line>"
        )
        if label_epochs:
            svg.append(
                f'<text class="epoch-label" x="{_num(x)}" '
                f'y="{_num(lanes_bottom + 12 + row * _LABEL_ROW)}" text-anchor="middle">'
                f"e{e.epoch}<title>{_e(tip)}</title></text>"
            )
        svg.append("</g>")

    # Markers: decisions a colour cannot show, and stalls.
    for d, subjects in _marked_decisions(lanes):
        x = px(axis.x(d.seq, d.at_us))
        tip = _e(f"seq {d.seq}, {_at(lanes, d.at_us)}: {DECISION_LABELS[d.decision]}: {d.detail}")
        if d.decision == "fleet_exhausted":
            cy = refit_top + _REFIT_ROW / 2
            svg.append(
                f'<polygon class="marker exhausted" points="{_star(x, cy, 8)}" fill="#d63031" '
                f'stroke="#000" stroke-width="0.8"><title>{tip}</title></polygon>'
            )
            continue
        for s in subjects:
            cy = lanes_top + s * _LANE + _LANE / 2
            if d.decision == "condemned":
                svg.append(
                    f'<path class="marker condemned" d="M{_num(x - 5)},{_num(cy - 5)} '
                    f"L{_num(x + 5)},{_num(cy + 5)} M{_num(x + 5)},{_num(cy - 5)} "
                    f'L{_num(x - 5)},{_num(cy + 5)}" stroke="#000" stroke-width="3">'
                    f"<title>{tip}</title></path>"
                )
            else:
                svg.append(
                    f'<polygon class="marker refused" points="{_num(x)},{_num(cy - 6)} '
                    f'{_num(x + 6)},{_num(cy)} {_num(x)},{_num(cy + 6)} {_num(x - 6)},{_num(cy)}" '
                    f'fill="#fff" stroke="#000" stroke-width="1.4"><title>{tip}</title></polygon>'
                )
    for s in lanes.stalls:
        x = px(axis.x(s.seq, s.at_us))
        cy = refit_top + _REFIT_ROW / 2
        tip = _e(
            f"seq {s.seq}, {_at(lanes, s.at_us)}: stall ({s.action}) — idle {s.idle_s:g} s, "
            f"{s.committed_groups} groups committed, {s.train_steps} train steps, "
            f"{s.in_flight} in flight"
        )
        svg.append(
            f'<polygon class="marker stall" points="{_num(x - 6)},{_num(cy - 5)} '
            f'{_num(x + 6)},{_num(cy - 5)} {_num(x)},{_num(cy + 6)}" fill="{stall_colour(s)}" '
            f'stroke="#000" stroke-width="0.8"><title>{tip}</title></polygon>'
        )

    # The end.
    x_end = px(axis.end)
    colour = end_colour(lanes)
    svg.append(
        f'<line class="end-line" x1="{_num(x_end)}" y1="{_num(refit_top)}" x2="{_num(x_end)}" '
        f'y2="{_num(axis_y)}" stroke="{colour}"><title>{_e(lanes.end_label())}</title></line>'
        "</svg>"
    )

    end_text = ("END · " if lanes.end else "STOPPED · ") + lanes.end_label()
    legend = [
        f'<span><span class="sw" style="background:{STATE_COLOURS[s]}"></span>'
        f"{s.lower()} <small>({_e(STATE_MEANING[s])})</small></span>"
        for s in STATE_COLOURS
    ]
    legend += [
        f'<span><span class="sw" style="background:{REFIT_COLOURS["completed"]}"></span>'
        "refit completed</span>",
        f'<span><span class="sw" style="background:{REFIT_COLOURS["aborted"]};'
        'border-color:#7f1d1d"></span>refit aborted (✕)</span>',
        '<span><span class="sw" style="background:#fff;border:1px dashed #37474f"></span>'
        "refit open</span>",
        '<span><span class="sw" style="border-left:2px dotted #5f6b7a"></span>'
        "epoch change (e#)</span>",
        "<span>✖ condemned</span><span>◇ condemnation refused</span>"
        "<span>▼ stall</span><span>★ fleet exhausted</span>",
    ]
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title(lanes))}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(title(lanes))}</h1>",
        f'<p class="sub">{_e(subtitle(lanes))}</p>',
        f'<p class="end" style="color:{colour}">{_e(end_text)}</p>',
        "".join(svg),
        f'<div class="legend">{"".join(legend)}</div>',
        *_html_tables(lanes),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _table(caption: str, header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return [f"<h2>{_e(caption)}</h2>", "<p>none</p>"]
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return [f"<h2>{_e(caption)}</h2>", f"<table><tr>{head}</tr>{body}</table>"]


def _html_tables(lanes: Lanes) -> list[str]:
    """The picture's facts as text, for reading and searching (cells escaped here)."""
    out: list[str] = []
    shards = []
    for index, lane in enumerate(lanes.lanes):
        last = lane[-1]
        shards.append(
            [
                str(index),
                f"<code>{_e(lanes.config.base_urls[index])}</code>",
                _e(last.state),
                str(last.start_seq),
                _e(last.rule),
                str(sum(1 for i in lane if i.state == "DEAD")),
            ]
        )
    out += _table(
        "Shards",
        ["shard", "base URL at start", "final state", "since seq", "because", "times DEAD"],
        shards,
    )
    out += _table(
        "Refits",
        ["weight version", "outcome", "seqs", "started", "duration", "shards", "reason"],
        [
            [
                str(r.weight_version),
                _e(r.outcome + (" (context lost)" if r.context_lost else "")),
                f"{r.started_seq}–{r.seq}",
                _e(_at(lanes, r.started_at_us)),
                _e(_duration(r.duration_us / 1e6)),
                _e(", ".join(map(str, r.participants)) or "none"),
                _e(r.reason),
            ]
            for r in lanes.refits
        ],
    )
    out += _table(
        "Membership epochs",
        ["epoch", "seq", "at", "serving", "absent", "refit world size"],
        [
            [
                str(e.epoch),
                str(e.seq),
                _e(_at(lanes, e.at_us)),
                _e(list(e.serving)),
                _e(list(e.absent)),
                _e(e.world_size if e.world_size is not None else f"none: {e.layout_error}"),
            ]
            for e in lanes.epochs
        ],
    )
    events = [
        (d.seq, d.at_us, d.decision.replace("_", " "), _e(list(d.subjects) or ""), d.detail)
        for d in lanes.decisions
    ] + [
        (
            s.seq,
            s.at_us,
            f"stall ({s.action})",
            "",
            f"idle {s.idle_s:g} s; {s.committed_groups} groups committed, "
            f"{s.train_steps} train steps, {s.in_flight} in flight",
        )
        for s in lanes.stalls
    ]
    out += _table(
        "Decisions and stalls",
        ["seq", "at", "what", "shards", "detail"],
        [
            [str(seq), _e(_at(lanes, at)), _e(what), shards, _e(detail)]
            for seq, at, what, shards, detail in sorted(events)
        ],
    )
    return out
