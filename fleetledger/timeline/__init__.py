"""Drawing a run's lanes: one scene, painted as a PNG (matplotlib) or one HTML file.

:mod:`.scene` decides what is drawn, from :func:`fleetledger.projections.lanes.lanes_of`
(the same history ``replay`` prints); :mod:`.png` and :mod:`.html` only paint it, so the
two files of one run tell the same story, legend included. A painter names what it
needs before any work (``require``), so a missing extra fails before the ledger is read.
A painter writes into a binary stream and never opens a file: the command hands it the
one safe output file of :func:`fleetledger.cli.output.whole_file`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO

from fleetledger.timeline.captions import plural
from fleetledger.timeline.html import write_html
from fleetledger.timeline.png import PlotUnavailable, require_matplotlib, write_png
from fleetledger.timeline.scene import AxisMode, Scene, build_scene


def _nothing_needed() -> None:
    """HTML is written with the standard library alone."""


@dataclass(frozen=True, slots=True)
class Painter:
    """A file format: what it needs (raises ``PlotUnavailable`` if missing), what writes it."""

    require: Callable[[], None]
    write: Callable[[Scene, BinaryIO], None]  # the scene's bytes into an open stream


PAINTERS: dict[str, Painter] = {
    "png": Painter(require_matplotlib, write_png),
    "html": Painter(_nothing_needed, write_html),
}

__all__ = [
    "PAINTERS",
    "AxisMode",
    "Painter",
    "PlotUnavailable",
    "Scene",
    "build_scene",
    "plural",
]
