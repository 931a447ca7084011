"""The ingest facade: one method per kind of report, each appended before it has effect.

Append, then apply: every call appends its events to the durable log and then folds
into the in-memory view exactly what the log holds after ``view.seq`` — the events it
accepted and any that other processes (a router, an adapter in another actor)
appended to the same run meanwhile. So ``ledger.view == fold(log up to view.seq)``
always holds, and a test pins it. A decision that is not in the log cannot be
explained by a replay, so decisions go through here too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import structlog

from fleetledger.adapters.late_reports import LateReports
from fleetledger.events.errors import LedgerError
from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    DeathOf,
    Event,
    FleetConfig,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeDeath,
    ProbeFailure,
    ProbeRound,
    ProgressReported,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunProgress,
    RunStarted,
    ShardOutcomes,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
    clip_text,
)
from fleetledger.projections.decisions import decide_exhaustion
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.shard_states import ShardState, Transition
from fleetledger.projections.snapshot import (
    PROJECTION_VERSION,
    SNAPSHOT_EVERY_EVENTS,
    SNAPSHOT_EVERY_RESULTS,
    results_in,
    to_snapshot,
)
from fleetledger.queries.tail import Tail
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog

DEFAULT_SNAPSHOT_EVERY = SNAPSHOT_EVERY_EVENTS

_log = structlog.get_logger("fleetledger.ledger")


@dataclass(frozen=True)
class ProbeResult:
    """What one probe of one shard returned; ``incarnation``: of the handle it went
    through (``None``: not known), so a result about a replaced actor can be dropped.

    ``what``: whose death a "died" result is: the actor's (the runtime said its process
    is gone) or the engine's under a live actor (it raised ``EngineDead``); recorded as
    the round's :class:`ProbeDeath` ``what``, so an explanation never calls an engine's
    death the actor's.
    """

    kind: Literal["ok", "timeout", "error", "died"]
    error: str = ""
    incarnation: int | None = field(default=None, compare=False)
    what: DeathOf = "actor"
    deep: bool = False  # a deep probe's (it asked the engine for a token)

    @classmethod
    def ok(cls, incarnation: int | None = None) -> ProbeResult:
        return cls("ok", incarnation=incarnation)


def round_event(results: Mapping[int, ProbeResult]) -> ProbeRound:
    """A probe round's results as the one event that records them, in shard order."""
    ok: list[int] = []
    failed: list[ProbeFailure] = []
    died: list[ProbeDeath] = []
    for shard in sorted(results):
        result = results[shard]
        if result.kind == "ok":
            ok.append(shard)
        elif result.kind == "died":
            died.append(ProbeDeath(shard=shard, what=result.what, **ProbeDeath.said(result.error)))
        else:
            failed.append(
                ProbeFailure(
                    shard=shard,
                    kind=result.kind,
                    deep=result.deep,
                    **ProbeFailure.said(result.error),
                )
            )
    return ProbeRound(ok=tuple(ok), failed=tuple(failed), died=tuple(died))


@dataclass(frozen=True, slots=True)
class Membership:
    """A consistent read of the live view for other threads (selector, metrics, pumps).

    The view is folded in place under the ledger's lock; a reader in another thread that
    walked it mid-batch could see half a probe round. This copy is rebuilt under the lock
    after every fold that applied something and swapped in whole.
    """

    seq: int
    epoch: int  # moves with the serving set: what a router or selector compares
    absent_generation: int  # moves with the absent set (the rank layout): what transports compare
    serving: tuple[int, ...]
    absent: tuple[int, ...]
    suspected: tuple[int, ...]
    states: tuple[str, ...]
    weight_versions: tuple[int, ...]
    restart_attempts: tuple[int, ...]
    ended: bool
    # Per shard: deaths reported for it while it was already absent, counted by this
    # ledger instead of recorded (see ``Ledger.actor_died``). Not in the log: a count of
    # this process, as a rollout counter is.
    collapsed_deaths: tuple[int, ...] = ()

    @classmethod
    def of(cls, view: FleetView, collapsed_deaths: Mapping[int, int] | None = None) -> Membership:
        collapsed = collapsed_deaths or {}
        return cls(
            seq=view.seq,
            epoch=view.epoch,
            absent_generation=view.absent_generation,
            serving=view.serving,
            absent=view.absent,
            suspected=view.suspected,
            states=tuple(r.state.value for r in view.shards),
            weight_versions=tuple(r.weight_version for r in view.shards),
            restart_attempts=tuple(r.restart_attempts for r in view.shards),
            ended=view.ended is not None,
            collapsed_deaths=tuple(collapsed.get(r.index, 0) for r in view.shards),
        )

    def counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in ShardState}
        for state in self.states:
            counts[state] += 1
        return counts


