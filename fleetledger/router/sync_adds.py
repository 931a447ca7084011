"""A router's adds until they are seen through, for ``router-sync``.

Why a part of its own: an add is the one call the sync cannot finish on its own time. A
vllm-router add blocks until the engine answers ``/health`` (so each is a daemon thread
that can be hung up on — vllm-router then drops it — and nothing waits on it: not a
removal, not the exit); an SMG add is accepted at once and completes later, when the
engine answers ``/health``, and cannot be cancelled (so it is remembered by the handle
SMG gave it, and followed until it lands or is given up, because a shard can leave while
its add waits: story — an accepted add landed after the shard's death, and SMG routed to
the dead engine until the next full reconcile).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fleetledger.router.external import AddAnswer, ExternalRouterError, Hangup, Registry
from fleetledger.router.sync_rule import AddState

__all__ = ["AddDone", "Adds"]


@dataclass(frozen=True, slots=True)
class AddDone:
    """An add's call, answered: what the router said, or why it failed."""

    url: str
    outcome: AddAnswer | ExternalRouterError
    hung_up: bool  # router-sync took it back


class Adds:
    """A router's adds until they are seen through: calls in progress (one daemon thread
    each: a vllm-router add blocks until the engine answers ``/health``, and nothing —
    a removal, the exit — waits on it), and adds the router accepted but completes
    later (an SMG add waits in its queue for the engine's ``/health``; it cannot be
    cancelled)."""

    def __init__(self, registry: Registry, on_done: Callable[[], None], hold_s: float) -> None:
        self._registry = registry
        self._on_done = on_done
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._calls: dict[str, tuple[threading.Thread, Hangup]] = {}
        self._pending: dict[str, str] = {}  # URL -> the router's handle on its add
        self._held: dict[str, float] = {}  # URL -> not asked again before (monotonic)
        self._done: list[AddDone] = []

    def start(self, url: str) -> bool:
        """Add ``url`` in the background, unless an add of it is in progress or pending,
        or was answered less than ``hold_s`` ago (asking again is a call for nothing)."""
        with self._lock:
            if url in self._calls or url in self._pending:
                return False
            if time.monotonic() < self._held.get(url, -math.inf):
                return False
            hangup = Hangup()
            thread = threading.Thread(
                target=self._add, args=(url, hangup), name=f"router-sync-add {url}", daemon=True
            )
            self._calls[url] = (thread, hangup)
        thread.start()
        return True

    def _add(self, url: str, hangup: Hangup) -> None:
        outcome: AddAnswer | ExternalRouterError
        try:
            outcome = self._registry.add(url, hangup)
        except ExternalRouterError as exc:
            outcome = exc
        except Exception as exc:  # an add left "in progress" forever would block its leave
            kind = self._registry.kind
            outcome = ExternalRouterError(f"{kind}: adding {url} failed ({exc!r})")
        with self._lock:
            del self._calls[url]
            self._held[url] = time.monotonic() + self._hold_s
            if isinstance(outcome, AddAnswer) and outcome.pending is not None:
                self._pending[url] = outcome.pending
            self._done.append(AddDone(url, outcome, hangup.hung))
        self._on_done()

    def state(self, url: str) -> AddState:
        with self._lock:
            if url in self._calls:
                return AddState.CALLING
            return AddState.PENDING if url in self._pending else AddState.NONE

    def calling(self) -> list[str]:
        with self._lock:
            return list(self._calls)

    def hang_up(self, urls: Sequence[str]) -> None:
        with self._lock:
            hangups = [self._calls[u][1] for u in urls if u in self._calls]
        for hangup in hangups:
            hangup.hang_up()

    def pending(self) -> dict[str, str]:
        with self._lock:
            return dict(self._pending)

    def resolved(self, url: str) -> None:
        """The router's pending add of ``url`` landed or was given up."""
        with self._lock:
            self._pending.pop(url, None)

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            running = [thread for thread, _ in self._calls.values()]
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))

    def finished(self) -> list[AddDone]:
        with self._lock:
            done, self._done = self._done, []
        return done
