"""The router, end to end over real sockets: aiohttp engines recorded as the shards' base
URLs in a real ledger, the router in front of them, the real ``openai`` client (and
raw HTTP) where a user would be, and the ledger read back for what the router reported.

The fake engines answer the OpenAI routes deterministically (the same request gives the
same bytes) and count what they receive, so every test can say which engine saw what.
Nothing here asserts on timing: waits are for a condition, bounded only so a broken
router fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetledger.adapters.failure_taxonomy import FailureKind, classify_http_status
from fleetledger.adapters.least_outstanding import least_outstanding
from fleetledger.config import ControllerConfig, RouterConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.engines.simulated import SimulatedShard
from fleetledger.events.models import OutcomeWindowReported
from fleetledger.projections.shard_states import ShardState
from fleetledger.router.app import Router, RouterError, reserve_port
from fleetledger.router.routing_table import Backend, RoutingTable, origin_of
from fleetledger.store.log import EventLog
from tests.fake_engines import Loop, ServedApp, call, wait_until

RUN = "run-router"


# ── fake engines ─────────────────────────────────────────────────────────────


class Engine(ServedApp):
    """A small OpenAI-compatible aiohttp server on 127.0.0.1 that counts what it receives.

    ``mode``: ``ok``; ``hang_up`` (reads the request, then closes the connection without
    answering); ``cut`` (starts a streamed answer, then closes the connection); or an
    int, the status every generation is answered with.
    """

    def __init__(self, loop: Loop, name: str) -> None:
        self.name = name
        self.loop = loop
        self.mode: str | int = "ok"
        self.received: Counter[str] = Counter()
        self.last_headers: dict[str, str] = {}
        self.gate: asyncio.Event | None = None  # generations wait for it when set
        self.midway: asyncio.Event | None = None  # streams wait for it after one event
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        super().__init__(loop, app)

    @property
    def generations(self) -> int:
        return self.received["/v1/completions"] + self.received["/v1/chat/completions"]

    def hold(self) -> None:
        """Make generations wait until :meth:`release`."""
        self.gate = self.loop.run(_new_event())

    def hold_midway(self) -> None:
        """Make streams wait after their first event until :meth:`release`."""
        self.midway = self.loop.run(_new_event())

    def release(self) -> None:
        for gate in (self.gate, self.midway):
            if gate is not None:
                self.loop.loop.call_soon_threadsafe(gate.set)

    async def _models(self, request: web.Request) -> web.Response:
        self.received[request.path] += 1
        self.last_headers = dict(request.headers)
        return web.json_response(
            {"object": "list", "data": [{"id": "tiny", "object": "model"}]},
            headers={"X-Engine": self.name, "Upgrade": "h2c"},
        )

    async def _tokenize(self, request: web.Request) -> web.Response:
        self.received[request.path] += 1
        body = await request.json()
        return web.json_response({"tokens": [ord(c) for c in body.get("prompt", "")]})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.received[request.path] += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.mode == "hang_up":
            assert request.transport is not None
            request.transport.abort()
            return web.Response()
        if isinstance(self.mode, int):
            message = "maximum context length is 16 tokens" if self.mode == 400 else "engine busy"
            return web.json_response({"error": {"message": message}}, status=self.mode)
        tokens = _tokens(body, chat)
        if not body.get("stream"):
            return web.json_response(_answer(tokens, chat, body.get("logprobs")))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, token in enumerate(tokens):
            if self.mode == "cut" and i == 2:
                assert request.transport is not None
                request.transport.abort()
                return response
            await response.write(f"data: {json.dumps(_chunk(token, i, chat))}\n\n".encode())
            if i == 0 and self.midway is not None:
                await self.midway.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _new_event() -> asyncio.Event:
    return asyncio.Event()


def _tokens(body: dict[str, Any], chat: bool) -> list[str]:
    seed = json.dumps(body.get("messages") if chat else body.get("prompt"), sort_keys=True)
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return [f"t{digest[i % 60 : i % 60 + 4]}" for i in range(int(body.get("max_tokens", 8)))]


def _logprobs(tokens: list[str]) -> dict[str, Any]:
    return {
        "tokens": tokens,
        "token_logprobs": [-0.1 * (i + 1) for i in range(len(tokens))],
        "top_logprobs": [{t: -0.1, f"{t}x": -2.5, f"{t}y": -3.25} for t in tokens],
        "text_offset": list(range(len(tokens))),
    }


def _answer(tokens: list[str], chat: bool, logprobs: object) -> dict[str, Any]:
    text = "".join(tokens)
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
        choice["logprobs"] = _logprobs(tokens) if logprobs else None
    return {
        "id": "cmpl-fixed",
        "object": "chat.completion" if chat else "text_completion",
        "created": 1,
        "model": "tiny",
        "choices": [choice],
        "usage": {"prompt_tokens": 1, "completion_tokens": len(tokens), "total_tokens": 1},
    }


def _chunk(token: str, i: int, chat: bool) -> dict[str, Any]:
    if chat:
        choice: dict[str, Any] = {"index": 0, "delta": {"content": token}, "finish_reason": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": token, "logprobs": _logprobs([token]), "finish_reason": None}
        kind = "text_completion"
    return {"id": f"c{i}", "object": kind, "created": 1, "model": "tiny", "choices": [choice]}


# ── fixtures and helpers ─────────────────────────────────────────────────────


@pytest.fixture
def loop() -> Iterator[Loop]:
    running = Loop()
    yield running
    running.close()


@pytest.fixture
def engines(loop: Loop) -> Iterator[list[Engine]]:
    started = [Engine(loop, f"e{i}") for i in range(3)]
    yield started
    for engine in started:
        engine.release()
        engine.stop()


def start_run(url: str, base_urls: list[str], run: str = RUN) -> Ledger:
    config = ControllerConfig().fleet_config(
        shard_count=len(base_urls), train_world_size=1, base_urls=base_urls
    )
    return Ledger.start(EventLog.open(url), run, config)


class Running:
    """A router served in a thread of its own through ``serve_forever`` (as the CLI and
    an actor run it); the test talks to it over its socket."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=router.serve_forever, args=(self.stop_event,))
        self.thread.start()
        self.client = openai.OpenAI(base_url=router.url, api_key="unused", max_retries=0)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()

    def wait_for_seq(self, seq: int) -> None:
        wait_until(lambda: self.router.seq >= seq, f"the router to fold seq {seq}")