class Ledger:
    """A run's ledger in one process: the log, the run id and the live view."""

    def __init__(
        self,
        log: EventLog,
        run: str,
        view: FleetView,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self.log = log
        self.run = run
        self._view = view
        self._tail = Tail(log, run, view)
        self._snapshot_every = snapshot_every
        self._snapshot_seq = view.seq
        self._results_since_snapshot = 0  # probe results folded since (see results_in)
        self._lock = threading.RLock()
        self._collapsed: dict[int, int] = {}  # shard → deaths counted, not recorded
        # (shard, incarnation) → reports dropped as stale: said once, counted after
        self._stale_dropped: dict[tuple[int, int], int] = {}
        self.late_reports = LateReports(run)  # reports that met the run's end
        # Where the training loop stands, recorded in ``run_ended`` (``end_run``).
        self.progress_source: Callable[[], RunProgress | None] | None = None
        self._membership = Membership.of(view)

    # ── lifecycle ───────────────────────────────────────────────────────────

    @classmethod
    def start(
        cls,
        log: EventLog,
        run: str,
        config: FleetConfig,
        *,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
    ) -> Ledger:
        """Start a new run; its configuration is its first event."""
        log.append(run, [RunStarted(config=config)])
        ledger = cls(log, run, fold(log.read(run, 0, 1)), snapshot_every=snapshot_every)
        ledger.catch_up()
        return ledger

    @classmethod
    def resume(
        cls, log: EventLog, run: str, *, snapshot_every: int = DEFAULT_SNAPSHOT_EVERY
    ) -> Ledger:
        """Pick a run up in a new process: snapshot + tail, so epoch and states survive."""
        return cls(log, run, load_view(log, run), snapshot_every=snapshot_every)

    @property
    def view(self) -> FleetView:
        """The live view. Folded in place: read it from the thread that records, or hold
        :attr:`lock`; other threads read :attr:`membership`."""
        return self._view

    @property
    def membership(self) -> Membership:
        """A consistent copy of serving/absent/states, safe to read from any thread."""
        return self._membership

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    @property
    def collapsed_deaths(self) -> dict[int, int]:
        """Per shard, the deaths reported while it was already absent: counted, not
        recorded (:meth:`actor_died`). A copy; this process's count, from zero."""
        with self._lock:
            return dict(self._collapsed)

    # ── the one way in ──────────────────────────────────────────────────────

    def record(self, events: Sequence[Event]) -> list[Transition]:
        """Append ``events`` in one transaction, then fold the log's tail into the view."""
        with self._lock:
            self.log.append(self.run, events)
            try:
                return self.catch_up()
            except LedgerError as exc:
                # The events are committed: raising would invite a retry that records them
                # again under fresh ids. The view stays a fold of a log prefix and catches
                # up on the next call.
                _log.warning(
                    "events recorded; the view will catch up later",
                    run=self.run,
                    view_seq=self._view.seq,
                    problem=str(exc),
                )
                return []

    def catch_up(self) -> list[Transition]:
        """Fold whatever the log holds after ``view.seq``; returns the state changes."""
        with self._lock:
            transitions: list[Transition] = []
            before = self._view.seq
            try:
                for recorded in self._tail.new():
                    transitions += self._view.apply(recorded)
                    self._results_since_snapshot += results_in(recorded.event)
            finally:  # pages applied before a failing one count too
                if self._view.seq != before:
                    self._membership = Membership.of(self._view, self._collapsed)
            for t in transitions:
                _log.info(
                    "shard transition",
                    run=self.run,
                    seq=t.seq,
                    shard=t.shard,
                    before=t.before.value,
                    after=t.after.value,
                    rule=t.rule,
                    evidence=list(t.evidence),
                    epoch=self._view.epoch,
                )
            if (
                self._view.seq - self._snapshot_seq >= self._snapshot_every
                or self._results_since_snapshot >= SNAPSHOT_EVERY_RESULTS
            ):
                try:
                    self.save_snapshot()
                except LedgerError as exc:  # a snapshot is an optimisation: never fail for it
                    _log.warning("snapshot not saved", run=self.run, problem=str(exc))
            return transitions

    def save_snapshot(self) -> int:
        with self._lock:
            self.log.save_snapshot(
                self.run, PROJECTION_VERSION, self._view.seq, to_snapshot(self._view)
            )
            self._snapshot_seq = self._view.seq
            self._results_since_snapshot = 0
            return self._snapshot_seq

    # ── reports ─────────────────────────────────────────────────────────────

    def record_probes(self, results: Mapping[int, ProbeResult]) -> list[Transition]:
        """A whole probe round, as one ``probe_round`` event (its results in shard order);
        a result obtained through a replaced actor's handle (an older incarnation) is
        dropped, with a log line."""
        with self._lock:
            if any(r.incarnation is not None for r in results.values()):
                self.catch_up()  # a restart recorded elsewhere moves the incarnation too
            fresh = {
                shard: result
                for shard, result in results.items()
                if not self._stale(shard, result.incarnation, f"probe {result.kind}")
            }
            if not fresh:
                return []
            return self.record([round_event(fresh)])

    def actor_died(
        self,
        shard: int,
        error: str,
        *,
        incarnation: int | None = None,
        what: DeathOf = "actor",
    ) -> list[Transition]:
        """The runtime said the shard's process is gone (seen outside a probe, e.g. by a
        rollout whose call raised ``ActorDiedError``), or, with ``what="engine"``, its
        engine died under a live actor and said so: conclusive, no counting.

        ``incarnation``: of the handle the death was seen through
        (``runtime_deaths.actor_death_of(exc).incarnation``). One older than the shard's
        restart count is a replaced actor's death: it is not about the replacement, so
        it is dropped (logged, nothing recorded). ``None`` records it unchecked.

        One death per incarnation: a shard that is already absent (DEAD, RESTARTING,
        RETIRED) after catching up has had its death recorded (or was taken out another
        way), and the fold ignores another. So a report for it is counted
        (:attr:`collapsed_deaths`, one debug line), not appended: one SIGKILL of a
        serving actor fails every rollout in flight on it, and each used to append its
        own ``actor_death_confirmed`` with Ray's kilobyte of text.
        """
        with self._lock:
            self.catch_up()  # a restart or a death recorded elsewhere counts too
            if self._stale(shard, incarnation, f"{what} death"):
                return []
            if self._already_absent(shard, incarnation, what):
                return []
            event = ActorDeathConfirmed(shard=shard, what=what, **ActorDeathConfirmed.said(error))
            return self.record([event])

    def _already_absent(self, shard: int, incarnation: int | None, what: DeathOf) -> bool:
        """True, and the death counted, when ``shard`` is already absent in the view."""
        if not 0 <= shard < len(self._view.shards):
            return False  # out of range: the log refuses it, naming the shard
        record = self._view.shards[shard]
        if not record.absent:
            return False
        count = self._collapsed[shard] = self._collapsed.get(shard, 0) + 1
        self._membership = Membership.of(self._view, self._collapsed)
        _log.debug(
            "death not recorded: the shard is already absent",
            run=self.run,
            shard=shard,
            state=record.state.value,
            since_seq=record.since_seq,
            what=what,
            incarnation=incarnation,
            collapsed=count,
        )
        return True

    def _stale(self, shard: int, incarnation: int | None, what: str) -> bool:
        """True when ``incarnation`` predates the shard's last recorded restart."""
        if incarnation is None or not 0 <= shard < len(self._view.shards):
            return False  # unknown: recorded as before; out of range: the log refuses it
        current = self._view.shards[shard].restart_attempts
        if incarnation >= current:
            return False
        # One SIGKILL fails every rollout in flight on the actor, and each reports the
        # death after the restart: one warning per replaced actor, the rest at debug.
        seen = self._stale_dropped.get((shard, incarnation), 0)
        self._stale_dropped[(shard, incarnation)] = seen + 1
        (_log.debug if seen else _log.warning)(
            "stale report dropped: seen through a replaced actor",
            run=self.run,
            shard=shard,
            report=what,
            incarnation=incarnation,
            current_incarnation=current,
            dropped=seen + 1,
        )
        return True

    @property
    def stale_dropped(self) -> dict[tuple[int, int], int]:
        """Per (shard, incarnation), the reports dropped because a restart replaced that
        actor since (this process's count): warned of once each, counted here."""
        with self._lock:
            return dict(self._stale_dropped)

    def report_outcomes(self, adapter: str, outcomes: Iterable[ShardOutcomes]) -> list[Transition]:
        """One adapter's window: successes and failures per shard, handed over together."""
        return self.record([OutcomeWindowReported(adapter=adapter, outcomes=tuple(outcomes))])

    def refit_started(
        self, weight_version: int, shards: Sequence[int] | None = None
    ) -> list[Transition]:
        """Participants default to every shard that is not absent (STALE included)."""
        participants = self._not_absent() if shards is None else tuple(shards)
        return self.record([RefitStarted(weight_version=weight_version, shards=participants)])

    def refit_completed(
        self, weight_version: int, shards: Sequence[int] | None = None
    ) -> list[Transition]:
        """Participants default to the open refit's, else every shard not absent."""
        if shards is None:
            open_refit = self._view.open_refit
            shards = open_refit.shards if open_refit else self._not_absent()
        return self.record([RefitCompleted(weight_version=weight_version, shards=tuple(shards))])

    def refit_aborted(
        self, weight_version: int, reason: str, *, context_lost: bool = False
    ) -> list[Transition]:
        return self.record(
            [RefitAborted(weight_version=weight_version, reason=reason, context_lost=context_lost)]
        )

    def mark_weights_partial(
        self, weight_version: int, shards: Sequence[int] | None = None
    ) -> list[Transition]:
        """The aborted refit's partial weights: on ``shards`` (those whose load may have
        begun; put in ascending order here), or, with ``None``, on every shard not absent.
        A shard left out keeps its state: its weights are whole, and it keeps serving."""
        named = None if shards is None else tuple(sorted(shards))
        return self.record([WeightsMarkedPartial(weight_version=weight_version, shards=named)])

    def restart_requested(self, shard: int) -> list[Transition]:
        return self.record([RestartRequested(shard=shard)])

    def restart_failed(self, shard: int, error: str) -> list[Transition]:
        return self.record([RestartFailed(shard=shard, **RestartFailed.said(error))])

    def replacement_loaded(self, shard: int, base_url: str | None = None) -> list[Transition]:
        return self.record([ReplacementLoaded(shard=shard, base_url=base_url)])

    def condemn_silent_participant(self, shard: int, reason: str) -> list[Transition]:
        return self.record([SilentParticipantCondemned(shard=shard, reason=reason)])

    def retire(self, shard: int, reason: str) -> list[Transition]:
        return self.record([ShardRetired(shard=shard, reason=reason)])

    def refuse_condemnation(self, suspected: Sequence[int], reason: str) -> list[Transition]:
        return self.record([CondemnationRefused(suspected=tuple(suspected), reason=reason)])

    def report_progress(
        self, *, committed_groups: int, train_steps: int, in_flight: int
    ) -> list[Transition]:
        return self.record(
            [
                ProgressReported(
                    committed_groups=committed_groups, train_steps=train_steps, in_flight=in_flight
                )
            ]
        )

    def stall_detected(
        self,
        *,
        committed_groups: int,
        train_steps: int,
        idle_s: float,
        in_flight: int,
        action: Literal["warn", "abort"],
    ) -> list[Transition]:
        return self.record(
            [
                StallDetected(
                    committed_groups=committed_groups,
                    train_steps=train_steps,
                    idle_s=idle_s,
                    in_flight=in_flight,
                    action=action,
                )
            ]
        )

    def declare_exhausted(self) -> list[Transition]:
        """Record the exhaustion decision's facts (serving, floor, counts per state); a
        fleet the decision does not find exhausted is refused, so no log says otherwise."""
        decision = decide_exhaustion(self._view)
        if not decision.exhausted:
            raise ValueError(f"run {self.run!r}: {decision.reason}; not exhausted")
        facts = decision.exhaustion
        return self.record(
            [
                FleetExhausted(
                    serving=facts.serving,
                    min_healthy_shards=facts.min_healthy_shards,
                    counts=facts.counts,
                )
            ]
        )

    def end_run(
        self,
        outcome: Literal["completed", "failed", "aborted"],
        cause: str,
        *,
        progress: RunProgress | None = None,
    ) -> list[Transition]:
        """``progress``: the loop's progress as it ends; by default :attr:`progress_source`'s
        (a ``FleetController`` built with a ``progress`` callable sets it)."""
        if progress is None:
            progress = self._sampled_progress()
        return self.record([RunEnded(outcome=outcome, cause=clip_text(cause), progress=progress)])

    def end_run_if_open(
        self,
        outcome: Literal["completed", "failed", "aborted"],
        cause: str,
        *,
        progress: RunProgress | None = None,
    ) -> str:
        """End the run unless it has ended (here or in another process); returns the
        cause the log holds — ours, or the one recorded first."""
        if progress is None:
            progress = self._sampled_progress()  # outside the lock: the loop's own code
        with self._lock:
            self.catch_up()
            if self._view.ended is not None:
                return self._view.ended.cause
            self.end_run(outcome, cause, progress=progress)
            return clip_text(cause)

    def _sampled_progress(self) -> RunProgress | None:
        source = self.progress_source
        if source is None:
            return None
        try:
            return source()
        except Exception as exc:  # the run ends either way; its progress is not known
            _log.warning("progress not sampled at the run's end", run=self.run, problem=str(exc))
            return None

    def _not_absent(self) -> tuple[int, ...]:
        return tuple(r.index for r in self._view.shards if not r.absent)
