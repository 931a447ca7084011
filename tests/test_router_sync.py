"""``router-sync`` end to end: real ``smg`` and ``vllm-router`` processes driven by a real
ledger, real HTTP engines behind them, requests sent through the external router.

The engines are small aiohttp servers (``/health``, ``/v1/models``, ``/v1/completions``)
that count the generations they receive, so a test can say that a dead engine got no
request after its removal. Each external router runs as the docs recommend (its own
ejection off where it can be: SMG ``--disable-health-check --disable-circuit-breaker
--disable-retries``; vllm-router ``--disable-circuit-breaker --disable-retries
--health-check-interval-secs 86400``) on free ports with a Prometheus port of its own,
and is reaped by its fixture. Nothing asserts on timing: waits are for conditions,
bounded only so that a broken sync fails instead of hanging; the removal lag is
printed (``-s``), not judged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.config import ControllerConfig
from fleetledger.controller.ledger import Ledger
from fleetledger.events.models import OutcomeWindowReported
from fleetledger.projections.shard_states import ShardState
from fleetledger.router.external import ExternalRouterError, Presence, fetch_metrics
from fleetledger.router.sync import RouterSync, RouterSyncError
from fleetledger.router.sync_membership import Membership, MembershipFollower
from fleetledger.router.sync_outcomes import CounterDeltas, WorkerCounts
from fleetledger.router.sync_rule import (
    RULES,
    Action,
    AddState,
    Settlement,
    credit,
    reconcile,
    settle_leave,
)
from fleetledger.store.log import EventLog
from tests.fake_engines import Loop, ServedApp, call, wait_until

RUN = "run-sync"
BIN = Path(sys.executable).parent
FLEETLEDGER = str(BIN / "fleetledger")


# ── engines ──────────────────────────────────────────────────────────────────────────


class Engine(ServedApp):
    """An OpenAI-compatible engine on 127.0.0.1 that counts its generations; ``status``
    is what every generation is answered with (200: a completion)."""

    def __init__(self, loop: Loop, name: str) -> None:
        self.name = name
        self.loop = loop
        self.status = 200
        self.healthy = True  # False: /health answers 503
        self.received: Counter[str] = Counter()
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        super().__init__(loop, app)

    @property
    def generations(self) -> int:
        return self.received["/v1/completions"]

    async def _health(self, request: web.Request) -> web.Response:
        self.received[request.path] += 1
        return web.Response(
            text="ok" if self.healthy else "sick", status=200 if self.healthy else 503
        )

    async def _models(self, request: web.Request) -> web.Response:
        self.received[request.path] += 1
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    async def _completions(self, request: web.Request) -> web.Response:
        await request.read()
        self.received[request.path] += 1
        if self.status != 200:
            return web.json_response({"error": {"message": "engine busy"}}, status=self.status)
        return web.json_response(
            {
                "id": "cmpl",
                "object": "text_completion",
                "created": 1,
                "model": "tiny",
                "choices": [{"index": 0, "text": self.name, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


@pytest.fixture
def make_engines(loop: Loop) -> Iterator[Callable[[int], list[Engine]]]:
    started: list[Engine] = []

    def make(n: int) -> list[Engine]:
        engines = [Engine(loop, f"e{len(started) + i}") for i in range(n)]
        started.extend(engines)
        return engines

    yield make
    for engine in started:
        engine.stop()


# ── external routers ─────────────────────────────────────────────────────────────────


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _binary(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        pytest.skip(f"{name} is not installed (pip install {name}): no external router to drive")
    return on_path


# The flags the docs recommend: the router's own ejection off where it can be.
FLAGS = {
    "smg": [
        "launch",
        "--policy",
        "round_robin",
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--worker-startup-check-interval",
        "1",
        "--log-level",
        "warn",
    ],
    "vllm-router": [
        "--policy",
        "round_robin",
        "--disable-circuit-breaker",
        "--disable-retries",
        "--health-check-interval-secs",
        "86400",
        "--worker-startup-timeout-secs",
        "5",
        "--worker-startup-check-interval",
        "1",
        "--log-level",
        "warning",
    ],
}
LIST_PATH = {"smg": "/workers", "vllm-router": "/list_workers"}


@dataclass
class External:
    """One external router process, on ports the test chose."""

    kind: str
    port: int
    metrics_port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)

    def routed(self) -> set[str]:
        """The workers the router lists as taking traffic, read straight from its API."""
        status, body = call("GET", self.url + LIST_PATH[self.kind])
        assert status == 200, body
        listed = json.loads(body)
        if self.kind == "vllm-router":
            return set(listed["urls"])
        return {w["url"] for w in listed["workers"] if w["status"] == "ready" and w["is_healthy"]}

    def complete(self, prompt: str = "hi") -> int:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 1}
        return call("POST", self.url + "/v1/completions", body)[0]


class Launcher:
    """Starts external routers and reaps every one it started."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[External] = []

    def __call__(
        self,
        kind: str,
        workers: list[str] | None = None,
        *,
        port: int | None = None,
        metrics_port: int | None = None,
        flags: list[str] | None = None,
    ) -> External:
        binary = _binary(kind)
        port = port or _free_port()
        metrics_port = metrics_port or _free_port()
        argv = [binary, *(FLAGS[kind] if flags is None else flags)]
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        argv += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port)]
        if workers:
            argv += ["--worker-urls", *workers]
        out = (self.tmp_path / f"{kind}-{port}-{len(self.started)}.log").open("wb")
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        external = External(kind, port, metrics_port, proc)
        self.started.append(external)
        wait_until(lambda: _answers(external), f"{kind} to answer on port {port}", 60)
        # SMG registers its --worker-urls in the background: wait for them.
        wait_until(lambda: external.routed() == set(workers or ()), f"{kind}'s workers", 60)
        return external

    def reap(self) -> None:
        for external in self.started:
            external.kill()


