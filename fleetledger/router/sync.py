"""``router-sync``: the field's routers (SMG, vllm-router) driven by the ledger.

Why it exists: users who run SMG or vllm-router keep them; what those lack is a worker
set that *is* the ledger's membership. Their own health checks and circuit breakers
decide alone, in memory, and forget on restart. The sync keeps each external router's
worker set equal to the run's serving set, and hands what the router saw per worker
back to the ledger.

Theory of operation. One :class:`RouterSync` follows one run for one or two external
routers. In ``__init__`` it checks the run (unknown or ended: :class:`RouterSyncError`)
and loads its view. Then each tick (every ``poll_s``, at once on a PostgreSQL
notification or when an add finishes):

- **follow**: fold the run's tail (``sync_membership``); each URL that left the serving
  set is remembered per router with the recorded time of the event that took it out;
- **reconcile** (when the serving set changed, a removal is still unconfirmed, an add
  finished, or ``reconcile_s`` passed; :meth:`RouterSync.step` always): list the router, apply
  the rule (``sync_rule.reconcile``): removals at once, then re-list to confirm them;
  adds in a daemon thread each (a vllm-router add blocks until the engine answers
  ``/health``), never in the way of a removal. Listing every time is what makes a
  restarted sync converge at its first step and a restarted router be repopulated;
- **confirm**: a URL that left and is no longer routed in the router's listing
  completes its lag (``fleetledger_router_sync_lag_seconds``); one that came back to
  the serving set first is forgotten;
- **report** (every ``window_s`` and on close): scrape each router's per-worker outcome
  counters and hand them over as one ``outcome_window_reported`` per router
  (``sync_outcomes``).

A party that fails — the ledger unreadable or refusing a window, a router unreachable
or answering errors, removals unconfirmed for longer than ``BEHIND_S`` — is said in
one warning line when it starts failing and one info line when it recovers; meanwhile
the sync keeps trying every tick, and catches up from the ledger's tail when it can.

When the run ends, nothing serves it: the routers are emptied, the sync stops.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from fleetledger.adapters.late_reports import LateReports
from fleetledger.adapters.outcome_reporter import OutcomeReporter
from fleetledger.errors import FleetledgerError
from fleetledger.events.errors import LedgerError
from fleetledger.router.external import (
    ADD_TIMEOUT_S,
    REGISTRIES,
    ExternalRouterError,
    ListedWorker,
    Presence,
    Registry,
    http_origin,
)
from fleetledger.router.sync_membership import Membership, MembershipFollower
from fleetledger.router.sync_metrics import SyncMetrics
from fleetledger.router.sync_outcomes import OutcomeScraper, WorkerCounts
from fleetledger.router.sync_rule import Action, Verdict, reconcile
from fleetledger.store.errors import AppendRejected, RunAlreadyEnded
from fleetledger.store.log import EventLog
from fleetledger.store.postgres_listen import AppendListener

__all__ = ["BEHIND_S", "DEFAULT_POLL_S", "RouterSync", "RouterSyncError"]

_log = structlog.get_logger("fleetledger.router_sync")

BEHIND_S = 1.0  # a removal unconfirmed for longer is the sync falling behind
# Seconds between reads of the tail, by backend: a SQLite read costs ~1 ms (~5% of a core
# at 50 a second); a PostgreSQL append's notification wakes the sync, the poll is a fallback.
DEFAULT_POLL_S = {"sqlite": 0.02, "postgresql": 0.5}


class RouterSyncError(FleetledgerError):
    """The sync cannot run: no router named, a bad URL or setting, an unknown or ended
    run, a metrics port that is taken."""


class _Trouble:
    """One party's failing state: one line when it starts failing, one when it recovers."""

    def __init__(self, run: str, party: str, metrics: SyncMetrics) -> None:
        self.run = run
        self.party = party
        self._gauge = metrics.failing.labels(party=party)
        self._gauge.set(0)
        self.since: float | None = None

    def update(self, problem: str | None) -> None:
        if problem is not None and self.since is None:
            self.since = time.monotonic()
            self._gauge.set(1)
            _log.warning("router-sync failing", run=self.run, party=self.party, problem=problem)
        elif problem is None and self.since is not None:
            lasted = time.monotonic() - self.since
            self.since = None
            self._gauge.set(0)
            _log.info(
                "router-sync recovered", run=self.run, party=self.party, after_s=round(lasted, 3)
            )


