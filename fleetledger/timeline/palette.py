"""How each mark of a timeline looks and what it means: the one source of both legends.

The PNG and the HTML of one run must read alike, so colours, the decisions that get a
marker, and the legend's wording live here once, and reach the painters only through
the scene (:mod:`fleetledger.timeline.scene`). A painter may add chrome of its own
(grid lines, outlines, fonts) but never a colour that carries meaning.

The legend lists every kind of mark whether or not a run has one, so a reader learns it
once and it reads the same for every run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleetledger.projections.lanes import Lanes
from fleetledger.projections.shard_states import ShardState

# A shape both painters know how to draw, in the picture and in the legend alike.
Glyph = Literal[
    "band",
    "refit-completed",
    "refit-aborted",
    "refit-open",
    "epoch",
    "condemned",
    "refused",
    "stall",
    "exhausted",
    "end",
]

# One colour per state, distinguishable in print and by most colour-blind readers:
# the two alarming states are the warm ones, the recovering ones cool, the terminal grey.
STATE_COLOURS: dict[ShardState, str] = {
    ShardState.HEALTHY: "#2f9e44",
    ShardState.SUSPECT: "#f59f00",
    ShardState.STALE: "#4c8ee8",
    ShardState.DEAD: "#d63031",
    ShardState.RESTARTING: "#8e5bd0",
    ShardState.RETIRED: "#8d8d8d",
}
STATE_MEANING: dict[ShardState, str] = {
    ShardState.HEALTHY: "serving, current weights",
    ShardState.SUSPECT: "serving, failing",
    ShardState.STALE: "alive, old or partial weights",
    ShardState.DEAD: "absent, quarantined",
    ShardState.RESTARTING: "absent, replacement coming up",
    ShardState.RETIRED: "absent for good",
}


@dataclass(frozen=True, slots=True)
class RefitLook:
    glyph: Glyph
    colour: str  # the bar's fill
    ink: str  # its outline and its label
    label: str
    meaning: str


REFIT_LOOKS: dict[str, RefitLook] = {
    "completed": RefitLook(
        "refit-completed", "#37474f", "#37474f", "refit completed", "new weights everywhere"
    ),
    "aborted": RefitLook(
        "refit-aborted", "#d63031", "#7f1d1d", "refit aborted (✕)", "red tick where it died"
    ),
    "open": RefitLook("refit-open", "#ffffff", "#37474f", "refit open", "never ended in the log"),
}
ABORTED_MARK = " ✕"  # after an aborted refit's label, as the legend says
EPOCH_COLOUR = "#5f6b7a"
OUTCOME_COLOURS = {"completed": "#2f9e44", "failed": "#d63031", "aborted": "#e67700"}
NOT_ENDED_COLOUR = "#5f6b7a"
STALL_COLOURS = {"abort": "#d63031", "warn": "#e67700"}
STALL_MEANING = {"abort": "training idle, run aborted", "warn": "training idle, warned"}


@dataclass(frozen=True, slots=True)
class MarkedDecision:
    """How one kind of decision is marked."""

    glyph: Glyph
    colour: str
    label: str  # in the legend
    meaning: str  # in the legend
    tip: str  # in the mark's tooltip, before the decision's detail
    on_subjects: bool  # a mark on each subject's lane; else one in the refits row


# Decisions a state colour alone does not show: a condemnation looks like any other death
# in colour; a refusal and an exhaustion change no state at all. Retirements and partial
# weights are their own colours, so they are not in the table and get no marker.
MARKED_DECISIONS: dict[str, MarkedDecision] = {
    "condemned": MarkedDecision(
        "condemned",
        "#000000",
        label="condemned",
        meaning="silent participant",
        tip="condemned as silent participant",
        on_subjects=True,
    ),
    "condemnation_refused": MarkedDecision(
        "refused",
        "#ffffff",
        label="condemnation refused",
        meaning="no single suspect",
        tip="condemnation refused",
        on_subjects=True,
    ),
    "fleet_exhausted": MarkedDecision(
        "exhausted",
        "#d63031",
        label="fleet exhausted",
        meaning="below min_healthy_shards",
        tip="fleet exhausted",
        on_subjects=False,
    ),
}


@dataclass(frozen=True, slots=True)
class LegendItem:
    glyph: Glyph
    colour: str
    label: str
    meaning: str
    ink: str = "#000000"  # outline, where the glyph has one

    @property
    def text(self) -> str:
        return f"{self.label} ({self.meaning})" if self.meaning else self.label


def end_colour(lanes: Lanes) -> str:
    """The outcome's colour; grey for a run that never recorded its end."""
    if lanes.end is None:
        return NOT_ENDED_COLOUR
    return OUTCOME_COLOURS.get(lanes.end.outcome, NOT_ENDED_COLOUR)


def stall_colour(action: str) -> str:
    return STALL_COLOURS.get(action, STALL_COLOURS["warn"])


def legend(end: str) -> tuple[LegendItem, ...]:
    """Every kind of mark, in drawing order; ``end`` is this run's end-line colour."""
    states = [LegendItem("band", c, s.lower(), STATE_MEANING[s]) for s, c in STATE_COLOURS.items()]
    refits = [
        LegendItem(r.glyph, r.colour, r.label, r.meaning, r.ink) for r in REFIT_LOOKS.values()
    ]
    epoch = LegendItem("epoch", EPOCH_COLOUR, "epoch change (e#)", "membership changed")
    decisions = [
        LegendItem(d.glyph, d.colour, d.label, d.meaning) for d in MARKED_DECISIONS.values()
    ]
    stalls = [
        LegendItem("stall", c, f"stall ({a})", STALL_MEANING[a]) for a, c in STALL_COLOURS.items()
    ]
    the_end = LegendItem("end", end, "end", "last event, outcome's colour")
    return (*states, *refits, epoch, *decisions, *stalls, the_end)
