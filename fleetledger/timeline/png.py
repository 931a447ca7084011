"""The PNG painter: a timeline scene onto matplotlib's Agg canvas.

It only places what :func:`~fleetledger.timeline.scene.build_scene` decided — inches
instead of axis rows, matplotlib styles for the scene's glyphs — and adds no mark, label
or colour of its own meaning, so the PNG says what the HTML of the same run says.

matplotlib is an optional extra. It is imported only when a PNG is asked for (here,
inside the functions), and only its Agg canvas is used — no pyplot, no global backend
switch — so a headless machine renders exactly what a laptop does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO

from fleetledger.errors import FleetledgerError
from fleetledger.timeline.scene import LABEL_ROWS, Mark, Scene

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from fleetledger.timeline.palette import LegendItem

PLOT_EXTRA_HINT = "pip install 'fleetledger[plot]'"
DPI = 110
WIDTH_IN = 12.5
LEGEND_COLUMNS = 4
END_TEXT_LIMIT = 120  # characters; a longer cause is cut with an ellipsis, the HTML has it all

# matplotlib styles of the scene's glyphs, for the picture and its legend alike.
_BAR_STYLES: dict[str, Callable[[str], dict[str, Any]]] = {  # glyph -> style from its ink
    "refit-completed": lambda ink: {"edgecolor": "none"},
    "refit-aborted": lambda ink: {"edgecolor": ink, "hatch": "////", "linewidth": 0.6},
    "refit-open": lambda ink: {"edgecolor": ink, "linestyle": "--", "linewidth": 1.0},
}
_MARKERS: dict[str, tuple[str, float, str]] = {  # glyph -> (marker, size, edge colour)
    # A white edge: the condemned shard's lane is red, where a black edge would vanish.
    "condemned": ("X", 8, "white"),
    "refused": ("D", 6, "black"),
    "stall": ("v", 8, "black"),
    "exhausted": ("*", 12, "black"),
}
_LINES: dict[str, dict[str, Any]] = {
    "epoch": {"linestyle": ":", "linewidth": 1.1},
    "end": {"linestyle": "-", "linewidth": 2.0},
}


class PlotUnavailable(FleetledgerError):
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


def write_png(scene: Scene, stream: BinaryIO) -> None:
    """Draw the scene as a PNG into ``stream`` (the caller makes the file whole or absent)."""
    require_matplotlib()
    figure(scene).savefig(stream, format="png", dpi=DPI)


def legend_handles(scene: Scene) -> list[Artist]:
    """The scene's legend as matplotlib handles: one per item, in order, with its text."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def band(item: LegendItem) -> Artist:
        return Patch(facecolor=item.colour, edgecolor="none", label=item.text)

    def bar(item: LegendItem) -> Artist:
        style = _BAR_STYLES[item.glyph](item.ink)
        return Patch(facecolor=item.colour, label=item.text, **style)

    def marker(item: LegendItem) -> Artist:
        shape, size, edge = _MARKERS[item.glyph]
        style = {"marker": shape, "ms": 0.8 * size, "mfc": item.colour, "mec": edge, "ls": ""}
        return Line2D([], [], label=item.text, **style)

    def line(item: LegendItem) -> Artist:
        return Line2D([], [], color=item.colour, label=item.text, **_LINES[item.glyph])

    makers = {"band": band, **dict.fromkeys(_BAR_STYLES, bar), **dict.fromkeys(_LINES, line)}
    makers |= dict.fromkeys(_MARKERS, marker)
    return [makers[item.glyph](item) for item in scene.legend]