def _answers(external: External) -> bool:
    if external.proc.poll() is not None:
        raise AssertionError(f"{external.kind} exited with {external.proc.returncode}")
    try:
        return call("GET", external.url + LIST_PATH[external.kind], timeout=2)[0] == 200
    except OSError:
        return False


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    launcher.reap()


@pytest.fixture(params=["smg", "vllm-router"])
def kind(request: pytest.FixtureRequest) -> str:
    _binary(request.param)
    return str(request.param)


# ── the sync, the ledger, waiting ────────────────────────────────────────────────────


def start_run(url: str, base_urls: list[str], run: str = RUN) -> Ledger:
    config = ControllerConfig().fleet_config(
        shard_count=len(base_urls), train_world_size=1, base_urls=base_urls
    )
    return Ledger.start(EventLog.open(url), run, config)


def new_sync(url: str, router: External, **kwargs: Any) -> RouterSync:
    names = {"smg": "smg", "vllm-router": "vllm_router"}
    given = {names[router.kind]: router.url, f"{names[router.kind]}_metrics": router.metrics_url}
    return RouterSync(url, RUN, **given, **kwargs)


class Served:
    """A sync in a thread of its own, through ``serve_forever`` (as the command runs it)."""

    def __init__(self, sync: RouterSync) -> None:
        self.sync = sync
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=sync.serve_forever, args=(self.stop_event,))
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


@pytest.fixture
def serve() -> Iterator[Callable[[RouterSync], Served]]:
    started: list[Served] = []

    def make(sync: RouterSync) -> Served:
        served = Served(sync)
        started.append(served)
        return served

    yield make
    for served in started:
        if served.thread.is_alive():
            served.stop()


def windows(url: str, run: str = RUN) -> list[OutcomeWindowReported]:
    with EventLog.open(url, mode="read") as log:
        return [r.event for r in log.read(run) if isinstance(r.event, OutcomeWindowReported)]


def lag_count(sync: RouterSync, kind: str) -> float:
    value = sync.metrics.registry.get_sample_value(
        "fleetledger_router_sync_lag_seconds_count", {"router": kind}
    )
    return value or 0.0


# ── membership: deaths, partial weights, re-admission ────────────────────────────────


def test_a_dead_shard_leaves_the_router_and_gets_no_request_after(
    sqlite_url, kind, make_engines, launch, serve
):
    engines = make_engines(3)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch(kind)  # empty: the sync fills it
    served = serve(new_sync(sqlite_url, router))
    every = {e.origin for e in engines}
    wait_until(lambda: router.routed() == every, f"{kind} to list the three serving shards")
    assert all(router.complete(f"p{i}") == 200 for i in range(6))
    assert all(e.generations > 0 for e in engines)  # round robin: each got some
    ledger.actor_died(1, "ActorDiedError: killed")
    wait_until(lambda: router.routed() == every - {engines[1].origin}, "shard 1's removal")
    before = engines[1].generations
    assert all(router.complete(f"q{i}") == 200 for i in range(12))
    assert engines[1].generations == before
    assert engines[0].generations + engines[2].generations >= 4 + 12
    served.stop()
    assert lag_count(served.sync, kind) == 1
    print(f"\n{kind}: removal lag {served.sync.recent_lags[-1][2] * 1000:.1f} ms")


@pytest.mark.postgres
def test_a_dead_shard_leaves_smg_on_postgresql(migrated_postgres_url, make_engines, launch, serve):
    """The same on PostgreSQL, where an append's notification wakes the sync."""
    engines = make_engines(2)
    ledger = start_run(migrated_postgres_url, [e.base_url for e in engines])
    router = launch("smg")
    served = serve(new_sync(migrated_postgres_url, router, poll_s=1.0))
    wait_until(lambda: router.routed() == {e.origin for e in engines}, "both shards listed")
    ledger.actor_died(0, "ActorDiedError: killed")
    wait_until(lambda: router.routed() == {engines[1].origin}, "shard 0's removal")
    wait_until(lambda: lag_count(served.sync, "smg") == 1, "the removal's lag")
    before = engines[0].generations
    assert all(router.complete(f"q{i}") == 200 for i in range(4))
    assert engines[0].generations == before


def test_partial_weights_and_a_replacement_are_routed_only_after_the_refit(
    sqlite_url, kind, make_engines, launch
):
    engines = make_engines(3)
    ledger = start_run(sqlite_url, [engines[0].base_url, engines[1].base_url])
    router = launch(kind, [engines[0].origin, engines[1].origin])
    sync = new_sync(sqlite_url, router)
    sync.step()
    ledger.mark_weights_partial(1, [1])  # an aborted refit's partial weights: STALE
    ledger.actor_died(0, "ActorDiedError: killed")
    ledger.restart_requested(0)
    ledger.replacement_loaded(0, engines[2].base_url)  # alive, old weights: STALE
    verdicts = sync.step()[kind]
    assert {v.action for v in verdicts} == {Action.REMOVE}
    assert {v.url: v.reason for v in verdicts} == {
        engines[0].origin: "no shard of the run has this URL now: not serving in the ledger",
        engines[1].origin: "shard 1 is STALE (since seq 2): not serving in the ledger",
    }
    wait_until(lambda: router.routed() == set(), "both shards out of the router")
    assert router.complete() != 200  # nothing to route to
    assert engines[2].generations == 0  # STALE is never routed
    ledger.refit_started(2)
    ledger.refit_completed(2)  # re-admits both STALE shards
    # SMG drains a removed worker for 5 s: shard 1's URL waits that long to be added back.
    pair = {engines[1].origin, engines[2].origin}
    wait_until(lambda: bool(sync.step()) and router.routed() == pair, "the re-admitted pair")
    assert all(router.complete(f"p{i}") == 200 for i in range(4))
    assert engines[2].generations > 0 and engines[1].generations > 0
    sync.close()


# ── restarts: the sync's and the router's ────────────────────────────────────────────


