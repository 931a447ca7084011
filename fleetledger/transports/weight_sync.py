"""The weight-sync contract: build a communicator for a rank layout, push, abort.

A transport remembers the absent set its communicator was built with and skips a
rebuild when it is unchanged (compared as sets): reconciling is called twice per refit,
and rebuilding every time after a loss cost one full bootstrap per call for the rest of
the run. The recovery path forces the rebuild, because after an abort the absent set is
unchanged and the communicator is gone. The set is recorded only after a rebuild
succeeded, so a failed rebuild leaves the record describing the communicator that still
exists.

A transport that owns no collective (weights loaded over HTTP, from disk) answers
``NOT_APPLICABLE`` — which is not ``UNCHANGED``: "there is nothing to rebuild" and "the
membership did not change" are different facts, and the recovery must not read the
first as the second.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from fleetledger.projections.rank_layout import RankLayout

__all__ = [
    "NoCollective",
    "PushReport",
    "ReconcileOutcome",
    "RefitFailed",
    "WeightSynchronizer",
]


class ReconcileOutcome(StrEnum):
    NOT_APPLICABLE = "not applicable"
    UNCHANGED = "unchanged"
    REBUILT = "rebuilt"


@dataclass(frozen=True)
class PushReport:
    """A completed push: every receiver verified what it got against the root."""

    version: int
    world_size: int
    bytes: int
    checksum: str
    elapsed_s: float


@dataclass
class RefitFailed(Exception):
    """A build or push failed. ``dead``: parties the runtime says are gone; ``silent``:
    parties that did not answer within the bound (alive, perhaps frozen); ``errors``:
    parties that raised. Parties are ``"trainer <rank>"`` or ``"shard <index>"``."""

    stage: str
    dead: dict[str, str] = field(default_factory=dict)
    silent: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    context_lost: bool = False

    def __str__(self) -> str:
        parts = []
        for label, found in (("dead", self.dead), ("silent", self.silent), ("failed", self.errors)):
            if found:
                parts.append(f"{label}: " + "; ".join(f"{k}: {v}" for k, v in found.items()))
        return f"refit {self.stage} failed — " + (" | ".join(parts) or "no party named")

    @property
    def dead_shards(self) -> tuple[int, ...]:
        return _shards(self.dead)

    @property
    def silent_shards(self) -> tuple[int, ...]:
        return _shards(self.silent)


def _shards(parties: Mapping[str, str]) -> tuple[int, ...]:
    return tuple(sorted(int(p.split()[1]) for p in parties if p.startswith("shard ")))


class WeightSynchronizer(ABC):
    """Builds the refit communicator over a layout and pushes weights through it."""

    def __init__(self) -> None:
        self.built_absent: frozenset[int] | None = None
        self.built_layout: RankLayout | None = None
        self.rebuilds = 0
        self.skipped_rebuilds = 0

    @abstractmethod
    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> ReconcileOutcome:
        """Make the communicator match ``absent`` (rebuild unless unchanged, or forced)."""

    @abstractmethod
    def push(self, version: int) -> PushReport:
        """Push the trainer's weights at ``version`` to every member; raise RefitFailed."""

    @abstractmethod
    def abort(self) -> None:
        """Abort the current communicator on every member that can still be reached."""


class NoCollective(WeightSynchronizer):
    """A transport without collective membership (weights loaded over HTTP, from disk):
    reconciling is not applicable; pushing is whatever loader it was given."""

    def __init__(self, load: Callable[[int], PushReport]) -> None:
        super().__init__()
        self._load = load

    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> ReconcileOutcome:
        return ReconcileOutcome.NOT_APPLICABLE

    def push(self, version: int) -> PushReport:
        return self._load(version)

    def abort(self) -> None:
        return None  # nothing collective to abort
