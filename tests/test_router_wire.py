"""The router's HTTP/1.1 against backends and clients that a well-behaved engine and the
``openai`` client never are: interim answers, answers before the request was sent,
answers that end with the connection, bodies cut mid-chunk, heads without end, clients
that do not read. Each was a way to hand one client's answer to another, to charge a
healthy shard, or to grow the router's memory (found by a hostile review of the router's
own HTTP path); each is pinned here over real sockets.

The backends here are written byte by byte (``RawBackend``): nothing else can misbehave
on purpose. Nothing asserts on timing: waits are for conditions, bounded only so a
broken router fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from fleetledger.config import RouterConfig
from tests import test_router
from tests.test_router import Loop, Running, reported, start_run, wait_until

loop = test_router.loop  # the fixtures, shared
serve = test_router.serve

Answer = Callable[["RawBackend", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawBackend:
    """A backend whose every byte the test writes: ``answer`` serves one connection."""

    def __init__(self, loop: Loop, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []  # request lines, as received
        self._loop = loop
        self.server = loop.run(self._start())
        self.port = int(self.server.sockets[0].getsockname()[1])

    async def _start(self) -> asyncio.Server:
        return await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.answer(self, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def head(self, reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes]]:
        """One request's head: (target, headers lower-cased)."""
        raw = await reader.readuntil(b"\r\n\r\n")
        line, *lines = raw[:-4].split(b"\r\n")
        self.requests.append(line)
        headers = {}
        for header in lines:
            name, _, value = header.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return line.split(b" ")[1], headers

    async def request(self, reader: asyncio.StreamReader) -> bytes:
        """One whole request (a Content-Length body read and dropped); its target."""
        target, headers = await self.head(reader)
        await reader.readexactly(int(headers.get(b"content-length", b"0")))
        return target

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self._loop.run(self._close())

    async def _close(self) -> None:
        self.server.close()  # on the server's own loop: not thread-safe from here


@pytest.fixture
def backend(loop: Loop) -> Iterator[Callable[[Answer], RawBackend]]:
    made: list[RawBackend] = []

    def make(answer: Answer) -> RawBackend:
        made.append(RawBackend(loop, answer))
        return made[-1]

    yield make
    for one in made:
        one.close()


def routed(sqlite_url: str, serve: Callable[..., Running], raw: RawBackend, **kw: Any) -> Running:
    start_run(sqlite_url, [raw.base_url])
    return serve(sqlite_url, window_s=3600, **kw)


def port_of(running: Running) -> int:
    return running.router.port


def json_answer(body: bytes, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        status,
        len(body),
        extra,
        body,
    )


def outcomes_after_stop(sqlite_url: str, running: Running) -> dict[int, tuple[int, Any]]:
    running.stop()  # hands over the last window
    return reported(sqlite_url)


# ── what backends do ─────────────────────────────────────────────────────────


def test_an_interim_1xx_is_not_the_answer_and_each_client_gets_its_own(sqlite_url, backend, serve):
    async def answer(raw: RawBackend, reader, writer) -> None:
        while True:
            target = await raw.request(reader)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n")
            await writer.drain()
            writer.write(json_answer(b'{"for": "%s"}' % target))

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    with httpx.Client(base_url=running.router.url, timeout=30) as client:
        got = [client.get(f"/models?client={c}").json()["for"] for c in "ABC"]
    assert got == ["/v1/models?client=A", "/v1/models?client=B", "/v1/models?client=C"]
    assert raw.connections == 1  # the connection was reused, answer by answer
    assert outcomes_after_stop(sqlite_url, running)[0][0] == 3


