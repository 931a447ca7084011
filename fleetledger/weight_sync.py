"""The weight-sync contract between refit recovery and the transports.

What the refit coordinator calls: ``reconcile(absent, force=)`` to make the communicator
match the ledger's absent set, ``push(version)``, ``abort(gone=)`` (which reports whose
load of the cut push had begun: :class:`AbortReport`), and ``built_layout`` — the
rank layout the transport actually built, which the coordinator checks against the
ledger's (a transport that builds no collective leaves it ``None``). What it gets back on
failure: a :class:`RefitFailed` whose parties are typed (:class:`Party`), so the recovery
reads who died, who hung and whether the device context is lost from fields, never by
parsing ``"shard 3"`` out of a string — and what kind of failure it is
(:class:`RefitFailureKind`: timed out, peer lost, aborted, deterministic), which decides
whether the recovery runs at all (``projections.decisions.decide_refit_failure``): a
deterministic failure is not retried, and nobody is condemned for it.

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
from typing import Literal, get_args

from fleetledger.errors import FleetledgerError
from fleetledger.projections.decisions import RefitFailureKind
from fleetledger.projections.rank_layout import RankLayout

__all__ = [
    "AbortReport",
    "NoCollective",
    "Party",
    "PartyKind",
    "PushReport",
    "ReconcileOutcome",
    "RefitFailed",
    "RefitFailureKind",
    "WeightSynchronizer",
]

PartyKind = Literal["trainer", "shard"]


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


@dataclass(frozen=True)
class AbortReport:
    """What an abort learned about the push it cut: which shards said their load of the
    pushed version had not begun (``untouched``) — they still hold whole weights of the
    version before, and are not partial. A shard that did not answer, or whose load
    began, may hold partial weights. The default (nothing known) leaves every shard
    possibly partial, which is what a transport that cannot tell must say.

    Story: a peer lost mid-broadcast marked every survivor partial though none had begun
    loading: the serving set emptied for ~0.1 s, the epoch moved twice, and a router
    answered 409 meanwhile.
    """

    untouched: frozenset[int] = frozenset()

    def may_be_partial(self, shards: Iterable[int]) -> tuple[int, ...]:
        """``shards`` whose weights may be partial, ascending."""
        return tuple(sorted(set(shards) - self.untouched))

    def __or__(self, other: AbortReport) -> AbortReport:
        """Two aborts of one refit: a shard untouched by either's account is untouched."""
        return AbortReport(self.untouched | other.untouched)


@dataclass(frozen=True, slots=True, order=True)
class Party:
    """One side of the refit communicator: a trainer rank or a generation shard.

    A shard is one party however many workers (ranks) it has: the ledger judges shards,
    not ranks. ``str()`` is the text messages and tests have always shown ("shard 3").
    """

    kind: PartyKind
    index: int

    def __post_init__(self) -> None:
        if self.kind not in get_args(PartyKind):
            raise ValueError(f"a party is a trainer or a shard, not {self.kind!r}")
        if self.index < 0:
            raise ValueError(f"{self.kind} index must be ≥ 0, got {self.index}")

    @classmethod
    def trainer(cls, rank: int) -> Party:
        return cls("trainer", rank)

    @classmethod
    def shard(cls, index: int) -> Party:
        return cls("shard", index)

    def __str__(self) -> str:
        return f"{self.kind} {self.index}"


