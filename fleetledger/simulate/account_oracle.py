"""The loop's own account held against the ledger: what each fault cost, and how long a
request through the router waited on a shard that had left.

- **Each fault's cost equals what the loop counted.** For a death a fault explains, the
  attempts the loop saw fail on that shard from the fault's injection (or an earlier
  fault on the same incarnation that no success followed) until the shard serves again
  or dies again, and what became of each — re-dispatched, dropped, ended the run — must
  be what :func:`~fleetledger.projections.fault_cost.fault_costs` derives from the
  ledger alone. And per shard, every success and every fate the loop counted is in the
  ledger's windows, once. Judged on runs that completed: a run ended by its controller
  refuses the windows that come after its end, as it should.
- **No request waits on a shard that left past one router poll.** A request the router
  ended because its shard left (re-sent, or a 503 naming it), or one that failed on a
  shard, ends within :data:`LEFT_WAIT_BOUND_S` of the ledger recording that shard out of
  serving (or of its own start, where it was sent there after); no request through the
  router waits until the loop's generation deadline.

Pure: a function of the trial's events, its injections and the loop's account.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from fleetledger.events.models import OutcomeWindowReported, RecordedEvent
from fleetledger.projections.fault_cost import FaultCost, fault_costs
from fleetledger.simulate.account import RoutedWait, Tally

__all__ = ["LEFT_WAIT_BOUND_S", "Death", "Leave", "cost_problems", "wait_problems"]

LEFT_WAIT_BOUND_S = 2.0
"""A request on a shard the ledger records leaving ends within this: the router's poll
(0.25 s) and its read of the tail, a re-sent generation (0.2 s), and the machine's margin
(2 cores, shared). What it tells apart: a client held until its 5 s generation deadline."""

_US = 1_000_000
_FATES = ("redispatched", "dropped", "ended_run")


@dataclass(frozen=True, slots=True)
class Death:
    """A shard's death that a fault explains: the fault's injection moment, the
    incarnation it hit, and where the ledger recorded the death."""

    shard: int
    incarnation: int
    seq: int
    at_us: int
    injected_us: int


@dataclass(frozen=True, slots=True)
class Leave:
    """A shard out of serving from ``at_us`` until ``back_us`` (``None``: to the end)."""

    shard: int
    at_us: int
    back_us: int | None


def cost_problems(
    events: Sequence[RecordedEvent],
    deaths: Sequence[Death],
    leaves: Sequence[Leave],
    tallies: Sequence[Tally],
    earlier_hits: dict[tuple[int, int], list[int]],
    adapter: str,
) -> list[str]:
    """Each explained death's cost against the loop's count; each shard's totals.
    ``earlier_hits``: (shard, incarnation) -> the injection moments of every fault on it."""
    problems: list[str] = []
    costs: dict[tuple[int, int], FaultCost] = {
        (c.seq, shard): c for c in fault_costs(events) for shard in c.shards
    }
    for death in deaths:
        cost = costs.get((death.seq, death.shard))
        if cost is None:
            problems.append(
                f"cost: shard {death.shard}'s death at seq {death.seq} has no fault in the "
                "cost report"
            )
            continue
        start = _since(death, earlier_hits, tallies)
        end = _until(death, deaths, leaves)
        seen = Counter(
            t.seen
            for t in tallies
            if t.shard == death.shard and start <= t.at_us < end and t.seen != "success"
        )
        counted = (sum(seen.values()), *(seen[f] for f in _FATES))
        derived = (cost.in_flight, cost.redispatched, cost.dropped, cost.ended_run)
        if counted != derived:
            problems.append(
                f"cost: shard {death.shard}'s {cost.kind} at seq {death.seq}: the ledger says "
                f"{_said(derived)}, the loop counted {_said(counted)}"
            )
    problems += _totals(events, tallies, adapter)
    return problems


def _said(counts: tuple[int | None, ...]) -> str:
    in_flight, redispatched, dropped, ended = counts
    if in_flight is None:
        return "in flight unknown"
    return f"{in_flight} in flight ({redispatched} re-dispatched, {dropped} dropped, {ended} ended)"


def _since(
    death: Death, earlier_hits: dict[tuple[int, int], list[int]], tallies: Sequence[Tally]
) -> int:
    """From the fault's injection, or from an earlier fault on the same incarnation when
    the loop saw no success on the shard in between (the ledger cannot tell the two
    apart: failures that led into a death are its own)."""
    start = death.injected_us
    for hit in sorted(earlier_hits.get((death.shard, death.incarnation), ()), reverse=True):
        if hit >= start:
            continue
        succeeded = any(
            t.shard == death.shard and t.seen == "success" and hit <= t.at_us < start
            for t in tallies
        )
        if succeeded:
            break
        start = hit
    return start


def _until(death: Death, deaths: Sequence[Death], leaves: Sequence[Leave]) -> float:
    """Until the shard serves again, or dies again (its next death is another fault's)."""
    ends: list[float] = [
        other.at_us for other in deaths if other.shard == death.shard and other.seq > death.seq
    ]
    ends += [
        leave.back_us
        for leave in leaves
        if leave.shard == death.shard and leave.back_us is not None and leave.back_us > death.at_us
    ]
    return min(ends, default=float("inf"))


def _totals(events: Sequence[RecordedEvent], tallies: Sequence[Tally], adapter: str) -> list[str]:
    """Per shard, the loop's successes and fates against its windows in the ledger."""
    ledger: Counter[tuple[int, str]] = Counter()
    for recorded in events:
        event = recorded.event
        if not isinstance(event, OutcomeWindowReported) or event.adapter != adapter:
            continue
        for o in event.outcomes:
            ledger[o.shard, "success"] += o.successes
            if o.fates is not None:
                for fate in _FATES:
                    ledger[o.shard, fate] += getattr(o.fates, fate)
    loop = Counter((t.shard, t.seen) for t in tallies)
    return [
        f"windows: shard {shard} {seen}: the ledger has {ledger[shard, seen]}, "
        f"the loop counted {loop[shard, seen]}"
        for shard, seen in sorted(set(loop) | {k for k, n in ledger.items() if n})
        if ledger[shard, seen] != loop[shard, seen]
    ]


def wait_problems(
    waits: Sequence[RoutedWait], leaves: Sequence[Leave]
) -> tuple[list[str], list[float]]:
    """Every request through the router against the moments its shard was out; the
    problems, and how long each request on a shard that left waited past its leaving."""
    problems: list[str] = []
    pasts: list[float] = []
    for wait in waits:
        took = (wait.ended_us - wait.started_us) / _US
        if wait.ended == "deadline":
            gone = sorted({leave.shard for leave in leaves if _overlaps(leave, wait)})
            problems.append(
                f"a request through the router waited {took:.2f}s, to its deadline"
                + (f", while shard(s) {gone} left the fleet" if gone else "")
            )
            continue
        shard = wait.resent_from if wait.resent_from is not None else wait.shard
        if shard is None or (wait.ended == "answered" and wait.resent_from is None):
            continue  # answered by the shard it was sent to: it waited on no leaver
        out = [leave for leave in leaves if leave.shard == shard and _overlaps(leave, wait)]
        if not out:
            if wait.ended == "shard_left" or wait.resent_from is not None:
                problems.append(
                    f"the router ended a request on shard {shard} as left, and the ledger "
                    f"has it serving from {wait.started_us} to {wait.ended_us}"
                )
            continue
        left_us = max(out[0].at_us, wait.started_us)
        past = max(0.0, (wait.ended_us - left_us) / _US)
        pasts.append(past)
        if past > LEFT_WAIT_BOUND_S:
            problems.append(
                f"a request waited {past:.2f}s on shard {shard} after it left the fleet "
                f"(bound {LEFT_WAIT_BOUND_S:g}s; it ended {wait.ended})"
            )
    return problems, pasts


def _overlaps(leave: Leave, wait: RoutedWait) -> bool:
    back = leave.back_us if leave.back_us is not None else float("inf")
    return leave.at_us <= wait.ended_us and back >= wait.started_us