def figure(scene: Scene) -> Figure:
    """The whole picture on a fresh Agg figure, not yet saved."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(scene.lanes)
    lane_h = 0.38 if n <= 16 else max(0.14, 6.0 / n)
    legend_rows = math.ceil(len(scene.legend) / LEGEND_COLUMNS)
    top_in, bottom_in = 1.1, 0.62 + 0.17 * legend_rows
    height = top_in + bottom_in + lane_h * (n + 2.3)
    fig = Figure(figsize=(WIDTH_IN, height), dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.085, bottom_in / height, 0.895, 1 - (top_in + bottom_in) / height))
    end_text = _ellipsis(scene.end_text, END_TEXT_LIMIT)
    for offset_in, text, style in (
        (0.22, scene.title, {"fontsize": 13, "weight": "bold"}),
        (0.52, scene.subtitle, {"fontsize": 8.5, "color": "#444444"}),
        (0.76, end_text, {"fontsize": 9.5, "weight": "bold", "color": scene.end_colour}),
    ):
        fig.text(0.085, 1 - offset_in / height, text, va="top", **style)
    _draw_lanes(ax, scene)
    _draw_refits(ax, scene)
    _draw_epochs(ax, scene)
    for mark in (*scene.decisions, *scene.stalls):
        _draw_mark(ax, scene, mark)
    # The end: a solid line at the last event, in the outcome's colour.
    ax.axvline(scene.axis.end, color=scene.end_colour, zorder=7, **_LINES["end"])
    _frame(ax, scene)
    fig.legend(
        handles=legend_handles(scene),
        loc="lower center",
        ncol=LEGEND_COLUMNS,
        fontsize=7.5,
        frameon=False,
        bbox_to_anchor=(0.53, 0.04 / height),
        handlelength=1.6,
        columnspacing=1.6,
    )
    return fig


# Rows in data units: shard 0 at the top, like a table; the refits row above it.


def _lane_y(scene: Scene, shard: int) -> float:
    return len(scene.lanes) - 1 - shard


def _refits_y(scene: Scene) -> float:
    return len(scene.lanes) + 0.35


def _draw_lanes(ax: Axes, scene: Scene) -> None:
    min_w = scene.axis.span * 0.0025  # a one-event state still shows as a sliver
    for lane in scene.lanes:
        y = _lane_y(scene, lane.shard)
        for span in lane.spans:
            ax.broken_barh(
                [(span.x0, max(span.x1 - span.x0, min_w))],
                (y + 0.12, 0.76),
                facecolor=span.colour,
                edgecolor="none",
                zorder=2,
            )


def _draw_refits(ax: Axes, scene: Scene) -> None:
    n, row_y = len(scene.lanes), _refits_y(scene)
    min_w = scene.axis.span * 0.004
    for r in scene.refits:
        style = _BAR_STYLES[r.glyph](r.ink)
        width = max(r.x1 - r.x0, min_w)
        ax.broken_barh([(r.x0, width)], (row_y - 0.3, 0.6), facecolor=r.colour, zorder=3, **style)
        if r.label is not None:
            y = row_y + 0.4 + 0.42 * r.label_row
            ha = "left" if r.label_anchor == "start" else "right"
            ax.text(r.x0, y, r.label, fontsize=7, color=r.ink, ha=ha, va="bottom")
        if r.aborted:
            # The participants felt it: a thin red tick where the refit died.
            ax.vlines(r.x1, -0.05, n - 0.05, colors=r.colour, linewidth=0.8, alpha=0.55, zorder=4)


def _draw_epochs(ax: Axes, scene: Scene) -> None:
    n = len(scene.lanes)
    for e in scene.epochs:
        ax.vlines(e.x, -0.05, n - 0.05, colors=e.colour, zorder=5, **_LINES["epoch"])
        if e.label is not None:
            y = -0.1 - 0.36 * e.label_row
            ax.text(e.x, y, e.label, fontsize=7, color=e.colour, ha="center", va="top")


def _draw_mark(ax: Axes, scene: Scene, mark: Mark) -> None:
    shape, size, edge = _MARKERS[mark.glyph]
    y = _refits_y(scene) if mark.shard is None else _lane_y(scene, mark.shard) + 0.5
    ax.plot(mark.x, y, marker=shape, ms=size, color=mark.colour, mec=edge, zorder=6)


def _frame(ax: Axes, scene: Scene) -> None:
    axis, n = scene.axis, len(scene.lanes)
    ax.set_xlim(axis.lo, axis.hi)
    ax.set_ylim(-0.35 - 0.25 * LABEL_ROWS, n + 0.55 + 0.4 * LABEL_ROWS)
    ax.set_xticks([t.at for t in axis.ticks], [t.text for t in axis.ticks])
    ax.set_yticks([_lane_y(scene, lane.shard) + 0.5 for lane in scene.lanes] + [_refits_y(scene)])
    ax.set_yticklabels([lane.label for lane in scene.lanes] + [scene.refits_row_label])
    ax.tick_params(axis="y", length=0, labelsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(axis.label, fontsize=8.5, labelpad=4)
    ax.axhline(n, color="#cccccc", linewidth=0.8, zorder=1)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.grid(axis="x", color="#eeeeee", zorder=0)


def _ellipsis(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
