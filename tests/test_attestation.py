"""Every answer names the weights the engine generated it with: the engine's own word,
set the instant its load completes, at the answer's first token and at its last.

Checked on the parts themselves: the engine's record of its weights (a property test
against a brute-force model of loads and arrivals), the wire spelling, the ASGI wrapper a
vLLM engine's server runs behind (driven with ASGI messages, as uvicorn drives it), and
the simulated engine's HTTP face over a real socket with a refit landing mid-stream.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.engines.attesting_asgi import AttestingApp
from fleetledger.engines.simulated import SimulatedRefitShard, SimulatedShard
from fleetledger.events.attestation import (
    Attested,
    attestation_headers,
    end_comment,
    end_in_line,
    read_attestation,
)
from fleetledger.shards.contract import GenerationRequest
from fleetledger.shards.held_weights import HeldWeights

# ── the engine's record of its weights ───────────────────────────────────────

# A step: ("begin", v) a load of v begins, ("complete",) it completes, ("fail",) it is
# cut, ("arrive",) a request arrives (its first token is not watched).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.integers(1, 3)),
        st.tuples(st.just("complete")),
        st.tuples(st.just("fail")),
        st.tuples(st.just("arrive")),
    ),
    max_size=40,
)


@given(steps)
def test_a_request_starts_at_the_version_it_arrived_to_or_the_load_it_waited_for(script):
    held = HeldWeights(0)
    # The model: the version held, the load in progress, and each request's truth —
    # a request that arrived during a load starts at what that load installs (or, cut,
    # at what is held then); otherwise at what was held on arrival.
    version, loading, partial = 0, None, False
    waiting: list[int] = []  # requests waiting on the load in progress
    truth: list[int | None] = []
    arrivals = []
    for step in script:
        if step[0] == "begin" and loading is None:
            loading = version + step[1]
            held.load_begins(loading)
            partial = True
        elif step[0] == "complete" and loading is not None:
            held.load_completes(loading)
            version, partial = loading, False
            for i in waiting:
                truth[i] = version
            waiting, loading = [], None
        elif step[0] == "fail" and loading is not None:
            held.load_failed()
            for i in waiting:
                truth[i] = version
            waiting, loading = [], None
        elif step[0] == "arrive":
            arrivals.append(held.arrival())
            truth.append(None if loading is not None else version)
            if loading is not None:
                waiting.append(len(truth) - 1)
        assert (held.version, held.partial) == (version, partial)
    for arrived, true in zip(arrivals, truth, strict=True):
        # Still waiting at the end: the version held now, until its load completes.
        assert held.start_of(arrived) == (version if true is None else true)


def test_weights_only_move_forward():
    held = HeldWeights(2, 5)
    with pytest.raises(ValueError, match="shard 2: weight version 4 is older than the 5"):
        held.load_completes(4)


# ── the wire ─────────────────────────────────────────────────────────────────


@given(st.integers(0, 10**9), st.integers(0, 10**9), st.booleans(), st.booleans())
def test_what_an_engine_writes_is_what_a_reader_reads(start, end, partial, streamed):
    headers = dict(attestation_headers(start, None if streamed else end, partial))
    said_end = end_in_line(end_comment(end).decode().rstrip("\n")) if streamed else None
    assert read_attestation(headers, said_end) == Attested(start, end, partial)


def test_a_foreign_answer_says_nothing_and_a_ledger_view_says_so():
    assert read_attestation({"content-type": "application/json"}) is None
    assert end_in_line("data: [DONE]") is None
    viewed = read_attestation(
        {"x-fleetledger-weight-version": "3", "x-fleetledger-weight-version-source": "ledger"}
    )
    assert viewed == Attested(3, 3, False, "ledger")


@pytest.mark.parametrize("value", ["", "v3", "-1", "3.0"])
def test_a_malformed_version_is_refused_naming_the_header(value):
    with pytest.raises(ValueError, match=r"header x-fleetledger-weight-version: .* not a weight"):
        read_attestation({"x-fleetledger-weight-version": value})
    with pytest.raises(ValueError, match="the end version is not an integer"):
        end_in_line(f": x-fleetledger-weight-version-end {value}")


# ── the ASGI wrapper around a vLLM engine's server ───────────────────────────


class _Engine:
    """An ASGI app that answers like vLLM's server: a whole JSON answer once generated,
    or an event stream (one event per token, then ``data: [DONE]``), each step released
    by the test so a refit can land between any two."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.go = asyncio.Queue[None]()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = b"text/event-stream" if self.stream else b"application/json"
        await self.go.get()  # the first token
        if not self.stream:
            await self.go.get()  # the last
            head = [(b"content-type", kind)]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        # As Starlette's StreamingResponse: the head before the first event.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]}
        )
        for token in ("a", "b"):
            body = f"data: {json.dumps({'text': token})}\n\n".encode()
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await self.go.get()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _drive(app: AttestingApp, engine: _Engine, during: list[Any]) -> list[dict[str, Any]]:
    """Run one request; ``during[i]`` is done to the weights before the engine's i-th step."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    task = asyncio.ensure_future(app({"type": "http", "method": "POST"}, receive, send))
    for change in during:
        change()
        await engine.go.put(None)
        await asyncio.sleep(0)
    await asyncio.wait_for(task, 5)
    return sent


def _headers(sent: list[dict[str, Any]]) -> dict[str, str]:
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return {k.decode(): v.decode() for k, v in start["headers"]}


def test_a_vllm_stream_names_its_first_tokens_version_and_its_last():
    held = HeldWeights(0, 4)
    engine = _Engine(stream=True)

    def nothing() -> None:
        pass

    # A load begins after the first token and completes before the last.
    sent = asyncio.run(
        _drive(
            AttestingApp(engine, held),
            engine,
            [nothing, lambda: held.load_begins(5), lambda: held.load_completes(5)],
        )
    )
    headers = _headers(sent)
    assert headers["x-fleetledger-weight-version"] == "4"
    assert "x-fleetledger-weight-version-end" not in headers  # a stream's end comes last
    bodies = [m["body"] for m in sent if m["type"] == "http.response.body"]
    assert bodies[-3:] == [
        b'data: {"text": "b"}\n\n',
        b": x-fleetledger-weight-version-end 5\n\ndata: [DONE]\n\n",
        b"",
    ]
    # The head left with the first event, not before it.
    assert sent[0]["type"] == "http.response.start" and sent[1]["body"].startswith(b"data: ")


def test_a_whole_vllm_answer_that_arrived_during_a_load_starts_at_what_the_load_installed():
    held = HeldWeights(0, 4)
    held.load_begins(6)  # generation is paused: the request waits for the load
    engine = _Engine(stream=False)
    sent = asyncio.run(
        _drive(AttestingApp(engine, held), engine, [lambda: held.load_completes(6), lambda: None])
    )
    headers = _headers(sent)
    assert (
        headers["x-fleetledger-weight-version"],
        headers["x-fleetledger-weight-version-end"],
    ) == ("6", "6")
    assert "x-fleetledger-weights" not in headers


def test_an_answer_from_weights_a_cut_load_left_says_they_are_partial():
    held = HeldWeights(0, 4)
    held.load_begins(5)
    held.load_failed()
    engine = _Engine(stream=False)
    sent = asyncio.run(_drive(AttestingApp(engine, held), engine, [lambda: None, lambda: None]))
    headers = _headers(sent)
    assert headers["x-fleetledger-weight-version"] == "4"
    assert headers["x-fleetledger-weights"] == "partial"


# ── the simulated engine, in process and over HTTP ───────────────────────────

REQUEST = GenerationRequest(prompt_id="p1", group_id="g1", prompt="2+2=", max_tokens=8)


def _versions_in(text: str) -> list[int]:
    """The version each simulated token says it came from (`` vN`` per token)."""
    return [int(word[1:]) for word in text.split() if word[:1] == "v" and word[1:].isdigit()]


def test_a_refit_landing_mid_generation_shows_in_the_tokens_after_it():
    """Driven token by token, so the load lands between two tokens by construction
    (not by a sleep racing the engine)."""

    async def scenario():
        shard = SimulatedRefitShard(0, generation_s=0.0)
        stream = aiter(shard.tokens(REQUEST))
        first = await anext(stream)
        shard._held.load_begins(1)  # the load a refit's push makes, completed at once
        shard._held.load_completes(1)
        rest = [token async for token in stream]
        # generate() stamps the first token's version and the last's, partial said.
        shard._held.load_begins(2)
        shard._held.load_failed()
        return first, rest, await shard.generate(REQUEST)

    first, rest, generation = asyncio.run(scenario())
    assert first.version == 0 and [t.version for t in rest] == [1] * 7
    assert _versions_in(first.text + "".join(t.text for t in rest)) == [0] + [1] * 7
    assert (generation.weight_version, generation.weight_version_end) == (1, 1)
    assert generation.weights_partial and _versions_in(generation.text) == [1] * 8


def test_the_simulated_engine_over_http_names_each_answers_weights():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("aiohttp")

    async def scenario() -> tuple[Any, list[tuple[Any, list[str]]]]:
        shard = SimulatedShard(0, generation_s=0.8, serve_http=True)
        base = await shard.start_http()
        body = {"model": "fleetledger-sim", "prompt": "x", "max_tokens": 8}
        streams = []
        async with httpx.AsyncClient(timeout=10) as client:
            whole = await client.post(f"{base}/completions", json=body)
            # Until a refit lands inside a stream (one per try; each 0.1 s per token).
            for version in range(1, 4):
                lines: list[str] = []
                async with client.stream(
                    "POST", f"{base}/completions", json={**body, "stream": True}
                ) as streamed:
                    async for line in streamed.aiter_lines():
                        lines.append(line)
                        if len(lines) == 3:  # two events in: the refit lands now
                            await shard.set_weight_version(version)
                streams.append((streamed.headers, lines))
                ends = [end_in_line(line) for line in lines if line.startswith(":")]
                said = read_attestation(streamed.headers, ends[0] if ends else None)
                if said is not None and said.moved:
                    break
        return whole, streams

    whole, streams = asyncio.run(scenario())
    said = read_attestation(whole.headers)
    tokens = _versions_in(whole.json()["choices"][0]["text"])
    assert said == Attested(tokens[0], tokens[-1]) == Attested(0, 0)
    moved = False
    for headers, lines in streams:
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        streamed_tokens = _versions_in("".join(e["choices"][0]["text"] for e in events))
        ends = [end_in_line(line) for line in lines if end_in_line(line) is not None]
        attested = read_attestation(headers, ends[0])
        # Every stream names the versions its own tokens came from.
        assert attested == Attested(streamed_tokens[0], streamed_tokens[-1])
        # The end line is the last before [DONE] (a parser that stops there has read it).
        said_lines = [line for line in lines if line]
        assert said_lines[-2:] == [f": x-fleetledger-weight-version-end {ends[0]}", "data: [DONE]"]
        moved = moved or attested.moved
    assert moved, f"no refit landed inside any of {len(streams)} streams"


def test_the_old_simulated_app_call_still_serves_and_warns():
    httpx = pytest.importorskip("httpx")
    web = pytest.importorskip("aiohttp.web")
    from fleetledger.engines.simulated_http import simulated_app

    async def scenario() -> tuple[Any, list[str]]:
        shard = SimulatedShard(0, generation_s=0.0, weight_version=3)
        with pytest.warns(DeprecationWarning, match=r"simulated_app\(shard, generate\)"):
            app = simulated_app(0, shard.generate)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
        body = {"model": "fleetledger-sim", "prompt": "x", "max_tokens": 2, "stream": True}
        async with (
            httpx.AsyncClient(timeout=10) as client,
            client.stream("POST", f"{base}/completions", json=body) as streamed,
        ):
            lines = [line async for line in streamed.aiter_lines() if line]
        await runner.cleanup()
        return streamed.headers, lines

    headers, lines = asyncio.run(scenario())
    assert read_attestation(headers, end_in_line(lines[-2])) == Attested(3, 3)
    assert len([line for line in lines if line.startswith("data: {")]) == 1  # one event