def test_an_answer_before_the_whole_request_closes_that_backend_connection(
    sqlite_url, backend, serve
):
    # An engine that refuses a request on its head (401 without reading the body) leaves
    # the rest of the body owed on the connection: reused, the engine would read the
    # next request as that body.
    async def answer(raw: RawBackend, reader, writer) -> None:
        while True:
            target, headers = await raw.head(reader)
            if target == b"/v1/completions":
                writer.write(json_answer(b"{}", b"401 Unauthorized"))
                await writer.drain()
                continue
            await reader.readexactly(int(headers.get(b"content-length", b"0")))
            writer.write(json_answer(b'{"for": "%s"}' % target))

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n"
        )  # the body's end is not sent yet
        got = b""
        while b"401" not in got:
            got += sock.recv(65536)
        sock.sendall(b"3\r\nGET\r\n")  # the rest arrives after the answer
    answer_b = httpx.get(running.router.url + "/models?client=B", timeout=30)
    assert answer_b.json() == {"for": "/v1/models?client=B"}
    assert raw.connections == 2
    ok, failures = outcomes_after_stop(sqlite_url, running)[0]
    assert ok == 1 and [reason for (_, reason) in failures] == ["http_401"]


def test_a_body_cut_mid_chunk_never_reaches_the_client_as_whole(sqlite_url, backend, serve):
    async def answer(raw: RawBackend, reader, writer) -> None:
        await raw.request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b'Transfer-Encoding: chunked\r\n\r\n10\r\ndata: {"a": 1}\n\r\n10\r\ndata: {"b'
        )
        await writer.drain()
        writer.close()  # mid-chunk: an engine that died

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(running.router.url + "/models", timeout=30)
    ok, failures = outcomes_after_stop(sqlite_url, running)[0]
    assert ok == 0 and list(failures) == [("infra", "connection")]


def test_an_answer_that_ends_with_its_connection_is_whole_and_a_success(sqlite_url, backend, serve):
    async def answer(raw: RawBackend, reader, writer) -> None:
        await raw.request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"object": "list", "data": []}')
        await writer.drain()
        writer.close()

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    for _ in range(2):
        answer_ = httpx.get(running.router.url + "/models", timeout=30)
        assert answer_.json() == {"object": "list", "data": []}
    assert running.router.routable == (0,)
    assert outcomes_after_stop(sqlite_url, running)[0] == (2, {})


def test_a_backend_head_without_end_is_the_backends_failure_not_the_routers_memory(
    sqlite_url, backend, serve
):
    async def answer(raw: RawBackend, reader, writer) -> None:
        await raw.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nX-Endless: ")
        for _ in range(64):  # 4 MiB of one header value, never ended
            writer.write(b"a" * 65536)
            await writer.drain()

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    answer_ = httpx.get(running.router.url + "/models", timeout=30)
    assert answer_.status_code == 500
    assert "answer head larger than" in answer_.json()["error"]["message"]
    ok, failures = outcomes_after_stop(sqlite_url, running)[0]
    assert ok == 0 and list(failures) == [("infra", "connection")]


# ── what clients do ──────────────────────────────────────────────────────────


def big_answer(size: int) -> Answer:
    async def answer(raw: RawBackend, reader, writer) -> None:
        while True:
            target = await raw.request(reader)
            body = b"x" * (size if b"big" in target else 2)
            writer.write(json_answer(body))
            await writer.drain()

    return answer


def test_a_client_too_slow_for_the_bound_is_cut_and_the_shard_not_blamed(
    sqlite_url, backend, serve
):
    raw = backend(big_answer(32 * 1024 * 1024))
    running = routed(sqlite_url, serve, raw, config=RouterConfig(backend_timeout_s=1))
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.connect(("127.0.0.1", port_of(running)))
        sock.settimeout(30)
        sock.sendall(b"GET /v1/models?big HTTP/1.1\r\nHost: r\r\n\r\n")
        wait_until(lambda: running.router.in_flight(0) == 1, "the request to be routed")
        # The client reads nothing: the answer stops at the sockets' buffers.
        wait_until(lambda: not running.router.in_flight(0), "the router to cut the slow client")
        got = 0
        try:
            while chunk := sock.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:
            pass
    assert got < 32 * 1024 * 1024  # cut: the bound holds whoever is slow
    assert running.router.routable == (0,)
    assert 0 not in outcomes_after_stop(sqlite_url, running)  # no outcome: nobody's fault