@dataclass
class RefitFailed(FleetledgerError):
    """A build or push failed, and who the transport saw fail.

    ``dead``: parties the runtime says are gone; ``silent``: parties that did not answer
    within the bound (alive, perhaps frozen); ``errors``: parties that raised — which
    every rank of a collective does when any peer fails, so an error names a party
    without condemning it. ``context_lost``: the trainer's device context is gone, and
    no rebuild can work. ``detail``: what failed when no party is to blame.

    ``kind``: what the transport knows the failure to be (it sees which party raised
    what). Left ``None`` by a transport that does not say, it is read from the parties
    (:attr:`failure_kind`): a dead party is a lost peer, a silent one a timeout, and a
    failure naming neither is deterministic — an error nobody recognised fails loudly
    instead of being retried, or pinned on a suspect, into silence.
    """

    stage: str
    dead: dict[Party, str] = field(default_factory=dict)
    silent: dict[Party, str] = field(default_factory=dict)
    errors: dict[Party, str] = field(default_factory=dict)
    context_lost: bool = False
    detail: str = ""
    kind: RefitFailureKind | None = None

    def __str__(self) -> str:
        found = (("dead", self.dead), ("silent", self.silent), ("failed", self.errors))
        parts = [
            f"{label}: " + "; ".join(f"{party}: {text}" for party, text in parties.items())
            for label, parties in found
            if parties
        ]
        if self.detail:
            parts.append(self.detail)
        return f"refit {self.stage} failed — " + (" | ".join(parts) or "no party named")

    @property
    def failure_kind(self) -> RefitFailureKind:
        """``kind`` when the transport set it, else what the parties say (see above)."""
        if self.kind is not None:
            return self.kind
        if self.dead:
            return RefitFailureKind.PEER_LOST
        if self.silent:
            return RefitFailureKind.TIMED_OUT
        return RefitFailureKind.DETERMINISTIC

    @property
    def dead_shards(self) -> tuple[int, ...]:
        return _indices(self.dead, "shard")

    @property
    def silent_shards(self) -> tuple[int, ...]:
        return _indices(self.silent, "shard")

    @property
    def dead_trainers(self) -> tuple[int, ...]:
        """Trainer ranks the runtime says are gone (a trainer that merely raised is not)."""
        return _indices(self.dead, "trainer")

    @property
    def named_shards(self) -> tuple[int, ...]:
        """Shards seen hanging or raising while alive: a silent participant, if the
        transport named any shard at all, must be among these."""
        return tuple(sorted({*_indices(self.silent, "shard"), *_indices(self.errors, "shard")}))


def _indices(parties: Mapping[Party, str], kind: PartyKind) -> tuple[int, ...]:
    return tuple(sorted(p.index for p in parties if p.kind == kind))


class WeightSynchronizer(ABC):
    """Builds the refit communicator over a layout and pushes weights through it.

    ``built_absent`` / ``built_layout`` describe the communicator that exists (``None``:
    none, or no collective at all); ``rebuilds`` / ``skipped_rebuilds`` count reconciles.
    """

    built_absent: frozenset[int] | None
    built_layout: RankLayout | None
    rebuilds: int
    skipped_rebuilds: int

    def __init__(self) -> None:
        self.built_absent = None
        self.built_layout = None
        self.rebuilds = 0
        self.skipped_rebuilds = 0

    @abstractmethod
    def reconcile(self, absent: Iterable[int], *, force: bool = False) -> ReconcileOutcome:
        """Make the communicator match ``absent`` (rebuild unless unchanged, or forced)."""

    @abstractmethod
    def push(self, version: int) -> PushReport:
        """Push the trainer's weights at ``version`` to every member; raise RefitFailed."""

    @abstractmethod
    def abort(self, *, gone: Iterable[int] = ()) -> AbortReport:
        """Abort the current communicator on every member that can still be reached.

        ``gone``: shards known dead, absent or unresponsive (a failed probe, a silent
        party): told to abort like the rest, but not waited for — a frozen participant
        costs the time to detect it, no more. Returns what the members said about their
        loads (:class:`AbortReport`).

        Called from another thread while ``reconcile`` or ``push`` waits (the refit
        coordinator's watch): it must make that call return promptly, failing, and a
        build it cut must never be installed afterwards."""


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

    def abort(self, *, gone: Iterable[int] = ()) -> AbortReport:
        return AbortReport()  # nothing collective to abort, and nothing known of the loads
