"""The adapters' way in: windows of (successes, failures) per shard, from any process.

A routing adapter (an HTTP router, a rollout worker in another Ray actor) sees what the
probes cannot: generations that time out on an engine that still answers probes. It
counts outcomes per shard into a window and hands the window over as one
``outcome_window_reported`` event, appended straight to the run's log — the controller
folds it in when it next reads the tail. Nothing goes through the controller's process,
so an adapter in another actor or on another host (PostgreSQL) reports the same way.

Successes and failures of a window travel together, and the fold applies the
successes first. Story: the reference once drained them apart, windows interleaved, and
a healthy shard with three transport blips days apart was eventually condemned.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetledger.adapters.failure_taxonomy import (
    Classification,
    FailureKind,
    classify_exception,
    classify_http_status,
    exception_text,
)
from fleetledger.adapters.retry_policy import FATES, Fate
from fleetledger.events.models import (
    MAX_EXAMPLE,
    Contradiction,
    FailureCount,
    OutcomeWindowReported,
    RolloutFates,
    ShardOutcomes,
    VersionCount,
)
from fleetledger.store.errors import AppendRejected
from fleetledger.store.log import EventLog

__all__ = ["OutcomeReporter", "OutcomeWindow"]


@dataclass
class _ShardTally:
    successes: int = 0
    versions: dict[int, int] = field(default_factory=dict)  # successes by attested version
    partial: int = 0
    fates: Counter[str] | None = None  # what became of failed attempts, where told
    contradicted: list[Contradiction] = field(default_factory=list)
    failures: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)  # the first of each


def _example(error: BaseException | None, status: int | None, detail: str | None) -> str:
    """One line of what failed: the exception's type and message, or the status and
    the first line of its body."""
    if error is not None:
        text = exception_text(error).strip().splitlines()
        said = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    else:
        body = (detail or "").strip().splitlines()
        said = f"HTTP {status}: {body[0]}" if body else f"HTTP {status}"
    return said[:MAX_EXAMPLE]


class OutcomeWindow:
    """One adapter's outcomes per shard since the last hand-over. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[int, _ShardTally] = {}

    def success(
        self, shard: int, count: int = 1, *, version: int | None = None, partial: bool = False
    ) -> None:
        """Count ``count`` successes; ``version``: the weight version the engine attested
        at their first token (None: nobody said — counted as unknown, never guessed),
        ``partial``: the engine said its weights were partial."""
        _check_shard(shard)
        if count < 1:
            raise ValueError(f"shard {shard}: a success count must be >= 1, got {count}")
        if version is not None and (type(version) is not int or version < 0):
            raise ValueError(f"shard {shard}: a weight version must be >= 0, got {version!r}")
        with self._lock:
            tally = self._tallies.get(shard)
            if tally is None:  # not setdefault: a tally built on every answer is dear
                tally = self._tallies[shard] = _ShardTally()
            tally.successes += count
            if version is not None:
                versions = tally.versions  # a dict, not a Counter: on every answer's path
                versions[version] = versions.get(version, 0) + count
            if partial:
                tally.partial += count

    def contradiction(self, shard: int, version: int, recorded: int) -> None:
        """``shard`` attested ``version`` where the ledger recorded ``recorded`` loaded:
        evidence handed over with the window."""
        _check_shard(shard)
        evidence = Contradiction(version=version, recorded=recorded)
        with self._lock:
            tally = self._tallies.setdefault(shard, _ShardTally())
            if evidence not in tally.contradicted:
                tally.contradicted.append(evidence)

    def fate(self, shard: int, fate: Fate, count: int = 1) -> None:
        """What became of ``count`` attempts that failed on ``shard`` (``run_rollout``'s
        ``on_fate``): the window then says its failures' fates, else they are unknown."""
        _check_shard(shard)
        if fate not in FATES:
            raise ValueError(f"shard {shard}: unknown fate {fate!r}; one of {', '.join(FATES)}")
        with self._lock:
            tally = self._tallies.setdefault(shard, _ShardTally())
            if tally.fates is None:
                tally.fates = Counter()
            tally.fates[fate] += count

    def failure(
        self,
        shard: int,
        error: BaseException | None = None,
        *,
        status: int | None = None,
        detail: str | None = None,
    ) -> Classification:
        """Count one failure, classified by the taxonomy; returns the classification.

        Give the exception the adapter caught, or the HTTP status (and body text) it got.
        A cancellation is not the shard's fault and is not counted.
        """
        _check_shard(shard)
        if (error is None) == (status is None):
            raise ValueError(f"shard {shard}: give exactly one of error= or status= for a failure")
        verdict = (
            classify_exception(error)
            if error is not None
            else classify_http_status(status or 0, detail)
        )
        if verdict.kind is FailureKind.CANCELLED:
            return verdict
        key = (verdict.kind.value, verdict.reason)
        with self._lock:
            tally = self._tallies.setdefault(shard, _ShardTally())
            tally.failures[key] += 1
            if key not in tally.examples:
                tally.examples[key] = _example(error, status, detail)
        return verdict

    def take(self) -> tuple[ShardOutcomes, ...]:
        """Drain the window: everything counted so far, per shard in shard order."""
        with self._lock:
            tallies, self._tallies = self._tallies, {}
        return tuple(
            ShardOutcomes(
                shard=shard,
                successes=tally.successes,
                versions=tuple(
                    VersionCount(version=v, count=c) for v, c in sorted(tally.versions.items())
                ),
                partial=tally.partial,
                fates=None if tally.fates is None else RolloutFates(**tally.fates),
                contradicted=tuple(tally.contradicted),
                failures=tuple(
                    FailureCount(
                        category=category,  # type: ignore[arg-type]
                        reason=reason[:4096],
                        count=count,
                        example=tally.examples.get((category, reason), ""),
                    )
                    for (category, reason), count in sorted(tally.failures.items())
                ),
            )
            for shard, tally in sorted(tallies.items())
        )

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._tallies)


