"""A history entry in words: the replay table's row — which shards, what happened, why —
and the tone a reader must not miss (a shard gone DEAD, a refit aborted).

One wording per entry type, in a table (``ENTRY_WORDING``, held to the entry types by a
test), shared by everything that shows entries to a person: ``replay`` and ``watch``
print it, the live page shows it. Pure: the words are a function of the entry and the
run's configuration.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from fleetledger.events.models import FleetConfig
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    EpochEntry,
    RefitEntry,
    RestartEntry,
    StallEntry,
    TransitionEntry,
)
from fleetledger.projections.rank_layout import layout_words, shard_ranks_of
from fleetledger.projections.shard_states import ShardState

# More subjects than this move from the narrow shard column into the detail.
MAX_SHARD_COLUMN = 2

# A row: (shard column, what happened, why / detail, style: rich's words for its tone).
Row = tuple[str, str, str, str]

DECISIONS: dict[str, str] = {
    "weights_partial": "weights partial",
    "condemned": "condemned",
    "retired": "retired",
    "condemnation_refused": "condemnation refused",
    "fleet_exhausted": "fleet exhausted",
}
# The states a reader must not miss in a long table, by the state a shard moved to.
TRANSITION_STYLES: dict[ShardState, str] = {
    ShardState.DEAD: "red",
    ShardState.RETIRED: "bold red",
    ShardState.HEALTHY: "green",
    ShardState.SUSPECT: "yellow",
}
REFIT_STYLES: dict[str, str] = {"aborted": "red", "open": "yellow"}


def _shards(shards: Iterable[int]) -> str:
    return ",".join(str(s) for s in shards)


def _seqs(seqs: Iterable[int]) -> str:
    return ", ".join(str(s) for s in seqs)


def describe_layout(entry: EpochEntry, config: FleetConfig) -> str:
    """The rank layout in the one notation (``rank_layout.layout_words``)."""
    if entry.world_size is None or entry.shard_prefixes is None:
        return f"no rank layout: {entry.layout_error}"
    trainers = config.train_world_size
    ranks = shard_ranks_of(entry.shard_prefixes, trainers, config.workers_per_shard)
    return layout_words(entry.world_size, trainers, ranks)


def _transition_row(entry: TransitionEntry, config: FleetConfig) -> Row:
    return (
        str(entry.shard),
        f"{entry.before} → {entry.after}",
        f"{entry.rule} [evidence: seq {_seqs(entry.evidence)}]",
        TRANSITION_STYLES.get(entry.after, ""),
    )


def _epoch_row(entry: EpochEntry, config: FleetConfig) -> Row:
    return (
        "",
        f"epoch {entry.epoch}" if entry.epoch_moved else "layout",
        f"serving [{_shards(entry.serving)}] · absent [{_shards(entry.absent)}] · "
        + describe_layout(entry, config),
        "bold cyan",
    )


def _refit_row(entry: RefitEntry, config: FleetConfig) -> Row:
    span = f"seq {entry.started_seq}→{entry.seq}, {entry.duration_s:.3f} s"
    detail = f"{span}, shards [{_shards(entry.participants)}]"
    if entry.outcome == "aborted":
        detail += f"; {entry.reason}"
        if entry.context_lost:
            detail += "; device context lost"
    elif entry.outcome == "open":
        detail += f"; still open: {entry.reason}"
    what = f"refit v{entry.weight_version} {entry.outcome}"
    return "", what, detail, REFIT_STYLES.get(entry.outcome, "")


def _restart_row(entry: RestartEntry, config: FleetConfig) -> Row:
    return str(entry.shard), f"restart {entry.action}", entry.detail, ""


def _decision_row(entry: DecisionEntry, config: FleetConfig) -> Row:
    what = DECISIONS.get(entry.decision, entry.decision)
    if len(entry.subjects) <= MAX_SHARD_COLUMN:
        return _shards(entry.subjects), what, entry.detail, "magenta"
    return "", what, f"{entry.detail}; shards [{_shards(entry.subjects)}]", "magenta"


def _stall_row(entry: StallEntry, config: FleetConfig) -> Row:
    return (
        "",
        f"stall ({entry.action})",
        f"idle {entry.idle_s:g} s; committed groups {entry.committed_groups}, "
        f"train steps {entry.train_steps}, in flight {entry.in_flight}",
        "yellow",
    )


def _end_row(entry: EndEntry, config: FleetConfig) -> Row:
    return "", f"run ended ({entry.outcome})", entry.cause, "bold"


# History entry type → the words of its row (a test holds it to ``history.ENTRY_TYPES``).
ENTRY_WORDING: dict[type[Entry], Callable[[Any, FleetConfig], Row]] = {
    TransitionEntry: _transition_row,
    EpochEntry: _epoch_row,
    RefitEntry: _refit_row,
    RestartEntry: _restart_row,
    DecisionEntry: _decision_row,
    StallEntry: _stall_row,
    EndEntry: _end_row,
}


def describe(entry: Entry, config: FleetConfig) -> Row:
    """(shard column, what happened, why / detail, style) for one entry of a run."""
    wording = ENTRY_WORDING.get(type(entry))
    if wording is None:  # an entry type newer than this table: show it raw, not nothing
        return "", entry.kind, json.dumps(entry.as_json()), ""
    return wording(entry, config)
