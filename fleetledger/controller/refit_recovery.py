"""A refit, and the recovery of one that failed, every step an event.

The failure this exists to remove: a refit collective that includes a dead or frozen
rank blocks forever while every process looks healthy. So the refit is bounded, and
when it fails the controller finds out who is gone before it rebuilds — probe now, mark
partial, condemn a lone suspect, rebuild, retry once:

1. ``refit_started``; reconcile the communicator with the ledger's absent set (not
   forced; a build is bounded by the transport);
2. push within ``refit_timeout_s + 2 × grace_s`` (``None``: no bound). The build and
   the push each run on a daemon thread (a
   thread parked on a frozen actor must not hold up interpreter exit). While either
   waits, the coordinator folds the ledger's tail every
   ``watch_interval_s``: as soon as any writer — the probe pump, a rollout that saw the
   actor die, another process — records a participant of this refit DEAD (or absent at
   all), it aborts the communicator and recovers, the abort's reason naming the shard
   and the seq of its death. Waiting out the bound instead cost the whole refit timeout
   (5 minutes by default) per SIGKILL: gloo survivors see no error when a peer dies;
3. on failure, the decision ``decide_refit_failure`` over the failure's kind: only a
   timeout, a lost peer or an abort is recovered. A deterministic failure (a mismatch, a
   bug) and a lost device context record ``refit_aborted`` with the error and end the
   run with it — no probe, no condemnation, no retry: the same push would fail again,
   and probing would pin the bug on whichever shard happened to be suspect. Otherwise,
   inside the watchdog's recovery window (the serving set is empty on purpose for a
   moment, and exhaustion must not end the run for that):
   - ``refit_aborted``; probe every participant now and record the round (a conclusive
     death is recorded; a party the transport saw die is recorded as a death too);
   - abort the old communicator (not waiting for a participant whose probe failed) and
     ``weights_marked_partial`` for the shards whose load of the version may have begun,
     as the members told the abort (every one that did not answer);
   - if no participant left since the round began (none newly absent, none replaced
     — a shard restarted meanwhile may be back, STALE, already), the condemnation decision
     (``projections.decisions``) is recorded as it returns: the lone suspect condemned
     as the silent participant, or the refusal naming what was found and the end of the
     run; reconcile with force (after an abort the absent set can be unchanged while the
     communicator is gone);
   - retry; ``refit_completed`` re-admits every STALE participant at the trainer's
     version. A retry that fails again is recovered the same way while each round
     leaves a participant out (at most one round per shard); otherwise it ends the run.

The transport is a :class:`~fleetledger.weight_sync.WeightSynchronizer`; its failure is
a :class:`~fleetledger.weight_sync.RefitFailed` with typed parties (dead, silent,
failed), ``context_lost`` and its ``kind``. The controller does not import the transports: the
composition root hands one in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NoReturn, TypeVar

import structlog

from fleetledger.adapters.failure_taxonomy import FailureKind, cause_chain, classify_exception
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import Prober
from fleetledger.controller.stale_watch import StaleWatch
from fleetledger.errors import FleetledgerError
from fleetledger.events.errors import LedgerError
from fleetledger.events.models import clip_text
from fleetledger.projections.decisions import (
    CondemnationVerdict,
    RefitFailureDecision,
    decide_condemnation,
    decide_refit_failure,
)
from fleetledger.weight_sync import (
    AbortReport,
    Party,
    PushReport,
    RefitFailed,
    RefitFailureKind,
    WeightSynchronizer,
)

__all__ = [
    "DEFAULT_WATCH_INTERVAL_S",
    "RefitCoordinator",
    "RefitOutcome",
    "RefitTimedOut",
    "RunFailed",
    "failure_kind_of",
]

_log = structlog.get_logger("fleetledger.refit")

T = TypeVar("T")

DEFAULT_WATCH_INTERVAL_S = 0.25
"""How often a waiting push folds the ledger's tail for a participant's recorded death:
one indexed read per interval, and a death costs at most this much on top of the time it
took to be recorded."""


class RunFailed(FleetledgerError, RuntimeError):
    """The refit could not be recovered; the run was ended with this cause."""


class RefitTimedOut(FleetledgerError, RuntimeError):
    """The push did not come back within refit_timeout_s + 2 × grace_s."""


@dataclass(frozen=True)
class RefitOutcome:
    version: int
    participants: tuple[int, ...]
    recovered: bool = False
    condemned: int | None = None
    push: PushReport | None = None


def _context_lost(failure: BaseException) -> bool:
    # Along the cause chain (and a Ray task error's remote cause): the RPC layers keep
    # the transport's account as the cause, not as the type they raise.
    return any(isinstance(link, RefitFailed) and link.context_lost for link in cause_chain(failure))


def _refit_failed(failure: BaseException) -> RefitFailed:
    """The transport's account of the failure; an empty one when it gave none (a
    timeout, a failed reconcile): it names nobody, and the probes decide alone."""
    return failure if isinstance(failure, RefitFailed) else RefitFailed("refit")


def failure_kind_of(failure: BaseException) -> RefitFailureKind:
    """The kind of a failed refit, from its typed facts: the transport's
    ``RefitFailed`` along the cause chain (a Ray task error's remote cause included), our
    own bound's expiry, else the failure taxonomy — the runtime's actor errors and
    connection errors are a lost peer, timeouts a timeout, and everything else (a
    ``ValueError``, an error nobody recognised) deterministic: it fails loudly."""
    chain = cause_chain(failure)
    for link in chain:
        if isinstance(link, RefitFailed):
            return link.failure_kind
        if isinstance(link, RefitTimedOut):
            return RefitFailureKind.TIMED_OUT
    verdict = classify_exception(failure)
    if verdict.kind is not FailureKind.INFRA:
        return RefitFailureKind.DETERMINISTIC
    if verdict.reason == "timeout" or any(isinstance(link, TimeoutError) for link in chain):
        return RefitFailureKind.TIMED_OUT
    return RefitFailureKind.PEER_LOST


class RefitCoordinator:
    """Runs refits for one run against one transport; recovers a failed one once."""

    def __init__(
        self,
        ledger: Ledger,
        sync: WeightSynchronizer,
        prober: Prober,
        *,
        refit_timeout_s: float | None,
        grace_s: float,
        probe_timeout_s: float,
        recovering: Callable[[], AbstractContextManager[None]] | None = None,
        watch_interval_s: float | None = DEFAULT_WATCH_INTERVAL_S,
        stale_probe_interval_s: float | None = None,
    ) -> None:
        """``refit_timeout_s=None``: a push is waited for without a bound (still aborted
        by a recorded death). ``watch_interval_s``: how often a waiting build or push
        looks for a participant's recorded death; ``None`` turns the watch off (it is
        then waited for until it fails or the bound expires — what the bench compares).
        ``stale_probe_interval_s``: how often a waiting refit probes its STALE
        participants, which the probe pump does not (:mod:`.stale_watch`; give it the
        pump's ``probe_interval_s``); ``None``: not probed — a frozen one is then found
        at the transport's bound."""
        if refit_timeout_s is not None and refit_timeout_s <= 0:
            raise ValueError(f"refit_timeout_s must be > 0 or None, got {refit_timeout_s}")
        for name, value in (
            ("watch_interval_s", watch_interval_s),
            ("stale_probe_interval_s", stale_probe_interval_s),
        ):
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None, got {value}")
        if not isinstance(sync, WeightSynchronizer):
            # The contract is a type, read by attribute, never guessed at by name.
            raise TypeError(
                f"{type(sync).__name__} is not a fleetledger.weight_sync.WeightSynchronizer: "
                "a refit transport implements that contract (reconcile, push, abort, "
                "built_layout)"
            )
        self.ledger = ledger
        self.sync = sync
        self.prober = prober
        self.refit_timeout_s = refit_timeout_s
        self.grace_s = grace_s
        self.probe_timeout_s = probe_timeout_s
        self.watch_interval_s = watch_interval_s
        self.stale_probe_interval_s = stale_probe_interval_s
        self._recovering = recovering
        self.recoveries = 0
        # Each shard's incarnation (its restart count) when the refit began: a death
        # the push saw is of that process, never of a replacement started since.
        self._pushed_to: tuple[int, ...] = ()
        # What the aborts of the refit in hand learned of the members' loads (the watch
        # may abort before the recovery does; the second abort finds no communicator).
        self._abort_report = AbortReport()

    # ── the refit ───────────────────────────────────────────────────────────

    def refit(self, version: int) -> RefitOutcome:
        """Push ``version`` to every shard that is not absent; recover once if it fails.

        The participants, the communicator and the completion all come from one snapshot
        of the absent set: a shard re-admitted by another thread meanwhile (STALE after a
        restart) was not built into this communicator and must not be promoted by it.
        """
        absent, participants = self._snapshot()
        self._pushed_to = self.ledger.membership.restart_attempts
        self._abort_report = AbortReport()
        self.ledger.refit_started(version, participants)
        try:
            self._reconcile(version, absent, participants, force=False)
            report = self._push_within(version, participants)
        except RunFailed:
            raise
        except Exception as failure:  # a failed build is a failed refit too
            return self._recover(version, absent, failure)
        self.ledger.refit_completed(version, participants)
        return RefitOutcome(version, participants, push=report)

    def _snapshot(self) -> tuple[frozenset[int], tuple[int, ...]]:
        with self.ledger.lock:
            self.ledger.catch_up()
            absent = frozenset(self.ledger.view.absent)
            count = self.ledger.view.config.shard_count
        return absent, tuple(s for s in range(count) if s not in absent)

    def _reconcile(
        self, version: int, absent: frozenset[int], participants: Sequence[int], *, force: bool
    ) -> None:
        """Reconcile, watched like the push (the transport bounds the build itself),
        then check the transport built the ledger's layout (when it says).

        Story: a survivor frozen as a re-admitting build began was recorded dead within
        a second, but nothing watched the build, which waited for it until its restart
        killed it; by then the replacement was loaded, and the recovery, seeing nothing
        newly absent, ended the run with two healthy shards left."""
        self._watched(
            version, "build", lambda: self.sync.reconcile(absent, force=force), participants, None
        )
        built = self.sync.built_layout
        if built is not None:
            expected = self.ledger.view.layout_for(absent)
            if built != expected:
                raise RuntimeError(
                    f"the transport built {built.as_dict()} but the ledger's layout for "
                    f"absent {sorted(absent)} is {expected.as_dict()}"
                )

    def _push_within(self, version: int, participants: Sequence[int]) -> PushReport:
        """``sync.push``, waited for at most timeout + 2 × grace and abandoned as soon as
        the ledger records one of ``participants`` absent.

        A transport bounds its own waits by timeout + grace; the second grace lets its
        error, which names who failed, arrive before our "it never came back".
        """
        bound = None if self.refit_timeout_s is None else self.refit_timeout_s + 2 * self.grace_s
        return self._watched(version, "push", lambda: self.sync.push(version), participants, bound)

    def _watched(
        self,
        version: int,
        stage: str,
        call: Callable[[], T],
        participants: Sequence[int],
        bound: float | None,
    ) -> T:
        """``call`` on a daemon thread (a thread parked on a frozen actor must not hold up
        interpreter exit), waited for at most ``bound`` (``None``: as long as it takes)
        and given up as soon as the ledger records one of ``participants`` absent: the
        communicator is aborted — which releases every member parked in it and makes a
        build in progress give up — and the refit fails naming the shard.

        Abandoning the thread is safe: the abort comes first, and the recovery rebuilds
        on fresh communicators.
        """
        result: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                result.append(call())
            except BaseException as exc:
                error.append(exc)

        stale = StaleWatch.of(
            self.ledger,
            self.prober,
            participants,
            interval_s=self.stale_probe_interval_s,
            timeout_s=self.probe_timeout_s,
        )
        thread = threading.Thread(target=run, name=f"refit-v{version}-{stage}", daemon=True)
        thread.start()
        deadline = None if bound is None else time.monotonic() + bound
        while True:
            wait = self.watch_interval_s
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = left if wait is None else min(wait, left)
            thread.join(wait)
            if not thread.is_alive():
                break
            if self.watch_interval_s is None:
                continue  # the watch is off: only the bound ends the wait
            lost = self._recorded_absent(participants)
            if lost is not None:
                raise self._abort_in_flight(version, stage, *lost)
            silent = None if stale is None else stale.silent()
            if silent is not None:
                raise self._abort_on_silence(version, stage, *silent)
        if thread.is_alive():
            raise RefitTimedOut(
                f"refit v{version}'s {stage} did not come back within "
                f"refit_timeout_s + 2 × grace_s = {bound:g}s"
            )
        if error:
            raise error[0]
        return result[0]

    def _recorded_absent(self, participants: Sequence[int]) -> tuple[int, int, str] | None:
        """(shard, seq, what) of the first participant the ledger now holds absent, after
        folding whatever any writer recorded meanwhile; ``None``: all present (or the
        ledger could not be read this time — the push is still bounded)."""
        with self.ledger.lock:
            try:
                self.ledger.catch_up()
            except LedgerError as exc:
                _log.warning("refit watch: ledger not read", run=self.ledger.run, problem=str(exc))
                return None
            shards = self.ledger.view.shards
            for shard in participants:
                record = shards[shard]
                if record.absent:
                    what = f"{record.state.value} at seq {record.since_seq} ({record.since_rule})"
                    return shard, record.since_seq, what
        return None

    def _abort_in_flight(
        self, version: int, stage: str, shard: int, seq: int, what: str
    ) -> RefitFailed:
        """Abort the communicator under a build or push whose participant was recorded
        absent; the failure the recovery gets names the shard and the seq of its death."""
        if stage == "build":
            limit = "the transport's build bound"
        elif self.refit_timeout_s is None:
            limit = "refit_timeout_s=None (unbounded)"
        else:
            limit = f"refit_timeout_s={self.refit_timeout_s:g}"
        detail = (
            f"aborted: participant shard {shard} was recorded {what} while refit v{version}'s "
            f"{stage} was in flight; not waiting out {limit}"
        )
        detail += self._abort_without(
            shard, "refit aborted: a participant was recorded absent", version, stage, seq=seq
        )
        return RefitFailed(stage, detail=detail, kind=RefitFailureKind.ABORTED)

    def _abort_on_silence(self, version: int, stage: str, shard: int, why: str) -> RefitFailed:
        """Abort the communicator under a build or push whose STALE participant stopped
        answering probes; the failure names it silent, as a transport would at its bound."""
        why += self._abort_without(
            shard, "refit aborted: a STALE participant stopped answering probes", version, stage
        )
        return RefitFailed(stage, silent={Party.shard(shard): why}, kind=RefitFailureKind.TIMED_OUT)

    def _abort_without(
        self, shard: int, message: str, version: int, stage: str, **fields: int
    ) -> str:
        """Log ``message`` and abort, not waiting for ``shard``; what went wrong with the
        abort ("": nothing)."""
        _log.warning(
            message, run=self.ledger.run, version=version, stage=stage, shard=shard, **fields
        )
        try:
            # Releases the survivors parked in the collective; the lost one is not waited for.
            self._abort(gone={shard})
        except Exception as exc:  # the recovery aborts again, and fails the run if it must
            return f" (aborting the communicator failed: {type(exc).__name__}: {exc})"
        return ""

    # ── recovery ────────────────────────────────────────────────────────────

    def _recover(
        self, version: int, absent_before: frozenset[int], failure: BaseException
    ) -> RefitOutcome:
        reason = clip_text(f"{type(failure).__name__}: {failure}")
        decision = self._judge(version, failure, reason)
        if not decision.recover:
            self._end_with(version, reason, decision.reason, decision.context_lost, failure)
        self.recoveries += 1
        _log.warning(
            "refit failed; recovering",
            run=self.ledger.run,
            version=version,
            kind=decision.kind.value,
            reason=reason,
        )
        with self._recovering() if self._recovering else nullcontext():
            try:
                return self._recover_steps(version, absent_before, failure, reason)
            except RunFailed:
                raise
            except Exception as exc:  # whatever broke mid-recovery, the run ends with it
                self._fail(
                    f"refit v{version} could not be recovered ({reason}): the recovery "
                    f"failed: {type(exc).__name__}: {exc}",
                    exc,
                )

    def _recover_steps(
        self,
        version: int,
        absent_before: frozenset[int],
        failure: BaseException,
        reason: str,
    ) -> RefitOutcome:
        """Recover in rounds: each finds who is gone, marks the partial, condemns a lone
        suspect if nobody is newly absent, rebuilds and pushes again.

        Departure from the reference, which retries once: a retry that fails again is
        recovered again, as long as the failure is one a rebuild can help and every
        round leaves a participant out (a death recorded, or a suspect condemned — the
        condemnation decision ends the run when it finds none), so there are at most as
        many rounds as shards. Story: two kills close together as a refit started ended
        the run with a healthy survivor left, the second kill landing in the retry.
        """
        self.ledger.refit_aborted(version, reason)
        condemned: int | None = None
        while True:
            failed = _refit_failed(failure)
            if failed.dead_trainers:
                # A trainer rank is never excluded: no rebuild over the shards can help.
                trainers = list(failed.dead_trainers)
                self._fail(f"refit v{version}: trainer rank(s) {trainers} died: {reason}")
            unresponsive = self._find_the_dead(failed)
            # Departure from the reference, which marks every serving shard partial: only
            # a shard whose load of this version may have begun is, as the members
            # reported it to the abort (one that did not answer may be). A survivor of a
            # broadcast cut before it loaded still holds whole weights of the version
            # before, and serves on: the serving set does not empty, the epoch does not
            # move twice.
            aborted = self._abort(gone=unresponsive | set(failed.silent_shards))
            _, present = self._snapshot()
            self.ledger.mark_weights_partial(version, aborted.may_be_partial(present))
            # Deviation from the reference, which rebuilds once before condemning: with
            # nothing newly absent that rebuild is over the very membership whose
            # collective just hung, and a frozen participant fails it too (its membership
            # call never returns). The outcome is the same; the communicator is built
            # once, without the condemned shard.
            if not self._left_since(absent_before):
                condemned = self._condemn_the_silent(version, reason, failed, unresponsive)
            absent, participants = self._snapshot()
            self._pushed_to = self.ledger.membership.restart_attempts
            self._abort_report = AbortReport()
            try:
                # A rebuild that fails is a failed round like a failed push: a member
                # frozen after the probe (two faults close together) is silent here, and
                # the next round finds it (a deterministic failure still ends the run).
                self._reconcile(version, absent, participants, force=True)
                self.ledger.refit_started(version, participants)
                report = self._push_within(version, participants)
            except Exception as again:
                reason = clip_text(f"retry: {type(again).__name__}: {again}")
                self.ledger.refit_aborted(version, reason)
                if not self._judge(version, again, reason).recover:
                    self._fail(f"refit v{version} failed again after recovery: {reason}", again)
                failure, absent_before = again, absent
                self.recoveries += 1
                continue
            self.ledger.refit_completed(version, participants)
            return RefitOutcome(
                version, participants, recovered=True, condemned=condemned, push=report
            )

    def _left_since(self, absent_before: frozenset[int]) -> bool:
        """Whether a participant left since the round began: recorded absent, or
        replaced — its restart count moved, so it died and was restarted, and may be back
        (STALE, not absent) by the time the recovery looks. Either way the round's
        failure is explained, and nobody is condemned for it."""
        with self.ledger.lock:
            self.ledger.catch_up()
            view = self.ledger.view
            if not frozenset(view.absent) <= absent_before:
                return True
            return any(
                record.restart_attempts > self._pushed_to[shard]
                for shard, record in enumerate(view.shards)
                if shard < len(self._pushed_to) and shard not in absent_before
            )

    def _judge(self, version: int, failure: BaseException, reason: str) -> RefitFailureDecision:
        """Whether a failed refit is one a rebuild can help (the decision, recorded by
        what the caller does with it)."""
        with self.ledger.lock:
            return decide_refit_failure(
                self.ledger.view,
                version=version,
                kind=failure_kind_of(failure),
                context_lost=_context_lost(failure),
                failure=reason,
            )

    def _abort(self, *, gone: set[int]) -> AbortReport:
        """Abort the communicator, not waiting for ``gone``; what every abort of this
        refit learned of the loads, together."""
        self._abort_report |= self.sync.abort(gone=gone)
        return self._abort_report

    def _find_the_dead(self, failed: RefitFailed) -> set[int]:
        """Probe every participant now; record the round and the deaths the push saw.
        Returns the participants that did not answer the probe well (dead, frozen,
        failing): an abort need not wait for them."""
        _, participants = self._snapshot()
        results = dict(self.prober.probe(participants, self.probe_timeout_s))
        for shard in participants:
            results.setdefault(shard, ProbeResult("error", "the prober returned nothing"))
        for shard in failed.dead_shards:
            if shard in results:
                text = failed.dead[Party.shard(shard)]
                incarnation = self._pushed_to[shard] if shard < len(self._pushed_to) else None
                results[shard] = ProbeResult(
                    "died", f"seen dying by the refit: {text}", incarnation=incarnation
                )
        self.ledger.record_probes(results)
        return {shard for shard, result in results.items() if result.kind != "ok"}

    def _condemn_the_silent(
        self, version: int, reason: str, failed: RefitFailed, unanswered: set[int]
    ) -> int:
        """Record the condemnation decision as it returns; a refusal ends the run."""
        decision = decide_condemnation(
            self.ledger.view,
            named=failed.named_shards,
            version=version,
            failure=reason,
            unanswered=unanswered,
        )
        if decision.verdict is CondemnationVerdict.CONDEMN and decision.shard is not None:
            self.ledger.condemn_silent_participant(decision.shard, decision.reason)
            return decision.shard
        self.ledger.refuse_condemnation(decision.suspected, decision.reason)
        self._fail(decision.end_cause)

    def _end_with(
        self,
        version: int,
        reason: str,
        cause: str,
        context_lost: bool,
        failure: BaseException,
    ) -> NoReturn:
        """A failure that is not recovered: ``refit_aborted`` with the error, and the end
        of the run with it. A deterministic failure's communicator is aborted on the way
        (best effort: members parked in it are released; the run ends either way); a lost
        context's is left alone — no call into a broken device context helps."""
        self.ledger.refit_aborted(version, reason, context_lost=context_lost)
        if not context_lost:
            try:
                self.sync.abort()
            except Exception as exc:
                _log.warning("communicator not aborted", run=self.ledger.run, problem=str(exc))
        self._fail(cause, failure)

    def _fail(self, cause: str, failure: BaseException | None = None) -> NoReturn:
        self.ledger.end_run_if_open("failed", cause)
        raise RunFailed(cause) from failure
