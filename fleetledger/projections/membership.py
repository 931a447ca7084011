"""The membership document: what ``fleetledger membership --json`` prints.

Stable keys, documented in ``docs/events.md``; each consumer compares one integer and
reads the rest only when it moved: a router or selector ``epoch`` (the serving set), a
transport ``absent_generation`` (the absent set, hence the rank layout).
"""

from __future__ import annotations

from typing import Any

from fleetledger.events.models import iso_at
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.rank_layout import RankLayoutError, layout_words, shard_ranks_of


def membership_document(view: FleetView) -> dict[str, Any]:
    try:
        layout: dict[str, Any] | None = view.layout().as_dict()
        layout_error = None
    except RankLayoutError as exc:
        layout, layout_error = None, str(exc)
    words = None
    if layout is not None:
        trainers = layout["train_world_size"]
        prefixes = {int(shard): prefix for shard, prefix in layout["shard_prefixes"].items()}
        ranks = shard_ranks_of(prefixes, trainers, layout["workers_per_shard"])
        words = layout_words(layout["world_size"], trainers, ranks)
    exhaustion = view.exhaustion()
    return {
        "run": view.run,
        "seq": view.seq,
        "at": iso_at(view.at_us),
        "epoch": view.epoch,
        "absent_generation": view.absent_generation,
        "serving": list(view.serving),
        "absent": list(view.absent),
        "suspected": list(view.suspected),
        "weight_version": view.weight_version,
        "trainer_version": view.trainer_version,
        "served": view.served.as_json(),
        "counts": view.counts(),
        "shards": {
            str(r.index): {
                "state": r.state.value,
                "weight_version": r.weight_version,
                "restart_attempts": r.restart_attempts,
                "probe_failures": r.probe_failures,
                "reported_failures": r.reported_failures,
                "base_url": r.base_url,
                "since_seq": r.since_seq,
                "since_at": iso_at(r.since_at_us),
                "since_rule": r.since_rule,
            }
            for r in view.shards
        },
        "layout": layout,
        "layout_words": words,
        "layout_error": layout_error,
        "open_refit": None
        if view.open_refit is None
        else {
            "seq": view.open_refit.seq,
            "weight_version": view.open_refit.weight_version,
            "shards": list(view.open_refit.shards),
        },
        "exhausted": None if exhaustion is None else exhaustion.describe(),
        "ended": None
        if view.ended is None
        else {"seq": view.ended.seq, "outcome": view.ended.outcome, "cause": view.ended.cause},
    }