def test_a_restarted_sync_converges_at_its_first_step(sqlite_url, kind, make_engines, launch):
    engines = make_engines(4)
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:3]])
    # The router starts with a shard the ledger will condemn and an engine of no shard.
    router = launch(kind, [engines[0].origin, engines[1].origin, engines[3].origin])
    first = new_sync(sqlite_url, router)
    first.step()
    wait_until(lambda: router.routed() == {e.origin for e in engines[:3]}, "the run's three")
    first.close()
    ledger.actor_died(1, "gone while the sync was down")
    second = new_sync(sqlite_url, router, poll_s=3600, reconcile_s=3600)
    verdicts = {v.url: v.action for v in second.step()[kind]}  # its first step
    assert verdicts.pop(engines[3].origin, Action.WAIT) is Action.WAIT  # SMG: still draining
    assert verdicts == {
        engines[0].origin: Action.KEEP,
        engines[1].origin: Action.REMOVE,
        engines[2].origin: Action.KEEP,
    }
    wait_until(lambda: router.routed() == {engines[0].origin, engines[2].origin}, "convergence")
    second.close()


def test_a_restarted_router_is_repopulated_and_said_once(
    sqlite_url, kind, make_engines, launch, serve
):
    engines = make_engines(2)
    start_run(sqlite_url, [e.base_url for e in engines])
    router = launch(kind)
    every = {e.origin for e in engines}
    with structlog.testing.capture_logs() as logged:
        served = serve(new_sync(sqlite_url, router, reconcile_s=0.1))
        wait_until(lambda: router.routed() == every, "the router populated")
        router.kill()
        wait_until(lambda: served.sync.failing()[kind], "the sync to notice the router is gone")
        again = launch(kind, port=router.port, metrics_port=router.metrics_port)  # empty
        wait_until(lambda: again.routed() == every, "the restarted router repopulated")
        wait_until(lambda: not served.sync.failing()[kind], "the sync to say it recovered")
        served.stop()
    said = [e for e in logged if e["event"] == "router-sync failing" and e["party"] == kind]
    assert len(said) == 1, said
    assert all(again.complete(f"p{i}") == 200 for i in range(2))


# Each router with its own health checks on, fast: what the sync does when it ejects.
FAST_CHECKS = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1"]
CHECKING = {
    "smg": [f for f in FLAGS["smg"] if f != "--disable-health-check"] + FAST_CHECKS,
    "vllm-router": FLAGS["vllm-router"] + FAST_CHECKS,  # the later setting wins
}


def test_a_worker_the_router_ejects_on_its_own_is_removed_and_added_afresh(
    sqlite_url, kind, make_engines, launch, serve
):
    engines = make_engines(2)
    start_run(sqlite_url, [e.base_url for e in engines])
    router = launch(kind, [e.origin for e in engines], flags=CHECKING[kind])
    served = serve(new_sync(sqlite_url, router, reconcile_s=0.2))
    engines[1].healthy = False  # the ledger still has shard 1 serving

    def removals() -> float:
        labels = {"router": kind, "action": "remove"}
        value = served.sync.metrics.registry.get_sample_value(
            "fleetledger_router_sync_changes_total", labels
        )
        return value or 0.0

    wait_until(lambda: removals() >= 1, "the sync to remove the ejected worker")
    assert router.routed() <= {engines[0].origin}
    engines[1].healthy = True
    every = {e.origin for e in engines}
    wait_until(lambda: router.routed() == every, "the worker added afresh and routed")
    served.stop()


def test_when_the_run_ends_the_router_is_emptied_and_the_sync_stops(
    sqlite_url, kind, make_engines, launch, serve
):
    engines = make_engines(2)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch(kind, [e.origin for e in engines])
    served = serve(new_sync(sqlite_url, router))
    ledger.end_run("completed", "done")
    served.thread.join(timeout=30)
    assert not served.thread.is_alive()  # stopped on its own
    wait_until(lambda: router.routed() == set(), "the router emptied")


# ── the lag ──────────────────────────────────────────────────────────────────────────


def test_the_removal_lag_is_observed_for_every_kill(sqlite_url, kind, make_engines, launch, serve):
    engines = make_engines(6)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch(kind)
    served = serve(new_sync(sqlite_url, router))
    left = {e.origin for e in engines}
    wait_until(lambda: router.routed() == left, "every shard listed")
    for shard in range(5):
        ledger.actor_died(shard, "ActorDiedError: killed")
        left.discard(engines[shard].origin)
        wait_until(lambda: router.routed() == left, f"shard {shard}'s removal")
    wait_until(lambda: lag_count(served.sync, kind) == 5, "five lags observed")
    served.stop()
    lags = sorted(lag for _, _, lag in served.sync.recent_lags)
    p50, top = statistics.median(lags) * 1000, lags[-1] * 1000
    print(f"\n{kind}: removal lag over {len(lags)} kills: p50 {p50:.1f} ms, max {top:.1f} ms")
    rendered = served.sync.metrics.render().decode()
    assert f'fleetledger_router_sync_lag_seconds_count{{router="{kind}"}} 5.0' in rendered


# ── outcomes ─────────────────────────────────────────────────────────────────────────


def test_the_routers_outcomes_become_windows_per_shard(sqlite_url, kind, make_engines, launch):
    engines = make_engines(3)
    engines[1].status = 500
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:2]])
    router = launch(kind, [engines[0].origin, engines[1].origin])
    sync = new_sync(sqlite_url, router)
    sync.step()
    assert sync.flush_outcomes() == {kind: {}}  # the baseline: nothing before it is reported
    statuses = Counter(router.complete(f"p{i}") for i in range(8))
    assert statuses == {200: 4, 500: 4}
    held = sync.flush_outcomes()[kind]
    assert {s: (c.successes, c.failures) for s, c in held.items()} == {0: (4, 0), 1: (0, 4)}
    (window,) = windows(sqlite_url)
    assert window.adapter == kind
    (ok, bad) = window.outcomes
    assert (ok.shard, ok.successes, ok.failures) == (0, 4, ())
    (failure,) = bad.failures
    label = kind.replace("-", "_")
    assert (bad.shard, failure.category, failure.reason, failure.count) == (
        1,
        "infra",
        f"{label}_failure",
        4,
    )
    assert ledger.catch_up() is not None
    assert ledger.view.shards[1].reported_failures > 0  # folded against the shard
    # Shard 1's engine is replaced before the next scrape: what the router saw of the
    # old URL says nothing about the new one, and is dropped.
    before = engines[0].generations
    router.complete("q0")
    router.complete("q1")
    ledger.actor_died(1, "gone")
    ledger.restart_requested(1)
    ledger.replacement_loaded(1, engines[2].base_url)
    held = sync.flush_outcomes()[kind]  # the router still lists the old URL: dropped
    assert 1 not in held
    assert held.get(0, WorkerCounts()).successes == engines[0].generations - before
    sync.close()


