"""A refit, and the recovery of one that failed, every step an event.

The failure this exists to remove: a refit collective that includes a dead or frozen
rank blocks forever while every process looks healthy. So the refit is bounded, and
when it fails the controller finds out who is gone before it rebuilds — probe now, mark
partial, condemn a lone suspect, rebuild, retry once:

1. reconcile the communicator with the ledger's absent set (not forced);
2. ``refit_started``; push within ``refit_timeout_s + grace_s`` on a daemon thread (a
   thread parked on a frozen actor must not hold up interpreter exit);
3. on failure, inside the watchdog's recovery window (the serving set is empty on
   purpose for a moment, and exhaustion must not end the run for that):
   - a lost device context ends the run at once, with that cause: no rebuild can work;
   - ``refit_aborted``; probe every participant now and record the round (a conclusive
     death is recorded; a party the transport saw die is recorded as a death too);
   - ``weights_marked_partial``: every serving shard holds a half-written version;
   - abort the old communicator; if nothing is absent, the condemnation decision
     (``projections.decisions``) is recorded as it returns: the lone suspect condemned
     as the silent participant, or the refusal naming what was found and the end of the
     run; reconcile with force (after an abort the absent set can be unchanged while the
     communicator is gone);
   - retry once; ``refit_completed`` re-admits every STALE participant at the trainer's
     version. A second failure ends the run.

The transport is a :class:`~fleetledger.weight_sync.WeightSynchronizer`; its failure is
a :class:`~fleetledger.weight_sync.RefitFailed` with typed parties (dead, silent,
failed) and ``context_lost``. The controller does not import the transports: the
composition root hands one in.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import NoReturn

import structlog

from fleetledger.controller.failure_taxonomy import cause_chain
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import Prober
from fleetledger.errors import FleetledgerError
from fleetledger.events.models import clip_text
from fleetledger.projections.decisions import CondemnationVerdict, decide_condemnation
from fleetledger.weight_sync import Party, PushReport, RefitFailed, WeightSynchronizer

__all__ = ["RefitCoordinator", "RefitOutcome", "RefitTimedOut", "RunFailed"]

_log = structlog.get_logger("fleetledger.refit")

# How far down a cause chain to look: past the RPC layers, never round a cycle for ever.


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


class RefitCoordinator:
    """Runs refits for one run against one transport; recovers a failed one once."""

    def __init__(
        self,
        ledger: Ledger,
        sync: WeightSynchronizer,
        prober: Prober,
        *,
        refit_timeout_s: float,
        grace_s: float,
        probe_timeout_s: float,
        recovering: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        if refit_timeout_s <= 0:
            raise ValueError(f"refit_timeout_s must be > 0, got {refit_timeout_s}")
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
        self._recovering = recovering
        self.recoveries = 0

    # ── the refit ───────────────────────────────────────────────────────────

    def refit(self, version: int) -> RefitOutcome:
        """Push ``version`` to every shard that is not absent; recover once if it fails.

        The participants, the communicator and the completion all come from one snapshot
        of the absent set: a shard re-admitted by another thread meanwhile (STALE after a
        restart) was not built into this communicator and must not be promoted by it.
        """
        absent, participants = self._snapshot()
        self.ledger.refit_started(version, participants)
        try:
            self._reconcile(absent, force=False)
            report = self._push_within(version)
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

    def _reconcile(self, absent: frozenset[int], *, force: bool) -> None:
        """Reconcile, then check the transport built the ledger's layout (when it says)."""
        self.sync.reconcile(absent, force=force)
        built = self.sync.built_layout
        if built is not None:
            expected = self.ledger.view.layout_for(absent)
            if built != expected:
                raise RuntimeError(
                    f"the transport built {built.as_dict()} but the ledger's layout for "
                    f"absent {sorted(absent)} is {expected.as_dict()}"
                )

    def _push_within(self, version: int) -> PushReport:
        """``sync.push`` on a daemon thread, waited for at most timeout + 2 × grace.

        A transport bounds its own waits by timeout + grace; the second grace lets its
        error, which names who failed, arrive before our "it never came back".
        """
        bound = self.refit_timeout_s + 2 * self.grace_s
        report: list[PushReport] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                report.append(self.sync.push(version))
            except BaseException as exc:
                error.append(exc)

        thread = threading.Thread(target=run, name=f"refit-v{version}", daemon=True)
        thread.start()
        thread.join(bound)
        if thread.is_alive():
            raise RefitTimedOut(
                f"refit v{version} did not come back within refit_timeout_s + 2 × grace_s "
                f"= {bound:g}s"
            )
        if error:
            raise error[0]
        return report[0]

    # ── recovery ────────────────────────────────────────────────────────────

    def _recover(
        self, version: int, absent_before: frozenset[int], failure: BaseException
    ) -> RefitOutcome:
        self.recoveries += 1
        reason = clip_text(f"{type(failure).__name__}: {failure}")
        _log.warning(
            "refit failed; recovering", run=self.ledger.run, version=version, reason=reason
        )
        with self._recovering() if self._recovering else nullcontext():
            try:
                return self._recover_steps(version, absent_before, failure, reason)
            except RunFailed:
                raise
            except Exception as exc:  # whatever broke mid-recovery, the run ends with it
                self._fail(
                    f"refit v{version} could not be recovered ({reason}): the recovery "
                    f"failed: {type(exc).__name__}: {exc}"
                )

    def _recover_steps(
        self,
        version: int,
        absent_before: frozenset[int],
        failure: BaseException,
        reason: str,
    ) -> RefitOutcome:
        if _context_lost(failure):
            self.ledger.refit_aborted(version, reason, context_lost=True)
            self._fail(f"refit v{version}: the trainer's device context is lost: {reason}")
        self.ledger.refit_aborted(version, reason)
        failed = _refit_failed(failure)
        if failed.dead_trainers:
            # A trainer rank is never excluded: no rebuild over the shards can help.
            trainers = list(failed.dead_trainers)
            self._fail(f"refit v{version}: trainer rank(s) {trainers} died: {reason}")
        self._find_the_dead(failed)
        self.ledger.mark_weights_partial(version)
        self.sync.abort()
        # Deviation from the reference, which rebuilds once before condemning: with
        # nothing newly absent that rebuild is over the very membership whose collective
        # just hung, and a frozen participant fails it too (its membership call never
        # returns). The outcome is the same; the communicator is built once, without the
        # condemned shard.
        condemned = None
        if frozenset(self.ledger.view.absent) <= absent_before:
            condemned = self._condemn_the_silent(version, reason, failed)
        absent, participants = self._snapshot()
        try:
            self._reconcile(absent, force=True)
        except Exception as exc:
            self._fail(f"rebuilding the refit communicator failed: {type(exc).__name__}: {exc}")
        self.ledger.refit_started(version, participants)
        try:
            report = self._push_within(version)
        except Exception as second:
            self.ledger.refit_aborted(
                version, clip_text(f"retry: {type(second).__name__}: {second}")
            )
            self._fail(
                f"refit v{version} failed again after recovery: {type(second).__name__}: {second}"
            )
        self.ledger.refit_completed(version, participants)
        return RefitOutcome(version, participants, recovered=True, condemned=condemned, push=report)

    def _find_the_dead(self, failed: RefitFailed) -> None:
        """Probe every participant now; record the round and the deaths the push saw."""
        _, participants = self._snapshot()
        results = dict(self.prober.probe(participants, self.probe_timeout_s))
        for shard in participants:
            results.setdefault(shard, ProbeResult("error", "the prober returned nothing"))
        for shard in failed.dead_shards:
            if shard in results:
                text = failed.dead[Party.shard(shard)]
                results[shard] = ProbeResult("died", f"seen dying by the refit: {text}")
        self.ledger.record_probes(results)

    def _condemn_the_silent(self, version: int, reason: str, failed: RefitFailed) -> int:
        """Record the condemnation decision as it returns; a refusal ends the run."""
        decision = decide_condemnation(
            self.ledger.view, named=failed.named_shards, version=version, failure=reason
        )
        if decision.verdict is CondemnationVerdict.CONDEMN and decision.shard is not None:
            self.ledger.condemn_silent_participant(decision.shard, decision.reason)
            return decision.shard
        self.ledger.refuse_condemnation(decision.suspected, decision.reason)
        self._fail(decision.end_cause)

    def _fail(self, cause: str) -> NoReturn:
        self.ledger.end_run_if_open("failed", cause)
        raise RunFailed(cause)
