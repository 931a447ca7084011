"""Explanations: why a shard is in its state, and why a run ended or where it stopped.

The ledger already holds every answer to "why did my run die"; this module puts them in
words. From a folded view (a ``FleetView`` at some seq), the history entries of the same
events (``projections.history``) and the events an explanation cites, it builds:

- ``ShardExplanation``: the causal chain that put one shard in its state: the rule that
  fired, the evidence it fired on (seqs, and what each event said), the earlier
  transitions, restart attempts against the budget, weight version, membership and the
  rank layout the transports would build.
- ``RunExplanation``: how the run ended (the recorded cause, and the facts before it that
  end runs: a refit aborted with the device context lost, a refused condemnation, an
  exhausted fleet, a stall, shards lost) or, for a run that has not ended, where progress
  stopped and which refit was open; and every shard that is not HEALTHY, with its reason.

Rules of this file:

- Pure, like every projection: no I/O, no clock. The caller asks ``evidence_needed``
  which events to read, reads them, and passes them in (``evidence``: seq → event, and a
  ``SpanTally`` of the probes between the first and last member of a reported streak,
  from ``tally_span`` over those events or ``ProbeTallies`` counted during the replay).
  So explaining the same events always prints the same words, wherever they are read.
- Every sentence is a fact the ledger holds or a rule of the fold (``shard_states``),
  never a guess. When an event the explanation wants was not supplied, it says so.
- Each explanation has ``.text`` for people and ``.as_dict()`` for ``--json``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    Event,
    FailureCount,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeFailed,
    ProbeSucceeded,
    ProgressReported,
    RecordedEvent,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
    datetime_from_us,
)
from fleetledger.projections.fleet_view import FleetView, ProjectionError
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    RefitEntry,
    RestartEntry,
    StallEntry,
    TransitionEntry,
)
from fleetledger.projections.rank_layout import RankLayoutError
from fleetledger.projections.shard_states import Input, ShardState

# How many transitions / findings ``.text`` lists before it summarises the rest
# (``as_dict`` always carries every one).
TEXT_LIMIT = 12


def iso(at_us: int) -> str:
    """A stamp as people read it: ISO 8601, UTC, microseconds, ``Z``."""
    return datetime_from_us(at_us).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _seqs(seqs: Sequence[int]) -> str:
    if len(seqs) == 1:
        return f"seq {seqs[0]}"
    return "seqs " + ", ".join(str(s) for s in seqs)


def _shards(shards: Sequence[int]) -> str:
    if not shards:
        return "no shard"
    if len(shards) == 1:
        return f"shard {shards[0]}"
    return "shards " + ", ".join(str(s) for s in shards[:-1]) + f" and {shards[-1]}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _progress_counts(committed_groups: int, train_steps: int) -> str:
    """Progress is the pair (committed rollout groups, completed train steps)."""
    return f"{_count(committed_groups, 'committed group')}, {_count(train_steps, 'train step')}"


def _seconds(delta_us: int) -> str:
    return f"{delta_us / 1e6:.1f} s"


# ── what one event says ────────────────────────────────────────────────────────


def _infra_failures_of(event: OutcomeWindowReported, shard: int) -> list[FailureCount]:
    for o in event.outcomes:
        if o.shard == shard:
            return [f for f in o.failures if f.category == "infra"]
    return []


def describe_event(event: Event, shard: int | None = None) -> str:
    """One line saying what ``event`` recorded (about ``shard``, for adapter windows)."""
    if isinstance(event, ProbeSucceeded):
        return f"probe of shard {event.shard} answered"
    if isinstance(event, ProbeFailed):
        detail = f": {event.error}" if event.error else ""
        return f"probe of shard {event.shard} failed ({event.kind}{detail})"
    if isinstance(event, ActorDeathConfirmed):
        return f"actor death of shard {event.shard} confirmed by the runtime: " + (
            event.error or "no detail"
        )
    if isinstance(event, OutcomeWindowReported):
        chosen = [o for o in event.outcomes if shard is None or o.shard == shard]
        if not chosen:
            return f"adapter {event.adapter} reported nothing about shard {shard}"
        parts = []
        for o in chosen:
            failures = ", ".join(f"{f.category} {f.reason} ×{f.count}" for f in o.failures)
            parts.append(
                f"shard {o.shard}: {o.successes} successes"
                + (f", failures: {failures}" if failures else ", no failures")
            )
        return f"adapter {event.adapter} reported " + "; ".join(parts)
    if isinstance(event, RefitStarted):
        return (
            f"refit to weight version {event.weight_version} started over {_shards(event.shards)}"
        )
    if isinstance(event, RefitCompleted):
        return (
            f"refit to weight version {event.weight_version} completed over {_shards(event.shards)}"
        )
    if isinstance(event, RefitAborted):
        lost = " (device context lost)" if event.context_lost else ""
        return f"refit to weight version {event.weight_version} aborted{lost}: {event.reason}"
    if isinstance(event, WeightsMarkedPartial):
        return (
            f"weights marked partial after the refit to weight version {event.weight_version} "
            "aborted"
        )
    if isinstance(event, RestartRequested):
        return f"restart of shard {event.shard} requested"
    if isinstance(event, RestartFailed):
        return f"restart of shard {event.shard} failed: {event.error}"
    if isinstance(event, ReplacementLoaded):
        where = f" at {event.base_url}" if event.base_url else " at the same URL"
        return f"replacement engine for shard {event.shard} loaded{where}"
    if isinstance(event, SilentParticipantCondemned):
        return f"shard {event.shard} condemned as the silent participant: {event.reason}"
    if isinstance(event, ShardRetired):
        return f"shard {event.shard} retired: {event.reason}"
    if isinstance(event, CondemnationRefused):
        return f"condemnation refused (suspected: {_shards(event.suspected)}): {event.reason}"
    if isinstance(event, ProgressReported):
        return (
            f"progress: {_progress_counts(event.committed_groups, event.train_steps)}, "
            f"{event.in_flight} in flight"
        )
    if isinstance(event, StallDetected):
        return (
            f"stall detected: idle {event.idle_s:g} s at "
            f"{_progress_counts(event.committed_groups, event.train_steps)}, "
            f"{event.in_flight} in flight (action {event.action})"
        )
    if isinstance(event, FleetExhausted):
        counts = ", ".join(f"{k} {v}" for k, v in event.counts.items() if v)
        return (
            f"fleet exhausted: {event.serving} serving < min_healthy_shards "
            f"{event.min_healthy_shards} ({counts})"
        )
    if isinstance(event, RunEnded):
        return f"run ended {event.outcome}: {event.cause}"
    if isinstance(event, RunStarted):
        c = event.config
        return (
            f"run started: {c.shard_count} shards × {c.workers_per_shard} workers, "
            f"{c.train_world_size} trainer ranks"
        )
    return event.type


@dataclass(frozen=True, slots=True)
class Cited:
    """One event an explanation rests on; ``at_us`` is None when it was not supplied."""

    seq: int
    at_us: int | None
    what: str

    @classmethod
    def of(cls, seq: int, evidence: Mapping[int, RecordedEvent], shard: int | None) -> Cited:
        recorded = evidence.get(seq)
        if recorded is None:
            return cls(seq, None, "event not read (not supplied to the explanation)")
        return cls(seq, recorded.at_us, describe_event(recorded.event, shard))

    @property
    def line(self) -> str:
        when = "" if self.at_us is None else f" ({iso(self.at_us)})"
        return f"seq {self.seq}{when}: {self.what}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": None if self.at_us is None else iso(self.at_us),
            "what": self.what,
        }


# ── what the caller must read ──────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """The events an explanation cites: read them and pass them in.

    ``seqs`` go into the ``evidence`` mapping; ``span`` (inclusive) is the stretch of the
    run whose probes ``tally_span`` should count for the shard, or None.
    """

    seqs: tuple[int, ...]
    span: tuple[int, int] | None


@dataclass(frozen=True, slots=True)
class SpanTally:
    """Probe results for one shard over an inclusive span of seqs."""

    shard: int
    first_seq: int
    last_seq: int
    probes_ok: int
    probes_failed: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "probes_ok": self.probes_ok,
            "probes_failed": self.probes_failed,
        }


def tally_span(
    events: Iterable[RecordedEvent], shard: int, first_seq: int, last_seq: int
) -> SpanTally:
    """Count ``shard``'s probe results among ``events`` with first_seq ≤ seq ≤ last_seq.

    A wedged engine still answers probes, so this count is what tells a reader that the
    reported streak, not the probes, condemned it. Streams: the span may be long.
    """
    ok = failed = 0
    for recorded in events:
        if not first_seq <= recorded.seq <= last_seq:
            continue
        event = recorded.event
        if isinstance(event, ProbeSucceeded) and event.shard == shard:
            ok += 1
        elif isinstance(event, ProbeFailed) and event.shard == shard:
            failed += 1
    return SpanTally(shard, first_seq, last_seq, ok, failed)


class ProbeTallies:
    """Probe results per shard, counted while the caller streams a run once.

    ``tally_span`` needs the span's events, and a long reported streak's span can be most
    of the run: reading it again costs as much as the replay. Fed the same stream as the
    replay (``replay(tallies.watch(events))``), this remembers the running counts at every
    adapter window that reported an infra failure — the only seqs a reported streak starts
    or ends at — so the tally of such a span is a subtraction.
    """

    def __init__(self) -> None:
        self._ok: dict[int, int] = {}
        self._failed: dict[int, int] = {}
        self._at: dict[int, tuple[dict[int, int], dict[int, int]]] = {}

    def watch(self, events: Iterable[RecordedEvent]) -> Iterator[RecordedEvent]:
        """Yield ``events`` unchanged, counting probes on the way."""
        ok, failed, at = self._ok, self._failed, self._at
        for recorded in events:
            event = recorded.event
            if isinstance(event, ProbeSucceeded):
                ok[event.shard] = ok.get(event.shard, 0) + 1
            elif isinstance(event, ProbeFailed):
                failed[event.shard] = failed.get(event.shard, 0) + 1
            elif isinstance(event, OutcomeWindowReported) and any(
                o.infra_failures for o in event.outcomes
            ):
                at[recorded.seq] = (dict(ok), dict(failed))
            yield recorded

    def span(self, shard: int, first_seq: int, last_seq: int) -> SpanTally:
        """Probe results of ``shard`` between two windows that reported infra failures."""
        for seq in (first_seq, last_seq):
            if seq not in self._at:
                raise ProjectionError(
                    f"no probe count remembered at seq {seq}: only adapter windows that "
                    "reported an infra failure are, and only for the events watched"
                )
        ok0, failed0 = self._at[first_seq]
        ok1, failed1 = self._at[last_seq]
        # Both ends are windows, not probes: the counts between them are the span's.
        return SpanTally(
            shard,
            first_seq,
            last_seq,
            ok1.get(shard, 0) - ok0.get(shard, 0),
            failed1.get(shard, 0) - failed0.get(shard, 0),
        )


def _transitions_of(entries: Sequence[Entry], shard: int) -> list[TransitionEntry]:
    return [e for e in entries if isinstance(e, TransitionEntry) and e.shard == shard]


def _last_abort_before(entries: Sequence[Entry], seq: int) -> RefitEntry | None:
    aborts = [
        e for e in entries if isinstance(e, RefitEntry) and e.outcome == "aborted" and e.seq <= seq
    ]
    return aborts[-1] if aborts else None


def check_shard(view: FleetView, shard: int) -> None:
    """Refuse a shard this run's fleet does not have, naming the valid range."""
    count = len(view.shards)
    if not 0 <= shard < count:
        raise ProjectionError(
            f"run {view.run!r}: shard {shard} is not in this fleet (shards 0..{count - 1})"
        )