def _check_shard(shard: int) -> None:
    if isinstance(shard, bool) or not isinstance(shard, int) or shard < 0:
        raise ValueError(f"shard must be a non-negative int, got {shard!r}")


class OutcomeReporter:
    """An adapter's handle on a run's log: count outcomes, hand windows over.

    Picklable — it carries only the database URL, the run and the adapter's name, and
    opens its own connection where it is used — so it can be passed to a Ray actor.
    A window is handed over by :meth:`flush`, and by the next :meth:`success` /
    :meth:`failure` once it is older than ``window_s``. Close it (or use it as a context
    manager) to hand over the last window.
    """

    def __init__(
        self,
        db_url: str,
        run: str,
        adapter: str,
        *,
        window_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not adapter:
            raise ValueError("adapter must name the reporting adapter (it is recorded)")
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.db_url = db_url
        self.run = run
        self.adapter = adapter
        self.window_s = window_s
        self._clock = clock
        self._setup()

    def _setup(self) -> None:
        self._window = OutcomeWindow()
        self._opened_at = self._clock()
        self._log: EventLog | None = None
        self._pending: OutcomeWindowReported | None = None  # taken, not yet appended
        self._flush_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {
            "db_url": self.db_url,
            "run": self.run,
            "adapter": self.adapter,
            "window_s": self.window_s,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._clock = time.monotonic
        self._setup()

    def success(
        self, shard: int, count: int = 1, *, version: int | None = None, partial: bool = False
    ) -> None:
        self._window.success(shard, count, version=version, partial=partial)
        self._flush_if_due()

    def contradiction(self, shard: int, version: int, recorded: int) -> None:
        self._window.contradiction(shard, version, recorded)

    def fate(self, shard: int, fate: Fate, count: int = 1) -> None:
        """What became of ``count`` attempts that failed on ``shard``."""
        self._window.fate(shard, fate, count)
        self._flush_if_due()

    def failure(
        self,
        shard: int,
        error: BaseException | None = None,
        *,
        status: int | None = None,
        detail: str | None = None,
    ) -> Classification:
        verdict = self._window.failure(shard, error, status=status, detail=detail)
        self._flush_if_due()
        return verdict

    def flush(self) -> int | None:
        """Append the window as one event; returns its seq, or None if it was empty.

        A window the log refuses (a shard this run does not have, a run that has ended)
        is dropped and the refusal raised: keeping it would block every later window.
        Any other failure keeps the event, id and all, and the next flush appends that
        same event first — if the failed append had in fact committed, the log
        recognises the id and nothing is counted twice.
        """
        with self._flush_lock:
            self._opened_at = self._clock()
            if self._pending is None:
                outcomes = self._window.take()
                if not outcomes:
                    return None
                self._pending = OutcomeWindowReported(adapter=self.adapter, outcomes=outcomes)
            try:
                if self._log is None:
                    self._log = EventLog.open(self.db_url)
                seqs = self._log.append(self.run, [self._pending])
            except AppendRejected:
                self._pending = None
                raise
            self._pending = None
            return seqs[0]

    def _flush_if_due(self) -> None:
        if self._clock() - self._opened_at >= self.window_s:
            self.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._log is not None:
                self._log.close()
                self._log = None

    def __enter__(self) -> OutcomeReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