def test_a_connection_paused_for_a_slow_client_serves_the_next_request(sqlite_url, backend, serve):
    raw = backend(big_answer(4 * 1024 * 1024))
    running = routed(sqlite_url, serve, raw)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.connect(("127.0.0.1", port_of(running)))
        sock.settimeout(30)
        sock.sendall(b"GET /v1/models?big HTTP/1.1\r\nHost: r\r\nConnection: close\r\n\r\n")
        time.sleep(0.3)  # the router's side fills; it pauses the backend's socket
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
            time.sleep(0.001)
    assert got.endswith(b"x" * 1000) and len(got) > 4 * 1024 * 1024
    assert httpx.get(running.router.url + "/models", timeout=30).content == b"xx"
    assert raw.connections == 1  # the paused connection came back reading, and served
    assert outcomes_after_stop(sqlite_url, running)[0] == (2, {})


def test_a_bad_request_pipelined_behind_a_good_one_is_refused_after_its_answer(
    sqlite_url, backend, serve
):
    raw = backend(big_answer(0))
    running = routed(sqlite_url, serve, raw)
    with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\nNOT HTTP\r\n\r\n")
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    first, second = got.split(b"HTTP/1.1 ")[1:]
    assert first.startswith(b"200") and first.endswith(b"\r\n\r\nxx")
    assert second.startswith(b"400") and b"malformed HTTP request" in second


def test_an_upgrade_is_refused_and_never_forwarded(sqlite_url, backend, serve):
    raw = backend(big_answer(0))
    running = routed(sqlite_url, serve, raw)
    assert httpx.get(running.router.url + "/models", timeout=30).status_code == 200  # warm
    with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nUpgrade: h2c\r\n"
            b"Connection: Upgrade, HTTP2-Settings\r\nContent-Length: 2\r\n\r\n{}"
        )
        got = b""
        while chunk := sock.recv(65536):
            got += chunk
    assert got.startswith(b"HTTP/1.1 400") and b"does not upgrade" in got
    assert raw.requests == [b"GET /v1/models HTTP/1.1"]


@pytest.mark.parametrize("path", ["/v1/models", "/nope", "/metrics"])
def test_a_head_request_gets_a_head_and_the_connection_stays_in_step(
    sqlite_url, backend, serve, path
):
    raw = backend(big_answer(0))
    running = routed(sqlite_url, serve, raw)
    origin = running.router.url.removesuffix("/v1")
    with httpx.Client(base_url=origin, timeout=30) as client:
        head = client.head(path)
        assert head.status_code in (200, 404, 405) and head.content == b""
        assert client.get("/v1/models").content == b"xx"  # the same connection, in step
    assert raw.requests == [b"GET /v1/models HTTP/1.1"]


def test_a_header_that_never_ends_is_431_before_it_is_held(sqlite_url, backend, serve):
    raw = backend(big_answer(0))
    running = routed(sqlite_url, serve, raw)
    with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
        # 1 MiB of one header value, never ended: a router that held a header until its
        # end would hold this one for ever and never answer.
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nX-Endless: " + b"a" * (1 << 20))
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except ConnectionResetError:
            pass
    assert got.startswith(b"HTTP/1.1 431"), got[:100]
    assert raw.requests == []


def test_requests_piled_up_by_a_client_that_never_reads_stop_being_read(sqlite_url, backend, serve):
    hold = threading.Event()

    async def answer(raw: RawBackend, reader, writer) -> None:
        while True:
            await raw.request(reader)
            while not hold.is_set():
                await asyncio.sleep(0.01)
            writer.write(json_answer(b"xx"))

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    one = b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
        sock.setblocking(False)
        sent = 0
        stalled = 0
        while stalled < 50 and sent < 64 * 1024 * 1024:
            try:
                sent += sock.send(one * 1024)
                stalled = 0
            except BlockingIOError:
                stalled += 1  # the router stopped reading: the socket's buffers are full
                time.sleep(0.02)
        hold.set()
    # What was taken in is the queue bound's worth plus the sockets' buffers, not the
    # 64 MiB a router that kept reading would have parsed and queued.
    assert sent < 16 * 1024 * 1024, sent


