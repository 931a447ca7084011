"""The weights an engine serves from, as the engine itself knows them: the source of
every answer's attestation.

The version moves the instant a load completes — not when the fleet is told the refit
completed, which comes later (the trainer hears every participant first). A load that
began and did not complete leaves the weights partial until the next load completes:
the engine says so on every answer instead of passing the old version off as whole.

A request's first token is not always generated at the version held when it arrived: a
request that arrives while a load is in progress waits for it (the engine's generation
is paused), so its first token comes from the weights that load installs.
:meth:`HeldWeights.arrival` and :meth:`HeldWeights.start_of` say that, for engines whose
first token cannot be watched (a non-streamed HTTP answer).
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetledger.shards.contract import checked_weight_version

__all__ = ["Arrival", "HeldWeights"]

_HISTORY = 256  # ended loads remembered, for requests that arrived during one


@dataclass(frozen=True, slots=True)
class Arrival:
    """What the engine held when a request arrived: the version, how many loads had
    ended (completed or cut), and whether one was in progress (the request waits for
    it)."""

    version: int
    loads: int
    loading: bool


class HeldWeights:
    """One engine's weights: the version, whether they are partial, the loads so far."""

    def __init__(self, shard: int, version: int = 0) -> None:
        self.shard = shard
        self.version = version
        self.partial = False
        self.loading: int | None = None  # the version whose load is in progress
        self._loads = 0  # loads ended, completed or cut
        self._after: dict[int, int] = {}  # load number -> the version held once it ended

    def load_begins(self, version: int) -> None:
        """From here until :meth:`load_completes`, a cut load leaves the weights partial."""
        self.loading = version
        self.partial = True

    def load_completes(self, version: int) -> int:
        """The engine serves ``version`` from now on (weights only move forward)."""
        self.version = checked_weight_version(self.shard, self.version, version)
        self.partial = False
        self._ended()
        return version

    def load_failed(self) -> None:
        """The load in progress ended without completing: the weights stay partial (and
        the engine serves from them again)."""
        self._ended()

    def _ended(self) -> None:
        self.loading = None
        self._loads += 1
        self._after[self._loads] = self.version
        self._after.pop(self._loads - _HISTORY, None)

    def arrival(self) -> Arrival:
        return Arrival(self.version, self._loads, self.loading is not None)

    def start_of(self, arrived: Arrival) -> int:
        """The version at the first token of a request that arrived at ``arrived`` and
        whose first token was not watched: the version held then, or — where a load was
        in progress — the version held once that load ended (the request waited for
        it), or the version held now while it has not."""
        if not arrived.loading:
            return arrived.version
        return self._after.get(arrived.loads + 1, self.version)
