"""The loop's own account of its rollouts: what it saw happen, stamped by the wall clock.

The chaos oracle holds what the ledger derives — each fault's cost, from the outcome
windows alone — against what the loop itself counted, and each request through the
router against the moment its shard left the fleet. Kept apart from the ledger on
purpose: counted where the loop sees it, never read back from the log, so a window lost,
doubled or misattributed on its way into the ledger shows as a difference.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Literal

from fleetledger.adapters.retry_policy import Fate

__all__ = ["Ended", "LoopAccount", "RoutedWait", "Seen", "Tally"]

Seen = Literal["success", "redispatched", "dropped", "ended_run"]
Ended = Literal["answered", "shard_left", "error", "deadline"]


def _now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class Tally:
    """One attempt the loop saw end on ``shard``: a success, or a failure's fate."""

    at_us: int
    shard: int
    seen: Seen


@dataclass(frozen=True, slots=True)
class RoutedWait:
    """One request through the router, from the client's side: when it was sent and when
    it came back (µs since the epoch); the shard the router named for it (``None``: none
    was named — a deadline, a refused connection); the shard it was re-sent from; how it
    ended."""

    started_us: int
    ended_us: int
    shard: int | None
    resent_from: int | None
    ended: Ended

    def as_json(self) -> list[object]:
        return [self.started_us, self.ended_us, self.shard, self.resent_from, self.ended]


class LoopAccount:
    """Appended to from the loop's thread (and the router client's); read when the run
    is over."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: list[Tally] = []
        self._waits: list[RoutedWait] = []

    def success(self, shard: int) -> None:
        self._add(Tally(_now_us(), shard, "success"))

    def fate(self, shard: int, fate: Fate) -> None:
        self._add(Tally(_now_us(), shard, fate))

    def waited(
        self,
        started_us: int,
        shard: int | None,
        resent_from: int | None,
        ended: Ended,
    ) -> None:
        wait = RoutedWait(started_us, _now_us(), shard, resent_from, ended)
        with self._lock:
            self._waits.append(wait)

    def _add(self, tally: Tally) -> None:
        with self._lock:
            self._tallies.append(tally)

    @property
    def tallies(self) -> tuple[Tally, ...]:
        with self._lock:
            return tuple(self._tallies)

    @property
    def waits(self) -> tuple[RoutedWait, ...]:
        with self._lock:
            return tuple(self._waits)

    @staticmethod
    def now_us() -> int:
        """The clock the account stamps with (the recorder's: µs since the epoch)."""
        return _now_us()