def _check_entries(view: FleetView, entries: Sequence[Entry]) -> None:
    """Entries and view must come from the same events, or the words would contradict."""
    if entries and entries[-1].seq > view.seq:
        raise ProjectionError(
            f"run {view.run!r}: history entries reach seq {entries[-1].seq} but the view is at "
            f"seq {view.seq}; replay the same events the view folded"
        )


def evidence_needed(
    view: FleetView, entries: Sequence[Entry], shard: int | None = None
) -> EvidenceRequest:
    """Which events ``explain_shard``/``explain_run`` will cite for this view and shard."""
    _check_entries(view, entries)
    seqs: set[int] = {1}
    if view.open_refit is not None:
        seqs.add(view.open_refit.seq)
    if shard is None:
        if view.progress is not None:
            seqs.add(view.progress.seq)
        return EvidenceRequest(tuple(sorted(seqs)), None)
    check_shard(view, shard)
    chain = _transitions_of(entries, shard)
    span: tuple[int, int] | None = None
    if chain:
        link = chain[-1]
        seqs |= {*link.evidence, link.seq}
        if link.input in (Input.CONDEMNED.value, Input.WEIGHTS_PARTIAL.value):
            abort = _last_abort_before(entries, link.seq)
            if abort is not None:
                seqs.add(abort.seq)
        if link.input == Input.REPORTED_FAILURE.value and link.evidence:
            span = (min(link.evidence), link.seq)
    return EvidenceRequest(tuple(sorted(seqs)), span)


