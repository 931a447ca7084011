"""What a batch must be before its first row is written: the log's admission rules.

A refused batch leaves the log unchanged, so the rules are checked whole, first:

- a run begins with ``run_started``, and only once;
- nothing follows ``run_ended``, which must be a batch's last event;
- every shard an event names is one of the run's (its configuration says how many);
- every event has an id, and no two events of a batch the same one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fleetledger.events.models import Event, FleetConfig, RunEnded, RunStarted, shards_outside
from fleetledger.store.errors import AppendRejected, RunAlreadyEnded, UnknownRun

# The events whose place in a run is fixed: the first, and the last.
_BOUNDARIES = (RunStarted, RunEnded)


def check_batch(
    run: str,
    batch: Sequence[Event],
    *,
    head: tuple[int, bool] | None,
    config: Callable[[], FleetConfig],
) -> FleetConfig:
    """Refuse ``batch`` for ``run`` (whose head is ``(seq, ended)``, None before it
    starts) with the first rule it breaks; returns the run's configuration."""
    offset = 0
    if head is None:
        first = batch[0]
        if not isinstance(first, RunStarted):
            raise UnknownRun(
                run,
                f"no run {run!r} in this ledger; a run begins with a run_started event "
                f"(got {first.type!r})",
                index=0,
            )
        fleet = first.config
        offset = 1
    else:
        head_seq, ended = head
        if ended:
            raise RunAlreadyEnded(run, head_seq)
        fleet = config()
    count, last = fleet.shard_count, len(batch) - 1
    for index in range(offset, len(batch)):
        event = batch[index]
        if isinstance(event, _BOUNDARIES):  # one check for the two rare kinds
            if isinstance(event, RunStarted):
                raise AppendRejected(run, "the run has already started", index=index)
            if index != last:
                raise AppendRejected(run, "run_ended must be the last event", index=index)
        problem = shards_outside(event.shards_named(), count)  # ``FleetConfig.check_event``
        if problem is not None:
            raise AppendRejected(run, f"{event.type}: {problem}", index=index)
    return fleet


def refuse_ids(run: str, batch: Sequence[Event]) -> None:
    """Refuse the first event of ``batch`` whose id is empty or repeats an earlier one's
    (the log checks the whole batch's ids at C speed first, and calls this to say which)."""
    seen: set[str] = set()
    for index, event in enumerate(batch):
        if not event.id:  # a fold's event (``read_pages(ids=False)``), not a row's
            raise AppendRejected(
                run, f"a {event.type} event without an id cannot be appended", index=index
            )
        if event.id in seen:
            raise AppendRejected(run, f"event id {event.id} appears twice", index=index)
        seen.add(event.id)
