"""What each fault cost the run: derived from the ledger alone, after the fact.

The question every fault raises next — what did it do to the training data? — answered
per fault: a shard's death (the runtime confirmed it), its condemnation (judged by
silence or a reported streak), a replacement that died while starting, a refit abort,
a stall. For each:

- **rollouts in flight** on its shards and what became of them — re-dispatched,
  dropped, ended the run — as the adapters' windows say (``ShardOutcomes.fates``); a
  window that reported failures without saying their fates makes them **unknown**
  (never zero), with the failures seen as a floor;
- **rollouts served on partial or stale weights** while it lasted, as the engines
  attested them (partial: a cut load's weights; stale: a version older than the last
  completed refit's); successes nobody attested are counted apart, unknown;
- **serving capacity lost**: shard-seconds out of service, from the fault until the
  shard serves again (or until the last event read, while it does not);
- **time to detection** — from the shard's last sign of life (its last successful probe
  or refit) to the fault; for an abort, from the refit's start; for a stall, the idle
  time it declared — and **to re-admission** (None: not re-admitted).

Each fault covers its shards from its first evidence — the first window of the failures
that led into it (reported since the shard's last window of successes alone), or the
first entry of its judgement's evidence — until the shard serves again or the shard's
next fault, so a shard's failures are never counted twice, and the attempts a freeze
broke before its condemnation are its own. Pure: fed each event with the view right
after it (``observe``), it reads no clock; ``finish`` closes what is still open at the
view's last event.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from fleetledger.events.models import (
    OutcomeWindowReported,
    RecordedEvent,
    RefitAborted,
    RefitStarted,
    StallDetected,
    iso_at,
)
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.history import History
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.shard_states import SERVING, Input, ShardState, Transition

__all__ = ["FaultCost", "FaultCosts", "FaultKind", "fault_costs"]

FaultKind = Literal["death", "condemned", "restart_failed", "refit_abort", "stall"]

_KIND_OF_INPUT: dict[Input, FaultKind] = {
    Input.ACTOR_DIED: "death",
    Input.ENGINE_DIED: "death",
    Input.RESTART_FAILED: "restart_failed",
}  # every other way into DEAD is a judgement: condemned

_US = 1_000_000


@dataclass(frozen=True, slots=True)
class FaultCost(JsonForm):
    """One fault and what it cost (``None``: the ledger cannot say — unknown)."""

    JSON_DERIVED = ("at",)

    seq: int
    at_us: int
    kind: FaultKind
    shards: tuple[int, ...]
    what: str  # the rule, reason or declaration that recorded it
    detection_s: float | None
    readmitted_s: float | None  # from the fault until its last shard served again
    out_of_service_s: float  # shard-seconds
    in_flight: int | None  # attempts it broke whose fate the adapters said
    redispatched: int | None
    dropped: int | None
    ended_run: int | None
    failures_seen: int  # infra failures reported on its shards while it lasted
    partial_served: int
    stale_served: int
    unattested: int  # successes nobody attested while it lasted (stale or not: unknown)

    @property
    def at(self) -> str:
        return iso_at(self.at_us)

    @property
    def line(self) -> str:
        """One short line for ``explain RUN``."""
        where = f"shard {self.shards[0]}" if len(self.shards) == 1 else _shards(self.shards)
        head = f"seq {self.seq} {self.kind.replace('_', ' ')} ({where})"
        if self.kind == "stall":
            head = f"seq {self.seq} stall"
        parts = [_in_flight_words(self)]
        if self.shards:
            parts.append(f"{self.out_of_service_s:.1f} shard-s out")
        if self.detection_s is not None:
            parts.append(f"detected in {self.detection_s:.2f} s")
        if self.kind != "stall":
            parts.append(
                "not re-admitted"
                if self.readmitted_s is None
                else f"re-admitted after {self.readmitted_s:.1f} s"
            )
        if self.partial_served or self.stale_served:
            parts.append(f"served {self.partial_served} partial, {self.stale_served} stale")
        return f"{head}: " + ", ".join(parts)


def _shards(shards: tuple[int, ...]) -> str:
    return "no shard" if not shards else "shards " + " ".join(str(s) for s in shards)


def _in_flight_words(c: FaultCost) -> str:
    if c.in_flight is None:
        return f"in flight unknown (≥ {c.failures_seen} failed)"
    if not c.in_flight:
        return "no attempt in flight reported"
    if c.redispatched is None:
        return f"{c.in_flight} in flight (what became of them: unknown)"
    fates = [
        f"{n} {word}"
        for n, word in (
            (c.redispatched, "re-dispatched"),
            (c.dropped, "dropped"),
            (c.ended_run, "ended the run"),
        )
        if n
    ]
    return f"{c.in_flight} in flight ({', '.join(fates)})"


@dataclass(slots=True)
class _Window:
    """One window's facts for one shard."""

    seq: int
    failures: int
    fates: tuple[int, int, int] | None
    partial: int
    stale: int
    unattested: int