# ── a shard ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class LayoutSummary:
    """The refit communicator the transports would build for this view's absent set."""

    world_size: int | None
    train_world_size: int
    workers_per_shard: int
    shard_ranks: dict[int, tuple[int, ...]]
    error: str | None

    @classmethod
    def of(cls, view: FleetView) -> LayoutSummary:
        c = view.config
        try:
            layout = view.layout()
        except RankLayoutError as exc:
            return cls(None, c.train_world_size, c.workers_per_shard, {}, str(exc))
        ranks = {s: tuple(layout.shard_ranks(s)) for s in layout.survivors}
        return cls(layout.world_size, c.train_world_size, c.workers_per_shard, ranks, None)

    def describe(self) -> str:
        if self.world_size is None:
            return f"no refit communicator can be built ({self.error})"

        def where(ranks: tuple[int, ...]) -> str:
            if len(ranks) == 1:
                return f"rank {ranks[0]}"
            return f"ranks {ranks[0]}–{ranks[-1]}"

        placed = ", ".join(f"shard {s} at {where(r)}" for s, r in self.shard_ranks.items())
        return (
            f"world {self.world_size} = {self.train_world_size} trainer ranks + "
            f"{_count(len(self.shard_ranks), 'shard')} × {self.workers_per_shard}: {placed}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "train_world_size": self.train_world_size,
            "workers_per_shard": self.workers_per_shard,
            "shard_ranks": {str(s): list(r) for s, r in self.shard_ranks.items()},
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class _Why:
    """What the sentence builders read (one shard, one view)."""

    view: FleetView
    shard: int
    link: TransitionEntry
    chain: Sequence[TransitionEntry]
    entries: Sequence[Entry]
    evidence: Mapping[int, RecordedEvent]
    tally: SpanTally | None

    def event(self, seq: int) -> Event | None:
        recorded = self.evidence.get(seq)
        return None if recorded is None else recorded.event

    @property
    def unhealthy(self) -> int:
        return self.view.config.unhealthy_threshold

    @property
    def previous(self) -> TransitionEntry | None:
        """The transition before the one being explained (the link is the chain's last)."""
        return self.chain[-2] if len(self.chain) > 1 else None

    def made_suspect_before(self, seq: int) -> TransitionEntry | None:
        found = [t for t in self.chain if t.after == ShardState.SUSPECT.value and t.seq <= seq]
        return found[-1] if found else None


def _because_reported_failure(w: _Why) -> list[str]:
    seqs = w.link.evidence
    reasons: list[str] = []
    total = 0
    complete = True
    for seq in seqs:
        event = w.event(seq)
        if not isinstance(event, OutcomeWindowReported):
            complete = False
            continue
        for failure in _infra_failures_of(event, w.shard):
            total += failure.count
            if f"infra {failure.reason}" not in reasons:
                reasons.append(f"infra {failure.reason}")
    what = f"{_seqs(seqs)}: {', '.join(reasons)}" if reasons else _seqs(seqs)
    if w.link.after != ShardState.DEAD.value:
        count = f"{total}" if complete else "a"
        return [
            f"adapters reported a failure ({what}): reported streak {count} of "
            f"unhealthy_threshold {w.unhealthy}; a SUSPECT shard still serves, so one blip "
            "costs no traffic"
        ]
    if complete:
        out = [
            f"{total} consecutive reported failures ({what}) ≥ unhealthy_threshold {w.unhealthy}"
        ]
    else:
        out = [f"{w.link.rule} ({what})"]
    t = w.tally
    if t is not None:
        if t.probes_ok:
            out.append(
                f"probes kept succeeding ({t.probes_ok} successful probes in that span), so only "
                "the reported streak could condemn it"
            )
        elif t.probes_failed:
            out.append(
                f"probes failed too ({t.probes_failed} failed probes in that span), but the "
                "reported streak reached the threshold first"
            )
        else:
            out.append(
                "no probe of it was recorded in that span: the reported streak alone condemned it"
            )
    return out


def _because_probe_failed(w: _Why) -> list[str]:
    seqs = w.link.evidence
    kinds: list[str] = []
    for seq in seqs:
        event = w.event(seq)
        if isinstance(event, ProbeFailed):
            kind = f"{event.kind}: {event.error}" if event.error else event.kind
            if kind not in kinds:
                kinds.append(kind)
    what = f"{_seqs(seqs)}: {', '.join(kinds)}" if kinds else _seqs(seqs)
    if w.link.after == ShardState.DEAD.value:
        return [
            f"{len(seqs)} consecutive failed probes ({what}) ≥ unhealthy_threshold {w.unhealthy}",
            "no actor death was confirmed: the probe streak condemned it",
        ]
    return [
        f"a probe failed ({what}): probe streak {len(seqs)} of unhealthy_threshold "
        f"{w.unhealthy}; a SUSPECT shard still serves, so one failed probe costs no traffic"
    ]


def _because_actor_died(w: _Why) -> list[str]:
    event = w.event(w.link.seq)
    error = event.error if isinstance(event, ActorDeathConfirmed) and event.error else None
    detail = f": {error}" if error else ""
    return [
        f"the runtime confirmed its actor is gone (seq {w.link.seq}{detail}); a confirmed death "
        f"is conclusive, so it went {w.link.before} → DEAD at once, without counting failures"
    ]


def _because_condemned(w: _Why) -> list[str]:
    event = w.event(w.link.seq)
    reason = event.reason if isinstance(event, SilentParticipantCondemned) else w.link.rule
    out = [
        f"condemned as the silent participant at seq {w.link.seq} ({reason}): a judgement "
        "after an aborted refit, not an actor death"
    ]
    abort = _last_abort_before(w.entries, w.link.seq)
    if abort is not None:
        out.append(
            f"the refit to weight version {abort.weight_version} over "
            f"{_shards(abort.participants)} aborted at seq {abort.seq} ({abort.reason})"
        )
    previous = w.previous
    if previous is not None and previous.after == ShardState.STALE.value:
        if previous.before == ShardState.SUSPECT.value:
            suspect = w.made_suspect_before(previous.seq)
            since = f" (since seq {suspect.seq}: {suspect.rule})" if suspect else ""
            out.append(f"it was SUSPECT before the abort{since}")
        else:
            out.append(f"it was {previous.before} before the abort")
    return out


def _because_partial(w: _Why) -> list[str]:
    abort = _last_abort_before(w.entries, w.link.seq)
    if abort is not None:
        what = (
            f"the refit to weight version {abort.weight_version} aborted at seq {abort.seq} "
            f"({abort.reason}), and the weights of every shard not absent were marked partial "
            f"at seq {w.link.seq}"
        )
    else:
        what = f"its weights were marked partial at seq {w.link.seq} ({w.link.rule})"
    out = [what]
    if w.link.before == ShardState.SUSPECT.value:
        out.append(
            "it was SUSPECT before the abort, so it counts as a suspect, and a completed refit "
            "returns it to SUSPECT, not HEALTHY"
        )
    return out


def _because_restart_requested(w: _Why) -> list[str]:
    if w.link.after == ShardState.RETIRED.value:
        return [
            f"{w.link.rule}: the restart requested at seq {w.link.seq} was one more than the "
            "budget allows",
            "RETIRED is terminal: nothing moves it again",
        ]
    return [
        f"a restart was requested at seq {w.link.seq} ({w.link.rule}); it serves again only "
        "after a replacement loads (STALE) and a refit that includes it completes"
    ]


def _because_restart_failed(w: _Why) -> list[str]:
    event = w.event(w.link.seq)
    error = event.error if isinstance(event, RestartFailed) else w.link.rule
    r = w.view.shards[w.shard]
    return [
        f"the restart failed at seq {w.link.seq} ({error}); "
        f"{r.restart_attempts} of max_restart_attempts_per_shard "
        f"{w.view.config.max_restart_attempts_per_shard} restart attempts used"
    ]


def _because_loaded(w: _Why) -> list[str]:
    event = w.event(w.link.seq)
    url = event.base_url if isinstance(event, ReplacementLoaded) and event.base_url else None
    where = f" at {url}" if url else ""
    return [
        f"a replacement engine loaded{where} at seq {w.link.seq}; it holds start-up weights, so "
        "it gets no traffic until a refit that includes it completes"
    ]


def _because_refit_completed(w: _Why) -> list[str]:
    if w.link.after == ShardState.SUSPECT.value:
        return [
            f"{w.link.rule} (seq {w.link.seq}); its reported streak was kept",
        ]
    return [
        f"a refit that included it completed at seq {w.link.seq} ({w.link.rule}), replacing "
        "its partial or start-up weights"
    ]


def _because_probe_ok(w: _Why) -> list[str]:
    return [f"probes answered again: {w.link.rule} (at seq {w.link.seq})"]


def _because_retired(w: _Why) -> list[str]:
    event = w.event(w.link.seq)
    reason = event.reason if isinstance(event, ShardRetired) else w.link.rule
    return [f"retired at seq {w.link.seq}: {reason}", "RETIRED is terminal: nothing moves it again"]


# Input of the transition that put the shard in its state → the sentences that explain it.
BECAUSE: dict[str, Callable[[_Why], list[str]]] = {
    Input.REPORTED_FAILURE.value: _because_reported_failure,
    Input.PROBE_FAILED.value: _because_probe_failed,
    Input.ACTOR_DIED.value: _because_actor_died,
    Input.CONDEMNED.value: _because_condemned,
    Input.WEIGHTS_PARTIAL.value: _because_partial,
    Input.RESTART_REQUESTED.value: _because_restart_requested,
    Input.RESTART_FAILED.value: _because_restart_failed,
    Input.REPLACEMENT_LOADED.value: _because_loaded,
    Input.REFIT_COMPLETED.value: _because_refit_completed,
    Input.PROBE_OK.value: _because_probe_ok,
    Input.RETIRE.value: _because_retired,
}


@dataclass(frozen=True)
class ShardExplanation:
    """Why one shard is in its state at one seq of one run."""

    run: str
    seq: int
    at_us: int
    shard: int
    state: str
    since_seq: int
    since_at_us: int | None
    rule: str
    input: str | None  # the input of the transition that put it there; None: never moved
    because: tuple[str, ...]
    evidence: tuple[Cited, ...]
    chain: tuple[TransitionEntry, ...]
    restarts: tuple[RestartEntry, ...]
    decisions: tuple[DecisionEntry, ...]
    restart_attempts: int
    max_restart_attempts: int
    probe_failures: int
    reported_failures: int
    unhealthy_threshold: int
    weight_version: int
    trainer_weight_version: int
    serving: bool
    absent: bool
    suspected: bool
    epoch: int
    serving_set: tuple[int, ...]
    absent_set: tuple[int, ...]
    suspected_set: tuple[int, ...]
    layout: LayoutSummary
    open_refit: RefitEntry | None
    base_url: str
    tally: SpanTally | None

    @property
    def headline(self) -> str:
        return f"shard {self.shard} is {self.state} since seq {self.since_seq}: " + (
            "; ".join(self.because) + "."
        )

    def _membership(self) -> str:
        if self.serving:
            role = "serving: gets traffic and joins the next refit"
        elif self.absent:
            role = "absent: no traffic and no rank in the next refit communicator"
        else:
            role = "not serving but not absent: no traffic, yet it joins the next refit"
        return (
            f"{role}; epoch {self.epoch}, serving {list(self.serving_set)}, absent "
            f"{list(self.absent_set)}, suspected {list(self.suspected_set)}"
        )

    def _restarts(self) -> str:
        line = (
            f"{self.restart_attempts} of max_restart_attempts_per_shard "
            f"{self.max_restart_attempts} used"
        )
        by_action: dict[str, list[int]] = {}
        for r in self.restarts:
            by_action.setdefault(r.action, []).append(r.seq)
        if by_action:
            line += " (" + "; ".join(f"{a} at {_seqs(s)}" for a, s in by_action.items()) + ")"
        return line

    @property
    def text(self) -> str:
        when = "" if self.since_at_us is None else f" ({iso(self.since_at_us)})"
        lines = [
            f"run {self.run}, as of seq {self.seq} ({iso(self.at_us)})",
            self.headline,
            f"rule: {self.rule} — at seq {self.since_seq}{when}",
        ]
        if self.evidence:
            lines.append("evidence:")
            lines += [f"  {c.line}" for c in self.evidence]
        if self.chain:
            shown = self.chain[-TEXT_LIMIT:]
            lines.append(f"how it got here ({_count(len(self.chain), 'transition')}):")
            if len(self.chain) > len(shown):
                lines.append(f"  … {len(self.chain) - len(shown)} earlier (see --json)")
            lines += [
                f"  seq {t.seq} ({iso(t.at_us)}): {t.before} → {t.after} — {t.rule}" for t in shown
            ]
        else:
            lines.append("how it got here: no transition recorded")
        lines += [f"decision: {d.decision} at seq {d.seq}: {d.detail}" for d in self.decisions]
        lines.append(f"restarts: {self._restarts()}")
        lines.append(
            f"streaks: {_count(self.probe_failures, 'failed probe')}, "
            f"{_count(self.reported_failures, 'reported failure')} "
            f"(unhealthy_threshold {self.unhealthy_threshold})"
        )
        behind = (
            ""
            if self.weight_version == self.trainer_weight_version
            else f", behind the trainer's last completed refit at version "
            f"{self.trainer_weight_version}"
        )
        lines.append(f"weights: version {self.weight_version}{behind}")
        if self.open_refit is not None:
            o = self.open_refit
            joined = "includes it" if self.shard in o.participants else "does not include it"
            lines.append(
                f"open refit: weight version {o.weight_version} since seq {o.started_seq} over "
                f"{_shards(o.participants)}; it {joined}"
            )
        lines.append(f"membership: {self._membership()}")
        lines.append(f"layout: {self.layout.describe()}")
        lines.append(f"base URL: {self.base_url}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "shard",
            "run": self.run,
            "seq": self.seq,
            "at": iso(self.at_us),
            "shard": self.shard,
            "state": self.state,
            "since_seq": self.since_seq,
            "since_at": None if self.since_at_us is None else iso(self.since_at_us),
            "rule": self.rule,
            "input": self.input,
            "because": list(self.because),
            "summary": self.headline,
            "evidence": [c.as_dict() for c in self.evidence],
            "chain": [t.as_dict() for t in self.chain],
            "restarts": [r.as_dict() for r in self.restarts],
            "decisions": [d.as_dict() for d in self.decisions],
            "restart_attempts": self.restart_attempts,
            "max_restart_attempts_per_shard": self.max_restart_attempts,
            "probe_failures": self.probe_failures,
            "reported_failures": self.reported_failures,
            "unhealthy_threshold": self.unhealthy_threshold,
            "weight_version": self.weight_version,
            "trainer_weight_version": self.trainer_weight_version,
            "serving": self.serving,
            "absent": self.absent,
            "suspected": self.suspected,
            "epoch": self.epoch,
            "serving_set": list(self.serving_set),
            "absent_set": list(self.absent_set),
            "suspected_set": list(self.suspected_set),
            "layout": self.layout.as_dict(),
            "open_refit": None if self.open_refit is None else self.open_refit.as_dict(),
            "base_url": self.base_url,
            "probe_tally": None if self.tally is None else self.tally.as_dict(),
        }


def _start_at(entries: Sequence[Entry], evidence: Mapping[int, RecordedEvent]) -> int | None:
    if entries and entries[0].seq == 1:
        return entries[0].at_us
    first = evidence.get(1)
    return None if first is None else first.at_us


def _open_refit(
    view: FleetView, entries: Sequence[Entry], evidence: Mapping[int, RecordedEvent]
) -> RefitEntry | None:
    """The refit open at the view's seq: from history when it recorded one, else the view."""
    opened = view.open_refit
    if opened is None:
        return None
    for e in reversed(entries):
        if isinstance(e, RefitEntry) and e.outcome == "open" and e.started_seq == opened.seq:
            return e
    started = evidence.get(opened.seq)
    started_at = view.at_us if started is None else started.at_us
    return RefitEntry(
        view.seq,
        view.at_us,
        opened.seq,
        started_at,
        opened.weight_version,
        opened.shards,
        "open",
        "no completion or abort was recorded",
        False,
    )


def explain_shard(
    view: FleetView,
    entries: Sequence[Entry],
    shard: int,
    evidence: Mapping[int, RecordedEvent],
    tally: SpanTally | None = None,
) -> ShardExplanation:
    """Why ``shard`` is in its state in ``view``; ``entries`` replay the same events."""
    check_shard(view, shard)
    _check_entries(view, entries)
    record = view.shards[shard]
    chain = _transitions_of(entries, shard)
    last_seq = chain[-1].seq if chain else 1
    if last_seq != record.since_seq:
        raise ProjectionError(
            f"run {view.run!r}: shard {shard}'s last transition in the history is at seq "
            f"{last_seq}, but the view says it is {record.state} since seq "
            f"{record.since_seq}; replay the same events the view folded"
        )
    if chain:
        link = chain[-1]
        w = _Why(view, shard, link, chain, entries, evidence, tally)
        because = BECAUSE[link.input](w)
        cited = sorted(set(evidence_needed(view, entries, shard).seqs) - {1})
        since_at: int | None = link.at_us
    else:
        because = [f"it has been {record.state} since the run started; no rule has moved it"]
        cited = []
        since_at = _start_at(entries, evidence)
    state = record.state
    if state is ShardState.STALE:
        opened = view.open_refit
        if opened is not None and shard in opened.shards:
            because.append(
                f"the refit to weight version {opened.weight_version} open since seq "
                f"{opened.seq} includes it"
            )
        else:
            because.append("no open refit includes it: it waits for the next one")
    if state is not ShardState.RETIRED and not any(
        t.after in (ShardState.DEAD.value, ShardState.RETIRED.value) for t in chain
    ):
        because.append("it has never been condemned (no transition to DEAD or RETIRED)")
    for d in entries:
        if (
            isinstance(d, DecisionEntry)
            and d.decision == "condemnation_refused"
            and shard in d.subjects
            and d.seq >= record.since_seq
        ):
            because.append(
                f"condemnation was refused at seq {d.seq}: it was one of the suspects "
                f"({_shards(d.subjects)}), so none was condemned"
            )
    restarts = tuple(e for e in entries if isinstance(e, RestartEntry) and e.shard == shard)
    decisions = tuple(
        e
        for e in entries
        if isinstance(e, DecisionEntry) and shard in e.subjects and e.decision != "weights_partial"
    )
    return ShardExplanation(
        run=view.run,
        seq=view.seq,
        at_us=view.at_us,
        shard=shard,
        state=state.value,
        since_seq=record.since_seq,
        since_at_us=since_at,
        rule=record.since_rule,
        input=chain[-1].input if chain else None,
        because=tuple(because),
        evidence=tuple(Cited.of(seq, evidence, shard) for seq in cited),
        chain=tuple(chain),
        restarts=restarts,
        decisions=decisions,
        restart_attempts=record.restart_attempts,
        max_restart_attempts=view.config.max_restart_attempts_per_shard,
        probe_failures=record.probe_failures,
        reported_failures=record.reported_failures,
        unhealthy_threshold=view.config.unhealthy_threshold,
        weight_version=record.weight_version,
        trainer_weight_version=view.weight_version,
        serving=record.serving,
        absent=record.absent,
        suspected=record.suspected,
        epoch=view.epoch,
        serving_set=view.serving,
        absent_set=view.absent,
        suspected_set=view.suspected,
        layout=LayoutSummary.of(view),
        open_refit=_open_refit(view, entries, evidence),
        base_url=record.base_url,
        tally=tally,
    )


# ── the run ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Finding:
    """A recorded fact of the kind that ends runs, in words."""

    seq: int
    at_us: int
    # context_lost | refit_aborted | shard_lost | condemnation_refused | fleet_exhausted | stall
    kind: str
    text: str
    shards: tuple[int, ...]
    decisive: bool  # the kind that can end a run by itself (not a recovered abort)

    @property
    def line(self) -> str:
        return f"seq {self.seq} ({iso(self.at_us)}): {self.text}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": iso(self.at_us),
            "kind": self.kind,
            "text": self.text,
            "shards": list(self.shards),
            "decisive": self.decisive,
        }