@pytest.fixture
def serve() -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def make(url: str, run: str = RUN, **kwargs: Any) -> Running:
        kwargs.setdefault("poll_s", 0.05)
        running = Running(Router(url, run, **kwargs))
        started.append(running)
        return running

    yield make
    for running in started:
        if running.thread.is_alive():
            running.stop()


def windows(url: str, run: str = RUN) -> list[OutcomeWindowReported]:
    with EventLog.open(url, mode="read") as log:
        return [r.event for r in log.read(run) if isinstance(r.event, OutcomeWindowReported)]


def reported(url: str, run: str = RUN) -> dict[int, tuple[int, Counter[tuple[str, str]]]]:
    """Per shard: successes and failures by (category, reason), over every window."""
    totals: dict[int, tuple[int, Counter[tuple[str, str]]]] = {}
    for window in windows(url, run):
        assert window.adapter == "router"
        for o in window.outcomes:
            ok, bad = totals.get(o.shard, (0, Counter()))
            for f in o.failures:
                bad[(f.category, f.reason)] += f.count
            totals[o.shard] = (ok + o.successes, bad)
    return totals


def state_of(ledger: Ledger, shard: int) -> ShardState:
    ledger.catch_up()
    return ledger.view.state_of(shard)


def complete(client: openai.OpenAI, prompt: str = "hi") -> str:
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=4).choices[0].text


# ── membership and selection ─────────────────────────────────────────────────


def test_every_answer_names_the_shard_that_served_it(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:2]])
    ledger.actor_died(0, "gone")
    running = serve(sqlite_url)
    raw = running.client.completions.with_raw_response.create(
        model="tiny", prompt="p", max_tokens=1
    )
    assert raw.headers["x-fleetledger-shard"] == "1"
    assert (engines[0].generations, engines[1].generations) == (0, 1)


def test_a_dead_shard_in_the_ledger_gets_no_request(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    running = serve(sqlite_url)
    ledger.actor_died(1, "ActorDiedError: killed")
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (0, 2)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: complete(running.client, f"p{i}"), range(12)))
    assert engines[1].generations == 0
    assert engines[0].generations + engines[2].generations == 12


def test_sequential_requests_tie_to_the_lowest_shard_and_concurrent_ones_spread(
    sqlite_url, engines, serve
):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    running = serve(sqlite_url)
    for i in range(3):  # nothing outstanding at each choice: ties go to shard 0
        complete(running.client, f"p{i}")
    assert (engines[0].generations, engines[1].generations) == (3, 0)
    for engine in engines[:2]:
        engine.hold()
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(complete, running.client, f"q{i}") for i in range(4)]
        wait_until(lambda: engines[0].generations + engines[1].generations == 7, "4 dispatches")
        # Least outstanding: two held on each, whatever order they arrived in.
        assert (engines[0].generations, engines[1].generations) == (5, 2)
        assert (running.router.in_flight(0), running.router.in_flight(1)) == (2, 2)
        for engine in engines[:2]:
            engine.release()
        for future in futures:
            future.result()
    assert (running.router.in_flight(0), running.router.in_flight(1)) == (0, 0)


def test_a_shard_whose_base_url_is_not_http_is_skipped(sqlite_url, engines, serve):
    start_run(sqlite_url, ["ray://shard-0", engines[1].base_url])
    running = serve(sqlite_url)
    assert running.router.routable == (1,)
    complete(running.client)
    assert engines[1].generations == 1


# ── pass-through ─────────────────────────────────────────────────────────────


