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
    """The push did not come back within refit_timeout_s + grace_s."""


@dataclass(frozen=True)
class RefitOutcome:
    version: int
    participants: tuple[int, ...]
    recovered: bool = False
    condemned: int | None = None
    push: Any = None


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
        """Push ``version`` to every shard that is not absent; recover once if it fails."""
        self.sync.reconcile(self.ledger.view.absent)
        participants = self._participants()
        self.ledger.refit_started(version, participants)
        try:
            report = self._push_within(version)
        except Exception as failure:
            return self._recover(version, failure)
        self.ledger.refit_completed(version, participants)
        return RefitOutcome(version, participants, push=report)

    def _participants(self) -> tuple[int, ...]:
        absent = set(self.ledger.view.absent)
        return tuple(s for s in range(self.ledger.view.config.shard_count) if s not in absent)

    def _push_within(self, version: int) -> Any:
        """``sync.push`` on a daemon thread, waited for at most timeout + grace."""
        bound = self.refit_timeout_s + self.grace_s
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
                f"refit v{version} did not come back within refit_timeout_s + grace_s = {bound:g}s"
            )
        if "error" in box:
            raise box["error"]
        return box.get("report")

    # ── recovery ────────────────────────────────────────────────────────────

    def _recover(self, version: int, failure: BaseException) -> RefitOutcome:
        self.recoveries += 1
        reason = f"{type(failure).__name__}: {failure}"[:4096]
        _log.warning(
            "refit failed; recovering", run=self.ledger.run, version=version, reason=reason
        )
        with self._recovering() if self._recovering else nullcontext():
            if getattr(failure, "context_lost", False):
                self.ledger.refit_aborted(version, reason, context_lost=True)
                self._fail(f"refit v{version}: the trainer's device context is lost: {reason}")
            self.ledger.refit_aborted(version, reason)
            self._find_the_dead(failure)
            self.ledger.mark_weights_partial(version)
            self.sync.abort()
            # Deviation from the reference, which rebuilds once before condemning: with
            # nothing absent that rebuild is over the very membership whose collective
            # just hung, and a frozen participant fails it too (its membership call never
            # returns). The outcome is the same; the communicator is built once, without
            # the condemned shard.
            condemned = None
            if not self.ledger.view.absent:
                condemned = self._condemn_the_silent(version, reason)
            self._reconcile_forced()
            participants = self._participants()
            self.ledger.refit_started(version, participants)
            try:
                report = self._push_within(version)
            except Exception as second:
                self.ledger.refit_aborted(
                    version, f"retry: {type(second).__name__}: {second}"[:4096]
                )
                self._fail(
                    f"refit v{version} failed again after recovery: {type(second).__name__}: "
                    f"{second}"
                )
            self.ledger.refit_completed(version, participants)
        return RefitOutcome(version, participants, recovered=True, condemned=condemned, push=report)

    def _find_the_dead(self, failure: BaseException) -> None:
        """Probe every participant now; record the round and the deaths the push saw."""
        participants = self._participants()
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

    def _reconcile_forced(self) -> None:
        try:
            self.sync.reconcile(self.ledger.view.absent, force=True)
        except Exception as exc:
            self._fail(f"rebuilding the refit communicator failed: {type(exc).__name__}: {exc}")

    def _condemn_the_silent(self, version: int, reason: str) -> int:
        suspected = self.ledger.view.suspected
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