def _refit_finding(e: RefitEntry, entries: Sequence[Entry]) -> Finding:
    if e.context_lost:
        return Finding(
            e.seq,
            e.at_us,
            "context_lost",
            f"refit to weight version {e.weight_version} aborted with the device context lost "
            f"mid-transfer: no rebuild can succeed ({e.reason})",
            e.participants,
            True,
        )
    later = [
        r
        for r in entries
        if isinstance(r, RefitEntry) and r.outcome == "completed" and r.seq > e.seq
    ]
    text = (
        f"refit to weight version {e.weight_version} over {_shards(e.participants)} aborted "
        f"after {_seconds(e.duration_us)}: {e.reason}"
    )
    if later:
        done = later[0]
        text += (
            f"; recovered: the refit to weight version {done.weight_version} over "
            f"{_shards(done.participants)} completed at seq {done.seq}"
        )
    else:
        text += "; no refit completed after it"
    return Finding(e.seq, e.at_us, "refit_aborted", text, e.participants, not later)


def _refusal_finding(e: DecisionEntry) -> Finding:
    suspects = e.subjects
    if not suspects:
        why = "no shard was suspected, so there was nothing to go on"
    elif len(suspects) == 1:
        why = f"the only suspect was {_shards(suspects)}"
    else:
        why = (
            f"{len(suspects)} suspects ({_shards(suspects)}): there is no telling which one "
            "broke the refit, so condemning one would be a guess"
        )
    return Finding(
        e.seq,
        e.at_us,
        "condemnation_refused",
        f"condemnation refused: {why}; recorded reason: {e.detail}",
        suspects,
        True,
    )


