"""Reports that arrive after their run ended: counted, and said once.

Story: after the controller ended a run, the rollouts still in flight each logged
"rollout failure not recorded … nothing may be appended after it" at error level — 16
lines that read like 16 failures, about a run that had ended as it should. A report
that finds its run ended is not an error: the run's end is the answer, recorded once in
the ledger. So each kind of late report is counted, and the first of each kind is logged
at info; any other refusal is still the error it was.
"""

from __future__ import annotations

import threading

import structlog

from fleetledger.store.errors import RunAlreadyEnded

__all__ = ["LateReports"]

_log = structlog.get_logger("fleetledger.late")


class LateReports:
    """Late reports of one run, by kind ("rollout failure", "restart", "probe round" …)."""

    def __init__(self, run: str) -> None:
        self.run = run
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, what: str, ended: RunAlreadyEnded) -> int:
        """Count one late ``what``; the first of its kind is logged at info. Returns how
        many of that kind have come so far."""
        with self._lock:
            n = self._counts[what] = self._counts.get(what, 0) + 1
        if n == 1:
            _log.info(
                "report after the run ended: counted, not recorded (further ones silently)",
                run=self.run,
                report=what,
                ended_at_seq=ended.ended_seq,
            )
        return n

    def counts(self) -> dict[str, int]:
        """A copy: kind → late reports counted in this process."""
        with self._lock:
            return dict(self._counts)
