"""The HTML painter: a timeline scene as one self-contained file that opens offline, forever.

Rules the file keeps:

- Inline SVG and inline CSS only: no script, no link, no ``url(…)``, no web font. The only
  ``http`` text in it is data (the shards' base URLs) shown as text. Tooltips are SVG
  ``<title>`` elements, which every browser shows without code.
- Data is never markup: every text and attribute taken from the scene goes through
  :func:`_e`, so a reason or a URL read from the ledger can only show as itself.
- Nothing is decided here that the PNG could disagree with: positions, labels, colours
  and the legend come from the scene; this module turns axis units into pixels and
  glyphs into SVG shapes (the same shape in the picture and in its legend entry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape
from typing import BinaryIO

from fleetledger.timeline.captions import Table
from fleetledger.timeline.palette import LegendItem
from fleetledger.timeline.scene import LABEL_ROWS, Mark, Scene

# The picture's own styles (also the live page's: :func:`fragment`), then the file's.
TIMELINE_CSS = """
.sub { color: #555; margin: 0 0 4px; font-size: 13px; }
.end { font-weight: 700; margin: 0 0 14px; }
svg.plot { width: 100%; height: auto; display: block; }
svg text { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
.lane-label, .row-label { font-size: 12px; fill: #333; }
.tick { font-size: 11px; fill: #555; }
.axis-label { font-size: 12px; fill: #444; }
.grid { stroke: #eee; }
.epoch-label, .refit-label { font-size: 10px; }
.abort-tick { stroke-width: 1; opacity: 0.6; }
rect:hover, polygon:hover, path:hover { opacity: 0.8; }
.legend { display: flex; flex-wrap: wrap; gap: 6px 18px; margin: 10px 0 0; font-size: 12px; }
.legend svg { width: 18px; height: 16px; margin-right: 5px; vertical-align: -3px; }
"""
_CSS = (
    """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       color: #222; margin: 24px auto; max-width: 1240px; padding: 0 16px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 28px 0 8px; }
"""
    + TIMELINE_CSS
    + """
table { border-collapse: collapse; font-size: 12.5px; width: 100%; }
th, td { text-align: left; padding: 3px 10px 3px 0; border-bottom: 1px solid #eee;
         vertical-align: top; }
th { color: #555; font-weight: 600; }
code { font-size: 12px; }
"""
)

_W = 1200.0
_LEFT = 92.0
_RIGHT = 16.0
_LANE = 30.0
_REFIT_ROW = 26.0
_LABEL_ROW = 13.0
_MIN_SPAN_PX = 1.5  # a one-event state still shows as a sliver
_MIN_REFIT_PX = 3.0


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".")


# ── glyphs as SVG, shared by the picture and the legend ─────────────────────────
# A marker: (centre x, centre y, fill or stroke colour, class, inner markup) -> element.
MarkerSvg = Callable[[float, float, str, str, str], str]


def _condemned(x: float, y: float, colour: str, cls: str, inner: str) -> str:
    d = (
        f"M{_num(x - 5)},{_num(y - 5)} L{_num(x + 5)},{_num(y + 5)} "
        f"M{_num(x + 5)},{_num(y - 5)} L{_num(x - 5)},{_num(y + 5)}"
    )
    return f'<path class="{cls}" d="{d}" stroke="{_e(colour)}" stroke-width="3">{inner}</path>'


def _refused(x: float, y: float, colour: str, cls: str, inner: str) -> str:
    points = f"{_num(x)},{_num(y - 6)} {_num(x + 6)},{_num(y)} {_num(x)},{_num(y + 6)} "
    points += f"{_num(x - 6)},{_num(y)}"
    return (
        f'<polygon class="{cls}" points="{points}" fill="{_e(colour)}" stroke="#000" '
        f'stroke-width="1.4">{inner}</polygon>'
    )


def _stall(x: float, y: float, colour: str, cls: str, inner: str) -> str:
    points = f"{_num(x - 6)},{_num(y - 5)} {_num(x + 6)},{_num(y - 5)} {_num(x)},{_num(y + 6)}"
    return (
        f'<polygon class="{cls}" points="{points}" fill="{_e(colour)}" stroke="#000" '
        f'stroke-width="0.8">{inner}</polygon>'
    )


def _exhausted(x: float, y: float, colour: str, cls: str, inner: str) -> str:
    points = []
    for k in range(10):
        radius = 8 if k % 2 == 0 else 8 * 0.45
        angle = -math.pi / 2 + k * math.pi / 5
        points.append(f"{_num(x + radius * math.cos(angle))},{_num(y + radius * math.sin(angle))}")
    return (
        f'<polygon class="{cls}" points="{" ".join(points)}" fill="{_e(colour)}" stroke="#000" '
        f'stroke-width="0.8">{inner}</polygon>'
    )


MARKERS: dict[str, MarkerSvg] = {
    "condemned": _condemned,
    "refused": _refused,
    "stall": _stall,
    "exhausted": _exhausted,
}
# Stroke attributes of a bar (a state band, a refit), from its ink.
BAR_STROKES: dict[str, Callable[[str], str]] = {
    "band": lambda ink: "",
    "refit-completed": lambda ink: "",
    "refit-aborted": lambda ink: f' stroke="{_e(ink)}" stroke-width="1"',
    "refit-open": lambda ink: f' stroke="{_e(ink)}" stroke-width="1.2" stroke-dasharray="4 3"',
}
LINE_STROKES = {"epoch": 'stroke-width="1.2" stroke-dasharray="2 3"', "end": 'stroke-width="2.5"'}


# A legend entry's glyph, drawn by the same code as the marks it explains.


def _marker_swatch(item: LegendItem) -> str:
    return MARKERS[item.glyph](9, 8, item.colour, "sw", "")


def _line_swatch(item: LegendItem) -> str:
    stroke = LINE_STROKES[item.glyph]
    return f'<line x1="9" y1="1" x2="9" y2="15" stroke="{_e(item.colour)}" {stroke}/>'


def _bar_swatch(item: LegendItem) -> str:
    stroke = BAR_STROKES[item.glyph](item.ink)
    return f'<rect x="2" y="3" width="14" height="10" fill="{_e(item.colour)}"{stroke}/>'


SWATCHES: dict[str, Callable[[LegendItem], str]] = {
    **dict.fromkeys(BAR_STROKES, _bar_swatch),
    **dict.fromkeys(LINE_STROKES, _line_swatch),
    **dict.fromkeys(MARKERS, _marker_swatch),
}


def _legend_item(item: LegendItem) -> str:
    meaning = f" <small>({_e(item.meaning)})</small>" if item.meaning else ""
    return (
        f'<span class="legend-item" data-glyph="{_e(item.glyph)}">'
        f'<svg viewBox="0 0 18 16" aria-hidden="true">{SWATCHES[item.glyph](item)}</svg>'
        f"{_e(item.label)}{meaning}</span>"
    )


# ── the page ───────────────────────────────────────────────────────────────────


def write_html(scene: Scene, stream: BinaryIO) -> None:
    """Write the scene as one self-contained HTML document (UTF-8) into ``stream``."""
    stream.write(page(scene).encode("utf-8"))


def page(scene: Scene) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(scene.title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{_e(scene.title)}</h1>",
        fragment(scene),
        *(html for table in scene.tables for html in _table(table)),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def fragment(scene: Scene) -> str:
    """The picture alone — subtitle, end, plot, legend — as markup to set inside a page
    (the live page's timeline): the same elements, classes and escaping as the file, so
    the page and ``timeline -o x.html`` cannot draw one run two ways. Its styles are
    :data:`TIMELINE_CSS`."""
    legend = "".join(_legend_item(item) for item in scene.legend)
    return "\n".join(
        [
            f'<p class="sub">{_e(scene.subtitle)}</p>',
            f'<p class="end" style="color:{_e(scene.end_colour)}">{_e(scene.end_text)}</p>',
            _Plot(scene).svg(),
            f'<div class="legend">{legend}</div>',
        ]
    )


def _table(table: Table) -> list[str]:
    if not table.rows:
        return [f"<h2>{_e(table.caption)}</h2>", "<p>none</p>"]

    def cell(index: int, text: str) -> str:
        return f"<code>{_e(text)}</code>" if index in table.code_columns else _e(text)

    head = "".join(f"<th>{_e(h)}</th>" for h in table.header)
    body = "".join(
        "<tr>" + "".join(f"<td>{cell(i, c)}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in table.rows
    )
    return [f"<h2>{_e(table.caption)}</h2>", f"<table><tr>{head}</tr>{body}</table>"]


class _Plot:
    """The scene's picture in pixels: the refits row, one lane per shard, the axis."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.plot_w = _W - _LEFT - _RIGHT
        self.refit_top = LABEL_ROWS * _LABEL_ROW + 6
        self.lanes_top = self.refit_top + _REFIT_ROW + 8
        self.lanes_bottom = self.lanes_top + len(scene.lanes) * _LANE
        self.axis_y = self.lanes_bottom + LABEL_ROWS * _LABEL_ROW + 10
        self.height = self.axis_y + 44

    def px(self, x: float) -> float:
        axis = self.scene.axis
        return _LEFT + (x - axis.lo) / axis.span * self.plot_w

    def mark_y(self, mark: Mark) -> float:
        if mark.shard is None:
            return self.refit_top + _REFIT_ROW / 2
        return self.lanes_top + mark.shard * _LANE + _LANE / 2

    def svg(self) -> str:
        s = self.scene
        out = [
            f'<svg class="plot" viewBox="0 0 {_num(_W)} {_num(self.height)}" role="img" '
            f'aria-label="{_e(s.title)}">',
            *self._axis(),
            *self._lanes(),
            *self._refits(),
            *self._epochs(),
            *(self._mark(m) for m in (*s.decisions, *s.stalls)),
        ]
        x = _num(self.px(s.axis.end))
        out.append(
            f'<line class="end-line" x1="{x}" y1="{_num(self.refit_top)}" x2="{x}" '
            f'y2="{_num(self.axis_y)}" stroke="{_e(s.end_colour)}" {LINE_STROKES["end"]}>'
            f"<title>{_e(s.end_label)}</title></line></svg>"
        )
        return "".join(out)

    def _axis(self) -> list[str]:
        axis, top, y = self.scene.axis, _num(self.refit_top), self.axis_y
        out = []
        for tick in axis.ticks:
            x = _num(self.px(tick.at))
            out.append(
                f'<line class="grid" x1="{x}" y1="{top}" x2="{x}" y2="{_num(y)}"/>'
                f'<line stroke="#999" x1="{x}" y1="{_num(y)}" x2="{x}" y2="{_num(y + 5)}"/>'
                f'<text class="tick" x="{x}" y="{_num(y + 18)}" text-anchor="middle">'
                f"{_e(tick.text)}</text>"
            )
        out.append(
            f'<line stroke="#333" x1="{_num(_LEFT)}" y1="{_num(y)}" x2="{_num(_W - _RIGHT)}" '
            f'y2="{_num(y)}"/><text class="axis-label" x="{_num(_LEFT + self.plot_w / 2)}" '
            f'y="{_num(y + 36)}" text-anchor="middle">{_e(axis.label)}</text>'
        )
        return out

    def _lanes(self) -> list[str]:
        out = []
        for index, lane in enumerate(self.scene.lanes):
            y = self.lanes_top + index * _LANE
            out.append(
                f'<g class="lane" data-shard="{lane.shard}"><text class="lane-label" '
                f'x="{_num(_LEFT - 8)}" y="{_num(y + _LANE / 2 + 4)}" text-anchor="end">'
                f"{_e(lane.label)}<title>{_e(lane.tip)}</title></text>"
            )
            for span in lane.spans:
                left, right = self.px(span.x0), self.px(span.x1)
                out.append(
                    f'<rect class="interval" data-state="{_e(span.state)}" x="{_num(left)}" '
                    f'y="{_num(y + 4)}" width="{_num(max(right - left, _MIN_SPAN_PX))}" '
                    f'height="{_num(_LANE - 8)}" fill="{_e(span.colour)}">'
                    f"<title>{_e(span.tip)}</title></rect>"
                )
            out.append("</g>")
        out.append(
            f'<text class="row-label" x="{_num(_LEFT - 8)}" '
            f'y="{_num(self.refit_top + _REFIT_ROW / 2 + 4)}" text-anchor="end">'
            f"{_e(self.scene.refits_row_label)}</text>"
            f'<line stroke="#ccc" x1="{_num(_LEFT)}" y1="{_num(self.lanes_top - 4)}" '
            f'x2="{_num(_W - _RIGHT)}" y2="{_num(self.lanes_top - 4)}"/>'
        )
        return out

    def _refits(self) -> list[str]:
        out = []
        for r in self.scene.refits:
            x0, x1 = self.px(r.x0), self.px(r.x1)
            outcome = _e(r.outcome)
            out.append(
                f'<g class="refit-mark" data-outcome="{outcome}">'
                f'<rect class="refit {outcome}" x="{_num(x0)}" y="{_num(self.refit_top + 3)}" '
                f'width="{_num(max(x1 - x0, _MIN_REFIT_PX))}" height="{_num(_REFIT_ROW - 6)}" '
                f'fill="{_e(r.colour)}"{BAR_STROKES[r.glyph](r.ink)}>'
                f"<title>{_e(r.tip)}</title></rect>"
            )
            if r.label is not None:
                y = self.refit_top - 4 - r.label_row * _LABEL_ROW
                out.append(
                    f'<text class="refit-label {outcome}" x="{_num(x0)}" y="{_num(y)}" '
                    f'text-anchor="{r.label_anchor}" '
                    f'fill="{_e(r.ink)}">{_e(r.label)}</text>'
                )
            if r.aborted:
                out.append(
                    f'<line class="abort-tick" x1="{_num(x1)}" y1="{_num(self.lanes_top)}" '
                    f'x2="{_num(x1)}" y2="{_num(self.lanes_bottom)}" stroke="{_e(r.colour)}"/>'
                )
            out.append("</g>")
        return out

    def _epochs(self) -> list[str]:
        out = []
        for e in self.scene.epochs:
            x, tip, colour = _num(self.px(e.x)), _e(e.tip), _e(e.colour)
            out.append(
                f'<g class="epoch-mark" data-epoch="{e.epoch}"><line class="epoch" x1="{x}" '
                f'y1="{_num(self.lanes_top)}" x2="{x}" y2="{_num(self.lanes_bottom)}" '
                f'stroke="{colour}" {LINE_STROKES["epoch"]}><title>{tip}</title></line>'
            )
            if e.label is not None:
                y = self.lanes_bottom + 12 + e.label_row * _LABEL_ROW
                out.append(
                    f'<text class="epoch-label" x="{x}" y="{_num(y)}" text-anchor="middle" '
                    f'fill="{colour}">{_e(e.label)}<title>{tip}</title></text>'
                )
            out.append("</g>")
        return out

    def _mark(self, mark: Mark) -> str:
        draw = MARKERS[mark.glyph]
        inner = f"<title>{_e(mark.tip)}</title>"
        return draw(self.px(mark.x), self.mark_y(mark), mark.colour, f"marker {mark.glyph}", inner)