class _Adds:
    """A router's adds in flight, one daemon thread each: a vllm-router add blocks until
    the engine answers ``/health``, and nothing (a removal, the exit) waits on it."""

    def __init__(self, registry: Registry, on_done: Callable[[], None], hold_s: float) -> None:
        self._registry = registry
        self._on_done = on_done
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._running: dict[str, threading.Thread] = {}
        self._held: dict[str, float] = {}  # URL -> not asked again before (monotonic)
        self._finished: list[tuple[str, str | ExternalRouterError]] = []

    def start(self, url: str) -> bool:
        """Add ``url`` in the background, unless its add is running or was answered less
        than ``hold_s`` ago (SMG lists a worker only once its background add is done;
        asking again meanwhile is a 409, a call for nothing)."""
        with self._lock:
            if url in self._running or time.monotonic() < self._held.get(url, -math.inf):
                return False
            thread = threading.Thread(
                target=self._add, args=(url,), name=f"router-sync-add {url}", daemon=True
            )
            self._running[url] = thread
        thread.start()
        return True

    def _add(self, url: str) -> None:
        outcome: str | ExternalRouterError
        try:
            outcome = self._registry.add(url)
        except ExternalRouterError as exc:
            outcome = exc
        with self._lock:
            del self._running[url]
            self._held[url] = time.monotonic() + self._hold_s
            self._finished.append((url, outcome))
        self._on_done()

    def running(self, url: str) -> bool:
        with self._lock:
            return url in self._running

    def wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        with self._lock:
            running = list(self._running.values())
        for thread in running:
            thread.join(max(0.0, deadline - time.monotonic()))

    def finished(self) -> list[tuple[str, str | ExternalRouterError]]:
        with self._lock:
            done, self._finished = self._finished, []
        return done


@dataclass
class _Target:
    """One external router as the sync drives it."""

    registry: Registry
    adapter: str
    trouble: _Trouble
    adds: _Adds
    scraper: OutcomeScraper | None
    leaves: dict[str, int] = field(default_factory=dict)  # URL -> µs it left, unconfirmed
    problem: str | None = None  # this tick's, from listing or changing the router
    scrape_problem: str | None = None  # the last window's, from its metrics page
    refused: set[tuple[str, str]] = field(default_factory=set)  # (URL, why) said once
    removing: dict[str, float] = field(default_factory=dict)  # URL -> removal asked (monotonic)

    @property
    def kind(self) -> str:
        return self.registry.kind