# ── adds a router may still complete ─────────────────────────────────────────────────


def _probed(engine: Engine) -> bool:
    """The router is waiting on the engine's /health to complete an add."""
    return engine.received["/health"] >= 1


@contextmanager
def captured() -> Iterator[list[dict[str, Any]]]:
    """Log events down to info, captured (the suite lets only warnings through)."""
    before = structlog.get_config()["wrapper_class"]
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    try:
        with structlog.testing.capture_logs() as logged:
            yield logged
    finally:
        structlog.configure(wrapper_class=before)


def _said(logged: list[dict[str, Any]], event: str, party: str | None = None) -> list[Any]:
    return [e for e in logged if e["event"] == event and party in (None, e.get("party"))]


def test_an_smg_add_pending_when_its_shard_leaves_is_removed_the_moment_it_lands(
    sqlite_url, make_engines, launch, serve
):
    e0, e1 = make_engines(2)
    e0.healthy = False  # still loading: SMG holds the add, and cannot cancel it
    ledger = start_run(sqlite_url, [e0.base_url, e1.base_url])
    router = launch("smg")
    with captured() as logged:
        served = serve(new_sync(sqlite_url, router))
        wait_until(lambda: router.routed() == {e1.origin} and _probed(e0), "e0's add pending")
        ledger.actor_died(0, "ActorDiedError: killed")
        wait_until(lambda: served.sync.failing()["smg"], "the leave said to be behind")
        assert lag_count(served.sync, "smg") == 0  # not out: SMG may still add it
        e0.healthy = True  # a restart at the same URL answers /health: the add lands
        wait_until(lambda: lag_count(served.sync, "smg") == 1, "the leave confirmed out")
        assert router.routed() == {e1.origin}
        before = e0.generations
        assert all(router.complete(f"p{i}") == 200 for i in range(6))
        assert e0.generations == before
        served.stop()
    (behind,) = _said(logged, "router-sync failing", "smg")
    assert "waiting on an add the router cannot cancel" in behind["problem"]
    assert [e["worker"] for e in _said(logged, "worker removed")] == [e0.origin]


def test_when_the_run_ends_with_an_smg_add_pending_the_sync_stops_once_it_is_out(
    sqlite_url, make_engines, launch, serve
):
    e0, e1 = make_engines(2)
    e0.healthy = False
    ledger = start_run(sqlite_url, [e0.base_url, e1.base_url])
    router = launch("smg")
    with captured() as logged:
        served = serve(new_sync(sqlite_url, router, settle_s=120))
        wait_until(lambda: router.routed() == {e1.origin} and _probed(e0), "e0's add pending")
        ledger.end_run("completed", "done")
        wait_until(lambda: served.sync.failing()["smg"], "the pending add said to be behind")
        assert served.thread.is_alive()  # SMG may still add e0: the sync does not stop
        e0.healthy = True
        served.thread.join(timeout=60)
        assert not served.thread.is_alive()
    assert router.routed() == set()
    before = e0.generations
    assert router.complete() != 200
    assert e0.generations == before
    assert _said(logged, "run ended: the routers were emptied; router-sync stops")


# vllm-router waiting long for an add's /health (its own default is 600 s).
LONG_ADDS = [
    "600" if previous == "--worker-startup-timeout-secs" else flag
    for previous, flag in zip(["", *FLAGS["vllm-router"]], FLAGS["vllm-router"], strict=False)
]


def test_a_vllm_router_add_in_progress_is_hung_up_on_when_its_shard_leaves(
    sqlite_url, make_engines, launch, serve
):
    e0, e1 = make_engines(2)
    e0.healthy = False  # vllm-router's add blocks until it answers /health
    ledger = start_run(sqlite_url, [e0.base_url, e1.base_url])
    router = launch("vllm-router", flags=LONG_ADDS)
    with captured() as logged:
        served = serve(new_sync(sqlite_url, router))
        wait_until(lambda: router.routed() == {e1.origin} and _probed(e0), "e0's add waiting")
        ledger.actor_died(0, "ActorDiedError: killed")
        # Out once the add's call, hung up on, ends: the sync never waits for the add's
        # own deadline, nor reports a worker that was never routed as one it is behind on.
        wait_until(lambda: lag_count(served.sync, "vllm-router") == 1, "the leave confirmed")
        served.stop()
    assert _said(logged, "add taken back: its shard left the serving set, or the sync stops")
    refused = "router refused to add a worker; tried again while the ledger has it serving"
    assert not _said(logged, refused)
    assert e0.origin not in router.routed()


def test_closing_takes_back_a_vllm_router_add_in_progress(sqlite_url, make_engines, launch):
    (engine,) = make_engines(1)
    engine.healthy = False
    start_run(sqlite_url, [engine.base_url])
    router = launch("vllm-router", flags=LONG_ADDS)
    sync = new_sync(sqlite_url, router)
    sync.step(wait_for_adds=False)
    wait_until(lambda: _probed(engine), "the add waiting on the engine's /health")
    sync.close()
    # Negative checks, so they take a wait: vllm-router probes a waiting add's /health
    # every second (--worker-startup-check-interval 1); an abandoned add is probed no more.
    time.sleep(1.5)
    probes = engine.received["/health"]
    engine.healthy = True
    time.sleep(2.5)
    assert engine.received["/health"] == probes
    assert router.routed() == set()


