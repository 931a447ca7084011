"""Deadlines for the three waits of a rollout (docs/reference.md §5), each optional.

Story: nothing on the rollout path had a deadline, and the gym client disabled every
timeout, so a dead engine parked a rollout forever while it held a buffer slot and an
in-flight permit; enough of them and the rollout pump blocked with no exception anywhere.

- the whole rollout *stream* (deliberately the whole stream, not each await: rows
  arrive as they finish, so a per-await budget would reset on every fast row and never
  fire for the slow row actually holding the group up);
- one *generation* turn;
- one *environment* step (this frees the rollout, not a thread stuck in a blocking call:
  Python cannot kill a running thread).

Every default is ``None``: wait indefinitely, exactly as if no deadline existed.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from types import TracebackType

from fleetledger.adapters.failure_taxonomy import DeadlineExpired

__all__ = ["Deadline", "DeadlineExpired", "RolloutDeadlines"]


class Deadline:
    """``asyncio.timeout`` that reports only its *own* expiry, as :class:`DeadlineExpired`.

    A bare ``asyncio.timeout`` surfaces expiry as ``TimeoutError``, indistinguishable
    from a ``TimeoutError`` raised by the wrapped code itself; relabelling the latter
    with our duration would send whoever debugs it to the wrong knob. So the expiry is
    relabelled only when ``expired()`` confirms our timer fired, and anything else --
    the wrapped code's own ``TimeoutError``, an inner deadline's expiry, an outer
    cancellation -- propagates untouched. Expiry is infrastructure (retriable).

    One instance guards one ``async with`` at a time; it may be re-entered afterwards.
    """

    def __init__(self, name: str, seconds: float | None) -> None:
        if seconds is not None and not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{name} deadline must be a positive number of seconds or None")
        self.name = name
        self.seconds = seconds
        self._timeout: asyncio.Timeout | None = None
        self._active = False

    def expired(self) -> bool:
        """True once our timer has fired during the current (or last) ``async with``."""
        return self._timeout is not None and self._timeout.expired()

    async def __aenter__(self) -> Deadline:
        if self._active:
            raise RuntimeError(f"{self.name} deadline is already in use")
        self._timeout = asyncio.timeout(self.seconds)
        await self._timeout.__aenter__()
        self._active = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        timeout = self._timeout
        if timeout is None or not self._active:
            raise RuntimeError(f"{self.name} deadline: __aexit__ without __aenter__")
        self._active = False
        try:
            return await timeout.__aexit__(exc_type, exc, tb)
        except TimeoutError as expiry:
            # Only the TimeoutError that asyncio.Timeout itself raises reaches here (the
            # wrapped code's own one propagates past __aexit__ untouched); expired() is
            # checked anyway so a relabel can only ever mean our timer fired.
            if not timeout.expired() or self.seconds is None:
                raise
            raise DeadlineExpired(self.name, self.seconds) from expiry


@dataclass(frozen=True, slots=True)
class RolloutDeadlines:
    """The three rollout deadlines in seconds; ``None`` (the default) = wait indefinitely."""

    stream_s: float | None = None
    generation_s: float | None = None
    environment_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("stream_s", "generation_s", "environment_s"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds or None")

    def stream(self) -> Deadline:
        """A deadline spanning a whole prompt-group stream."""
        return Deadline("stream", self.stream_s)

    def generation(self) -> Deadline:
        """A deadline for one generation turn."""
        return Deadline("generation", self.generation_s)

    def environment(self) -> Deadline:
        """A deadline for one environment step."""
        return Deadline("environment", self.environment_s)
