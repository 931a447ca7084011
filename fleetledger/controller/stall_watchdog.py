"""One watchdog tick: a stall is no progress with work remaining; the clock is injected.

Why it is shaped like this:

- **One tick, no timer.** The caller owns the loop (every ``watchdog.interval_s``) and
  hands each tick what it observed; this class only decides and records. The clock is
  an injected ``now()`` (monotonic seconds), so tests advance time by hand instead of
  sleeping, and a wall-clock jump cannot fake or hide a stall.
- **Progress is the pair** (committed rollout groups, completed train steps). Either
  moving is progress: a trainer stepping on a full buffer is as alive as a rollout pump
  committing groups.
- **A stall needs only work remaining and no progress** for ``stall_timeout_s``.
  In-flight work is deliberately not required: a hung refit parks the pump with nothing
  in flight, which is exactly the wedge the watchdog exists to explain. Once train steps
  reach max steps nothing is expected to move, so that is never a stall.
- **Everything that matters goes through the Ledger**, so a replay explains it:
  ``progress_reported`` is recorded only when the pair changes (plus once, on the first
  tick, so the log has the baseline). Recording every tick would put one event per
  ``interval_s`` into the log for the whole run while saying nothing new; the in-flight
  count alone moving is not progress and is not recorded either (it still goes into
  the ``stall_detected`` event, where it matters).
- **A stall is recorded once per episode** (``stall_detected``): a wedged run would
  otherwise add one identical event per tick. The episode ends when progress moves;
  the next stall is a new episode and is recorded again.
- **The tick does not end the run on a stall.** It returns a :class:`TickDecision`
  whose ``action`` is ``warn`` or ``abort`` (``watchdog.stall_action``); aborting means
  tearing down the pump, which is the caller's job (it records
  ``Ledger.end_run("aborted", decision.cause)`` when it does).
- **Fleet exhaustion ends the run here**, with its cause: the exhaustion decision
  (``projections.decisions``) is recorded as it returns — ``declare_exhausted``, then
  ``end_run("failed", reason)``. It is suspended inside :meth:`recovering`,
  because a refit recovery (condemn, restart, re-admit) takes shards out of serving on
  purpose for a moment, and failing the run for that would defeat the recovery. It is
  also not checked once no work remains: a run that has finished its steps completes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from fleetledger.config import WatchdogConfig
from fleetledger.controller.ledger import Ledger
from fleetledger.projections.decisions import decide_exhaustion

Action = Literal["none", "warn", "abort", "exhausted", "ended"]


@dataclass(frozen=True, slots=True)
class TickDecision:
    """What one tick concluded.

    ``action``: ``none`` (carry on), ``warn``/``abort`` (a stall, per ``stall_action``;
    returned on every tick of the episode, with ``stall_recorded`` true only on the tick
    that recorded it), ``exhausted`` (this tick ended the run, ``cause`` says why) or
    ``ended`` (the run had already ended; nothing was recorded).
    """

    action: Action
    idle_s: float
    stall_recorded: bool = False
    progress_recorded: bool = False
    cause: str = ""

    @property
    def stalled(self) -> bool:
        return self.action in ("warn", "abort")


class StallWatchdog:
    """Stall and exhaustion checks of one run, one :meth:`tick` at a time.

    Idle time is measured from the last observed progress, or from construction before
    any: a run that never makes progress at all stalls too. After a controller restart
    the baseline progress comes from the log (``view.progress``), so an unchanged pair is
    not recorded again; idle time restarts, because a monotonic clock does not survive a
    process.
    """

    def __init__(
        self,
        ledger: Ledger,
        config: WatchdogConfig,
        *,
        now: Callable[[], float],
    ) -> None:
        self._ledger = ledger
        self._config = config
        self._now = now
        last = ledger.view.progress
        self._progress: tuple[int, int] | None = (
            (last.committed_groups, last.train_steps) if last is not None else None
        )
        self._since = now()
        self._in_episode = False
        self._recovering = 0
        self._lock = threading.Lock()

    # ── the refit recovery window ─────────────────────────────────────────────

    @contextmanager
    def recovering(self) -> Iterator[None]:
        """Suspend the exhaustion check while a refit recovery runs (nestable).

        Entered from the refit's thread while ticks run in the watchdog's, hence the lock;
        the stall check keeps running (stall_timeout_s outlasts every refit bound, so a
        recovery that hangs is still reported).
        """
        with self._lock:
            self._recovering += 1
        try:
            yield
        finally:
            with self._lock:
                self._recovering -= 1

    @property
    def is_recovering(self) -> bool:
        with self._lock:
            return self._recovering > 0

    # ── one tick ────────────────────────────────────────────────────────────

    def tick(
        self,
        *,
        committed_groups: int,
        train_steps: int,
        in_flight: int,
        work_remains: bool,
    ) -> TickDecision:
        """Observe once: record progress if it moved, then check exhaustion, then stall."""
        view = self._ledger.view
        if view.ended is not None:
            return TickDecision("ended", 0.0, cause=view.ended.cause)

        now = self._now()
        pair = (committed_groups, train_steps)
        progress_recorded = False
        if pair != self._progress:
            first = self._progress is None
            self._ledger.report_progress(
                committed_groups=committed_groups, train_steps=train_steps, in_flight=in_flight
            )
            progress_recorded = True
            self._progress = pair
            if not first:
                # Movement, not the baseline, resets the idle clock and ends an episode.
                self._since = now
                self._in_episode = False
        idle_s = now - self._since

        if work_remains and not self.is_recovering:
            exhaustion = decide_exhaustion(self._ledger.view)
            if exhaustion.exhausted:
                self._ledger.declare_exhausted()
                self._ledger.end_run("failed", exhaustion.reason)
                return TickDecision(
                    "exhausted",
                    idle_s,
                    progress_recorded=progress_recorded,
                    cause=exhaustion.reason,
                )

        if not work_remains or idle_s < self._config.stall_timeout_s:
            if not work_remains:
                self._in_episode = False
            return TickDecision("none", idle_s, progress_recorded=progress_recorded)

        action = self._config.stall_action
        cause = (
            f"no progress for {idle_s:g}s (stall_timeout_s={self._config.stall_timeout_s:g}): "
            f"{committed_groups} committed groups, {train_steps} train steps, "
            f"{in_flight} in flight"
        )
        recorded = not self._in_episode
        if recorded:
            self._ledger.stall_detected(
                committed_groups=committed_groups,
                train_steps=train_steps,
                idle_s=idle_s,
                in_flight=in_flight,
                action=action,
            )
            self._in_episode = True
        return TickDecision(
            action,
            idle_s,
            stall_recorded=recorded,
            progress_recorded=progress_recorded,
            cause=cause,
        )
