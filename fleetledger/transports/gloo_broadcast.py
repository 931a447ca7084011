"""Broadcast weight sync over torch.distributed between Ray actors (gloo on CPU).

The controller side of the transport: it computes the layout for an absent set, tells
the generation side the new membership, has rank 0 (a trainer) bind a fresh store,
dispatches the build to the trainers and the surviving shards' workers only, and pushes
weights by broadcast from rank 0, every receiver returning the checksum of what it holds.

Every wait is bounded: ``ray.wait`` with the refit timeout plus a grace (the ranks' own,
attributable error should win the race against "it never came back"). When one party
fails, the others are given ``settle_s`` to finish failing before the error propagates:
the rebuild that follows is itself a collective and needs every survivor out of the old
one. Ray's "actor died" is reported as a dead party; no answer as a silent one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

from fleetledger.events.models import shard_outside
from fleetledger.projections.rank_layout import RankLayout, rank_layout
from fleetledger.weight_sync import (
    Party,
    PushReport,
    ReconcileOutcome,
    RefitFailed,
    WeightSynchronizer,
)

__all__ = ["GlooBroadcastSynchronizer"]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class GlooBroadcastSynchronizer(WeightSynchronizer):
    """Rebuilds a gloo group over the surviving shards; pushes by broadcast from rank 0."""

    def __init__(
        self,
        trainers: Sequence[ActorHandle],
        shard_workers: Mapping[int, Sequence[ActorHandle]],
        *,
        refit_timeout_s: float,
        grace_s: float = 5.0,
        settle_s: float = 10.0,
        build_timeout_s: float = 60.0,
    ) -> None:
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
        if refit_timeout_s <= 0:
            raise ValueError(f"refit_timeout_s must be > 0, got {refit_timeout_s}")
        if build_timeout_s <= 0:
            raise ValueError(f"build_timeout_s must be > 0, got {build_timeout_s}")
        self.build_timeout_s = build_timeout_s
        self._trainers = list(trainers)
        self._workers = {shard: list(workers) for shard, workers in shard_workers.items()}
        self.workers_per_shard = widths.pop()
        self.refit_timeout_s = refit_timeout_s
        self.grace_s = grace_s
        self.settle_s = settle_s
        self.builds = 0

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
        absent = frozenset(absent)
        if not force and self.built_absent is not None and absent == self.built_absent:
            self.skipped_rebuilds += 1
            return ReconcileOutcome.UNCHANGED
        layout = self.layout_for(absent)  # "no surviving shards" propagates from here
        build = self.builds + 1
        members = self._members(layout)
        # Telling the membership is a plain call: a frozen member is found within the
        # refit bound, not the (longer) rendezvous budget.
        bound = self.refit_timeout_s + self.grace_s
        # The generation side hears the new membership before the build is dispatched,
        # and only surviving shards are addressed: the dead one is why we rebuild.
        self._gather(
            {
                h.refit_membership.remote(build, layout.as_dict()): p
                for _, p, h in members[len(self._trainers) :]
            },
            bound,
            "membership",
        )
        bound = self.build_timeout_s + self.grace_s
        (port,) = self._gather(
            {
                members[0][2].refit_open_store.remote(
                    layout.world_size, self.build_timeout_s
                ): Party.trainer(0)
            },
            bound,
            "store",
        )
        self._gather(
            {
                h.refit_join.remote(
                    build,
                    port,
                    layout.world_size,
                    rank,
                    self.build_timeout_s,
                    self.refit_timeout_s,
                ): p
                for rank, p, h in members
            },
            bound,
            "build",
        )
        # Recorded only now: a failed build leaves the record describing what exists.
        self.builds = build
        self.built_absent, self.built_layout = absent, layout
        self.rebuilds += 1
        return ReconcileOutcome.REBUILT

    # ── pushing ─────────────────────────────────────────────────────────────

    def push(self, version: int) -> PushReport:
        layout = self.built_layout
        if layout is None:
            raise RefitFailed("push", detail="no communicator: reconcile first")
        started = time.monotonic()
        results = self._gather(
            {h.refit_broadcast.remote(version): p for _, p, h in self._members(layout)},
            self.refit_timeout_s + self.grace_s,
            "push",
        )
        root = results[0]["checksum"]
        # A shard is one party whatever its width: each of its wrong ranks is one clause.
        wrong: dict[Party, list[str]] = {}
        for (_, party, _), r in zip(self._members(layout), results, strict=True):
            if r["checksum"] != root:
                wrong.setdefault(party, []).append(
                    f"rank {r['rank']}: checksum {r['checksum'][:12]} ≠ root {root[:12]}"
                )
        if wrong:
            raise RefitFailed("verify", errors={p: "; ".join(w) for p, w in wrong.items()})
        return PushReport(
            version=version,
            world_size=layout.world_size,
            bytes=int(results[0]["bytes"]),
            checksum=root,
            elapsed_s=time.monotonic() - started,
        )

    def abort(self) -> None:
        """Tell every member still reachable to abort its group; wait a little, not more."""
        layout = self.built_layout
        self.built_absent = self.built_layout = None
        if layout is None:
            return
        refs = [h.refit_abort.remote() for _, _, h in self._members(layout)]
        ray.wait(refs, num_returns=len(refs), timeout=min(self.settle_s, 5.0))

    # ── waiting ─────────────────────────────────────────────────────────────

    def _gather(self, calls: Mapping[Any, Party], bound: float, stage: str) -> list[Any]:
        """Results in call order, or RefitFailed naming every party that did not deliver.

        Once one party has failed, the rest get ``settle_s`` (not the whole bound) to
        finish: long enough for gloo survivors to hit their own timeout and leave the old
        group, which the rebuild needs.
        """
        refs = list(calls)
        outcomes: dict[Any, tuple[str, Any]] = {}
        pending = list(refs)
        deadline = time.monotonic() + bound
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in ready:
                outcomes[ref] = self._outcome(ref)
                if outcomes[ref][0] != "ok":
                    # One failed: the others get settle_s from now, never more than bound.
                    deadline = min(deadline, time.monotonic() + self.settle_s)
        error = RefitFailed(stage)
        for ref in pending:
            error.silent[calls[ref]] = f"no answer within {bound:g}s"
        for ref, (kind, value) in outcomes.items():
            if kind == "dead":
                error.dead[calls[ref]] = value
            elif kind == "error":
                error.errors[calls[ref]] = value
        if error.dead or error.silent or error.errors:
            raise error
        return [outcomes[ref][1] for ref in refs]

    @staticmethod
    def _outcome(ref: Any) -> tuple[str, Any]:
        try:
            return "ok", ray.get(ref, timeout=0)
        except ActorUnavailableError as exc:
            return "error", f"{type(exc).__name__}: {_first_line(exc)}"
        except RayActorError as exc:
            return "dead", f"{type(exc).__name__}: {_first_line(exc)}"
        except Exception as exc:
            cause = getattr(exc, "cause", None) or exc
            return "error", f"{type(cause).__name__}: {_first_line(cause)}"