class RouterSync:
    """Keeps external routers' worker sets equal to one run's serving set (module
    docstring). ``step()`` for a caller that drives it; ``serve_forever(stop)`` in a
    thread of its own; ``close()`` hands over the last windows."""

    def __init__(
        self,
        db_url: str,
        run: str,
        *,
        smg: str | None = None,
        vllm_router: str | None = None,
        smg_metrics: str | None = None,
        vllm_router_metrics: str | None = None,
        name: str | None = None,
        poll_s: float | None = None,
        window_s: float = 1.0,
        reconcile_s: float = 0.5,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        routers = _routers(smg, vllm_router, smg_metrics, vllm_router_metrics)
        _check_settings(name, poll_s, window_s, reconcile_s, metrics_port)
        self.run = run
        self.window_s = float(window_s)
        self.reconcile_s = float(reconcile_s)
        self._log_db = _open(db_url, run)
        backend = self._log_db.database.backend
        self.poll_s = float(poll_s if poll_s is not None else DEFAULT_POLL_S.get(backend, 0.02))
        try:
            self._follower = MembershipFollower(self._log_db, run)
        except LedgerError as exc:
            self._log_db.close()
            raise RouterSyncError(f"router-sync: {exc}") from None
        if self._follower.membership.ended is not None:
            self._log_db.close()
            raise RouterSyncError(
                f"router-sync: run {run!r} ended {self._follower.membership.ended}; "
                "a sync follows only a live run"
            )
        self.metrics = SyncMetrics(run)
        self.metrics_url: str | None = None
        if metrics_port is not None:
            self._serve_metrics(metrics_port, metrics_host)
        self._wake = threading.Event()
        self._adds_done = threading.Event()
        self._ledger = _Trouble(run, "ledger", self.metrics)
        self._ledger_problem: str | None = None
        self._append_problem: str | None = None
        self._late = LateReports(run)
        self._targets = [
            self._target(db_url, kind, url, m, name, len(routers)) for kind, url, m in routers
        ]
        self._listener: AppendListener | None = None
        self._baseline()
        self._served_ledger: dict[str, int] | None = None  # the serving set last reconciled
        self.recent_lags: deque[tuple[str, str, float]] = deque(maxlen=1024)
        self._closed = False

    def _serve_metrics(self, port: int, host: str) -> None:
        try:
            bound = self.metrics.serve(port, host)
        except OSError as exc:
            self._log_db.close()
            why = exc.strerror or exc
            raise RouterSyncError(
                f"router-sync: cannot serve metrics on {host}:{port}: {why}"
            ) from None
        shown = f"[{host}]" if ":" in host else host
        self.metrics_url = f"http://{shown}:{bound}/metrics"

    def _target(
        self, db_url: str, kind: str, url: str, metrics_url: str | None, name: str | None, n: int
    ) -> _Target:
        registry = REGISTRIES[kind](url, metrics_url)
        adapter = kind if name is None else (name if n == 1 else f"{name}-{kind}")
        scraper = None
        if metrics_url is not None:
            reporter = OutcomeReporter(db_url, self.run, adapter, window_s=math.inf)  # timer: ours
            scraper = OutcomeScraper(registry, reporter)
        else:
            _log.info(
                "no metrics URL for this router: its outcomes are not reported",
                run=self.run,
                router=kind,
            )
        return _Target(
            registry,
            adapter,
            _Trouble(self.run, kind, self.metrics),
            self._adds_for(registry),
            scraper,
        )

    def _baseline(self) -> None:
        """The outcome counters as the sync starts: what the routers counted before it is
        never reported (a restarted sync would report it twice). A router that cannot
        be read now gets its baseline at its first successful scrape."""
        for target in self._targets:
            if target.scraper is not None:
                try:
                    target.scraper.scrape(self.membership.shard_of)
                except ExternalRouterError:
                    pass

    def _adds_for(self, registry: Registry) -> _Adds:
        def done() -> None:
            self._adds_done.set()
            self._wake.set()

        return _Adds(registry, done, hold_s=self.reconcile_s)

    # ── read side ───────────────────────────────────────────────────────────

    @property
    def membership(self) -> Membership:
        """The run as the sync last read it, by worker URL."""
        return self._follower.membership

    @property
    def routers(self) -> tuple[str, ...]:
        return tuple(t.kind for t in self._targets)

    def failing(self) -> dict[str, bool]:
        """Per party (``ledger`` and each router): failing now?"""
        parties = [self._ledger, *(t.trouble for t in self._targets)]
        return {p.party: p.since is not None for p in parties}

    # ── driving it ──────────────────────────────────────────────────────────

    def step(self, *, wait_for_adds: bool = True) -> dict[str, tuple[Verdict, ...]]:
        """Read the tail, reconcile every router now; returns each router's verdicts
        (empty while it cannot be reached). With ``wait_for_adds`` the adds it started
        have been answered when it returns."""
        self._follow()
        verdicts = self._reconcile_all(wait_for_adds=wait_for_adds)
        self._assess()
        return verdicts

    def flush_outcomes(self) -> dict[str, dict[int, WorkerCounts]]:
        """Scrape every router's outcome counters and hand the window over now; returns
        what each window held per shard."""
        self._follow()  # outcomes are mapped to shards by the URLs the ledger has now
        held = {}
        for target in self._targets:
            if target.scraper is not None:
                held[target.kind] = self._report(target)
        self._assess()
        return held

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Run in the calling thread until ``stop`` is set or the run ends; then close."""
        stop = stop or threading.Event()
        self._listen()
        next_window = time.monotonic() + self.window_s
        next_reconcile = 0.0
        try:
            while not stop.is_set():
                changed = self._follow()
                now = time.monotonic()
                # A removal not yet confirmed is listed again every tick, not every
                # reconcile_s: the lag runs until the router's listing shows it.
                unconfirmed = any(t.leaves and t.problem is None for t in self._targets)
                if changed or unconfirmed or self._adds_done.is_set() or now >= next_reconcile:
                    self._adds_done.clear()
                    self._reconcile_all(wait_for_adds=False)
                    next_reconcile = now + self.reconcile_s
                if now >= next_window:
                    self.flush_outcomes()
                    next_window = now + self.window_s
                self._assess()
                if self.membership.ended is not None:
                    _log.info(
                        "run ended: the routers were emptied; router-sync stops", run=self.run
                    )
                    break
                due = min(next_reconcile, next_window) - time.monotonic()
                self._wake.wait(max(0.0, min(self.poll_s, due)))
                self._wake.clear()
        finally:
            self.close()

    def close(self) -> None:
        """Hand over the last windows, stop listening and serving metrics. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            self._listener.stop()
        try:
            if self.membership.ended is None:
                self.flush_outcomes()
            for target in self._targets:
                if target.scraper is not None:
                    self._close_reporter(target.scraper.reporter)
        finally:
            self._log_db.close()
            self.metrics.stop_serving()

    def _close_reporter(self, reporter: OutcomeReporter) -> None:
        try:
            reporter.close()  # appends only a window an earlier flush failed to
        except RunAlreadyEnded as ended:
            self._late.count("outcome window", ended)
        except Exception as exc:  # the ledger is gone: said, nothing more to do
            _log.warning("last outcome window not handed over", run=self.run, error=str(exc))

    def __enter__(self) -> RouterSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ── the ledger ──────────────────────────────────────────────────────────

    def _listen(self) -> None:
        """On PostgreSQL, an append wakes the loop at once (the poll stays the fallback)."""
        if self._log_db.database.backend != "postgresql":
            return
        self._listener = AppendListener(
            self._log_db.database,
            lambda run, _seq: self._wake.set() if run == self.run else None,
            lambda state: _log.info("router-sync ledger notifications", run=self.run, state=state),
        )
        self._listener.start()

    def _follow(self) -> bool:
        """Fold the tail; True when the serving set is not the one last reconciled."""
        try:
            left = self._follower.poll()
        except Exception as exc:  # unreachable or refusing: keep the routers as they are
            self._ledger_problem = f"cannot read the run's tail: {exc}"
            return False
        self._ledger_problem = None
        for url, at_us in left:
            for target in self._targets:
                target.leaves.setdefault(url, at_us)
        return self.membership.serving != self._served_ledger

    # ── the routers ─────────────────────────────────────────────────────────

    def _reconcile_all(self, *, wait_for_adds: bool) -> dict[str, tuple[Verdict, ...]]:
        membership = self.membership
        self._served_ledger = membership.serving
        verdicts = {t.kind: self._reconcile(t, membership) for t in self._targets}
        if wait_for_adds:
            for target in self._targets:
                target.adds.wait(ADD_TIMEOUT_S + 1.0)
                self._note_adds(target)
        return verdicts

    def _reconcile(self, target: _Target, membership: Membership) -> tuple[Verdict, ...]:
        self._note_adds(target)
        try:
            listed = target.registry.workers()
            verdicts = reconcile(
                membership.serving, self._presences(target, listed), membership.not_serving
            )
            if self._remove(target, listed, verdicts):
                listed = target.registry.workers()
        except ExternalRouterError as exc:
            target.problem = str(exc)
            return ()
        target.problem = None
        self._confirm(target, listed, membership.serving)
        for verdict in verdicts:
            if verdict.action is Action.ADD and target.adds.start(verdict.url):
                _log.info(
                    "adding worker",
                    run=self.run,
                    router=target.kind,
                    worker=verdict.url,
                    reason=verdict.reason,
                )
        return verdicts

    def _presences(
        self, target: _Target, listed: Mapping[str, ListedWorker]
    ) -> dict[str, Presence]:
        """How the router lists each worker, except that one whose removal the sync asked
        for less than ``reconcile_s`` ago is moving: SMG lists it ``draining`` a few ms
        after its 202, and asking twice is a call for nothing."""
        now = time.monotonic()
        target.removing = {u: t for u, t in target.removing.items() if now - t < self.reconcile_s}
        return {
            url: Presence.MOVING if url in target.removing else w.presence
            for url, w in listed.items()
        }

    def _remove(
        self, target: _Target, listed: Mapping[str, ListedWorker], verdicts: tuple[Verdict, ...]
    ) -> bool:
        removed = False
        for verdict in verdicts:
            if verdict.action is not Action.REMOVE:
                continue
            target.registry.remove(listed[verdict.url])
            target.removing[verdict.url] = time.monotonic()
            self.metrics.changes.labels(router=target.kind, action="remove").inc()
            removed = True
            _log.info(
                "worker removed",
                run=self.run,
                router=target.kind,
                worker=verdict.url,
                reason=verdict.reason,
            )
        return removed

    def _note_adds(self, target: _Target) -> None:
        for url, outcome in target.adds.finished():
            if isinstance(outcome, str):
                self.metrics.changes.labels(router=target.kind, action="add").inc()
                target.refused = {r for r in target.refused if r[0] != url}
                continue
            if (url, str(outcome)) not in target.refused:
                target.refused.add((url, str(outcome)))
                _log.warning(
                    "router refused to add a worker; tried again while the ledger has it serving",
                    run=self.run,
                    router=target.kind,
                    worker=url,
                    problem=str(outcome),
                )

    def _confirm(
        self, target: _Target, listed: Mapping[str, ListedWorker], serving: Mapping[str, int]
    ) -> None:
        now = time.time()
        for url, at_us in list(target.leaves.items()):
            if url in serving:  # back in the serving set before its removal: no lag
                del target.leaves[url]
                continue
            if target.adds.running(url):  # an add in flight may still list it: not yet
                continue
            worker = listed.get(url)
            if worker is None or worker.presence is not Presence.ROUTED:
                lag = max(0.0, now - at_us / 1e6)
                self.metrics.lag.labels(router=target.kind).observe(lag)
                self.recent_lags.append((target.kind, url, lag))
                del target.leaves[url]

    # ── outcomes ────────────────────────────────────────────────────────────

    def _report(self, target: _Target) -> dict[int, WorkerCounts]:
        scraper = target.scraper
        if scraper is None or self.membership.ended is not None:
            return {}
        try:
            held = scraper.scrape(self.membership.shard_of)
        except ExternalRouterError as exc:
            target.scrape_problem = f"cannot read its outcome counters: {exc}"
            return {}
        target.scrape_problem = None
        try:
            scraper.reporter.flush()
        except RunAlreadyEnded as ended:
            self._late.count("outcome window", ended)
        except AppendRejected as exc:  # a shard this run does not have: dropped, said
            _log.warning(
                "outcome window dropped", run=self.run, router=target.kind, reason=str(exc)
            )
        except Exception as exc:  # kept by the reporter; the next flush appends it first
            self._append_problem = f"cannot hand an outcome window over: {exc}"
            return held
        self._append_problem = None
        return held

    # ── saying so ───────────────────────────────────────────────────────────

    def _assess(self) -> None:
        """Each party's state after this tick, said only when it changes."""
        self._ledger.update(self._ledger_problem or self._append_problem)
        now_us = time.time() * 1e6
        for target in self._targets:
            problem = target.problem or target.scrape_problem
            if problem is None and target.leaves:
                oldest = min(target.leaves.values())
                if now_us - oldest > BEHIND_S * 1e6:
                    waiting = len(target.leaves)
                    problem = f"behind: {waiting} removal(s) unconfirmed for over {BEHIND_S:g} s"
            target.trouble.update(problem)


# ── checking what it is given ───────────────────────────────────────────────────


def _routers(
    smg: str | None,
    vllm_router: str | None,
    smg_metrics: str | None,
    vllm_router_metrics: str | None,
) -> list[tuple[str, str, str | None]]:
    """(kind, URL, metrics URL) of each router named, each URL checked."""
    given = [("smg", smg, smg_metrics), ("vllm-router", vllm_router, vllm_router_metrics)]
    routers = []
    for kind, url, metrics_url in given:
        if url is None:
            if metrics_url is not None:
                raise RouterSyncError(f"router-sync: a {kind} metrics URL without a {kind} URL")
            continue
        routers.append(
            (
                kind,
                _checked(kind, url),
                None if metrics_url is None else _checked(f"{kind} metrics", metrics_url),
            )
        )
    if not routers:
        raise RouterSyncError("router-sync: name at least one external router (smg or vllm-router)")
    return routers


def _checked(what: str, url: str) -> str:
    origin = http_origin(url)
    if origin is None:
        raise RouterSyncError(
            f"router-sync: the {what} URL {url!r} is not an http(s) URL of the form "
            "http://host:port"
        )
    return origin


def _check_settings(
    name: str | None,
    poll_s: float | None,
    window_s: float,
    reconcile_s: float,
    metrics_port: int | None,
) -> None:
    if name is not None and not name:
        raise RouterSyncError(
            "router-sync: name must be non-empty (it is the recorded adapter name)"
        )
    given: list[tuple[str, float]] = [("window_s", window_s), ("reconcile_s", reconcile_s)]
    if poll_s is not None:
        given.append(("poll_s", poll_s))
    for what, value in given:
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise RouterSyncError(f"router-sync: {what} must be a positive number, got {value!r}")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise RouterSyncError(
            f"router-sync: metrics port {metrics_port} is not a TCP port (0..65535)"
        )


def _open(db_url: str, run: str) -> EventLog:
    try:
        return EventLog.open(db_url, mode="read")
    except LedgerError as exc:
        raise RouterSyncError(f"router-sync for run {run!r}: {exc}") from None
