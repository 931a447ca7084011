"""The router: one stable URL in front of the fleet, fed by the ledger.

Why it exists: the rollout client picks an engine by static round-robin over a list
fixed at start, never fails over, and retries a refused connection forever — a dead
engine keeps ~1/N of the new rollouts for the rest of the run. So the client is given
one URL, ``http://host:port/v1``, and routing moves next to fleet health.

Theory of operation. One :class:`Router` serves one run. In ``__init__`` it checks the
run (unknown or ended: :class:`RouterError`), loads the run's view — the true
membership, before it serves a single request — and binds its socket on the calling
thread, so a port conflict fails construction rather than a background thread. Once
started it runs three things on one event loop:

- the **handler** (allow-listed routes only, anything else 404 and never forwarded):
  choose a backend (least outstanding over ``RoutingTable.candidates``), forward
  (``proxy.forward``), count the outcome;
- the **follower**: every ``poll_s`` it folds the run's tail off the loop and swaps in
  the new table snapshot; when the run ends it stops, and the router answers
  every request with the no-healthy status;
- the **reporter**: every ``window_s`` it hands the window of outcomes (successes and
  failures per shard) to the ledger as one ``outcome_window_reported`` event from the
  adapter ``name``; :meth:`Router.stop` hands over the last one, :meth:`Router.flush`
  the current one at once (for whoever ends the run: flush, then end).

Outcome rules: a 2xx/3xx answer is a success of the shard; an error status is
classified by the taxonomy (5xx, 408, 429: the shard's failure; other 4xx: the
prompt's, recorded as data and not held against the shard); a timeout or connection
error is the shard's failure and avoids it locally (rule in ``routing_table``). An
outcome of a URL that no longer belongs to the fleet — the shard's base URL changed
while the request was in flight — is dropped with a log line: it says nothing about
the replacement. A client that went away is nobody's outcome.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
import weakref
from collections.abc import Mapping
from functools import partial
from typing import Any, cast

import structlog
from pydantic import ValidationError

from fleetledger.adapters.late_reports import LateReports
from fleetledger.adapters.least_outstanding import InFlight
from fleetledger.adapters.outcome_reporter import OutcomeReporter
from fleetledger.config import ControllerConfig, RouterConfig
from fleetledger.errors import FleetledgerError
from fleetledger.events.errors import LedgerError
from fleetledger.router.backends import BackendPool, Origin
from fleetledger.router.front import Front, Inbound
from fleetledger.router.listen import bind_listening, reserve_port
from fleetledger.router.loops import event_loop_runner
from fleetledger.router.metrics import RouterMetrics
from fleetledger.router.proxy import Exchange, Forwarded, answer, error_answer, forward
from fleetledger.router.routing_table import (
    Avoidance,
    Backend,
    RoutingTable,
    RoutingTableFollower,
)
from fleetledger.store.errors import AppendRejected, RunAlreadyEnded
from fleetledger.store.log import EventLog

__all__ = ["METHODS", "ROUTES", "Router", "RouterError", "RunNotLive", "reserve_port"]

_log = structlog.get_logger("fleetledger.router")

ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/tokenize"}
)
METHODS = frozenset({b"GET", b"POST"})  # what the OpenAI routes take; anything else is 405
STOP_GRACE_S = 5.0  # in-flight requests a stopping router lets finish
_METRICS_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


class RouterError(FleetledgerError):
    """The router cannot serve: an unknown or ended run, a bad setting, a taken port."""


class RunNotLive(RouterError):
    """The run has ended: no router will serve it again (a worker is not restarted)."""


def recorded_router_config(run: str, settings: Mapping[str, Any]) -> RouterConfig:
    """The router section the run recorded in ``run_started`` (defaults if it has none):
    a router started from the command line serves with the run's own settings."""
    try:
        return ControllerConfig.from_recorded(settings).router
    except ValidationError:
        section = settings.get("router")
        if not isinstance(section, Mapping):
            return RouterConfig()
        try:
            return RouterConfig.model_validate(dict(section))
        except ValidationError as exc:
            problem = exc.errors(include_url=False)[0]["msg"]
            raise RouterError(
                f"router: run {run!r} recorded a router configuration that does not "
                f"validate: {problem}"
            ) from None


