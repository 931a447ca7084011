"""Broadcast weight sync over torch.distributed between Ray actors (gloo on CPU).

The controller side of the transport: it computes the layout for an absent set, tells
the generation side the new membership, has rank 0 (a trainer) bind a fresh store,
dispatches the build to the trainers and the surviving shards' workers only, and pushes
weights by broadcast from rank 0, every receiver returning the checksum of what it holds.

Every wait is bounded: ``ray.wait`` with the refit timeout plus a grace (the ranks' own,
attributable error should win the race against "it never came back"); a refit timeout
of ``None`` makes them unbounded, explicitly. When one party fails, the others are given
``settle_s`` (bounded even then) to finish failing before the error propagates: the
rebuild that follows is itself a collective and needs every survivor out of the old
one. A survivor that sees no error leaves at its op timeout, which is the refit timeout —
so the settle window follows the refit timeout (plus the grace); a fixed window shorter
than it propagated the error while survivors still sat in the old group. What cuts a
long wait short is an abort (``abort()``, which releases every member's parked
collective): the refit coordinator aborts as soon as the ledger records a participant
dead.

Ray's "actor died" is reported as a dead party; no answer as a silent one. Each failure
carries its kind (``RefitFailed.kind``): a dead peer or a reset connection is a lost
peer, no answer or gloo's timeout a timeout, an aborted group an abort, and anything else
a member raised — a ``ValueError``, a checksum that differs from the root's — is
deterministic. A deterministic failure aborts the rest at once instead of waiting the
settle window: no rebuild follows it, the run ends with it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

from fleetledger.events.causes import exception_line
from fleetledger.events.models import shard_outside
from fleetledger.projections.decisions import refit_failure_kind
from fleetledger.projections.rank_layout import RankLayout, rank_layout
from fleetledger.transports.gloo_rank import (
    STORE_HOST,
    CollectiveAborted,
    NoCommunicator,
    PeerLost,
)
from fleetledger.weight_sync import (
    AbortReport,
    Party,
    PushReport,
    ReconcileOutcome,
    RefitFailed,
    RefitFailureKind,
    WeightSynchronizer,
)

__all__ = ["GlooBroadcastSynchronizer"]

CANCEL_POLL_S = 0.1
"""How often a build in progress looks whether ``abort()`` gave it up."""

UNBOUNDED_SETTLE_S = 60.0
"""How long the others get to settle once one party failed when the refit itself is
unbounded (``refit_timeout_s=None``): the reference bounds the wait for stragglers before
a rebuild whatever the refit's deadline, and with no op timeout a survivor parked in the
old group never leaves by itself — what releases it is the abort the recovery sends."""

ABORT_WAIT_S = 5.0
"""How long ``abort()`` waits for the members not known gone to acknowledge (it only sets
a flag, answered on the member's event loop within milliseconds)."""


def _plus(seconds: float | None, extra: float) -> float | None:
    return None if seconds is None else seconds + extra


def _kind_of(exc: BaseException) -> RefitFailureKind:
    """What a member's exception says about the failure (see the module docstring)."""
    if isinstance(exc, CollectiveAborted | NoCommunicator):
        return RefitFailureKind.ABORTED
    if isinstance(exc, PeerLost | ConnectionError):
        return RefitFailureKind.PEER_LOST
    if isinstance(exc, TimeoutError):
        return RefitFailureKind.TIMED_OUT
    return RefitFailureKind.DETERMINISTIC


@dataclass
class _Build:
    """A build in progress: what ``abort()`` must tell its members, and the flag that
    makes the thread building it give up."""

    build: int
    layout: RankLayout
    port: int | None = None  # rank 0's store, once opened: the build's identity on members
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class _Outcome:
    status: str  # ok | dead | error
    value: Any  # the result, or the text of the failure
    kind: RefitFailureKind | None = None
    exc: BaseException | None = None


class GlooBroadcastSynchronizer(WeightSynchronizer):
    """Rebuilds a gloo group over the surviving shards; pushes by broadcast from rank 0."""

    def __init__(
        self,
        trainers: Sequence[ActorHandle],
        shard_workers: Mapping[int, Sequence[ActorHandle]],
        *,
        refit_timeout_s: float | None,
        grace_s: float = 5.0,
        settle_s: float | None = None,
        build_timeout_s: float = 60.0,
        store_host: str = STORE_HOST,
    ) -> None:
        """``refit_timeout_s``: every collective's op timeout and, plus ``grace_s``, every
        wait for a push (``None``: unbounded). ``settle_s``: how long the others get once
        one party failed; by default it follows the refit timeout (+ grace), and is
        :data:`UNBOUNDED_SETTLE_S` when the refit is unbounded — never unbounded itself.
        ``store_host``: the address of trainer rank 0 that every rank reaches
        its store at — loopback by default (one machine); on a fleet across machines,
        the trainer node's address (and ``GLOO_SOCKET_IFNAME`` set to match)."""
        self.store_host = store_host
        super().__init__()
        if not trainers:
            raise ValueError("a broadcast refit needs at least one trainer rank (rank 0)")
        widths = {len(workers) for workers in shard_workers.values()}
        if len(widths) != 1 or 0 in widths:
            raise ValueError(
                f"every shard needs the same, non-zero number of workers; got {sorted(widths)}"
            )
        if sorted(shard_workers) != list(range(len(shard_workers))):
            raise ValueError(f"shards must be 0..n-1, got {sorted(shard_workers)}")
        if refit_timeout_s is not None and refit_timeout_s <= 0:
            raise ValueError(f"refit_timeout_s must be > 0 or None, got {refit_timeout_s}")
        if settle_s is not None and settle_s < 0:
            raise ValueError(f"settle_s must be >= 0, got {settle_s}")
        if build_timeout_s <= 0:
            raise ValueError(f"build_timeout_s must be > 0, got {build_timeout_s}")
        self.build_timeout_s = build_timeout_s
        self._trainers = list(trainers)
        self._workers = {shard: list(workers) for shard, workers in shard_workers.items()}
        self.workers_per_shard = widths.pop()
        self.refit_timeout_s = refit_timeout_s
        self.grace_s = grace_s
        if settle_s is None:
            settle_s = UNBOUNDED_SETTLE_S if refit_timeout_s is None else refit_timeout_s + grace_s
        self.settle_s: float = settle_s
        self.builds = 0  # the build the current communicator is (0: none built yet)
        self._numbered = 0  # the last build number handed out (a failed build uses one)
        self._lock = threading.Lock()
        self._building: _Build | None = None
        # The version pushed in this refit: an abort asks each member whether its load of
        # it had begun (None: nothing pushed since the last reconcile — a refit whose
        # build failed pushed nothing, and every member still holds whole weights).
        self._pushing: int | None = None

    @property
    def building(self) -> int | None:
        """The number of the build in progress (``None``: no reconcile running)."""
        building = self._building
        return None if building is None else building.build

    @property
    def dp_size(self) -> int:
        return len(self._workers)

    def layout_for(self, absent: Iterable[int]) -> RankLayout:
        absent = set(absent)
        return rank_layout(
            survivors=[s for s in range(self.dp_size) if s not in absent],
            dp_size=self.dp_size,
            total_workers=self.dp_size * self.workers_per_shard,
            train_world_size=len(self._trainers),
        )

    def replace_shard(self, shard: int, workers: Sequence[ActorHandle]) -> None:
        """A restarted shard's new workers; they join at the next rebuild (re-admission)."""
        problem = shard_outside(shard, self.dp_size)
        if problem is not None:
            raise ValueError(problem)
        if len(workers) != self.workers_per_shard:
            raise ValueError(
                f"shard {shard}: {len(workers)} workers given, {self.workers_per_shard} expected"
            )
        self._workers[shard] = list(workers)

    # ── membership ──────────────────────────────────────────────────────────

    def _members(self, layout: RankLayout) -> list[tuple[int, Party, ActorHandle]]:
        """(rank, party, handle) of every member of ``layout``, rank order."""
        members = [(rank, Party.trainer(rank), h) for rank, h in enumerate(self._trainers)]
        for shard in layout.survivors:
            for local, handle in enumerate(self._workers[shard]):
                members.append((layout.rank_of(shard, local), Party.shard(shard), handle))
        return members

    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> ReconcileOutcome:
        """Rebuild over the shards not ``absent`` unless the communicator already matches.

        ``abort()`` from another thread gives up a build in progress: this call raises
        (``ABORTED``) within ``CANCEL_POLL_S``, and the members are told, so a rendezvous
        that completes afterwards is not installed. Story: a survivor frozen during a
        re-admitting build was recorded dead within a second, but the build waited for
        it until a restart killed it; by then its replacement was loaded, nothing looked
        newly absent, and the recovery ended the run with two healthy shards left."""
        absent = frozenset(absent)
        layout = self.layout_for(absent)  # "no surviving shards" propagates from here
        with self._lock:
            self._numbered += 1
            building = self._building = _Build(self._numbered, layout)
            self._pushing = None  # a new refit: nothing of it pushed yet
        try:
            if self._admit(absent, building.cancel):
                force = True  # same absent set, a different process: the group is stale
            if not force and self.built_absent is not None and absent == self.built_absent:
                self.skipped_rebuilds += 1
                return ReconcileOutcome.UNCHANGED
            self._build(building)
            with self._lock:
                if building.cancel.is_set():
                    raise RefitFailed(
                        "build", detail="aborted while it was built", kind=RefitFailureKind.ABORTED
                    )
                # Recorded only now: a failed build leaves the record describing what exists.
                self.builds = building.build
                self.built_absent, self.built_layout = absent, layout
                self.rebuilds += 1
            return ReconcileOutcome.REBUILT
        finally:
            with self._lock:
                if self._building is building:
                    self._building = None

    def _admit(self, absent: frozenset[int], cancel: threading.Event) -> bool:
        """Before a reconcile: bring in members that changed (a restarted shard's new
        workers). True when one did, which forces a rebuild. None changes here."""
        return False

    def _build(self, building: _Build) -> None:
        build, layout = building.build, building.layout
        members = self._members(layout)
        # Telling the membership is a plain call: a frozen member is found within the
        # refit bound, not the (longer) rendezvous budget.
        bound = _plus(self.refit_timeout_s, self.grace_s)
        # The generation side hears the new membership before the build is dispatched,
        # and only surviving shards are addressed: the dead one is why we rebuild.
        self._gather(
            {
                h.refit_membership.remote(build, layout.as_dict()): p
                for _, p, h in members[len(self._trainers) :]
            },
            bound,
            "membership",
            cancel=building.cancel,
        )
        bound = self.build_timeout_s + self.grace_s
        (port,) = self._gather(
            {
                members[0][2].refit_open_store.remote(
                    layout.world_size, self.build_timeout_s, self.store_host
                ): Party.trainer(0)
            },
            bound,
            "store",
            cancel=building.cancel,
        )
        building.port = port
        self._gather(
            {
                h.refit_join.remote(
                    build,
                    port,
                    layout.world_size,
                    rank,
                    self.build_timeout_s,
                    self.refit_timeout_s,
                    self.store_host,
                ): p
                for rank, p, h in members
            },
            bound,
            "build",
            cancel=building.cancel,
        )

    # ── pushing ─────────────────────────────────────────────────────────────

    def push(self, version: int) -> PushReport:
        layout, build = self.built_layout, self.builds
        if layout is None:
            raise RefitFailed(
                "push", detail="no communicator: reconcile first", kind=RefitFailureKind.ABORTED
            )
        started = time.monotonic()
        self._pushing = version

        def give_up() -> None:
            # A deterministic failure: no rebuild follows, so nobody needs to settle;
            # release the rest now. Only this push's build, never a newer one.
            if self.builds == build and self.built_layout is layout:
                self.built_absent = self.built_layout = None
            self._abort_members(layout, build)

        results = self._gather(
            {h.refit_broadcast.remote(version): p for _, p, h in self._members(layout)},
            _plus(self.refit_timeout_s, self.grace_s),
            "push",
            on_deterministic=give_up,
        )
        root = results[0]["checksum"]
        # A shard is one party whatever its width: each of its wrong ranks is one clause.
        wrong: dict[Party, list[str]] = {}
        for (_, party, _), r in zip(self._members(layout), results, strict=True):
            if r["checksum"] != root:
                wrong.setdefault(party, []).append(
                    f"rank {r['rank']}: checksum {r['checksum'][:12]} ≠ root {root[:12]}"
                )
        if wrong:  # the same push would deliver the same bytes: deterministic
            raise RefitFailed(
                "verify",
                errors={p: "; ".join(w) for p, w in wrong.items()},
                kind=RefitFailureKind.DETERMINISTIC,
            )
        return PushReport(
            version=version,
            world_size=layout.world_size,
            bytes=int(results[0]["bytes"]),
            checksum=root,
            elapsed_s=time.monotonic() - started,
        )

    def abort(self, *, gone: Iterable[int] = ()) -> AbortReport:
        """Tell every member still reachable to abort its group — which releases a push
        parked in it — and wait a little for the ones not ``gone`` to say so, not more.

        Each member answers with the version whose load it last began: a shard all of
        whose workers answered with another version than the push's is untouched."""
        with self._lock:
            building, self._building = self._building, None
            layout, build = self.built_layout, self.builds
            self.built_absent = self.built_layout = None
        if building is not None:
            self._give_up(building)
        if layout is None:
            # No communicator: nothing to tell. If nothing was pushed since the last
            # build (a first build that failed, say), no member can have begun a load.
            return AbortReport(frozenset(self._workers) if self._pushing is None else frozenset())
        return self._abort_members(layout, build, frozenset(gone))

    def _give_up(self, building: _Build) -> None:
        """Give up a build in progress: its thread raises, and every member is told, so
        one whose rendezvous completes after all does not install the build (a member
        parked in the rendezvous stays parked on its own thread until the rendezvous
        budget; the next build joins on another). Not waited for: a member that never
        got the join has nothing to refuse."""
        building.cancel.set()
        if building.port is None:
            return  # no join was dispatched: nothing to refuse
        for _, _, handle in self._members(building.layout):
            handle.refit_abort.remote(building.build, building.port)

    def _abort_members(
        self, layout: RankLayout, build: int, gone: frozenset[int] = frozenset()
    ) -> AbortReport:
        asked = [(p, h.refit_abort.remote(build)) for _, p, h in self._members(layout)]
        # A member known gone is told (a dead one's call fails at once) but not waited
        # for: a frozen participant used to cost ABORT_WAIT_S on top of its detection.
        awaited = [ref for p, ref in asked if not (p.kind == "shard" and p.index in gone)]
        wait = min(self.settle_s, ABORT_WAIT_S)
        if awaited:
            ray.wait(awaited, num_returns=len(awaited), timeout=wait)
        loading: dict[int, list[int | None]] = {}
        for party, ref in asked:
            if party.kind != "shard":
                continue
            try:
                said = ray.get(ref, timeout=0)
            except Exception:  # no answer (yet), or gone: its weights may be partial
                loading.setdefault(party.index, []).append(self._pushing)
                continue
            loading.setdefault(party.index, []).append(said.get("loading"))
        # A shard outside the layout received nothing through it; with nothing pushed
        # since the build (a refit whose build failed), nobody did.
        touched = {
            shard
            for shard, versions in loading.items()
            if self._pushing is not None and any(v == self._pushing for v in versions)
        }
        return AbortReport(frozenset(self._workers) - touched)

    # ── waiting ─────────────────────────────────────────────────────────────

    def _gather(
        self,
        calls: Mapping[Any, Party],
        bound: float | None,
        stage: str,
        *,
        on_deterministic: Callable[[], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> list[Any]:
        """Results in call order, or RefitFailed naming every party that did not deliver.

        Once one party has failed, the rest get ``settle_s`` (not the whole bound) to
        finish: long enough for gloo survivors to hit their own timeout and leave the old
        group, which the rebuild needs. ``on_deterministic`` is called once, at the first
        deterministic failure (the push releases the others with it). ``bound=None``:
        wait as long as it takes. ``cancel``: set by ``abort()``, it ends the wait with
        an ``ABORTED`` failure within ``CANCEL_POLL_S``.
        """
        refs = list(calls)
        outcomes: dict[Any, _Outcome] = {}
        pending = list(refs)
        deadline = None if bound is None else time.monotonic() + bound
        settling = ""  # the party whose failure cut the wait to the settle window
        while pending:
            if cancel is not None and cancel.is_set():
                raise RefitFailed(
                    stage, detail="aborted by the controller", kind=RefitFailureKind.ABORTED
                )
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if cancel is not None:
                left = CANCEL_POLL_S if left is None else min(left, CANCEL_POLL_S)
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in ready:
                outcome = outcomes[ref] = self._outcome(ref)
                if outcome.status == "ok":
                    continue
                # One failed: the others get settle_s from now, never more than bound.
                settled = time.monotonic() + self.settle_s
                if deadline is None or settled < deadline:
                    deadline, settling = settled, settling or str(calls[ref])
                if outcome.kind is RefitFailureKind.DETERMINISTIC and on_deterministic:
                    on_deterministic()
                    on_deterministic = None
        error = RefitFailed(stage)
        kinds: list[RefitFailureKind] = []
        # Unbounded, a party is left pending only by the settle window (never unbounded).
        waited = "the settle window" if bound is None else f"{bound:g}s"
        if settling:
            waited = f"settle_s={self.settle_s:g}s after {settling} failed"
        for ref in pending:
            error.silent[calls[ref]] = f"no answer within {waited}"
            kinds.append(RefitFailureKind.TIMED_OUT)
        cause: BaseException | None = None
        for ref, outcome in outcomes.items():
            if outcome.status == "ok":
                continue
            (error.dead if outcome.status == "dead" else error.errors)[calls[ref]] = outcome.value
            if outcome.kind is not None:
                kinds.append(outcome.kind)
            if cause is None and outcome.kind is RefitFailureKind.DETERMINISTIC:
                cause = outcome.exc
        error.kind = refit_failure_kind(kinds)
        if error.kind is not None:
            raise error from cause  # a deterministic failure chains the member's own error
        return [outcomes[ref].value for ref in refs]

    @staticmethod
    def _outcome(ref: Any) -> _Outcome:
        try:
            return _Outcome("ok", ray.get(ref, timeout=0))
        except ActorUnavailableError as exc:  # unreachable for now, not known dead
            return _Outcome("error", exception_line(exc), RefitFailureKind.PEER_LOST, exc)
        except RayActorError as exc:
            return _Outcome("dead", exception_line(exc), RefitFailureKind.PEER_LOST, exc)
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            return _Outcome("error", exception_line(cause), _kind_of(cause), cause)
