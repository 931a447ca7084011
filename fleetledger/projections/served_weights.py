"""Which weights the run's rollouts came from: per weight version, the rollouts it
produced; per trainer version, how stale the rollouts reported then were.

Read from the outcome windows alone, where every success carries the version the engine
attested at its first token (``ShardOutcomes.versions``): facts the engines stated,
not the ledger's view of which version a shard held. A success nobody attested (a
foreign engine, a row written before the field) is counted as **unknown** — never
guessed from the shard's version in the ledger.

Staleness is the off-policy distance a trainer bounds: the trainer's version when the
window was recorded (the highest version a ``refit_started`` has pushed by then: step N
pushes version N) minus the rollout's version. It is measured where the ledger learns
of a rollout, which is when the adapter hands its window over — a window later than the
rollout's own end, never earlier, so it can only read a rollout as staler, not fresher.
Negative staleness — an engine attesting a version no refit has pushed yet — is kept
as it is: it is evidence that something attests falsely, not a number to clip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetledger.events.models import ShardOutcomes

__all__ = ["ServedWeights"]


def _add(counts: dict[int, int], key: int, n: int) -> None:
    counts[key] = counts.get(key, 0) + n


@dataclass
class ServedWeights:
    """The running count (a part of ``FleetView``; folded in seq order)."""

    by_version: dict[int, int] = field(default_factory=dict)  # version -> rollouts
    partial: int = 0  # rollouts the engine attested as from partial weights
    unknown: int = 0  # rollouts nobody attested
    # trainer version -> staleness -> rollouts; and the unknown ones per trainer version
    staleness: dict[int, dict[int, int]] = field(default_factory=dict)
    unknown_at: dict[int, int] = field(default_factory=dict)
    # Attestations the ledger contradicts: (shard, attested, recorded), once each.
    contradicted: list[tuple[int, int, int]] = field(default_factory=list)

    def add_window(self, outcomes: Iterable[ShardOutcomes], trainer_version: int) -> None:
        for o in outcomes:
            for c in o.contradicted:
                self.contradicted.append((o.shard, c.version, c.recorded))
            if not o.successes:
                continue
            if o.versions:
                step = self.staleness.setdefault(trainer_version, {})
            for v in o.versions:
                _add(self.by_version, v.version, v.count)
                _add(step, trainer_version - v.version, v.count)
            unattested = o.unattested
            if unattested:
                self.unknown += unattested
                _add(self.unknown_at, trainer_version, unattested)
            self.partial += o.partial

    @property
    def attested(self) -> int:
        return sum(self.by_version.values())

    def staleness_total(self) -> dict[int, int]:
        """Staleness -> rollouts, over the whole run."""
        total: dict[int, int] = {}
        for per_step in self.staleness.values():
            for stale, n in per_step.items():
                _add(total, stale, n)
        return total

    def describe(self, shown: int = 4) -> str:
        """One line for people: the rollouts per version (the last ``shown`` versions),
        the staleness distribution, and what nobody attested."""
        total = self.attested + self.unknown
        if not total:
            return "rollouts by weights: none reported"
        versions = sorted(self.by_version.items())
        per_version = ", ".join(f"v{v} {n}" for v, n in versions[-shown:])
        if len(versions) > shown:
            per_version = f"… {len(versions) - shown} earlier versions, " + per_version
        stale = sorted(self.staleness_total().items())
        spread = ", ".join(f"{k}: {n}" for k, n in stale[:shown])
        if len(stale) > shown:
            spread += f", … (max {stale[-1][0]})"
        line = f"rollouts by weights: {total} reported"
        if versions:
            line += f" — {per_version}; staleness {spread}"
        line += f"; unknown {self.unknown}" + (f"; partial {self.partial}" if self.partial else "")
        if self.contradicted:
            shard, said, recorded = self.contradicted[-1]
            line += (
                f"; contradicted by the ledger {len(self.contradicted)}× (last: shard {shard} "
                f"said v{said} where the ledger recorded v{recorded})"
            )
        return line

    def as_json(self) -> dict[str, Any]:
        """The counts as JSON (string keys), for snapshots and documents."""
        return {
            "by_version": _keyed(self.by_version),
            "partial": self.partial,
            "unknown": self.unknown,
            "staleness": {str(t): _keyed(s) for t, s in sorted(self.staleness.items())},
            "unknown_at": _keyed(self.unknown_at),
            "contradicted": [list(c) for c in self.contradicted],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ServedWeights:
        return cls(
            by_version=_unkeyed(d["by_version"]),
            partial=int(d["partial"]),
            unknown=int(d["unknown"]),
            staleness={int(t): _unkeyed(s) for t, s in d["staleness"].items()},
            unknown_at=_unkeyed(d["unknown_at"]),
            contradicted=[(int(a), int(b), int(c)) for a, b, c in d["contradicted"]],
        )


def _keyed(counts: Mapping[int, int]) -> dict[str, int]:
    return {str(k): n for k, n in sorted(counts.items())}


def _unkeyed(counts: Mapping[str, Any]) -> dict[int, int]:
    return {int(k): int(n) for k, n in counts.items()}
