"""``router-sync``: the field's routers (SMG, vllm-router) driven by the ledger.

Why it exists: users who run SMG or vllm-router keep them; what those lack is a worker
set that *is* the ledger's membership. Their own health checks and circuit breakers
decide alone, in memory, and forget on restart. The sync keeps each external router's
worker set equal to the run's serving set, and hands what the router saw per worker
back to the ledger.

Theory of operation. One :class:`RouterSync` follows one run for one or two external
routers. In ``__init__`` it checks the run (unknown or ended: :class:`RouterSyncError`)
and loads its view. ``serve_forever`` then runs one thread that follows the ledger and
one thread per router that drives it, so that a router that hangs or trickles its
answers delays only its own calls, never another router's removals (and every call has
a deadline for its whole exchange, ``external``):

- **follow** (every ``poll_s``, at once on a PostgreSQL notification): fold the run's
  tail (``sync_membership``); each URL that left the serving set is remembered per
  router with the recorded time of the event that took it out, and the routers'
  threads are woken;
- **reconcile** (a router's thread, when the serving set changed, an add's call
  ended, ``reconcile_s`` passed, or every ``RELIST_S`` while a URL that left is not yet
  out; :meth:`RouterSync.step` always): list the router, apply the rule
  (``sync_rule.reconcile``): removals at once, each on its own (one refused removal
  stops no other), then re-list; adds in a daemon thread each, never in the way of a
  removal. Listing every time is what makes a restarted sync converge at its first
  step and a restarted router be repopulated;
- **settle** each URL that left (``sync_rule.settle_leave``): it is out once the
  router lists it as taking no new request *and* holds no add of it that could still
  land; that completes its lag (``fleetledger_router_sync_lag_seconds``). An add is
  followed until it is seen through: a vllm-router add in progress for a URL that left
  is hung up on (vllm-router then abandons it); an SMG add accepted with 202 cannot be
  cancelled and lands whenever the engine answers ``/health``, so the sync asks SMG
  about it every ``RELIST_S`` and removes the worker the moment it lands;
- **report** (every ``window_s``, and when it stops): scrape the router's per-worker
  outcome counters and hand them over as one ``outcome_window_reported``
  (``sync_outcomes``).

A party that fails — the ledger unreadable or refusing a window, a router unreachable,
answering errors or garbage, a removal refused, leaves unconfirmed for longer than
``BEHIND_S`` — is said in one warning line when it starts failing and one info line
when it recovers; meanwhile the sync keeps trying, and catches up from the ledger's tail
when it can.

When it stops — the run ended, ``stop`` was set, or :meth:`RouterSync.close` — each
router is reconciled once more (no adds; a vllm-router add in progress is hung up on)
and, for up to ``settle_s``, until every URL that left is out: after the run's end,
until the router lists nothing that takes requests. A run that ends while a router's
thread is busy (a scrape, a call) is acted on all the same, since stopping always
reconciles against the ended run. Whatever is still not out then (a router
unreachable, an SMG add still pending) is said in a warning line naming it, because
the router may still route to it and nothing watches it any more.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import structlog

from fleetledger.adapters.late_reports import LateReports
from fleetledger.adapters.outcome_reporter import OutcomeReporter
from fleetledger.errors import FleetledgerError
from fleetledger.events.errors import LedgerError
from fleetledger.router.external import (
    ADD_TIMEOUT_S,
    CALL_TIMEOUT_S,
    REGISTRIES,
    AddAnswer,
    ExternalRouterError,
    ListedWorker,
    Presence,
    Registry,
    http_origin,
)
from fleetledger.router.sync_adds import Adds
from fleetledger.router.sync_membership import Membership, MembershipFollower
from fleetledger.router.sync_metrics import SyncMetrics
from fleetledger.router.sync_outcomes import OutcomeScraper, WorkerCounts
from fleetledger.router.sync_rule import (
    Action,
    AddState,
    Settlement,
    Verdict,
    reconcile,
    settle_leave,
)
from fleetledger.store.errors import AppendRejected, RunAlreadyEnded
from fleetledger.store.log import EventLog
from fleetledger.store.postgres_listen import AppendListener

__all__ = [
    "BEHIND_S",
    "DEFAULT_POLL_S",
    "RELIST_S",
    "SETTLE_S",
    "RouterSync",
    "RouterSyncError",
]

_log = structlog.get_logger("fleetledger.router_sync")

BEHIND_S = 1.0  # a removal unconfirmed for longer is the sync falling behind
# Seconds between reads of the tail, by backend: a SQLite read costs ~1 ms (~5% of a core
# at 50 a second); a PostgreSQL append's notification wakes the sync, the poll is a fallback.
DEFAULT_POLL_S = {"sqlite": 0.02, "postgresql": 0.5}
# While a URL that left is not yet out, its router is listed again this often (whatever
# the ledger's poll_s): its lag runs until the listing shows it out, and an SMG add that
# lands for it routes requests to it until the next listing.
RELIST_S = 0.02
# How long stopping waits for URLs that left to be out: an SMG add pending when its
# shard left lands at SMG's next /health check of the engine (every
# --worker-startup-check-interval s; 1 with the flags the docs give).
SETTLE_S = 10.0
# Worker states that take requests now or soon: after the run's end none may be left.
_TAKING = frozenset({Presence.ROUTED, Presence.EJECTED, Presence.ADDING})

T = TypeVar("T")


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


@dataclass
class _Router:
    """One external router as the sync drives it. ``leaves`` is shared with the thread
    that follows the ledger (under ``RouterSync._lock``); the rest belongs to whoever
    drives this router (its own thread in ``serve_forever``)."""

    registry: Registry
    adapter: str
    trouble: _Trouble
    adds: Adds
    scraper: OutcomeScraper | None
    wake: threading.Event = field(default_factory=threading.Event)
    added: threading.Event = field(default_factory=threading.Event)  # an add's call ended
    leaves: dict[str, int] = field(default_factory=dict)  # URL -> µs it left, not yet out
    served: dict[str, int] | None = None  # the serving set last reconciled
    problem: str | None = None  # this tick's, from listing the router
    change_problem: str | None = None  # this tick's: removals refused, adds' state unsaid
    metrics_problem: str | None = None  # which workers it ejected could not be read
    scrape_problem: str | None = None  # the last window's, from its metrics page
    append_problem: str | None = None  # the last window's, from the ledger
    refused: set[tuple[str, str]] = field(default_factory=set)  # (URL, why) said once
    removing: dict[str, float] = field(default_factory=dict)  # URL -> removal asked (monotonic)
    waiting: dict[str, str] = field(default_factory=dict)  # URL that left -> why not out yet
    strays: set[str] = field(default_factory=set)  # listed, not serving, taking requests
    finished: bool = False

    @property
    def kind(self) -> str:
        return self.registry.kind


class RouterSync:
    """Keeps external routers' worker sets equal to one run's serving set (module
    docstring). ``step()`` for a caller that drives it; ``serve_forever(stop)`` in a
    thread of its own; ``close()`` hands over the last windows. One driver at a time."""

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
        settle_s: float = SETTLE_S,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        routers = _routers(smg, vllm_router, smg_metrics, vllm_router_metrics)
        _check_settings(name, poll_s, window_s, reconcile_s, settle_s, metrics_port)
        self.run = run
        self.window_s = float(window_s)
        self.reconcile_s = float(reconcile_s)
        self.settle_s = float(settle_s)
        self._log_db = _open(db_url, run)
        self.metrics = SyncMetrics(run)
        self.metrics_url: str | None = None
        try:
            backend = self._log_db.database.backend
            self.poll_s = float(poll_s if poll_s is not None else DEFAULT_POLL_S.get(backend, 0.02))
            self._follower = self._follow_run(run)
            if metrics_port is not None:
                self._serve_metrics(metrics_port, metrics_host)
            self._lock = threading.Lock()
            self._membership = self._follower.membership
            self._wake = threading.Event()
            self._ledger = _Trouble(run, "ledger", self.metrics)
            self._ledger_problem: str | None = None
            self._listening: str | None = None
            self._late = LateReports(run)
            self._routers = [
                self._router(db_url, kind, url, m, name, len(routers)) for kind, url, m in routers
            ]
            self._listener: AppendListener | None = None
            self._baseline()
        except BaseException:
            self._log_db.close()
            self.metrics.stop_serving()
            raise
        self.recent_lags: deque[tuple[str, str, float]] = deque(maxlen=1024)
        self._fault: BaseException | None = None  # a router's thread died of it
        self._closed = False

    def _follow_run(self, run: str) -> MembershipFollower:
        try:
            follower = MembershipFollower(self._log_db, run)
        except LedgerError as exc:
            raise RouterSyncError(f"router-sync: {exc}") from None
        if follower.membership.ended is not None:
            raise RouterSyncError(
                f"router-sync: run {run!r} ended {follower.membership.ended}; "
                "a sync follows only a live run"
            )
        return follower

    def _serve_metrics(self, port: int, host: str) -> None:
        try:
            bound = self.metrics.serve(port, host)
        except OSError as exc:
            why = exc.strerror or exc
            raise RouterSyncError(
                f"router-sync: cannot serve metrics on {host}:{port}: {why}"
            ) from None
        shown = f"[{host}]" if ":" in host else host
        self.metrics_url = f"http://{shown}:{bound}/metrics"

    def _router(
        self, db_url: str, kind: str, url: str, metrics_url: str | None, name: str | None, n: int
    ) -> _Router:
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
        wake, added = threading.Event(), threading.Event()

        def add_done() -> None:
            added.set()
            wake.set()

        adds = Adds(registry, add_done, hold_s=self.reconcile_s)
        trouble = _Trouble(self.run, kind, self.metrics)
        return _Router(registry, adapter, trouble, adds, scraper, wake=wake, added=added)

    def _baseline(self) -> None:
        """The outcome counters as the sync starts: what the routers counted before it is
        never reported (a restarted sync would report it twice). A router that cannot
        be read now gets its baseline at its first successful scrape."""
        for router in self._routers:
            if router.scraper is not None:
                try:
                    router.scraper.scrape(self.membership)
                except ExternalRouterError:
                    pass

    # ── read side ───────────────────────────────────────────────────────────

    @property
    def membership(self) -> Membership:
        """The run as the sync last read it, by worker URL."""
        return self._membership

    @property
    def routers(self) -> tuple[str, ...]:
        return tuple(r.kind for r in self._routers)

    def failing(self) -> dict[str, bool]:
        """Per party (``ledger`` and each router): failing now?"""
        parties = [self._ledger, *(r.trouble for r in self._routers)]
        return {p.party: p.since is not None for p in parties}

    # ── driving it ──────────────────────────────────────────────────────────

    def step(self, *, wait_for_adds: bool = True) -> dict[str, tuple[Verdict, ...]]:
        """Read the tail, reconcile every router now (each in a thread of its own);
        returns each router's verdicts (empty while it cannot be reached). With
        ``wait_for_adds`` the adds it started have been answered when it returns."""
        self._follow()
        verdicts = self._each(self._reconcile, self._routers)
        for router in self._routers:
            if wait_for_adds:
                router.adds.wait(ADD_TIMEOUT_S + 1.0)
                self._note_adds(router)
            self._assess_router(router)
        self._assess_ledger()
        return verdicts

    def flush_outcomes(self) -> dict[str, dict[int, WorkerCounts]]:
        """Scrape every router's outcome counters and hand the window over now; returns
        what each window held per shard."""
        self._follow()  # outcomes are mapped to shards by the URLs the ledger has now
        scraped = [r for r in self._routers if r.scraper is not None]
        held = self._each(self._report, scraped)
        for router in scraped:
            self._assess_router(router)
        self._assess_ledger()
        return held

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Run in the calling thread until ``stop`` is set or the run ends; then close.
        Each router is driven from a thread of its own."""
        stop = stop or threading.Event()
        halt = threading.Event()
        drivers = [
            threading.Thread(
                target=self._drive, args=(r, halt), name=f"router-sync {r.kind}", daemon=True
            )
            for r in self._routers
        ]
        try:
            self._listen()
            for driver in drivers:
                driver.start()
            while not stop.is_set() and self.membership.ended is None and self._fault is None:
                self._follow()
                self._assess_ledger()
                self._wake.wait(self.poll_s)
                self._wake.clear()
        finally:
            halt.set()
            for router in self._routers:
                router.wake.set()
            for driver in drivers:
                if driver.ident is not None:  # started
                    # A driver ends its tick first; each of its calls has a deadline.
                    driver.join(timeout=self.reconcile_s + 20 * CALL_TIMEOUT_S)
            self.close()
        if self._fault is not None:
            raise self._fault

    def close(self) -> None:
        """Stop: reconcile each router once more and wait (up to ``settle_s``) until
        every URL that left is out of it, hand over the last windows, stop listening
        and serving metrics. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._listener is not None:
            self._listener.stop()
        try:
            deadline = time.monotonic() + self.settle_s
            unfinished = [r for r in self._routers if not r.finished]
            self._each(lambda r: self._finish(r, deadline), unfinished)
            self._say_end()
            for router in self._routers:
                if router.scraper is not None:
                    self._close_reporter(router.scraper.reporter)
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

    def _each(self, job: Callable[[_Router], T], routers: Sequence[_Router]) -> dict[str, T]:
        """``job`` for each router at once, each in a thread of its own: one router
        that hangs delays no other's removals. Every call a job makes has a deadline."""
        if len(routers) < 2:
            return {r.kind: job(r) for r in routers}
        done: dict[str, T] = {}
        failed: list[BaseException] = []

        def run(router: _Router) -> None:
            try:
                done[router.kind] = job(router)
            except BaseException as exc:  # re-raised in the caller's thread below
                failed.append(exc)

        threads = [
            threading.Thread(target=run, args=(r,), name=f"router-sync {r.kind}", daemon=True)
            for r in routers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]
        return {r.kind: done[r.kind] for r in routers}

    # ── one router's thread ─────────────────────────────────────────────────

    def _drive(self, router: _Router, halt: threading.Event) -> None:
        """Drive one router until ``halt`` is set or the run ends (then ``close``
        finishes it). A fault of the sync's own stops it all, loudly: a router left
        undriven while the sync goes on would be the silent failure it exists to end."""
        try:
            self._drive_until(router, halt)
        except BaseException as exc:
            self._fault = exc
            self._wake.set()

    def _drive_until(self, router: _Router, halt: threading.Event) -> None:
        next_reconcile = 0.0
        next_window = time.monotonic() + self.window_s
        while not halt.is_set():
            membership = self.membership
            if membership.ended is not None:
                return
            now = time.monotonic()
            hurry = self._hurry(router)
            if (
                membership.serving != router.served
                or hurry
                or router.added.is_set()
                or now >= next_reconcile
            ):
                router.added.clear()
                self._reconcile(router)
                next_reconcile = now + self.reconcile_s
            if now >= next_window:
                self._report(router)
                next_window = now + self.window_s
            self._assess_router(router)
            due = min(next_reconcile, next_window) - time.monotonic()
            if self._hurry(router):
                due = min(due, RELIST_S)
            router.wake.wait(max(0.0, due))
            router.wake.clear()

    def _hurry(self, router: _Router) -> bool:
        """A URL that left and is not yet out is listed again every ``RELIST_S``, not
        every ``reconcile_s``: its lag runs until the router shows it out, and an SMG add
        that lands for it must be removed at once."""
        with self._lock:
            unsettled = bool(router.leaves)
        return unsettled and router.problem is None

    def _finish(self, router: _Router, deadline: float) -> None:
        """Reconcile once more (no adds) and until every URL that left is out of the
        router — after the run's end, until it lists nothing that takes requests — or
        ``deadline`` passes; then hand over the last window."""
        if router.registry.abandons_on_hang_up:
            router.adds.hang_up(router.adds.calling())  # nothing of ours stays in flight
        router.adds.wait(max(0.0, deadline - time.monotonic()) + CALL_TIMEOUT_S)
        while True:
            self._reconcile(router, adding=False)
            ended = self.membership.ended is not None
            if self._out(router, ended):
                break
            if router.problem is not None and not ended:
                break  # stopped, and the router does not answer: nothing to wait for
            if time.monotonic() >= deadline:
                break
            self._assess_router(router)
            router.wake.wait(RELIST_S)
            router.wake.clear()
        if not ended:
            self._report(router)
        self._assess_router(router)
        router.finished = True

    def _out(self, router: _Router, ended: bool) -> bool:
        """Nothing the ledger has out that the router may still route to: every leave
        settled, and after the run's end, no worker listed that takes requests."""
        with self._lock:
            leaves = bool(router.leaves)
        if router.problem is not None or leaves:
            return False
        return not (ended and router.strays)

    def _say_end(self) -> None:
        ended = self.membership.ended is not None
        left = {r.kind: self._left_in(r) for r in self._routers}
        for kind, what in left.items():
            if what:
                _log.warning(
                    "router-sync stops; the router may still route to workers the ledger has out",
                    run=self.run,
                    router=kind,
                    left=what,
                )
        if ended and not any(left.values()):
            _log.info("run ended: the routers were emptied; router-sync stops", run=self.run)

    def _left_in(self, router: _Router) -> list[str]:
        with self._lock:
            leaves = list(router.leaves)
        what = [f"{url}: {router.waiting.get(url, 'not confirmed out')}" for url in leaves]
        if self.membership.ended is not None:
            what += [f"{url}: listed, taking requests" for url in sorted(router.strays)]
        if what and router.problem is not None:
            what.append(router.problem)
        return what

    # ── the ledger ──────────────────────────────────────────────────────────

    def _listen(self) -> None:
        """On PostgreSQL, an append wakes the loop at once (the poll stays the fallback)."""
        if self._log_db.database.backend != "postgresql":
            return
        self._listener = AppendListener(
            self._log_db.database,
            lambda run, _seq: self._wake.set() if run == self.run else None,
            self._listening_is,
        )
        self._listener.start()

    def _listening_is(self, state: str) -> None:
        """The listener's state, said when it changes (a server that stays down is
        retried every second, and would otherwise be said every second)."""
        if state != self._listening:
            self._listening = state
            _log.info("router-sync ledger notifications", run=self.run, state=state)
        self._wake.set()  # catch up at once: appends may have gone unannounced

    def _follow(self) -> bool:
        """Fold the tail and publish it to the routers' threads; True when the serving
        set changed (or the run ended)."""
        try:
            left = self._follower.poll()
        except Exception as exc:  # unreachable or refusing: keep the routers as they are
            self._ledger_problem = f"cannot read the run's tail: {exc}"
            return False
        self._ledger_problem = None
        membership = self._follower.membership
        with self._lock:
            before = self._membership
            for url, at_us in left:
                for router in self._routers:
                    router.leaves.setdefault(url, at_us)
            self._membership = membership
        changed = bool(left) or (membership.serving, membership.ended) != (
            before.serving,
            before.ended,
        )
        if changed:
            for router in self._routers:
                router.wake.set()
        return changed

    # ── the routers ─────────────────────────────────────────────────────────

    def _reconcile(self, router: _Router, *, adding: bool = True) -> tuple[Verdict, ...]:
        with self._lock:
            membership = self._membership
            leaves = dict(router.leaves)
        router.served = membership.serving
        self._note_adds(router)
        if router.registry.abandons_on_hang_up:  # take back adds of URLs that left
            router.adds.hang_up([u for u in router.adds.calling() if u not in membership.serving])
        refusals = self._check_pending(router)  # first: an add that lands is then listed
        try:
            listed = self._list(router)
        except ExternalRouterError as exc:
            router.problem = str(exc)
            return ()
        router.problem = None
        verdicts = reconcile(
            membership.serving, self._presences(router, listed), membership.not_serving
        )
        removed = self._remove(router, listed, verdicts, refusals)
        router.change_problem = None
        if refusals:
            more = f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""
            router.change_problem = f"{refusals[0]}{more}"
        if removed:
            try:
                listed = self._list(router)
            except ExternalRouterError as exc:
                router.problem = str(exc)
                return verdicts
        self._settle(router, listed, membership, leaves)
        for verdict in verdicts:
            if adding and verdict.action is Action.ADD and router.adds.start(verdict.url):
                _log.info(
                    "adding worker",
                    run=self.run,
                    router=router.kind,
                    worker=verdict.url,
                    reason=verdict.reason,
                )
        return verdicts

    def _list(self, router: _Router) -> dict[str, ListedWorker]:
        """The router's listing; where only its metrics say which workers it stopped
        routing to (vllm-router), those are marked ejected. Metrics that cannot be read
        stop no removal: the listing is taken as routed, and that is said."""
        listed = router.registry.workers()
        try:
            ejected = router.registry.ejected()
        except ExternalRouterError as exc:
            router.metrics_problem = (
                f"cannot read which workers it stopped routing to ({exc}); "
                "its listed workers are taken as routed"
            )
            return listed
        router.metrics_problem = None
        return {
            url: replace(w, presence=Presence.EJECTED)
            if url in ejected and w.presence is Presence.ROUTED
            else w
            for url, w in listed.items()
        }

    def _check_pending(self, router: _Router) -> list[str]:
        """Ask the router about each add it accepted and has not yet completed; returns
        what it would not say (such an add stays pending)."""
        refusals = []
        for url, handle in router.adds.pending().items():
            try:
                if not router.registry.add_pending(handle):
                    router.adds.resolved(url)
            except ExternalRouterError as exc:
                refusals.append(f"cannot tell whether its add of {url} is pending: {exc}")
        return refusals

    def _presences(
        self, router: _Router, listed: Mapping[str, ListedWorker]
    ) -> dict[str, Presence]:
        """How the router lists each worker, except that one whose removal the sync asked
        for less than ``reconcile_s`` ago is draining: SMG lists it ``draining`` a few ms
        after its 202, and asking twice is a call for nothing."""
        now = time.monotonic()
        router.removing = {u: t for u, t in router.removing.items() if now - t < self.reconcile_s}
        return {
            url: Presence.DRAINING if url in router.removing else w.presence
            for url, w in listed.items()
        }

    def _remove(
        self,
        router: _Router,
        listed: Mapping[str, ListedWorker],
        verdicts: tuple[Verdict, ...],
        refusals: list[str],
    ) -> bool:
        """Every REMOVE, each on its own: a router that refuses one removal still gets
        the others (and the adds after them); each refusal goes to ``refusals``."""
        removed = False
        for verdict in verdicts:
            if verdict.action is not Action.REMOVE:
                continue
            try:
                router.registry.remove(listed[verdict.url])
            except ExternalRouterError as exc:
                refusals.append(f"a removal refused: {exc}")
                continue
            router.removing[verdict.url] = time.monotonic()
            self.metrics.changes.labels(router=router.kind, action="remove").inc()
            removed = True
            _log.info(
                "worker removed",
                run=self.run,
                router=router.kind,
                worker=verdict.url,
                reason=verdict.reason,
            )
        return removed

    def _note_adds(self, router: _Router) -> None:
        for done in router.adds.finished():
            url, outcome = done.url, done.outcome
            if isinstance(outcome, AddAnswer):
                if outcome.accepted:  # a 409 "already there / under way" added nothing
                    self.metrics.changes.labels(router=router.kind, action="add").inc()
                router.refused = {r for r in router.refused if r[0] != url}
            elif done.hung_up:
                _log.info(
                    "add taken back: its shard left the serving set, or the sync stops",
                    run=self.run,
                    router=router.kind,
                    worker=url,
                )
            elif (url, str(outcome)) not in router.refused:
                router.refused.add((url, str(outcome)))
                _log.warning(
                    "router refused to add a worker; tried again while the ledger has it serving",
                    run=self.run,
                    router=router.kind,
                    worker=url,
                    problem=str(outcome),
                )

    def _settle(
        self,
        router: _Router,
        listed: Mapping[str, ListedWorker],
        membership: Membership,
        leaves: Mapping[str, int],
    ) -> None:
        """Settle each URL that left (``sync_rule.settle_leave``); a confirmed one
        completes its lag."""
        now = time.time()
        waiting: dict[str, str] = {}
        gone: list[str] = []
        for url, at_us in leaves.items():
            worker = listed.get(url)
            settled, why = settle_leave(
                url in membership.serving,
                None if worker is None else worker.presence,
                router.adds.state(url),
            )
            if settled is Settlement.WAITING:
                waiting[url] = why
                continue
            gone.append(url)
            if settled is Settlement.CONFIRMED:
                lag = max(0.0, now - at_us / 1e6)
                self.metrics.lag.labels(router=router.kind).observe(lag)
                self.recent_lags.append((router.kind, url, lag))
        with self._lock:
            for url in gone:
                if router.leaves.get(url) == leaves[url]:  # not left again meanwhile
                    del router.leaves[url]
        router.waiting = waiting
        router.strays = {
            url
            for url, w in listed.items()
            if url not in membership.serving and w.presence in _TAKING
        }

    # ── outcomes ────────────────────────────────────────────────────────────

    def _report(self, router: _Router) -> dict[int, WorkerCounts]:
        scraper = router.scraper
        membership = self.membership
        if scraper is None or membership.ended is not None:
            return {}
        try:
            held = scraper.scrape(membership)
        except ExternalRouterError as exc:
            router.scrape_problem = f"cannot read its outcome counters: {exc}"
            return {}
        router.scrape_problem = None
        try:
            scraper.reporter.flush()
        except RunAlreadyEnded as ended:
            self._late.count("outcome window", ended)
        except AppendRejected as exc:  # a shard this run does not have: dropped, said
            _log.warning(
                "outcome window dropped", run=self.run, router=router.kind, reason=str(exc)
            )
        except Exception as exc:  # kept by the reporter; the next flush appends it first
            router.append_problem = f"cannot hand an outcome window over: {exc}"
            return held
        router.append_problem = None
        return held

    # ── saying so ───────────────────────────────────────────────────────────

    def _assess_ledger(self) -> None:
        appending = next((r.append_problem for r in self._routers if r.append_problem), None)
        self._ledger.update(self._ledger_problem or appending)

    def _assess_router(self, router: _Router) -> None:
        """The router's state after this tick, said only when it changes."""
        problem = (
            router.problem
            or router.change_problem
            or router.metrics_problem
            or router.scrape_problem
        )
        with self._lock:
            leaves = dict(router.leaves)
        if problem is None and leaves:
            oldest = min(leaves.values())
            if time.time() * 1e6 - oldest > BEHIND_S * 1e6:
                problem = f"behind: {len(leaves)} removal(s) unconfirmed for over {BEHIND_S:g} s"
                held = sum(1 for u in leaves if router.adds.state(u) is AddState.PENDING)
                if held:
                    problem += f", {held} waiting on an add the router cannot cancel"
        router.trouble.update(problem)


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
    try:
        return http_origin(url)
    except ValueError as exc:
        shown = re.sub(r"//([^/@]*?):[^/@]*@", r"//\1:***@", url)  # no password said
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise RouterSyncError(f"router-sync: the {what} URL {shown!r} {exc}") from None


def _check_settings(
    name: str | None,
    poll_s: float | None,
    window_s: float,
    reconcile_s: float,
    settle_s: float,
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
    if not (isinstance(settle_s, int | float) and math.isfinite(settle_s) and settle_s >= 0):
        raise RouterSyncError(
            f"router-sync: settle_s must be a number of seconds >= 0, got {settle_s!r}"
        )
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise RouterSyncError(
            f"router-sync: metrics port {metrics_port} is not a TCP port (0..65535)"
        )


def _open(db_url: str, run: str) -> EventLog:
    try:
        return EventLog.open(db_url, mode="read")
    except LedgerError as exc:
        raise RouterSyncError(f"router-sync for run {run!r}: {exc}") from None