def _stall_finding(e: StallEntry) -> Finding:
    text = (
        f"stall detected: no progress for {e.idle_s:g} s at "
        f"{_progress_counts(e.committed_groups, e.train_steps)}, {e.in_flight} in flight "
        f"(action {e.action})"
    )
    if e.in_flight == 0:
        text += (
            "; nothing was in flight, so nothing could fail or time out: only the missing "
            "progress shows the wedge"
        )
    return Finding(e.seq, e.at_us, "stall", text, (), e.action == "abort")


def _findings(view: FleetView, entries: Sequence[Entry]) -> list[Finding]:
    out: list[Finding] = []
    for e in entries:
        if isinstance(e, RefitEntry) and e.outcome == "aborted":
            out.append(_refit_finding(e, entries))
        elif isinstance(e, DecisionEntry) and e.decision == "condemnation_refused":
            out.append(_refusal_finding(e))
        elif isinstance(e, DecisionEntry) and e.decision == "fleet_exhausted":
            out.append(
                Finding(e.seq, e.at_us, "fleet_exhausted", f"fleet exhausted: {e.detail}", (), True)
            )
        elif isinstance(e, StallEntry):
            out.append(_stall_finding(e))
        elif isinstance(e, TransitionEntry) and e.after in (
            ShardState.DEAD.value,
            ShardState.RETIRED.value,
        ):
            now = view.shards[e.shard].state.value
            still = "" if now == e.after else f" (it is {now} now)"
            out.append(
                Finding(
                    e.seq,
                    e.at_us,
                    "shard_lost",
                    f"shard {e.shard} {e.before} → {e.after}: {e.rule}{still}",
                    (e.shard,),
                    False,
                )
            )
    return out


