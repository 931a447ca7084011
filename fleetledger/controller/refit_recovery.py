"""A refit, and the recovery of one that failed (REFERENCE §4), every step an event.

The failure this exists to remove: a refit collective that includes a dead or frozen
rank blocks forever while every process looks healthy. So the refit is bounded, and
when it fails the controller finds out who is gone before it rebuilds:

1. reconcile the communicator with the ledger's absent set (not forced);
2. ``refit_started``; push within ``refit_timeout_s + grace_s`` on a daemon thread (a
   thread parked on a frozen actor must not hold up interpreter exit);
3. on failure, inside the watchdog's recovery window (the serving set is empty on
   purpose for a moment, and exhaustion must not end the run for that):
   - a lost device context ends the run at once, with that cause: no rebuild can work;
   - ``refit_aborted``; probe every participant now and record the round (a conclusive
     death is recorded; a party the transport saw die is recorded as a death too);
   - ``weights_marked_partial``: every serving shard holds a half-written version;
   - abort the old communicator; if nothing is absent, exactly one suspected shard is
     condemned as the silent participant (none or several: the refusal is recorded
     naming them and the run ends); reconcile with force (after an abort the absent set
     can be unchanged while the communicator is gone);
   - retry once; ``refit_completed`` re-admits every STALE participant at the trainer's
     version. A second failure ends the run.

The transport is anything with ``reconcile(absent, force=)``, ``push(version)`` and
``abort()``; its failure may carry ``dead`` / ``silent`` (party → text, parties named
``"shard N"``) and ``context_lost``. (The controller does not import the transports: the
composition root hands one in.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol

import structlog

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import Prober

__all__ = ["RefitCoordinator", "RefitOutcome", "RunFailed", "WeightSync"]

_log = structlog.get_logger("fleetledger.refit")


class WeightSync(Protocol):
    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> Any: ...

    def push(self, version: int) -> Any: ...

    def abort(self) -> None: ...


class RunFailed(RuntimeError):
    """The refit could not be recovered; the run was ended with this cause."""


class RefitTimedOut(RuntimeError):
    """The push did not come back within refit_timeout_s + 2 × grace_s."""


@dataclass(frozen=True)
class RefitOutcome:
    version: int
    participants: tuple[int, ...]
    recovered: bool = False
    condemned: int | None = None
    push: Any = None


def _context_lost(failure: BaseException) -> bool:
    """``context_lost`` set anywhere along the cause chain (``__cause__`` or a Ray task
    error's ``.cause``), at most 8 links: the RPC layers keep the cause, not the type."""
    link: BaseException | None = failure
    for _ in range(8):
        if link is None:
            return False
        if getattr(link, "context_lost", False):
            return True
        link = getattr(link, "cause", None) or link.__cause__
    return False


def _dead_trainers(failure: BaseException) -> list[int]:
    """Trainer ranks the runtime says are gone. (A trainer that merely *raised* is what
    every rank of a collective does when any peer fails; that names nobody.)"""
    parties = getattr(failure, "dead", None) or {}
    out = []
    for party in parties:
        kind, _, index = party.partition(" ")
        if kind == "trainer" and index.isdigit():
            out.append(int(index))
    return sorted(out)


def _shards_named(parties: Mapping[str, str] | None) -> set[int]:
    out: set[int] = set()
    for party in parties or {}:
        kind, _, index = party.partition(" ")
        if kind == "shard" and index.isdigit():
            out.add(int(index))
    return out


class RefitCoordinator:
    """Runs refits for one run against one transport, recovering as REFERENCE §4 says."""

    def __init__(
        self,
        ledger: Ledger,
        sync: WeightSync,
        prober: Prober,
        *,
        refit_timeout_s: float,
        grace_s: float,
        probe_timeout_s: float,
        recovering: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        if refit_timeout_s <= 0:
            raise ValueError(f"refit_timeout_s must be > 0, got {refit_timeout_s}")
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
        built = getattr(self.sync, "built_layout", None)
        if built is not None:
            expected = self.ledger.view.layout_for(absent)
            if built != expected:
                raise RuntimeError(
                    f"the transport built {built.as_dict()} but the ledger's layout for "
                    f"absent {sorted(absent)} is {expected.as_dict()}"
                )

    def _push_within(self, version: int) -> Any:
        """``sync.push`` on a daemon thread, waited for at most timeout + 2 × grace.

        A transport bounds its own waits by timeout + grace; the second grace lets its
        error, which names who failed, arrive before our "it never came back".
        """
        bound = self.refit_timeout_s + 2 * self.grace_s
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["report"] = self.sync.push(version)
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"refit-v{version}", daemon=True)
        thread.start()
        thread.join(bound)
        if thread.is_alive():
            raise RefitTimedOut(
                f"refit v{version} did not come back within refit_timeout_s + 2 × grace_s "
                f"= {bound:g}s"
            )
        if "error" in box:
            raise box["error"]
        return box.get("report")

    # ── recovery ────────────────────────────────────────────────────────────

    def _recover(
        self, version: int, absent_before: frozenset[int], failure: BaseException
    ) -> RefitOutcome:
        self.recoveries += 1
        reason = f"{type(failure).__name__}: {failure}"[:4096]
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
        trainers = _dead_trainers(failure)
        if trainers:
            # A trainer rank is never excluded: no rebuild over the shards can help.
            self._fail(f"refit v{version}: trainer rank(s) {trainers} died: {reason}")
        self._find_the_dead(failure)
        self.ledger.mark_weights_partial(version)
        self.sync.abort()
        # Deviation from the reference, which rebuilds once before condemning: with
        # nothing newly absent that rebuild is over the very membership whose collective
        # just hung, and a frozen participant fails it too (its membership call never
        # returns). The outcome is the same; the communicator is built once, without the
        # condemned shard.
        condemned = None
        if frozenset(self.ledger.view.absent) <= absent_before:
            condemned = self._condemn_the_silent(version, reason, failure)
        absent, participants = self._snapshot()
        try:
            self._reconcile(absent, force=True)
        except Exception as exc:
            self._fail(f"rebuilding the refit communicator failed: {type(exc).__name__}: {exc}")
        self.ledger.refit_started(version, participants)
        try:
            report = self._push_within(version)
        except Exception as second:
            self.ledger.refit_aborted(version, f"retry: {type(second).__name__}: {second}"[:4096])
            self._fail(
                f"refit v{version} failed again after recovery: {type(second).__name__}: {second}"
            )
        self.ledger.refit_completed(version, participants)
        return RefitOutcome(version, participants, recovered=True, condemned=condemned, push=report)

    def _find_the_dead(self, failure: BaseException) -> None:
        """Probe every participant now; record the round and the deaths the push saw."""
        _, participants = self._snapshot()
        results = dict(self.prober.probe(participants, self.probe_timeout_s))
        for shard in participants:
            results.setdefault(shard, ProbeResult("error", "the prober returned nothing"))
        dead: Mapping[str, str] = getattr(failure, "dead", None) or {}
        for shard in _shards_named(dead):
            if shard in results:
                results[shard] = ProbeResult(
                    "died", f"seen dying by the refit: {dead[f'shard {shard}']}"
                )
        self.ledger.record_probes(results)

    def _condemn_the_silent(self, version: int, reason: str, failure: BaseException) -> int:
        suspected = self.ledger.view.suspected
        named = _shards_named(getattr(failure, "silent", None)) | _shards_named(
            getattr(failure, "errors", None)
        )
        if len(suspected) == 1 and named and suspected[0] not in named:
            # The transport saw someone else hang: blaming the suspect would be wrong.
            found = (
                f"the only suspect, shard {suspected[0]}, is not among the shards the "
                f"transport named ({sorted(named)})"
            )
            self.ledger.refuse_condemnation(suspected, f"refit v{version}: {found}")
            self._fail(
                f"refit v{version} aborted and no silent participant could be named: {found}"
            )
        if len(suspected) == 1:
            (shard,) = suspected
            self.ledger.condemn_silent_participant(
                shard,
                f"refit v{version} aborted with nothing absent and shard {shard} the only "
                f"suspect: {reason}"[:4096],
            )
            return shard
        found = (
            "no shard is suspected" if not suspected else f"shards {list(suspected)} are suspected"
        )
        self.ledger.refuse_condemnation(
            suspected,
            f"refit v{version} aborted with nothing absent and {found}: condemning one would be "
            f"a guess",
        )
        self._fail(
            f"refit v{version} aborted and no silent participant could be named: {found} ({reason})"
        )

    def _fail(self, cause: str) -> NoReturn:
        with self.ledger.lock:
            self.ledger.catch_up()
            if self.ledger.view.ended is None:
                self.ledger.end_run("failed", cause[:4096])
        raise RunFailed(cause)
