"""Versioned serialisation of a ``FleetView``: snapshot at seq N + the tail = the full fold.

``PROJECTION_VERSION`` changes whenever the fold's rules or the view's fields change.
A snapshot written by another version is ignored, not trusted: it encodes what other
rules made of the same events, and folding on from it would silently mix the two. (The
log is asked for snapshots of this version only, so an old run's snapshots are skipped
and its view is refolded from seq 1, once, until a snapshot of this version is saved.)

Versions: 1 — the first; 2 — ``absent_generation`` and ``last_absent`` (a version-1
snapshot has neither, and its absent generation could not be recovered from it); 3 — a
shard's ``since_at_us``, the time of the transition that put it in its state; 4 — the
trainer's version and the rollouts by attested weights (``served``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from fleetledger.events.models import Event, FleetConfig, ProbeRound, RecordedEvent
from fleetledger.projections.fleet_view import (
    FleetView,
    OpenRefit,
    Progress,
    ProjectionError,
    RefitAbort,
    Refusal,
    RunEnd,
    fold_pages,
)
from fleetledger.projections.served_weights import ServedWeights
from fleetledger.projections.shard_states import ShardRecord, ShardState

PROJECTION_VERSION = 4

# When a snapshot is due: after this many events, or this many probe results (a round
# of 256 shards is one event and 256 results), whichever comes first. Counting events
# alone let a 256-shard fleet fold 2.5 million results from its nearest snapshot; the
# results bound keeps ``membership --at`` on any run to a short tail of work.
SNAPSHOT_EVERY_EVENTS = 10_000
SNAPSHOT_EVERY_RESULTS = 200_000


def results_in(event: Event) -> int:
    """The fold work an event stands for: a probe round's results, else one."""
    return len(event.shards_named()) if isinstance(event, ProbeRound) else 1


def fold_with_snapshots(
    pages: Iterable[Sequence[RecordedEvent]],
    on_snapshot: Callable[[int, str], None],
    *,
    every_events: int = SNAPSHOT_EVERY_EVENTS,
    every_results: int = SNAPSHOT_EVERY_RESULTS,
) -> FleetView:
    """Fold a run from seq 1, page by page, handing ``on_snapshot(seq, payload)`` the view
    wherever a snapshot is due; returns the final view.

    What a live ``Ledger`` leaves behind as it records, for a run that arrived whole (an
    import): the same cadence, so ``membership --at`` is as fast on either. The caller
    stores the snapshots; this folds and serialises, nothing more.
    """
    view: FleetView | None = None
    for chunk, due in _snapshot_chunks(pages, every_events, every_results):
        view = fold_pages([chunk], into=view)
        if due:
            on_snapshot(view.seq, to_snapshot(view))
    if view is None:
        raise ProjectionError("nothing to fold: a run needs at least its run_started event")
    return view


def _snapshot_chunks(
    pages: Iterable[Sequence[RecordedEvent]], every_events: int, every_results: int
) -> Iterator[tuple[Sequence[RecordedEvent], bool]]:
    """The run's pages cut where a snapshot is due: (events, due after them). The run's
    first event (``run_started``) starts the view and counts toward no cadence."""
    events = results = 0
    first = True
    for page in pages:
        start = 0
        for index, recorded in enumerate(page):
            if first:
                first = False
                continue
            events += 1
            results += results_in(recorded.event)
            if events >= every_events or results >= every_results:
                yield page[start : index + 1], True
                start = index + 1
                events = results = 0
        if start < len(page):
            yield page[start:], False


_SHARD_FIELDS = tuple(ShardRecord.__slots__)  # type: ignore[attr-defined]


def _shard_to_json(r: ShardRecord) -> dict[str, Any]:
    out = {name: getattr(r, name) for name in _SHARD_FIELDS}
    out["state"] = r.state.value
    out["state_before_partial"] = r.state_before_partial and r.state_before_partial.value
    out["probe_evidence"] = list(r.probe_evidence)
    out["reported_evidence"] = list(r.reported_evidence)
    return out


def _shard_from_json(d: dict[str, Any]) -> ShardRecord:
    r = ShardRecord(**{name: d[name] for name in _SHARD_FIELDS})
    r.state = ShardState(d["state"])
    before = d["state_before_partial"]
    r.state_before_partial = ShardState(before) if before else None
    r.probe_evidence = tuple(d["probe_evidence"])
    r.reported_evidence = tuple(d["reported_evidence"])
    return r


def _maybe(cls: type, d: dict[str, Any] | None) -> Any:
    if d is None:
        return None
    for key in ("shards", "suspected"):  # JSON arrays back to the tuples the view holds
        if key in d:
            d = {**d, key: tuple(d[key])}
    return cls(**d)


def _as_dict(obj: Any) -> dict[str, Any] | None:
    if obj is None:
        return None
    return {name: getattr(obj, name) for name in obj.__slots__}


def to_snapshot(view: FleetView) -> str:
    """The view as JSON, tagged with the projection version."""
    return json.dumps(
        {
            "projection_version": PROJECTION_VERSION,
            "run": view.run,
            "config": view.config.model_dump(mode="json"),
            "shards": [_shard_to_json(r) for r in view.shards],
            "seq": view.seq,
            "at_us": view.at_us,
            "epoch": view.epoch,
            "last_serving": sorted(view.last_serving),
            "absent_generation": view.absent_generation,
            "last_absent": sorted(view.last_absent),
            "open_refit": _as_dict(view.open_refit),
            "last_refit_seq": view.last_refit_seq,
            "weight_version": view.weight_version,
            "last_abort": _as_dict(view.last_abort),
            "stalls": view.stalls,
            "last_stall_seq": view.last_stall_seq,
            "exhausted_seq": view.exhausted_seq,
            "progress": _as_dict(view.progress),
            "last_refusal": _as_dict(view.last_refusal),
            "ended": _as_dict(view.ended),
            "trainer_version": view.trainer_version,
            "served": view.served.as_json(),
        },
        separators=(",", ":"),
    )


def from_snapshot(payload: str) -> FleetView:
    """Rebuild a view; raises ``ProjectionError`` for another version or a damaged payload."""
    try:
        d = json.loads(payload)
        if not isinstance(d, dict):
            raise ProjectionError(
                f"snapshot is damaged: expected a JSON object, got {type(d).__name__}"
            )
        version = d.get("projection_version")
        if version != PROJECTION_VERSION:
            raise ProjectionError(
                f"snapshot has projection version {version}, this code folds version "
                f"{PROJECTION_VERSION}"
            )
        return FleetView(
            run=d["run"],
            config=FleetConfig.model_validate(d["config"]),
            shards=[_shard_from_json(s) for s in d["shards"]],
            seq=d["seq"],
            at_us=d["at_us"],
            epoch=d["epoch"],
            last_serving=frozenset(d["last_serving"]),
            absent_generation=d["absent_generation"],
            last_absent=frozenset(d["last_absent"]),
            open_refit=_maybe(OpenRefit, d["open_refit"]),
            last_refit_seq=d["last_refit_seq"],
            weight_version=d["weight_version"],
            last_abort=_maybe(RefitAbort, d["last_abort"]),
            stalls=d["stalls"],
            last_stall_seq=d["last_stall_seq"],
            exhausted_seq=d["exhausted_seq"],
            progress=_maybe(Progress, d["progress"]),
            last_refusal=_maybe(Refusal, d["last_refusal"]),
            ended=_maybe(RunEnd, d["ended"]),
            trainer_version=d["trainer_version"],
            served=ServedWeights.from_json(d["served"]),
        )
    except ProjectionError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise ProjectionError(f"snapshot is damaged: {exc}") from None
