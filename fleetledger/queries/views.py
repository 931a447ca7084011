"""The view of a run at a seq: the nearest snapshot at or before it, folded forward.

A snapshot is an optimisation, never a source of truth: one whose payload disagrees
with its row (another run's, another seq's) or that cannot be decoded is ignored with
a warning and the fold starts from seq 1, so the answer is always ``fold(log[:seq])``.
"""

from __future__ import annotations

from fleetledger.logs import get_logger
from fleetledger.projections.fleet_view import FleetView, ProjectionError, fold_pages
from fleetledger.projections.snapshot import PROJECTION_VERSION, from_snapshot
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunHead

_log = get_logger("fleetledger.queries")  # structlog is loaded on the first warning


def load_view(
    log: EventLog, run: str, at_seq: int | None = None, *, head: RunHead | None = None
) -> FleetView:
    """The view of ``run`` at ``at_seq`` (default: the head).

    ``head``: the run's head as the caller already read it (a :class:`RunReader`), so
    this costs no lookup of its own.
    """
    last = (head or log.run_head(run)).seq
    if at_seq is not None and not 1 <= at_seq <= last:
        raise ProjectionError(f"run {run!r} has seqs 1..{last}; --at {at_seq} is outside it")
    target = last if at_seq is None else at_seq
    view: FleetView | None = None
    stored = log.load_snapshot(run, PROJECTION_VERSION, at_most_seq=target)
    if stored is not None:
        try:
            view = from_snapshot(stored[1])
            if (view.run, view.seq) != (run, stored[0]):
                raise ProjectionError(
                    f"its payload is of run {view.run!r} seq {view.seq}, stored as seq {stored[0]}"
                )
        except ProjectionError as exc:
            view = None
            _log.warning("snapshot ignored", run=run, seq=stored[0], problem=str(exc))
    # A fold reads what events say, never their ids: one shared event per repeated payload.
    return fold_pages(log.read_pages(run, view.seq if view else 0, target, ids=False), into=view)