class Router:
    """A reverse proxy over the serving shards of one run (module docstring)."""

    def __init__(
        self,
        db_url: str,
        run: str,
        config: RouterConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "router",
        window_s: float = 1.0,
        poll_s: float = 0.25,
        shared_port: bool = False,
    ) -> None:
        if not name:
            raise RouterError("router: name must be non-empty (it is the recorded adapter name)")
        for what, value in (("window_s", window_s), ("poll_s", poll_s)):
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise RouterError(f"router: {what} must be a positive number, got {value!r}")
        if not 0 <= port <= 65535:
            raise RouterError(f"router: port {port} is not a TCP port (0..65535)")
        self.run = run
        self.name = name
        self.window_s = float(window_s)
        self.poll_s = float(poll_s)
        self._log_db = self._open(db_url, run)
        try:
            self._follower = RoutingTableFollower(self._log_db, run)
            table = self._follower.table
            if table.ended is not None:
                raise RunNotLive(
                    f"router: run {run!r} ended {table.ended}; a router serves only a live run"
                )
            self.config = config or recorded_router_config(
                run, self._log_db.run_head(run).config.settings
            )
            self._sock = bind_listening(host, port, RouterError, shared=shared_port)
        except LedgerError as exc:
            self._log_db.close()
            raise RouterError(f"router: {exc}") from None
        except BaseException:
            self._log_db.close()
            raise
        self.host = host
        self.port = int(self._sock.getsockname()[1])
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/v1"
        self.metrics = RouterMetrics(run)
        self.reporter = OutcomeReporter(db_url, run, name, window_s=math.inf)  # timer below
        self.late_reports = LateReports(run)
        self.avoidance = Avoidance()
        self._table = table
        self._in_flight = InFlight()
        # Per shard, the exchanges in flight on it and the base URL each went to.
        self._exchanges: dict[int, dict[Exchange, str]] = {}
        self._contradictions: set[tuple[int, int]] = set()  # (shard, recorded) said
        self._note_routable()
        self._origins: dict[str, Origin] = {}
        self._pool = BackendPool(self.config.connect_bound_s)
        self._server: asyncio.Server | None = None
        self._fronts: weakref.WeakSet[Front] = weakref.WeakSet()  # open connections
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False

    @staticmethod
    def _open(db_url: str, run: str) -> EventLog:
        try:
            return EventLog.open(db_url, mode="read")
        except LedgerError as exc:
            raise RouterError(f"router for run {run!r}: {exc}") from None

    # ── read side ───────────────────────────────────────────────────────────

    @property
    def table(self) -> RoutingTable:
        """The routing table the router routes by now."""
        return self._table

    @property
    def seq(self) -> int:
        """The last seq of the run the router has folded."""
        return self._table.seq

    @property
    def routable(self) -> tuple[int, ...]:
        """Shards a request may go to now: serving, HTTP, not avoided."""
        return tuple(self._table.candidates(self.avoidance.avoided))

    def in_flight(self, shard: int) -> int:
        return self._in_flight.of(shard)

    # ── lifecycle ───────────────────────────────────────────────────────────

    async def start(self) -> None:
        """Serve on the socket bound in ``__init__``; follow the run; report windows."""
        if self._server is not None or self._stopped:
            raise RouterError(f"router for run {self.run!r}: start() may be called once")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._front, sock=self._sock, backlog=1024)
        self._tasks = [
            asyncio.create_task(self._follow(), name=f"router-follow-{self.run}"),
            asyncio.create_task(self._report(), name=f"router-report-{self.run}"),
        ]
        _log.info("router serving", run=self.run, url=self.url, routable=self.routable)

    def _front(self) -> Front:
        front = Front(self._handle)
        self._fronts.add(front)
        return front

    async def stop(self) -> None:
        """Stop serving (in-flight requests get ``STOP_GRACE_S``), then hand over the
        last window of outcomes. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            self._server.close()  # no new connections; those open finish what they hold
            loop = asyncio.get_running_loop()
            deadline = loop.time() + STOP_GRACE_S
            while self._in_flight and loop.time() < deadline:
                await asyncio.sleep(0.01)
            for front in list(self._fronts):
                front.close()
            self._fronts.clear()
        else:
            self._sock.close()
        self._pool.close()
        await asyncio.to_thread(self._close_ledger)

    async def flush(self, settle_s: float = STOP_GRACE_S) -> int | None:
        """Hand the window of outcomes to the ledger now; returns its seq once it is
        durable (None: nothing to hand over). A refusal (the run has ended) is raised.

        For whoever ends the run: a window handed over after ``run_ended`` is refused,
        so the run's owner flushes, then ends. A client can hold its answer before the
        handler that sent it has counted it, so requests still in flight get up to
        ``settle_s`` to be counted first.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + settle_s
        while self._in_flight and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return await asyncio.to_thread(self.reporter.flush)

    def serve_forever(self, stop: threading.Event | None = None) -> None:
        """Run the router on an event loop of its own in the calling thread (uvloop where
        it is installed) until ``stop`` is set (or the loop is interrupted); the last
        window is handed over either way."""
        with event_loop_runner() as runner:
            runner.run(self._serve(stop))

    async def _serve(self, stop: threading.Event | None) -> None:
        await self.start()
        try:
            while stop is None or not stop.is_set():
                await asyncio.sleep(0.05)
        finally:
            await self.stop()

    # ── following the run ───────────────────────────────────────────────────

    async def _follow(self) -> None:
        failing = ""
        while self._table.ended is None:
            await asyncio.sleep(self.poll_s)
            try:
                table = await asyncio.to_thread(self._follower.poll)
            except Exception as exc:  # the ledger is unreachable: route by what we know
                if str(exc) != failing:
                    failing = str(exc)
                    _log.warning("router cannot read the run's tail", run=self.run, error=failing)
                continue
            failing = ""
            self._apply(table)
        _log.info("run ended: answering the no-healthy status", run=self.run)

    def _apply(self, table: RoutingTable) -> None:
        self._table = table
        self._end_where_shards_left(table)
        for shard in self.avoidance.lift(table):
            _log.info(
                "backend routable again: the ledger named it after its failure",
                run=self.run,
                shard=shard,
                seq=table.seq,
            )
        self._note_routable()

    def _end_where_shards_left(self, table: RoutingTable) -> None:
        """No client waits on a shard the ledger says has left (DEAD, condemned,
        RESTARTING, weights partial): its requests in flight end within the poll that
        saw it — re-sent elsewhere where nothing was answered yet, else cut, saying why.
        Story: a request on a SIGSTOPped shard was still unanswered after the client's
        10 s timeout although the ledger had the shard DEAD 1.8 s after the freeze."""
        for shard, exchanges in self._exchanges.items():
            for exchange, base_url in list(exchanges.items()):
                why = table.left(shard, base_url)
                if why is not None:
                    self.metrics.ended_by_ledger.inc()
                    _log.info("request ended: its shard left", run=self.run, why=why)
                    exchange.leave(why)

    def _note_routable(self) -> None:
        self.metrics.serving_backends.set(len(self.routable))

    # ── outcomes ────────────────────────────────────────────────────────────

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(self.window_s)
            await asyncio.to_thread(self._flush)

    def _flush(self) -> None:
        try:
            self.reporter.flush()
        except RunAlreadyEnded as ended:
            self.late_reports.count("outcome window", ended)
        except AppendRejected as exc:  # a shard this run does not have: dropped, said
            _log.warning("outcome window dropped", run=self.run, reason=str(exc))
        except Exception as exc:  # kept by the reporter; the next flush appends it first
            _log.warning("outcome window not handed over yet", run=self.run, error=str(exc))

    def _close_ledger(self) -> None:
        try:
            self._flush()
            self.reporter.close()  # nothing left to append unless the flush above failed
        except Exception as exc:
            _log.warning("last outcome window not handed over", run=self.run, error=str(exc))
        finally:
            self._log_db.close()

    def _account(self, backend: Backend, done: Forwarded) -> None:
        if done.client_gone and done.error is None:
            return  # a client that went away is not the shard's failure
        if done.left:
            # Ended because the ledger says its shard left: not the shard's failure (the
            # ledger knows), but what became of it is the fault's cost.
            self.reporter.fate(backend.shard, "redispatched" if done.resend else "dropped")
            return
        shard = backend.shard
        if done.error is not None:
            self.metrics.backend_errors.labels(shard=str(shard)).inc()
            # Story: the reference kept routing to a dead engine; avoid it until the
            # ledger has said something about it since.
            self.avoidance.avoid(shard, backend.base_url, self._table.seq)
            self._note_routable()
        if self._table.url_of(shard) != backend.base_url:
            _log.warning(
                "outcome dropped: the shard's base URL changed while the request was in flight",
                run=self.run,
                shard=shard,
                base_url=backend.base_url,
                now=self._table.url_of(shard),
            )
            return
        if done.error is not None:
            self.reporter.failure(shard, done.error)
        elif done.status is not None and done.status >= 400:
            self.reporter.failure(shard, status=done.status, detail=done.detail)
        elif done.status is not None:
            self.reporter.success(shard, version=done.attested, partial=done.partial)
            if done.attested is not None and done.attested < backend.weight_version:
                self._contradicted(backend, done.attested)

    def _contradicted(self, backend: Backend, attested: int) -> None:
        """The engine generated from weights older than the ledger had recorded it load
        before the request was routed (a completed refit): counted every time, kept as
        evidence in the window once per shard and recorded version, never used to
        overwrite the ledger. (An attestation ahead of the ledger is not judged: the
        router's view lags the ledger by up to a poll, and a load completes before the
        refit that pushed it is recorded complete.)"""
        shard, recorded = backend.shard, backend.weight_version
        self.metrics.contradicted.labels(shard=str(shard)).inc()
        if (shard, recorded) in self._contradictions:
            return
        self._contradictions.add((shard, recorded))
        self.reporter.contradiction(shard, attested, recorded)
        _log.warning(
            "an engine attested weights the ledger contradicts",
            run=self.run,
            shard=shard,
            attested=attested,
            recorded=recorded,
        )

    # ── the handler ─────────────────────────────────────────────────────────

    async def _handle(self, front: Front, inbound: Inbound) -> None:
        path = inbound.path
        if path == "/metrics":
            answer(front, inbound, 200, self.metrics.render(), _METRICS_TYPE)
            return
        if path not in ROUTES:
            self.metrics.count(route="other", status="404")
            error_answer(
                front,
                inbound,
                404,
                "not_found",
                f"{path} is not a route of this router (routes: {', '.join(sorted(ROUTES))})",
            )
            return
        if inbound.method not in METHODS:
            self.metrics.count(route=path, status="405")
            method = inbound.method.decode("latin-1")
            error_answer(
                front,
                inbound,
                405,
                "method_not_allowed",
                f"{method} {path}: routes take GET, POST",
                extra=b"Allow: GET, POST\r\n",
            )
            return
        arrived = time.monotonic()
        resends_left = 1  # a request whose shard left before answering goes elsewhere once
        left = ""
        resent_from: int | None = None
        while True:
            table = self._table
            shard = self._in_flight.take(table.candidates(self.avoidance.avoided))
            if shard is None:
                self._no_healthy(front, inbound, path, table, left)
                return
            backend = table.backends[shard]
            base_url = backend.base_url
            exchanges = self._exchanges.get(shard)
            if exchanges is None:
                exchanges = self._exchanges[shard] = {}
            try:
                done = await forward(
                    front,
                    inbound,
                    self._pool,
                    self._origin(backend),
                    shard=shard,
                    bound_s=self.config.backend_bound_s,
                    version_at=backend.weight_version,
                    version_now=partial(self._version_now, shard, base_url),
                    may_resend=resends_left > 0,
                    in_flight=exchanges,
                    base_url=base_url,
                    resent_from=resent_from,
                )
            finally:
                self._in_flight.release(shard)
            self._account(backend, done)
            if not done.resend:
                break
            resends_left, left, resent_from = resends_left - 1, done.left, shard
            self.metrics.resent.inc()
        self.metrics.count(route=path, status=_status_label(done))
        if done.first_byte_at is not None:
            self.metrics.added_latency.observe(
                max(0.0, done.first_byte_at - arrived - done.backend_wait_s)
            )

    def _version_now(self, shard: int, base_url: str) -> int | None:
        return self._table.weight_version_of(shard, base_url)

    def _origin(self, backend: Backend) -> Origin:
        # A candidate is routable, so its origin is an HTTP(S) URL (tested rule).
        origin = cast(str, backend.origin)
        dial = self._origins.get(origin)
        if dial is None:
            dial = self._origins[origin] = Origin(origin)
        return dial

    def _no_healthy(
        self, front: Front, inbound: Inbound, path: str, table: RoutingTable, left: str = ""
    ) -> None:
        """The no-healthy status, saying why (``left``: the request was on its way to be
        re-sent after its shard left, which it says)."""
        status = self.config.no_healthy_status
        self.metrics.no_healthy.inc()
        self.metrics.count(route=path, status=str(status))
        if table.ended is not None:
            why = f"run {self.run!r} ended {table.ended}"
        else:
            fleet = ", ".join(f"{s} {n}" for s, n in table.counts.items() if n)
            avoided = sorted(self.avoidance.avoided)
            not_http = [b.shard for b in table.backends if b.serving and b.origin is None]
            why = f"run {self.run!r} at seq {table.seq} (fleet: {fleet}"
            why += f"; avoided after errors: {avoided}" if avoided else ""
            why += f"; not HTTP: {not_http}" if not_http else ""
            why += ")"
        error_answer(
            front,
            inbound,
            status,
            "no_healthy_shards",
            f"no healthy shards: no serving backend for {why}"
            + (f"; the request was re-sent after {left}" if left else ""),
        )


def _status_label(done: Forwarded) -> str:
    """The requests metric's status: the client's answer; ``cut`` when the backend
    failed after its answer had started (the client's connection was cut without the
    final chunk); ``client_gone`` when the client left before any answer."""
    if done.error is not None and done.status is not None:
        return "cut"
    if done.answered:
        return str(done.answered)
    return "client_gone" if done.client_gone else str(done.status or 0)