# ── one router's trouble is its own ──────────────────────────────────────────────────


class Trickler:
    """A TCP server that reads a request and answers it one byte every half second,
    never finishing: a router that hangs without refusing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.stopped = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        try:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not self.stopped.wait(0.5):
                conn.sendall(b" ")
        except OSError:
            pass

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    server = Trickler()
    yield server
    server.close()


def test_every_call_to_a_router_has_a_deadline_for_its_whole_answer(trickler):
    failed: list[str] = []

    def fetch() -> None:
        try:
            fetch_metrics("smg", trickler.url)
        except ExternalRouterError as exc:
            failed.append(str(exc))

    caller = threading.Thread(target=fetch, daemon=True)
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive()
    (said,) = failed
    assert said.startswith(f"smg at {trickler.url}: GET /metrics failed (TimeoutError"), said


def test_a_router_that_trickles_its_answers_holds_up_no_other_routers_removals(
    sqlite_url, make_engines, launch, serve, trickler
):
    engines = make_engines(2)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch("vllm-router", [e.origin for e in engines])
    sync = RouterSync(
        sqlite_url,
        RUN,
        smg=trickler.url,
        smg_metrics=trickler.url,
        vllm_router=router.url,
        vllm_router_metrics=router.metrics_url,
    )
    served = serve(sync)
    ledger.actor_died(0, "ActorDiedError: killed")
    wait_until(lambda: router.routed() == {engines[1].origin}, "vllm-router's removal")
    before = engines[0].generations
    assert all(router.complete(f"p{i}") == 200 for i in range(4))
    assert engines[0].generations == before
    wait_until(lambda: sync.failing()["smg"], "the trickling SMG said to be failing")
    assert not sync.failing()["vllm-router"]
    served.stop()  # bounded: its calls to the trickler end at their deadlines


def test_vllm_router_removals_go_on_when_its_metrics_cannot_be_read(
    sqlite_url, make_engines, launch, serve
):
    engines = make_engines(2)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch("vllm-router", [e.origin for e in engines])
    closed = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    with captured() as logged:
        sync = RouterSync(sqlite_url, RUN, vllm_router=router.url, vllm_router_metrics=closed)
        served = serve(sync)
        ledger.actor_died(0, "ActorDiedError: killed")
        wait_until(lambda: router.routed() == {engines[1].origin}, "the dead shard's removal")
        served.stop()
    (failing,) = _said(logged, "router-sync failing", "vllm-router")  # said once
    assert "its listed workers are taken as routed" in failing["problem"]


def test_one_refused_removal_stops_no_other_removal_nor_the_adds(sqlite_url, loop):
    calls: list[tuple[str, str]] = []
    listed = [
        {"id": "a", "url": "http://10.9.9.1:1", "status": "ready", "is_healthy": True},
        {"id": "b", "url": "http://10.9.9.2:1", "status": "ready", "is_healthy": True},
    ]

    async def workers(request: web.Request) -> web.Response:
        return web.json_response({"workers": listed})

    async def delete(request: web.Request) -> web.Response:
        worker = request.match_info["id"]
        calls.append(("DELETE", worker))
        if worker == "a":
            return web.json_response({"error": "internal"}, status=500)
        listed[:] = [w for w in listed if w["id"] != worker]
        return web.json_response({"status": "accepted"}, status=202)

    async def add(request: web.Request) -> web.Response:
        calls.append(("POST", (await request.json())["url"]))
        return web.json_response({"status": "accepted", "worker_id": "c"}, status=202)

    async def state(request: web.Request) -> web.Response:
        return web.json_response({"status": "pending"})

    app = web.Application()
    app.router.add_get("/workers", workers)
    app.router.add_post("/workers", add)
    app.router.add_get("/workers/{id}", state)
    app.router.add_delete("/workers/{id}", delete)
    fake = ServedApp(loop, app)
    try:
        start_run(sqlite_url, ["http://10.9.9.3:1/v1"])
        with captured() as logged:
            sync = RouterSync(sqlite_url, RUN, smg=fake.origin)
            for _ in range(3):
                sync.step()
            sync.close()
    finally:
        fake.stop()
    assert ("DELETE", "b") in calls
    assert calls.count(("POST", "http://10.9.9.3:1")) == 1  # pending since: not asked again
    (failing,) = _said(logged, "router-sync failing", "smg")
    assert failing["problem"].startswith("a removal refused: smg at")
    assert "DELETE /workers/a (http://10.9.9.1:1) answered 500" in failing["problem"]


W = "http://10.9.9.3:1"


@pytest.mark.parametrize(
    ("page", "failing"),
    [
        (f'smg_worker_cb_outcomes_total{{worker="{W}",outcome="success"}} +Inf\n', True),
        (f'smg_worker_cb_outcomes_total{{worker="{W}",outcome="success"}} NaN\n', True),
        (f'smg_worker_cb_outcomes_total{{worker="{W}"}} 5\n', True),
        ('smg_worker_cb_outcomes_total{outcome="success"} 5\n', True),
        ("smg_worker_cb_outcomes_total{{{\n", True),
        # Finite, but more than any worker serves: dropped, not handed over one by one.
        (f'smg_worker_cb_outcomes_total{{worker="{W}",outcome="failure"}} 1e300\n', False),
    ],
)
def test_garbage_on_a_metrics_page_is_a_failing_router_not_a_crash(sqlite_url, loop, page, failing):
    pages = iter([f'smg_worker_cb_outcomes_total{{worker="{W}",outcome="success"}} 1\n'])

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=next(pages, page))

    async def workers(request: web.Request) -> web.Response:
        return web.json_response({"workers": []})

    async def add(request: web.Request) -> web.Response:
        return web.json_response({"status": "accepted"}, status=202)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/workers", workers)
    app.router.add_post("/workers", add)
    fake = ServedApp(loop, app)
    try:
        start_run(sqlite_url, [W + "/v1"])
        sync = RouterSync(sqlite_url, RUN, smg=fake.origin, smg_metrics=fake.origin)  # baseline
        assert sync.flush_outcomes() == {"smg": {}}
        assert sync.failing()["smg"] is failing
        sync.close()
    finally:
        fake.stop()
    assert windows(sqlite_url) == []


def test_a_vllm_router_health_page_without_worker_labels_stops_no_removal(sqlite_url, loop):
    removed: list[str] = []

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"urls": [] if removed else ["http://10.9.9.1:1"]})

    async def remove(request: web.Request) -> web.Response:
        removed.append(request.query["url"])
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm_router_worker_health 0\n")

    app = web.Application()
    app.router.add_get("/list_workers", listing)
    app.router.add_post("/remove_worker", remove)
    app.router.add_get("/metrics", metrics)
    fake = ServedApp(loop, app)
    try:
        start_run(sqlite_url, ["ray://shard-0"])  # no worker serves: everything listed goes
        sync = RouterSync(sqlite_url, RUN, vllm_router=fake.origin, vllm_router_metrics=fake.origin)
        sync.step()
        assert sync.failing()["vllm-router"]
        sync.close()
    finally:
        fake.stop()
    assert removed == ["http://10.9.9.1:1"]


def test_an_smg_add_under_way_is_followed_not_asked_again_nor_counted(sqlite_url, loop):
    posts: list[str] = []
    given_up = threading.Event()
    under_way = "01a23c58-4a9b-7022-a269-cc7324d09cb8"

    async def workers(request: web.Request) -> web.Response:
        return web.json_response({"workers": []})

    async def add(request: web.Request) -> web.Response:
        posts.append((await request.json())["url"])
        if len(posts) == 1:  # a previous sync's add, still waiting for the engine
            error = f"Worker creation already in progress for URL 'x' with ID {under_way}."
            body = {"error": error, "code": "WORKER_CREATE_IN_PROGRESS"}
            return web.json_response(body, status=409)
        return web.json_response({"status": "accepted", "worker_id": "new"}, status=202)

    async def state(request: web.Request) -> web.Response:
        if request.match_info["id"] == under_way and given_up.is_set():
            return web.json_response({"error": "not found"}, status=404)
        return web.json_response({"status": "pending"})

    app = web.Application()
    app.router.add_get("/workers", workers)
    app.router.add_post("/workers", add)
    app.router.add_get("/workers/{id}", state)
    fake = ServedApp(loop, app)

    def adds(sync: RouterSync) -> float:
        labels = {"router": "smg", "action": "add"}
        value = sync.metrics.registry.get_sample_value(
            "fleetledger_router_sync_changes_total", labels
        )
        return value or 0.0

    try:
        start_run(sqlite_url, [W + "/v1"])
        # reconcile_s is also how long an answered add is not asked again: nothing here.
        sync = RouterSync(sqlite_url, RUN, smg=fake.origin, reconcile_s=1e-6)
        for _ in range(3):
            sync.step()
        assert posts == [W] and adds(sync) == 0  # a 409 added nothing
        given_up.set()  # SMG gave that add up: asked again, accepted, counted once
        for _ in range(3):
            sync.step()
        assert posts == [W, W] and adds(sync) == 1
        sync.close()
    finally:
        fake.stop()


# ── the run's end, outcomes and URLs ─────────────────────────────────────────────────


def test_a_run_that_ends_during_a_scrape_still_empties_the_router(
    sqlite_url, loop, make_engines, launch, serve
):
    engines = make_engines(2)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch("smg", [e.origin for e in engines])
    scrapes: list[int] = []
    scraping, ended = threading.Event(), threading.Event()

    async def metrics(request: web.Request) -> web.Response:
        scrapes.append(1)
        if len(scrapes) == 2:  # the first window's scrape (the first is the baseline)
            scraping.set()
            await asyncio.to_thread(ended.wait, 30)
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    fake = ServedApp(loop, app)
    try:
        sync = RouterSync(sqlite_url, RUN, smg=router.url, smg_metrics=fake.origin, window_s=0.05)
        with captured() as logged:
            served = serve(sync)
            wait_until(scraping.is_set, "a window's scrape")
            ledger.end_run("completed", "done")
            ended.set()
            served.thread.join(timeout=30)
        assert not served.thread.is_alive()
    finally:
        ended.set()
        fake.stop()
    assert router.routed() == set()
    assert _said(logged, "run ended: the routers were emptied; router-sync stops")


def test_a_dead_engines_failures_never_condemn_its_successor_at_the_same_url(
    sqlite_url, make_engines, launch
):
    e0, e1 = make_engines(2)
    ledger = start_run(sqlite_url, [e0.base_url, e1.base_url])
    # vllm-router keeps a URL's counters across its removal and re-add.
    router = launch("vllm-router", [e0.origin, e1.origin])
    sync = new_sync(sqlite_url, router, window_s=3600)
    sync.step()
    e0.status = 500  # shard 0's engine fails its last requests, then dies
    assert Counter(router.complete(f"p{i}") for i in range(6)) == {200: 3, 500: 3}
    ledger.actor_died(0, "ActorDiedError: killed")
    sync.step()
    e0.status = 200  # its replacement, at the same URL, loads fresh weights
    ledger.restart_requested(0)
    ledger.replacement_loaded(0, e0.base_url)
    ledger.refit_started(1)
    ledger.refit_completed(1)
    wait_until(lambda: bool(sync.step()) and router.routed() == {e0.origin, e1.origin}, "e0")
    held = sync.flush_outcomes()["vllm-router"]
    assert held.get(0, WorkerCounts()).failures == 0
    assert held[1].successes == 3
    assert ledger.catch_up() is not None
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    sync.close()


def _membership(serving: dict[str, int], shard_of: dict[str, int], turns: dict[str, int]):
    return Membership(0, serving, shard_of, {}, None, turns)


def test_outcomes_go_only_to_a_shard_that_served_at_the_url_all_window():
    a = "http://h:1"
    opened = _membership({a: 0}, {a: 0}, {})
    assert credit(a, opened, _membership({a: 0}, {a: 0}, {}))[0] == 0
    assert credit(a, opened, _membership({}, {a: 0}, {a: 1}))[0] == 0  # its death's evidence
    came_back = credit(a, opened, _membership({a: 0}, {a: 0}, {a: 2}))
    assert came_back == (None, "the URL left the serving set and came back within the window")
    rejoined = credit(a, _membership({}, {a: 0}, {}), _membership({a: 0}, {a: 0}, {a: 1}))
    assert rejoined == (None, "shard 0 was not serving at this URL when the window opened")
    assert credit(a, opened, _membership({}, {}, {a: 1}))[0] is None  # no shard has it
    assert credit(a, opened, _membership({a: 1}, {a: 1}, {a: 2}))[0] is None  # another's


def test_two_shards_recorded_at_one_url_map_it_to_the_serving_one(sqlite_url):
    first, second = "http://10.0.0.1:8000/v1", "http://10.0.0.1:8001/v1"
    ledger = start_run(sqlite_url, [first, second])
    ledger.actor_died(1, "gone")  # shard 1 dies; its port is freed
    ledger.actor_died(0, "gone")
    ledger.restart_requested(0)
    ledger.replacement_loaded(0, second)  # shard 0's replacement takes that port
    ledger.refit_started(1)
    ledger.refit_completed(1)  # and serves there
    with captured() as logged, EventLog.open(sqlite_url, mode="read") as log:
        follower = MembershipFollower(log, RUN)
        ledger.refit_started(2)
        ledger.refit_completed(2)
        follower.poll()  # folded again: said once all the same
    url = "http://10.0.0.1:8001"
    assert follower.membership.serving == {url: 0}
    assert follower.membership.shard_of == {url: 0}
    assert url not in follower.membership.not_serving
    (shared,) = _said(logged, "several shards record one URL; its outcomes go to the one serving")
    assert shared["shards"] == {0: "HEALTHY", 1: "DEAD"}


def test_a_worker_listed_with_a_trailing_slash_is_replaced_by_the_shards_exact_url(
    sqlite_url, make_engines, launch
):
    (engine,) = make_engines(1)
    start_run(sqlite_url, [engine.base_url])
    # SMG keeps "origin/" as a worker of its own and sends it requests at origin//v1/...
    router = launch("smg", [engine.origin + "/"])
    sync = new_sync(sqlite_url, router)
    verdicts = {v.url: v.action for v in sync.step()["smg"]}
    assert verdicts == {engine.origin + "/": Action.REMOVE, engine.origin: Action.ADD}
    wait_until(lambda: router.routed() == {engine.origin}, "the shard's own URL routed")
    assert all(router.complete(f"p{i}") == 200 for i in range(3))
    assert engine.generations == 3
    sync.close()


def test_the_ledger_listeners_state_is_said_once_per_change(sqlite_url):
    start_run(sqlite_url, ["http://127.0.0.1:9/v1"])
    sync = RouterSync(sqlite_url, RUN, smg="http://127.0.0.1:9", settle_s=0)
    down = "not listening (OperationalError: connection refused); polling"
    with captured() as logged:
        for state in ["listening", down, down, down, "listening"]:
            sync._listening_is(state)  # as the listener calls it, once a second while down
    sync.close()
    said = [e["state"] for e in _said(logged, "router-sync ledger notifications")]
    assert said == ["listening", down, "listening"]


# ── the command ──────────────────────────────────────────────────────────────────────


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}
    return env | {"FLEETLEDGER_LOG": "warning"}


def test_the_command_drives_smg_serves_its_metrics_and_stops_on_sigterm(
    sqlite_url, make_engines, launch, tmp_path
):
    engines = make_engines(2)
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    router = launch("smg")
    argv = [FLEETLEDGER, "router-sync", RUN, "--smg", router.url, "--db", sqlite_url]
    argv += ["--smg-metrics", router.metrics_url, "--metrics-port", "0", "--window-s", "3600"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        metrics_url = proc.stdout.readline().strip()
        assert metrics_url.startswith("http://127.0.0.1:") and metrics_url.endswith("/metrics")
        wait_until(lambda: router.routed() == {e.origin for e in engines}, "smg populated")
        assert all(router.complete(f"p{i}") == 200 for i in range(4))  # after the baseline
        ledger.actor_died(0, "ActorDiedError: killed")
        wait_until(lambda: router.routed() == {engines[1].origin}, "shard 0's removal")

        def lag_shown() -> bool:
            page = call("GET", metrics_url)[1].decode()
            return 'fleetledger_router_sync_lag_seconds_count{router="smg"} 1.0' in page

        wait_until(lag_shown, "the lag on the sync's /metrics")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    (window,) = windows(sqlite_url)  # handed over on SIGTERM
    assert window.adapter == "smg"
    assert sum(o.successes for o in window.outcomes) == 4


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["nope", "--smg", "http://127.0.0.1:9"], "no run 'nope'"),
        ([RUN, "--smg", "http://127.0.0.1:9"], f"run '{RUN}' ended at seq"),
        ([RUN], "give at least one of --smg URL or --vllm-router URL"),
        ([RUN, "--vllm-router", "ftp://h:1"], "the vllm-router URL 'ftp://h:1' is not an http(s)"),
        ([RUN, "--smg", "http://h:1/v1"], "the smg URL 'http://h:1/v1' has a path"),
        ([RUN, "--smg", "http://127.0.0.1:abc"], "is not a URL (Port could not be cast"),
        ([RUN, "--smg", "http://[::1"], "the smg URL 'http://[::1' is not a URL (Invalid IPv6"),
        ([RUN, "--smg", "http://h:-1"], "the smg URL 'http://h:-1' is not a URL (Port"),
        ([RUN, "--smg", "http://127.0.0.1:99999"], "is not a URL (Port out of range"),
        ([RUN, "--smg", "http://h:0"], "has port 0"),
        (
            [RUN, "--smg", "http://127.0.0.1:9", "--smg-metrics", "http://127.0.0.1:abc"],
            "the smg metrics URL 'http://127.0.0.1:abc' is not a URL",
        ),
        # Once taken, and retried forever: spaces, a host no DNS name is, a bad metrics
        # address of the same kinds; a password is never said back.
        ([RUN, "--smg", "http:// 127.0.0.1:1"], "'http:// 127.0.0.1:1' holds spaces"),
        ([RUN, "--smg", "http://127.0.0.1:1\t"], "holds spaces or control characters"),
        ([RUN, "--smg", "http://" + "a" * 5000 + ":1"], "names a host of 5000 characters"),
        ([RUN, "--smg", "http://" + "a" * 64 + ".x:1"], "names a host of 66 characters"),
        ([RUN, "--vllm-router", "http://u:secret@h:1"], "'http://u:***@h:1' carries credentials"),
        (
            [RUN, "--vllm-router", "http://127.0.0.1:9", "--vllm-router-metrics", "http://h :9"],
            "the vllm-router metrics URL 'http://h :9' holds spaces",
        ),
        (
            [
                RUN,
                "--smg",
                "http://127.0.0.1:9",
                "--metrics-port",
                "0",
                "--metrics-host",
                "192.0.2.1",
            ],
            "cannot serve metrics on 192.0.2.1:0",
        ),
    ],
)
def test_the_command_refuses_in_one_line(sqlite_url, make_engines, args, says):
    ledger = start_run(sqlite_url, [make_engines(1)[0].base_url])
    if "ended" in says:
        ledger.end_run("completed", "done")
    done = subprocess.run(
        [FLEETLEDGER, "router-sync", *args, "--db", sqlite_url],
        capture_output=True,
        text=True,
        env=_cli_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetledger: error: router-sync"), lines
    assert says in lines[0] and "secret" not in lines[0] and len(lines[0]) < 300


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({}, "name at least one external router"),
        ({"smg_metrics": "http://h:2"}, "a smg metrics URL without a smg URL"),
        ({"smg": "http://h:1", "poll_s": 0}, "poll_s must be a positive number"),
        ({"smg": "http://h:1", "name": ""}, "name must be non-empty"),
    ],
)
def test_bad_sync_settings_are_refused(sqlite_url, kwargs, says):
    start_run(sqlite_url, ["http://127.0.0.1:9/v1"])
    with pytest.raises(RouterSyncError, match=says):
        RouterSync(sqlite_url, RUN, **kwargs)


def test_a_taken_metrics_port_is_refused_in_one_line(sqlite_url):
    start_run(sqlite_url, ["http://127.0.0.1:9/v1"])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(RouterSyncError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            RouterSync(sqlite_url, RUN, smg="http://127.0.0.1:9", metrics_port=port)


# ── the reconciliation rule, as a property ───────────────────────────────────────────

URLS = [f"http://h:{port}" for port in range(8)]


@given(
    st.dictionaries(st.sampled_from(URLS), st.integers(0, 7)),
    st.dictionaries(st.sampled_from(URLS), st.sampled_from(list(Presence))),
)
def test_reconciliation_reaches_the_serving_set_and_stays_there(serving, listed):
    verdicts = reconcile(serving, listed)
    assert sorted(v.url for v in verdicts) == sorted(serving.keys() | listed.keys())
    by_url = {v.url: v for v in verdicts}
    for url, verdict in by_url.items():
        expected, _ = RULES[(url in serving, listed.get(url))]
        assert verdict.action is expected
        assert verdict.reason
        assert verdict.action is not Action.ADD or (url in serving and url not in listed)
        assert verdict.action is not Action.REMOVE or url in listed
        if url in serving and listed.get(url) is Presence.ROUTED:
            assert verdict.action is Action.KEEP  # a routed serving worker is never touched
        if url not in serving and listed.get(url) in (Presence.ROUTED, Presence.EJECTED):
            assert verdict.action is Action.REMOVE  # whoever added it
    actions = [v.action for v in verdicts]
    assert actions == sorted(
        actions, key=[Action.REMOVE, Action.ADD, Action.WAIT, Action.KEEP].index
    )
    # Carried out by a router that finishes what it was moving (a drain ends in removal,
    # an add it is still making in a routed worker), it converges in three rounds and
    # then holds.
    state = dict(listed)
    for _ in range(3):
        for v in reconcile(serving, state):
            if v.action is Action.REMOVE:
                del state[v.url]
            elif v.action is Action.ADD:
                state[v.url] = Presence.ROUTED
        state = {
            u: Presence.ROUTED if p is Presence.ADDING else p
            for u, p in state.items()
            if p is not Presence.DRAINING
        }
    assert state == dict.fromkeys(serving, Presence.ROUTED)
    assert {v.action for v in reconcile(serving, state)} <= {Action.KEEP}


@given(st.booleans(), st.sampled_from([None, *Presence]), st.sampled_from(list(AddState)))
def test_a_leave_is_out_only_when_nothing_can_route_to_it_again(serving_again, listed, add):
    settled, why = settle_leave(serving_again, listed, add)
    assert why
    if serving_again:
        assert settled is Settlement.FORGOTTEN
    elif add is not AddState.NONE or listed in (Presence.ROUTED, Presence.ADDING, Presence.EJECTED):
        assert settled is Settlement.WAITING  # an add that may land, or a worker routed
    else:
        assert settled is Settlement.CONFIRMED


@given(st.lists(st.dictionaries(st.sampled_from([("a", "ok"), ("b", "ok")]), st.integers(0, 50))))
def test_counter_deltas_report_growth_and_read_a_reset_as_a_fresh_start(scrapes):
    deltas = CounterDeltas()
    previous: dict[tuple[str, ...], float] | None = None
    for scrape in scrapes:
        values = {k: float(v) for k, v in scrape.items()}
        grown = deltas.take(values)
        if previous is None:
            assert grown == {}  # the baseline
        else:
            for key, value in values.items():
                before = previous.get(key, 0.0)
                expected = int(value - before) if value >= before else int(value)
                assert grown.get(key, 0) == expected
            assert set(grown) <= set(values)
        previous = values