@dataclass(frozen=True, slots=True)
class ProgressSummary:
    seq: int
    at_us: int | None
    committed_groups: int
    train_steps: int
    in_flight: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": None if self.at_us is None else iso(self.at_us),
            "committed_groups": self.committed_groups,
            "train_steps": self.train_steps,
            "in_flight": self.in_flight,
        }


@dataclass(frozen=True, slots=True)
class ShardLine:
    """One shard that is not HEALTHY, with the rule that put it there."""

    shard: int
    state: str
    since_seq: int
    rule: str
    suspected: bool

    @property
    def line(self) -> str:
        note = " (suspected)" if self.suspected and self.state != "SUSPECT" else ""
        return f"shard {self.shard} {self.state}{note} since seq {self.since_seq}: {self.rule}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "state": self.state,
            "since_seq": self.since_seq,
            "rule": self.rule,
            "suspected": self.suspected,
        }


@dataclass(frozen=True)
class RunExplanation:
    """Why a run ended, or where it stands, as of one seq."""

    run: str
    seq: int
    at_us: int
    started_at_us: int | None
    ended: EndEntry | None
    why: Finding | None  # the last decisive finding before the end (or the view's seq)
    findings: tuple[Finding, ...]
    progress: ProgressSummary | None
    stalls: tuple[StallEntry, ...]
    open_refit: RefitEntry | None
    last_completed_refit: RefitEntry | None
    not_healthy: tuple[ShardLine, ...]
    epoch: int
    serving: tuple[int, ...]
    absent: tuple[int, ...]
    suspected: tuple[int, ...]
    trainer_weight_version: int
    layout: LayoutSummary

    @property
    def headline(self) -> str:
        if self.ended is not None:
            e = self.ended
            return f"run {self.run} ended {e.outcome} at seq {e.seq} ({iso(e.at_us)}): {e.cause}"
        return (
            f"run {self.run} has not ended: as of seq {self.seq} ({iso(self.at_us)}) no run_ended "
            "is recorded"
        )

    def _progress(self) -> str:
        p = self.progress
        if p is None:
            return "progress: none was ever reported"
        when = "" if p.at_us is None else f" ({iso(p.at_us)})"
        ago = ""
        if p.at_us is not None and p.seq < self.seq:
            ago = (
                f"; nothing newer in the {self.seq - p.seq} events and "
                f"{_seconds(self.at_us - p.at_us)} up to seq {self.seq}"
            )
        return (
            f"last progress at seq {p.seq}{when}: "
            f"{_progress_counts(p.committed_groups, p.train_steps)}, {p.in_flight} in flight{ago}"
        )

    def _refit(self) -> str:
        o = self.open_refit
        if o is not None:
            return (
                f"refit open: weight version {o.weight_version} over {_shards(o.participants)} "
                f"since seq {o.started_seq} ({iso(o.started_at_us)}), "
                f"{_seconds(self.at_us - o.started_at_us)} before seq {self.seq}; no completion "
                "or abort was recorded"
            )
        done = self.last_completed_refit
        if done is None:
            return "refits: none open, none completed"
        return (
            f"refits: none open; the last completed was weight version {done.weight_version} "
            f"over {_shards(done.participants)} at seq {done.seq}"
        )

    @property
    def text(self) -> str:
        lines = [self.headline]
        if self.ended is not None and self.why is not None:
            lines.append(f"why: {self.why.text} (seq {self.why.seq})")
        if self.findings:
            shown = self.findings[-TEXT_LIMIT:]
            lines.append(f"trouble recorded, in order ({len(self.findings)}):")
            if len(self.findings) > len(shown):
                lines.append(f"  … {len(self.findings) - len(shown)} earlier (see --json)")
            lines += [f"  {f.line}" for f in shown]
        else:
            lines.append(
                "trouble recorded: none (no abort, refusal, exhaustion, stall, lost shard)"
            )
        lines.append(self._progress())
        if self.stalls:
            last = self.stalls[-1]
            lines.append(
                f"stalls: {len(self.stalls)} recorded, the last at seq {last.seq} "
                f"(idle {last.idle_s:g} s, {last.in_flight} in flight, action {last.action})"
            )
        else:
            lines.append("stalls: none recorded")
        lines.append(self._refit())
        lines.append(
            f"fleet: epoch {self.epoch}, serving {list(self.serving)}, absent "
            f"{list(self.absent)}, suspected {list(self.suspected)}; trainer weights at version "
            f"{self.trainer_weight_version}"
        )
        lines.append(f"layout: {self.layout.describe()}")
        if self.not_healthy:
            lines.append("not HEALTHY:")
            lines += [f"  {s.line}" for s in self.not_healthy]
        else:
            lines.append("every shard is HEALTHY")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": "run",
            "run": self.run,
            "seq": self.seq,
            "at": iso(self.at_us),
            "started_at": None if self.started_at_us is None else iso(self.started_at_us),
            "summary": self.headline,
            "ended": None
            if self.ended is None
            else {
                "seq": self.ended.seq,
                "at": iso(self.ended.at_us),
                "outcome": self.ended.outcome,
                "cause": self.ended.cause,
            },
            "why": None if self.why is None else self.why.as_dict(),
            "findings": [f.as_dict() for f in self.findings],
            "progress": None if self.progress is None else self.progress.as_dict(),
            "stalls": [s.as_dict() for s in self.stalls],
            "open_refit": None if self.open_refit is None else self.open_refit.as_dict(),
            "last_completed_refit": None
            if self.last_completed_refit is None
            else self.last_completed_refit.as_dict(),
            "not_healthy": [s.as_dict() for s in self.not_healthy],
            "epoch": self.epoch,
            "serving": list(self.serving),
            "absent": list(self.absent),
            "suspected": list(self.suspected),
            "trainer_weight_version": self.trainer_weight_version,
            "layout": self.layout.as_dict(),
        }