def test_payloads_with_logprobs_and_streams_arrive_byte_identical(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    direct = openai.OpenAI(base_url=engines[0].base_url, api_key="unused", max_retries=0)
    routed = running.client
    # ~100 KiB up, ~160 KiB down with per-token logprobs: several 64 KiB chunks each way.
    big = {"model": "tiny", "prompt": "x" * 100_000, "max_tokens": 2000, "logprobs": 3}
    a = direct.completions.with_raw_response.create(**big)
    b = routed.completions.with_raw_response.create(**big)
    assert len(a.content) > 2 * 64 * 1024
    assert a.content == b.content
    assert b.parse().choices[0].logprobs.token_logprobs[:2] == [-0.1, -0.2]
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
    for kind in ("completions", "chat"):
        api_direct = direct.completions if kind == "completions" else direct.chat.completions
        api_routed = routed.completions if kind == "completions" else routed.chat.completions
        args = big | {"max_tokens": 50} if kind == "completions" else chat
        with api_direct.with_streaming_response.create(**args, stream=True) as one:
            expected = b"".join(one.iter_bytes())
        with api_routed.with_streaming_response.create(**args, stream=True) as two:
            assert two.headers["content-type"].startswith("text/event-stream")
            assert b"".join(two.iter_bytes()) == expected
        events = list(api_routed.create(**args, stream=True))
        assert len(events) == args["max_tokens"]
    models = routed.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert call("POST", running.router.url.removesuffix("/v1") + "/tokenize", {"prompt": "ab"}) == (
        200,
        b'{"tokens": [97, 98]}',
    )
    assert engines[0].received["/tokenize"] == 1 and engines[0].received["/v1/models"] == 1


def test_a_stream_reaches_the_client_as_it_is_generated(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    engine = engines[0]
    engine.hold_midway()
    stream = running.client.with_options(timeout=30).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    events = iter(stream)
    # The engine waits after its first event: a router that buffered would never
    # deliver it, and this read would time out.
    first = next(events)
    assert first.choices[0].delta.content
    engine.release()
    assert len(list(events)) == 2
    assert engine.received["/v1/chat/completions"] == 1


def test_backend_status_and_body_pass_through_and_4xx_is_not_the_shards_fault(
    sqlite_url, engines, serve
):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url, window_s=3600)
    engines[0].mode = 400
    status, body = call("POST", running.router.url + "/completions", {"prompt": "long"})
    assert status == 400
    assert json.loads(body) == {"error": {"message": "maximum context length is 16 tokens"}}
    engines[0].mode = 503
    with pytest.raises(openai.InternalServerError) as raised:
        complete(running.client)
    assert raised.value.status_code == 503
    assert running.router.routable == (0,)  # an answer, even a 5xx, is no connection error
    running.stop()
    ok, bad = reported(sqlite_url)[0]
    assert (ok, bad) == (0, Counter({("data", "context_length"): 1, ("infra", "http_503"): 1}))


def test_hop_by_hop_headers_are_stripped_both_ways_and_the_rest_pass(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    conn = http.client.HTTPConnection("127.0.0.1", running.router.port, timeout=30)
    conn.request(
        "GET",
        "/v1/models?verbose=1",
        headers={
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "named by Connection",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic eA==",
            "TE": "trailers",
            "Upgrade": "websocket",
            "X-Custom": "kept",
            "Authorization": "Bearer kept",
        },
    )
    answer = conn.getresponse()
    assert answer.status == 200 and json.loads(answer.read())["data"][0]["id"] == "tiny"
    assert answer.getheader("X-Engine") == "e0" and answer.getheader("Upgrade") is None
    conn.close()
    seen = {k.lower(): v for k, v in engines[0].last_headers.items()}
    assert seen["x-custom"] == "kept" and seen["authorization"] == "Bearer kept"
    for hop in ("x-hop", "keep-alive", "proxy-authorization", "te", "upgrade"):
        assert hop not in seen, hop
    assert seen["host"] == f"127.0.0.1:{engines[0].port}"


@pytest.mark.parametrize(
    "path", ["/v1/embeddings", "/admin", "/v1/completions/extra", "/v1", "/v1/tokenize", "/"]
)
def test_a_route_outside_the_allow_list_is_404_and_never_forwarded(
    sqlite_url, engines, serve, path
):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    origin = running.router.url.removesuffix("/v1")
    status, body = call("POST", origin + path, {"prompt": "x"})
    assert status == 404
    assert json.loads(body)["error"]["type"] == "not_found"
    assert sum(engines[0].received.values()) == 0


# ── failures ─────────────────────────────────────────────────────────────────


def test_a_backend_that_hangs_up_is_500_recorded_and_avoided(sqlite_url, engines, serve):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    # A window that never falls due inside the test: the router's own report of the
    # failure would name the shard and re-admit it (the rule the next test pins).
    running = serve(sqlite_url, window_s=3600)
    engines[0].mode = "hang_up"
    with pytest.raises(openai.InternalServerError) as failed:
        running.client.completions.create(model="tiny", prompt="x")
    assert failed.value.status_code == 500
    assert failed.value.response.headers["x-fleetledger-shard"] == "0"  # whose failure
    error = failed.value.response.json()["error"]
    assert error["type"] == "backend_error" and "shard 0" in error["message"]
    assert running.router.routable == (1,)
    for i in range(4):
        complete(running.client, f"after{i}")
    assert (engines[0].generations, engines[1].generations) == (1, 4)
    metrics = call("GET", running.router.url.removesuffix("/v1") + "/metrics")[1].decode()
    assert 'fleetledger_router_backend_errors_total{shard="0"} 1.0' in metrics
    assert 'fleetledger_router_requests_total{route="/v1/completions",status="200"} 4.0' in metrics
    assert 'fleetledger_router_requests_total{route="/v1/completions",status="500"} 1.0' in metrics
    assert "fleetledger_router_added_latency_seconds_count 4.0" in metrics
    running.stop()
    totals = reported(sqlite_url)
    assert totals[1] == (4, Counter())
    ok, bad = totals[0]
    assert ok == 0 and sum(bad.values()) == 1 and next(iter(bad))[0] == "infra"


def test_a_backend_past_its_bound_is_500_recorded_as_a_timeout_and_avoided(
    sqlite_url, engines, serve
):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    running = serve(sqlite_url, config=RouterConfig(backend_timeout_s=0.5), window_s=3600)
    engines[0].hold()
    status, body = call("POST", running.router.url + "/completions", {"prompt": "p"})
    engines[0].release()
    assert status == 500
    assert "within the backend bound of 0.5 s" in json.loads(body)["error"]["message"]
    assert running.router.routable == (1,)
    complete(running.client)
    assert engines[1].generations == 1
    running.stop()
    ok, bad = reported(sqlite_url)[0]
    assert ok == 0 and list(bad) == [("infra", "timeout")]


def test_a_backend_killed_mid_stream_cuts_the_client_and_is_recorded(sqlite_url, engines, serve):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    running = serve(sqlite_url, window_s=3600)
    engines[0].mode = "cut"
    stream = running.client.completions.create(model="tiny", prompt="p", max_tokens=5, stream=True)
    got = []
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        for event in stream:
            got.append(event)
    assert len(got) == 2  # the two events sent before the engine died, never a false end
    assert running.router.routable == (1,)
    complete(running.client)
    assert engines[1].generations == 1
    running.stop()
    ok, bad = reported(sqlite_url)[0]
    assert ok == 0 and sum(c for (kind, _), c in bad.items() if kind == "infra") == 1


# An engine in a process of its own: one SSE event, then it waits to be killed.
_KILLABLE_ENGINE = """
import asyncio, sys
from aiohttp import web

async def completions(request):
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    event = '{"id":"c0","object":"text_completion","created":1,"model":"tiny",'
    event += '"choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]}'
    await response.write(("data: " + event + "\\n\\n").encode())
    await asyncio.sleep(3600)
    return response

app = web.Application()
app.router.add_post("/v1/completions", completions)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


def test_an_engine_process_killed_mid_stream_is_recorded_and_avoided(sqlite_url, engines, serve):
    port = reserve_port()
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE_ENGINE, str(port)])
    try:
        wait_until(lambda: _listening(port), "the engine process to listen")
        start_run(sqlite_url, [f"http://127.0.0.1:{port}/v1", engines[1].base_url])
        running = serve(sqlite_url, window_s=3600)
        stream = running.client.completions.create(
            model="tiny", prompt="p", max_tokens=5, stream=True
        )
        events = iter(stream)
        assert next(events).choices[0].text == "a"
        proc.send_signal(signal.SIGKILL)
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            list(events)
        wait_until(lambda: running.router.routable == (1,), "the killed engine avoided")
        complete(running.client)
        assert engines[1].generations == 1
        running.stop()
        ok, bad = reported(sqlite_url)[0]
        assert ok == 0 and sum(c for (kind, _), c in bad.items() if kind == "infra") == 1
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def test_avoiding_the_last_backend_gives_the_no_healthy_answer(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url, window_s=3600)
    engines[0].mode = "hang_up"
    assert call("POST", running.router.url + "/completions", {"prompt": "x"})[0] == 500
    engines[0].mode = "ok"
    status, body = call("POST", running.router.url + "/completions", {"prompt": "x"})
    assert status == 409
    assert "avoided after errors: [0]" in json.loads(body)["error"]["message"]
    assert engines[0].generations == 1


def test_an_avoided_backend_returns_when_the_ledger_next_names_it(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:2]])
    running = serve(sqlite_url, window_s=3600)
    engines[0].mode = "hang_up"
    assert call("POST", running.router.url + "/completions", {"prompt": "x"})[0] == 500
    engines[0].mode = "ok"
    ledger.record_probes({1: ProbeResult.ok()})  # names shard 1 only
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (1,)
    ledger.record_probes({0: ProbeResult.ok(), 1: ProbeResult.ok()})  # names shard 0
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (0, 1)
    complete(running.client)
    assert engines[0].generations == 2  # the failed one, and this one


def test_the_routers_own_failure_report_readmits_the_shard_until_the_ledger_condemns_it(
    sqlite_url, engines, serve
):
    # A dead engine costs at most unhealthy_threshold (3) failed requests, one per window.
    nothing_there = f"http://127.0.0.1:{reserve_port()}/v1"  # connection refused
    ledger = start_run(sqlite_url, [nothing_there, engines[1].base_url])
    running = serve(sqlite_url, window_s=0.1)
    for _ in range(3):
        wait_until(lambda: 0 in running.router.routable, "shard 0 re-admitted")
        status, _ = call("POST", running.router.url + "/completions", {"prompt": "x"})
        assert status == 500
    wait_until(lambda: state_of(ledger, 0) == ShardState.DEAD, "shard 0 recorded DEAD")
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (1,)
    assert call("POST", running.router.url + "/completions", {"prompt": "x"})[0] == 200


def test_nothing_serving_answers_the_no_healthy_status_with_a_json_body(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:2]])
    ledger.actor_died(0, "gone")
    ledger.actor_died(1, "gone")
    running = serve(sqlite_url)
    status, body = call("POST", running.router.url + "/chat/completions", {"messages": []})
    assert status == 409
    error = json.loads(body)["error"]
    assert error["type"] == "no_healthy_shards" and "DEAD 2" in error["message"]
    # The body tells the rollout client it is the fleet's fault, though 409 is not retried.
    assert classify_http_status(status, body.decode()).kind is FailureKind.INFRA
    with pytest.raises(openai.ConflictError):
        complete(running.client)
    assert sum(sum(e.received.values()) for e in engines) == 0
    metrics = call("GET", running.router.url.removesuffix("/v1") + "/metrics")[1].decode()
    assert "fleetledger_router_no_healthy_total 2.0" in metrics
    assert "fleetledger_router_serving_backends 0.0" in metrics


def test_a_run_that_ends_while_served_is_answered_no_healthy(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url, config=RouterConfig(no_healthy_status=410))
    complete(running.client)
    ledger.end_run("completed", "all steps done")
    running.wait_for_seq(ledger.view.seq)
    status, body = call("POST", running.router.url + "/completions", {"prompt": "x"})
    assert status == 410
    assert "ended at seq" in json.loads(body)["error"]["message"]
    assert engines[0].generations == 1


# ── restarts and replacements ────────────────────────────────────────────────


def test_a_restarted_router_on_its_port_serves_the_true_membership_at_once(
    sqlite_url, engines, serve
):
    ledger = start_run(sqlite_url, [e.base_url for e in engines[:2]])
    port = reserve_port()
    first = serve(sqlite_url, port=port)
    complete(first.client)
    first.stop()
    ledger.actor_died(0, "gone while the router was down")
    second = serve(sqlite_url, port=port, poll_s=3600)  # it must not need to poll
    assert second.router.url == first.router.url
    assert second.router.routable == (1,)
    complete(second.client)
    assert (engines[0].generations, engines[1].generations) == (1, 1)


def test_a_replacement_is_routed_at_its_new_url_once_a_refit_admits_it(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [engines[0].base_url, engines[1].base_url])
    running = serve(sqlite_url)
    ledger.actor_died(0, "gone")
    ledger.restart_requested(0)
    ledger.replacement_loaded(0, engines[2].base_url)
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (1,)  # STALE: alive, but not served
    ledger.refit_started(1)
    ledger.refit_completed(1)
    running.wait_for_seq(ledger.view.seq)
    assert running.router.routable == (0, 1)
    complete(running.client)
    assert (engines[0].generations, engines[2].generations) == (0, 1)


def test_an_outcome_for_a_url_that_left_the_fleet_is_dropped(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url, window_s=3600)
    engines[0].hold()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(complete, running.client)
        wait_until(lambda: engines[0].generations == 1, "the request to reach engine 0")
        ledger.restart_requested(0)
        ledger.replacement_loaded(0, engines[1].base_url)
        running.wait_for_seq(ledger.view.seq)
        engines[0].release()
        # Ended by the router once the ledger said so; re-sent, it found no serving shard.
        with pytest.raises(openai.ConflictError, match="re-sent after shard 0 left the fleet"):
            pending.result()
    running.stop()
    # Neither a success nor a failure of the shard: only what became of the request.
    ((only,),) = [w.outcomes for w in windows(sqlite_url)]
    assert (only.shard, only.successes, only.failures) == (0, 0, ())
    assert only.fates is not None and only.fates.redispatched == 1


# ── outcomes in the ledger ───────────────────────────────────────────────────


@pytest.mark.postgres
def test_outcome_windows_match_what_the_backends_saw_on_postgresql(
    migrated_postgres_url, engines, serve
):
    outcome_windows_match_what_the_backends_saw(migrated_postgres_url, engines, serve)


def test_outcome_windows_match_what_the_backends_saw_on_sqlite(sqlite_url, engines, serve):
    outcome_windows_match_what_the_backends_saw(sqlite_url, engines, serve)


def outcome_windows_match_what_the_backends_saw(
    url: str, engines: list[Engine], serve: Callable[..., Running]
) -> None:
    ledger = start_run(url, [e.base_url for e in engines])
    running = serve(url, window_s=0.2)
    with ThreadPoolExecutor(5) as pool:
        list(pool.map(lambda i: complete(running.client, f"p{i}"), range(20)))
    running.client.models.list()
    wait_until(lambda: len(windows(url)) >= 1, "a window handed over while serving")
    for i in range(5):
        complete(running.client, f"late{i}")
    running.stop()  # the last window is handed over on stop
    totals = reported(url)
    seen = {i: sum(e.received.values()) for i, e in enumerate(engines)}
    assert sum(seen.values()) == 26
    assert {shard: ok for shard, (ok, _) in totals.items()} == {i: n for i, n in seen.items() if n}
    assert all(not bad for _, bad in totals.values())
    assert ledger.catch_up() is not None and ledger.view.serving == (0, 1, 2)


# ── configuration and refusals ───────────────────────────────────────────────


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504, 520])
def test_a_no_healthy_status_that_clients_retry_is_refused(status):
    with pytest.raises(ValidationError, match=f"router.no_healthy_status={status}"):
        RouterConfig(no_healthy_status=status)


def test_router_timeouts_have_bounded_defaults_and_connect_fits_inside_backend():
    config = RouterConfig()
    assert (config.connect_bound_s, config.backend_bound_s) == (5.0, 300.0)
    assert RouterConfig(backend_timeout_s=2).connect_bound_s == 2
    with pytest.raises(ValidationError, match=r"the default router\.backend_timeout_s of 300"):
        RouterConfig(connect_timeout_s=301)


def test_unknown_and_ended_runs_are_refused_in_one_line(sqlite_url, engines):
    ledger = start_run(sqlite_url, [engines[0].base_url])
    with pytest.raises(RouterError, match="no run 'nope'") as unknown:
        Router(sqlite_url, "nope")
    ledger.end_run("failed", "fleet exhausted")
    with pytest.raises(RouterError, match=f"run '{RUN}' ended at seq 2") as ended:
        Router(sqlite_url, RUN)
    for raised in (unknown, ended):
        assert "\n" not in str(raised.value)


def test_a_taken_port_fails_construction(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    with pytest.raises(RouterError, match=f"cannot listen on 127.0.0.1:{running.router.port}"):
        Router(sqlite_url, RUN, port=running.router.port)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"window_s": 0}, "window_s must be a positive"), ({"poll_s": -1}, "poll_s must be")],
)
def test_bad_router_arguments_are_refused(sqlite_url, engines, kwargs, message):
    start_run(sqlite_url, [engines[0].base_url])
    with pytest.raises(RouterError, match=message):
        Router(sqlite_url, RUN, **kwargs)


# ── the command ──────────────────────────────────────────────────────────────

FLEETLEDGER = str(Path(sys.executable).with_name("fleetledger"))


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}
    return env | {"FLEETLEDGER_LOG": "warning"}


def test_the_router_command_serves_and_flushes_on_sigterm(sqlite_url, engines, tmp_path):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    proc = subprocess.Popen(
        [FLEETLEDGER, "router", RUN, "--db", sqlite_url, "--window-s", "3600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(),
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
        for i in range(3):
            complete(client, f"p{i}")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert {s: ok for s, (ok, _) in reported(sqlite_url).items()} == {0: 3}  # ties: lowest


@pytest.mark.parametrize("ending", ["unknown", "ended"])
def test_the_router_command_refuses_an_unknown_or_ended_run(sqlite_url, engines, ending):
    ledger = start_run(sqlite_url, [engines[0].base_url])
    if ending == "ended":
        ledger.end_run("completed", "done")
    run = "nope" if ending == "unknown" else RUN
    done = subprocess.run(
        [FLEETLEDGER, "router", run, "--db", sqlite_url],
        capture_output=True,
        text=True,
        env=_cli_env(),
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetledger: error: router:")
    assert f"'{run}'" in lines[0]


def _router_command(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [FLEETLEDGER, "router", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_cli_env(),
        cwd=cwd,
    )


def _worker_pids(parent: int) -> set[int]:
    found = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True)
    return {int(pid) for pid in found.stdout.split()}


def test_router_workers_share_one_port_and_each_reports_under_its_own_name(
    sqlite_url, engines, tmp_path
):
    start_run(sqlite_url, [e.base_url for e in engines[:2]])
    proc = _router_command(RUN, "--db", sqlite_url, "--workers", "2", "--window-s", "0.2",
                           cwd=tmp_path)  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        workers = _worker_pids(proc.pid)
        assert len(workers) == 2
        # A fresh connection per request: the kernel spreads connections over the two
        # workers' sockets (all 40 on one worker: odds 2**-39).
        for i in range(40):
            with httpx.Client(timeout=30) as fresh:
                answer = fresh.post(url + "/completions", json={"model": "tiny", "prompt": f"{i}"})
                assert answer.status_code == 200
        port = int(url.rsplit(":", 1)[1].removesuffix("/v1"))
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        assert 'fleetledger_router_requests_total{route="/v1/completions",status="200"} 40.0' in (
            scraped
        )  # every worker's count, whichever worker answered the scrape
        # A worker killed outright is started again on the same port.
        victim = min(workers)
        os.kill(victim, signal.SIGKILL)
        wait_until(lambda: len(_worker_pids(proc.pid) - {victim}) == 2, "a new worker")
        assert httpx.post(url + "/completions", json={"model": "tiny"}, timeout=30).is_success
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "router worker died; starting it again" in err
    by_adapter: Counter[str] = Counter()
    for window in windows(sqlite_url):
        by_adapter[window.adapter] += sum(o.successes for o in window.outcomes)
    assert set(by_adapter) <= {"router-0", "router-1"}
    assert len(by_adapter) == 2
    # The killed worker's unreported window is lost with it (it was SIGKILLed): at most
    # the requests it served since its last window.
    assert 1 <= sum(by_adapter.values()) <= 41


def test_router_workers_serve_a_run_with_a_shard_that_is_not_http(sqlite_url, engines, tmp_path):
    # A worker logs "shard skipped" before it listens: the line goes to stderr, never
    # where the supervisor waits for the worker's answer (it once took that line for a
    # refusal), and a worker's logs never fill a pipe nobody reads.
    start_run(sqlite_url, ["ray://shard-0", engines[1].base_url])
    env = _cli_env() | {"FLEETLEDGER_LOG": "info"}
    proc = subprocess.Popen(
        [FLEETLEDGER, "router", RUN, "--db", sqlite_url, "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        for i in range(3):
            answer = httpx.post(url + "/completions", json={"model": "tiny", "prompt": f"{i}"})
            assert answer.headers["x-fleetledger-shard"] == "1"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert out == ""  # the URL line was the command's only output
    assert err.count("shard skipped: its base URL is not HTTP(S)") == 2  # one per worker


@pytest.mark.parametrize("problem", ["unknown run", "taken port"])
def test_router_workers_refuse_in_one_line_and_leave_no_process(
    sqlite_url, engines, serve, problem
):
    start_run(sqlite_url, [engines[0].base_url])
    args = [RUN, "--db", sqlite_url, "--workers", "2"]
    if problem == "unknown run":
        args[0] = "nope"
    else:
        args += ["--port", str(serve(sqlite_url).router.port)]
    proc = _router_command(*args)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetledger: error: router:"), err
    assert ("'nope'" if problem == "unknown run" else "cannot listen") in lines[0]
    left = subprocess.run(["pgrep", "-f", f"fleetledger.router.worker.*{sqlite_url}"],
                          capture_output=True, text=True)  # fmt: skip
    assert left.stdout == ""


# ── the weights behind every answer ──────────────────────────────────────────


def test_every_answer_carries_the_weight_version_the_ledger_had(sqlite_url, engines, serve):
    ledger = start_run(sqlite_url, [engines[0].base_url, engines[1].base_url])
    ledger.refit_started(3)
    ledger.refit_completed(3)
    running = serve(sqlite_url)
    raw = running.client.completions.with_raw_response.create(model="tiny", prompt="p")
    assert raw.headers["x-fleetledger-weight-version"] == "3"
    # These engines say nothing of their weights: the version is the ledger's, said so.
    assert raw.headers["x-fleetledger-weight-version-source"] == "ledger"
    assert "x-fleetledger-weight-version-end" not in raw.headers
    # A refit that completes while a (non-streamed) request waits for its answer: the
    # answer's head names the version it ended under.
    engines[0].hold()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(
            running.client.completions.with_raw_response.create, model="tiny", prompt="p"
        )
        wait_until(lambda: engines[0].generations == 2, "the request to reach the engine")
        ledger.refit_started(4)
        ledger.refit_completed(4)
        running.wait_for_seq(ledger.view.seq)
        engines[0].release()
        late = held.result(timeout=30)
    assert ledger.view.shards[0].weight_version == 4
    assert late.headers["x-fleetledger-weight-version"] == "3"
    assert late.headers["x-fleetledger-weight-version-end"] == "4"


def test_a_refit_in_the_middle_of_a_stream_is_named_where_the_stream_ends(
    sqlite_url, engines, serve
):
    ledger = start_run(sqlite_url, [engines[0].base_url])
    ledger.refit_started(7)
    ledger.refit_completed(7)
    running = serve(sqlite_url)
    engines[0].hold_midway()
    chat = running.client.with_options(timeout=30).chat.completions
    args = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with chat.with_streaming_response.create(**args, stream=True) as streamed:
        assert streamed.headers["x-fleetledger-weight-version"] == "7"
        lines = streamed.iter_lines()
        first = next(lines)
        assert first.startswith("data: ")  # the first event went out before the refit
        ledger.refit_started(8)
        ledger.refit_completed(8)
        running.wait_for_seq(ledger.view.seq)
        engines[0].release()
        rest = [line for line in lines if line]
    assert ledger.view.shards[0].weight_version == 8
    assert rest[-2:] == ["data: [DONE]", ": x-fleetledger-weight-version-end 8"]
    # Every SSE parser skips a comment line: the openai client sees the same events.
    engines[0].hold_midway()
    with ThreadPoolExecutor(1) as pool:
        events = pool.submit(lambda: list(chat.create(**args, stream=True)))
        wait_until(lambda: engines[0].generations == 2, "the second stream to start")
        ledger.refit_started(9)
        ledger.refit_completed(9)
        running.wait_for_seq(ledger.view.seq)
        engines[0].release()
        assert len(events.result(timeout=30)) == 3
    # A stream with no refit under it ends as the engine ended it.
    with chat.with_streaming_response.create(**args, stream=True) as quiet:
        assert quiet.headers["x-fleetledger-weight-version"] == "9"
        assert [line for line in quiet.iter_lines() if line][-1] == "data: [DONE]"


def test_an_engine_that_attests_is_taken_at_its_word_and_counted_by_it(sqlite_url, loop, serve):
    # The simulated engine attests (as every engine of fleetledger's does); the ledger,
    # which learns of a load only after the refit completes, still says version 2.
    shard = SimulatedShard(0, generation_s=0.0, weight_version=0, serve_http=True)
    base = loop.run(shard.start_http())
    ledger = start_run(sqlite_url, [base])
    ledger.refit_started(2)
    ledger.refit_completed(2)
    loop.run(shard.set_weight_version(5))  # the engine's own load, ahead of the ledger
    running = serve(sqlite_url, window_s=0.05)
    for _ in range(3):
        raw = running.client.completions.with_raw_response.create(model="m", prompt="p")
        text = raw.parse().choices[0].text
        assert text.endswith(" v5")  # the tokens the engine generated from version 5
        assert raw.headers["x-fleetledger-weight-version"] == "5"
        assert raw.headers["x-fleetledger-weight-version-end"] == "5"
        assert "x-fleetledger-weight-version-source" not in raw.headers
    args = {"model": "m", "prompt": "p", "max_tokens": 2, "stream": True}
    with running.client.completions.with_streaming_response.create(**args) as streamed:
        said = [line for line in streamed.iter_lines() if line]
    assert streamed.headers["x-fleetledger-weight-version"] == "5"
    assert said[-2:] == [": x-fleetledger-weight-version-end 5", "data: [DONE]"]  # once
    running.stop()  # its last window handed over
    counted = [(o.shard, o.successes, o.versions) for w in windows(sqlite_url) for o in w.outcomes]
    assert sum(n for _, n, _ in counted) == 4
    assert {(v.version) for _, _, versions in counted for v in versions} == {5}
    assert sum(v.count for _, _, versions in counted for v in versions) == 4


def test_no_request_waits_on_a_shard_the_ledger_says_has_left(sqlite_url, engines, serve):
    """A request in flight on a shard the ledger records leaving ends within the poll that
    saw it: re-sent once to a serving shard while nothing was answered, a JSON 503 naming
    the shard and the seq where the client opted out, an event stream cut after an error
    event. (The engines hold their requests, as a frozen engine does, until released at
    the end.)"""
    ledger = start_run(sqlite_url, [e.base_url for e in engines])
    running = serve(sqlite_url)
    create = running.client.with_options(timeout=30).completions.with_raw_response.create
    engines[0].hold()
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(create, model="tiny", prompt="p")
        wait_until(lambda: engines[0].generations == 1, "the request to reach shard 0")
        ledger.actor_died(0, "frozen, then condemned")
        moved = held.result(timeout=30)
    assert moved.headers["x-fleetledger-shard"] == "1"  # re-sent, answered by shard 1
    assert moved.headers["x-fleetledger-resent-from"] == "0"  # ... off the shard that left
    assert (engines[0].generations, engines[1].generations) == (1, 1)
    # Opted out: the client is told at once, with the shard and the seq.
    engines[1].hold()
    with ThreadPoolExecutor(1) as pool:
        kept = pool.submit(
            create, model="tiny", prompt="q", extra_headers={"x-fleetledger-resend": "never"}
        )
        wait_until(lambda: engines[1].generations == 2, "the request to reach shard 1")
        ledger.actor_died(1, "frozen, then condemned")
        with pytest.raises(openai.InternalServerError) as ended:
            kept.result(timeout=30)
    assert ended.value.status_code == 503
    assert ended.value.response.headers["x-fleetledger-shard"] == "1"
    assert f"shard 1 left the fleet at seq {ledger.view.seq} (it is DEAD)" in str(ended.value)
    assert engines[2].generations == 0  # not re-sent
    # A stream already flowing is cut after an error event saying why.
    engines[2].hold_midway()
    lines: list[str] = []
    body = {"model": "tiny", "prompt": "s", "max_tokens": 4, "stream": True}
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", f"{running.router.url}/completions", json=body) as streamed,
    ):
        with pytest.raises(httpx.RemoteProtocolError):  # cut: no final chunk
            for line in streamed.iter_lines():
                lines.append(line)
                if len(lines) == 1:
                    ledger.actor_died(2, "frozen, then condemned")
    said = [line for line in lines if line]
    assert said[0].startswith("data: {") and said[-1].startswith('data: {"error"')
    assert f"shard 2 left the fleet at seq {ledger.view.seq}" in said[-1]
    for engine in engines:
        engine.release()
    running.stop()
    # The re-sent request is shard 1's success; those ended by the ledger count as
    # nobody's success or failure, only by what became of them (the fault's cost).
    assert reported(sqlite_url) == {0: (0, Counter()), 1: (1, Counter()), 2: (0, Counter())}
    fates = {
        o.shard: (o.fates.redispatched, o.fates.dropped)
        for w in windows(sqlite_url)
        for o in w.outcomes
        if o.fates is not None
    }
    assert fates == {0: (1, 0), 1: (0, 1), 2: (0, 1)}


def test_an_engine_older_than_the_ledger_recorded_is_evidence_never_an_overwrite(
    sqlite_url, loop, serve
):
    # The ledger records a refit to v5 completed on shard 0; its engine says v2 (a
    # replacement nobody recorded, a load that never happened): counted each time,
    # kept once as evidence, and the ledger's own view of the shard does not move.
    shard = SimulatedShard(0, generation_s=0.0, weight_version=2, serve_http=True)
    ledger = start_run(sqlite_url, [loop.run(shard.start_http())])
    ledger.refit_started(5)
    ledger.refit_completed(5)
    running = serve(sqlite_url, window_s=0.05)
    for _ in range(3):
        raw = running.client.completions.with_raw_response.create(model="m", prompt="p")
        assert raw.headers["x-fleetledger-weight-version"] == "2"  # the engine's word
    metrics = httpx.get(running.router.url.removesuffix("/v1") + "/metrics").text
    assert 'fleetledger_router_attestations_contradicted_total{shard="0"} 3.0' in metrics
    running.stop()
    said = [c for w in windows(sqlite_url) for o in w.outcomes for c in o.contradicted]
    assert [(c.version, c.recorded) for c in said] == [(2, 5)]
    ledger.catch_up()
    assert ledger.view.shards[0].weight_version == 5
    assert ledger.view.served.contradicted == [(0, 2, 5)]
    assert "shard 0 said v2 where the ledger recorded v5" in ledger.view.served.describe()


# ── the wire ─────────────────────────────────────────────────────────────────


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on one fresh connection; everything the router writes back until
    it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(data)
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    return got


def test_verbs_the_routes_do_not_take_are_405_and_never_forwarded(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    for verb in ("PUT", "DELETE", "HEAD", "PATCH"):
        status, _ = call(verb, running.router.url + "/completions", {"prompt": "p"})
        assert status == 405
    assert sum(engines[0].received.values()) == 0


def test_pipelined_requests_are_answered_in_order_on_one_connection(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    bodies = [json.dumps({"model": "tiny", "prompt": f"p{i}", "max_tokens": 2}) for i in range(3)]
    requests = b"".join(
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s"
        % (len(body), b"Connection: close\r\n" if i == 2 else b"", body.encode())
        for i, body in enumerate(bodies)
    )
    got = raw_exchange(running.router.port, requests)
    assert got.count(b"HTTP/1.1 200 OK") == 3
    texts = [json.loads(part.split(b"\r\n\r\n", 1)[1].split(b"HTTP/1.1")[0])["choices"][0]
             ["text"] for part in got.split(b"HTTP/1.1 200 OK")[1:]]  # fmt: skip
    direct = openai.OpenAI(base_url=engines[0].base_url, api_key="unused", max_retries=0)
    expected = [
        direct.completions.create(model="tiny", prompt=f"p{i}", max_tokens=2).choices[0].text
        for i in range(3)
    ]
    assert texts == expected


def test_a_chunked_upload_and_expect_continue_reach_the_engine_intact(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    body = json.dumps({"model": "tiny", "prompt": "x" * 200_000, "max_tokens": 3}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", running.router.port, timeout=30)
    pieces = [body[i : i + 7000] for i in range(0, len(body), 7000)]
    conn.request(
        "POST",
        "/v1/completions",
        body=iter(pieces),
        headers={"Content-Type": "application/json", "Expect": "100-continue"},
        encode_chunked=True,
    )
    answer = conn.getresponse()
    assert answer.status == 200
    routed = json.loads(answer.read())["choices"][0]["text"]
    conn.close()
    direct = openai.OpenAI(base_url=engines[0].base_url, api_key="unused", max_retries=0)
    expected = direct.completions.create(model="tiny", prompt="x" * 200_000, max_tokens=3)
    assert routed == expected.choices[0].text
    assert "expect" not in {k.lower() for k in engines[0].last_headers}


def test_an_http_1_0_client_gets_its_answer_and_the_connection_closed(sqlite_url, engines, serve):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    got = raw_exchange(running.router.port, b"GET /v1/models HTTP/1.0\r\n\r\n")
    head, body = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["data"][0]["id"] == "tiny"


@pytest.mark.parametrize(
    ("request_bytes", "status", "words"),
    [
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "malformed HTTP request"),
        (b"GET /v1/models HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431, "head"),
        (b"GET /v1/models HTTP/1.1\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n", 400,
         "does not upgrade"),
    ],
)  # fmt: skip
def test_a_request_that_cannot_be_read_gets_one_json_error_and_a_closed_connection(
    sqlite_url, engines, serve, request_bytes, status, words
):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url)
    got = raw_exchange(running.router.port, request_bytes)
    head, body = got.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 %d" % status)
    assert b"Connection: close" in head
    assert words in json.loads(body)["error"]["message"]
    assert sum(engines[0].received.values()) == 0


def test_a_client_that_leaves_mid_stream_is_no_outcome_and_frees_its_place(
    sqlite_url, engines, serve
):
    start_run(sqlite_url, [engines[0].base_url])
    running = serve(sqlite_url, window_s=0.05)
    engines[0].hold_midway()
    body = json.dumps({"model": "tiny", "prompt": "p", "max_tokens": 4, "stream": True})
    with socket.create_connection(("127.0.0.1", running.router.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body.encode())
        )
        got = b""
        while b"data: " not in got:  # the first event arrives; then the client leaves
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    wait_until(lambda: not running.router.in_flight(0), "the router to let the request go")
    engines[0].release()
    complete(running.client)
    wait_until(lambda: 0 in reported(sqlite_url), "a window")
    ok, failures = reported(sqlite_url)[0]
    assert (ok, sum(failures.values())) == (1, 0)


# ── the selection rule, as a property ────────────────────────────────────────


@given(
    st.lists(
        st.tuples(st.booleans(), st.booleans(), st.integers(0, 5), st.booleans()),
        max_size=8,
    )
)
def test_selection_is_least_outstanding_ties_lowest_never_unroutable_or_avoided(shards):
    urls = [
        f"http://h:{i}/v1" if http_url else f"ray://{i}"
        for i, (_, http_url, *_) in enumerate(shards)
    ]
    backends = [
        Backend(i, url, origin_of(url), serving)
        for i, (url, (serving, *_)) in enumerate(zip(urls, shards, strict=True))
    ]
    in_flight = {i: n for i, (_, _, n, _) in enumerate(shards)}
    avoided = {i for i, (*_, avoid) in enumerate(shards) if avoid}
    table = RoutingTable("r", 1, tuple(backends), (0,) * len(backends), {})
    chosen = least_outstanding(table.candidates(avoided), in_flight)
    eligible = [b.shard for b in backends if b.routable and b.shard not in avoided]
    if not eligible:
        assert chosen is None
        return
    assert chosen is not None and chosen in eligible
    least = min(in_flight[s] for s in eligible)
    assert in_flight[chosen] == least
    assert chosen == min(s for s in eligible if in_flight[s] == least)
    ended = RoutingTable("r", 1, tuple(backends), (0,) * len(backends), {}, ended="at seq 2")
    assert list(ended.candidates(avoided)) == []


def test_origin_strips_the_v1_suffix_once_and_refuses_non_http():
    assert origin_of("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert origin_of("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert origin_of("http://h:1/engine/v1") == "http://h:1/engine"
    assert origin_of("https://h") == "https://h"
    assert origin_of("ray://shard-0") is None
    assert origin_of("not a url") is None