# ── faults at random moments ─────────────────────────────────────────────────

TRIALS = 16


def _answer_bytes(chunked: bool) -> bytes:
    body = b'{"text": "' + b"x" * 60_000 + b'"}'
    if not chunked:
        return json_answer(body)
    pieces = [body[i : i + 7000] for i in range(0, len(body), 7000)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    return head + b"\r\n" + framed


def test_a_backend_cut_at_any_byte_never_hands_the_client_a_whole_looking_answer(
    sqlite_url, backend, serve
):
    """The backend closes its connection after a random number of its answer's bytes
    (head and body, both framings), one fresh run per trial: the client gets the whole
    answer and the shard a success, or an error (a 500 before the head, a cut after it)
    and the shard a failure — never a truncated body that reads as complete."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}, {TRIALS} trials")
    draw = random.Random(seed)
    for trial in range(TRIALS):
        chunked = trial % 2 == 1
        whole = _answer_bytes(chunked)
        cut = draw.choice([len(whole), draw.randrange(len(whole))])

        async def answer(raw: RawBackend, reader, writer, cut: int = cut, whole: bytes = whole):
            await raw.request(reader)
            writer.write(whole[:cut])
            await writer.drain()
            writer.close()

        raw = backend(answer)
        run = f"cut-{trial}"
        start_run(sqlite_url, [raw.base_url], run=run)
        running = serve(sqlite_url, run=run, window_s=3600)
        try:
            got = httpx.get(running.router.url + "/models", timeout=30)
            delivered = got.status_code == 200
            if delivered:
                assert got.content == whole.split(b"\r\n\r\n", 1)[1] or chunked
                assert len(got.json()["text"]) == 60_000  # whole, or it would not parse
            else:
                assert got.status_code == 500 and cut < whole.index(b"\r\n\r\n") + 4, cut
        except httpx.HTTPError:
            delivered = False
            assert cut < len(whole), f"seed {seed} trial {trial}: a whole answer cut"
        wait_until(lambda r=running: not r.router.in_flight(0), "the request to be let go")
        running.stop()
        ok, failures = reported(sqlite_url, run).get(0, (0, Counter()))
        assert (ok, sum(failures.values())) == ((1, 0) if delivered else (0, 1)), (
            f"seed {seed} trial {trial}: cut at {cut} of {len(whole)}"
        )
        assert delivered == (cut == len(whole)), f"seed {seed} trial {trial}: cut {cut}"


def test_a_client_leaving_at_any_byte_is_no_failure_and_leaves_the_pool_sound(
    sqlite_url, backend, serve
):
    """The client closes after reading a random number of bytes of a large answer; then
    a whole request follows. No failure is ever charged to the shard, every request is
    let go, and the next answer is whole (no connection handed on half-read)."""
    whole = _answer_bytes(chunked=False)

    async def answer(raw: RawBackend, reader, writer) -> None:
        while True:
            await raw.request(reader)
            writer.write(whole)
            await writer.drain()

    raw = backend(answer)
    running = routed(sqlite_url, serve, raw)
    seed = random.randrange(1 << 30)
    print(f"seed {seed}, {TRIALS} trials")
    draw = random.Random(seed)
    for _ in range(TRIALS):
        leave_after = draw.randrange(len(whole))
        with socket.create_connection(("127.0.0.1", port_of(running)), timeout=30) as sock:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: r\r\n\r\n")
            got = 0
            while got < leave_after:
                chunk = sock.recv(min(65536, leave_after - got))
                if not chunk:
                    break
                got += len(chunk)
        wait_until(lambda: not running.router.in_flight(0), "the request to be let go")
        after = httpx.get(running.router.url + "/models", timeout=30)
        assert after.status_code == 200 and len(after.json()["text"]) == 60_000, f"seed {seed}"
    ok, failures = outcomes_after_stop(sqlite_url, running)[0]
    assert sum(failures.values()) == 0, f"seed {seed}: {failures}"
    assert TRIALS <= ok <= 2 * TRIALS  # every follow-up, and any leaver answered in full