def explain_run(
    view: FleetView, entries: Sequence[Entry], evidence: Mapping[int, RecordedEvent]
) -> RunExplanation:
    """Why the run in ``view`` ended, or where it stands; ``entries`` replay the same events."""
    _check_entries(view, entries)
    findings = _findings(view, entries)
    ended = next((e for e in reversed(entries) if isinstance(e, EndEntry)), None)
    decisive = [f for f in findings if f.decisive]
    progress = None
    if view.progress is not None:
        p = view.progress
        recorded = evidence.get(p.seq)
        progress = ProgressSummary(
            p.seq,
            None if recorded is None else recorded.at_us,
            p.committed_groups,
            p.train_steps,
            p.in_flight,
        )
    completed = [e for e in entries if isinstance(e, RefitEntry) and e.outcome == "completed"]
    return RunExplanation(
        run=view.run,
        seq=view.seq,
        at_us=view.at_us,
        started_at_us=_start_at(entries, evidence),
        ended=ended,
        why=decisive[-1] if decisive else None,
        findings=tuple(findings),
        progress=progress,
        stalls=tuple(e for e in entries if isinstance(e, StallEntry)),
        open_refit=_open_refit(view, entries, evidence),
        last_completed_refit=completed[-1] if completed else None,
        not_healthy=tuple(
            ShardLine(r.index, r.state.value, r.since_seq, r.since_rule, r.suspected)
            for r in view.shards
            if r.state is not ShardState.HEALTHY
        ),
        epoch=view.epoch,
        serving=view.serving,
        absent=view.absent,
        suspected=view.suspected,
        trainer_weight_version=view.weight_version,
        layout=LayoutSummary.of(view),
    )