@dataclass(slots=True)
class _Span:
    shard: int
    first_seq: int
    at_us: int
    end_seq: int | None = None
    end_us: int | None = None
    back: bool = False  # ended by the shard serving again (not by another fault)


@dataclass(slots=True)
class _Open:
    seq: int
    at_us: int
    kind: FaultKind
    what: str
    detection_s: float | None
    spans: list[_Span] = field(default_factory=list)
    stall_in_flight: int | None = None
    ends_run: bool = False


class FaultCosts:
    """The running account (``observe`` each event, then ``finish``)."""

    def __init__(self) -> None:
        self._faults: list[_Open] = []
        self._open_span: dict[int, tuple[_Open, _Span]] = {}  # shard -> its fault's span
        self._windows: dict[int, list[_Window]] = {}  # shard -> its windows, by seq
        self._refit_at: int | None = None  # when the refit in progress started
        self._abort: _Open | None = None  # the last abort, until the next refit starts
        # shard -> the seq of the first window of its failures since its last window of
        # successes alone (while no fault's span holds it)
        self._failing_since: dict[int, int] = {}

    def observe(
        self, recorded: RecordedEvent, transitions: list[Transition], view: FleetView
    ) -> None:
        """One event, with the transitions it caused and the view right after it."""
        event = recorded.event
        if isinstance(event, OutcomeWindowReported):
            self._window(recorded.seq, event, view)
        elif isinstance(event, RefitStarted):
            self._refit_at, self._abort = recorded.at_us, None
        elif isinstance(event, RefitAborted):
            started = self._refit_at
            detection = None if started is None else (recorded.at_us - started) / _US
            reason = f"refit v{event.weight_version} aborted: {event.reason}"
            self._abort = _Open(recorded.seq, recorded.at_us, "refit_abort", reason, detection)
            self._faults.append(self._abort)
        elif isinstance(event, StallDetected):
            what = f"no progress for {event.idle_s:g} s, action {event.action}"
            fault = _Open(recorded.seq, recorded.at_us, "stall", what, event.idle_s)
            fault.stall_in_flight, fault.ends_run = event.in_flight, event.action == "abort"
            self._faults.append(fault)
        for t in transitions:
            self._transition(t, view)

    def _transition(self, t: Transition, view: FleetView) -> None:
        entering_dead = t.after is ShardState.DEAD and t.before is not ShardState.DEAD
        back = t.after in SERVING and t.before not in SERVING
        failing_since = t.seq
        if entering_dead or back:
            self._close(t.shard, t.seq, t.at_us, back=back)
            failing_since = self._failing_since.pop(t.shard, t.seq)
        if entering_dead:
            last_ok = view.shards[t.shard].last_ok_at_us
            kind = _KIND_OF_INPUT.get(t.input, "condemned")
            detection = None if last_ok is None else max(0, t.at_us - last_ok) / _US
            fault = _Open(t.seq, t.at_us, kind, t.rule, detection)
            self._faults.append(fault)
            self._start(fault, t.shard, min((t.seq, failing_since, *t.evidence)), t.at_us)
        elif t.input is Input.WEIGHTS_PARTIAL and t.after is ShardState.STALE:
            if self._abort is not None and t.shard not in self._open_span:
                self._start(self._abort, t.shard, t.seq, t.at_us)

    def _start(self, fault: _Open, shard: int, first_seq: int, at_us: int) -> None:
        span = _Span(shard, first_seq, at_us)
        fault.spans.append(span)
        self._open_span[shard] = (fault, span)

    def _close(self, shard: int, seq: int, at_us: int, *, back: bool) -> None:
        opened = self._open_span.pop(shard, None)
        if opened is not None:
            span = opened[1]
            span.end_seq, span.end_us, span.back = seq, at_us, back

    def _window(self, seq: int, event: OutcomeWindowReported, view: FleetView) -> None:
        completed = view.weight_version  # the last completed refit's version
        for o in event.outcomes:
            fates = None
            if o.fates is not None:
                fates = (o.fates.redispatched, o.fates.dropped, o.fates.ended_run)
            elif not o.infra_failures:
                fates = (0, 0, 0)  # nothing failed: nothing to say, nothing unknown
            if o.shard not in self._open_span:
                if o.infra_failures:
                    self._failing_since.setdefault(o.shard, seq)
                elif o.successes:
                    self._failing_since.pop(o.shard, None)
            stale = sum(v.count for v in o.versions if v.version < completed)
            self._windows.setdefault(o.shard, []).append(
                _Window(seq, o.infra_failures, fates, o.partial, stale, o.unattested)
            )

    def finish(self, view: FleetView) -> tuple[FaultCost, ...]:
        """Every fault so far, what is still open measured up to the view's last event."""
        return tuple(self._cost(f, view) for f in self._faults)

    def _cost(self, fault: _Open, view: FleetView) -> FaultCost:
        failures = partial = stale = unattested = 0
        fates: list[int] | None = [0, 0, 0]
        out_s = 0.0
        readmitted: float | None = fault.at_us if fault.spans else None
        for span in fault.spans:
            end_seq = view.seq if span.end_seq is None else span.end_seq
            end_us = view.at_us if span.end_us is None else span.end_us
            out_s += max(0, end_us - span.at_us) / _US
            if readmitted is not None:
                readmitted = max(readmitted, end_us) if span.back else None
            windows = self._windows.get(span.shard, [])
            lo = bisect.bisect_left(windows, span.first_seq, key=lambda w: w.seq)
            hi = bisect.bisect_right(windows, end_seq, key=lambda w: w.seq)
            for w in windows[lo:hi]:
                failures += w.failures
                partial += w.partial
                stale += w.stale
                unattested += w.unattested
                if fates is not None and w.fates is not None:
                    fates = [a + b for a, b in zip(fates, w.fates, strict=True)]
                else:
                    fates = None
        if fault.kind == "stall":  # what it declared in flight; ended with the run, or went on
            in_flight = fault.stall_in_flight
            fates = [0, 0, in_flight] if fault.ends_run and in_flight is not None else None
        else:
            in_flight = None if fates is None else sum(fates)
        return FaultCost(
            seq=fault.seq,
            at_us=fault.at_us,
            kind=fault.kind,
            shards=tuple(sorted({s.shard for s in fault.spans})),
            what=fault.what,
            detection_s=fault.detection_s,
            readmitted_s=None if readmitted is None else (readmitted - fault.at_us) / _US,
            out_of_service_s=out_s,
            in_flight=in_flight,
            redispatched=None if fates is None else fates[0],
            dropped=None if fates is None else fates[1],
            ended_run=None if fates is None else fates[2],
            failures_seen=failures,
            partial_served=partial,
            stale_served=stale,
            unattested=unattested,
        )


def fault_costs(events: Iterable[RecordedEvent]) -> tuple[FaultCost, ...]:
    """Every fault of a run's events (from seq 1) and what it cost: what ``explain``
    computes while it replays, for a caller that holds the events."""
    costs = FaultCosts()
    history: History | None = None
    for recorded in events:
        if history is None:
            history = History.start(recorded, costs.observe)[0]
        else:
            history.feed(recorded)
    return () if history is None else costs.finish(history.view)
