"""The router against hostile framing: no request smuggled to a backend, no answer
smuggled to a client.

A request with ``Connection: Content-Length`` once had the router drop its length and
still forward its body, which the engine read as a second request — any path, past the
allow-list, with no outcome recorded (issue 36). Here every class of ambiguous framing
is sent over a real socket to the real router in front of a backend that records every
byte it receives (``Recorder``, parsing with h11, an HTTP/1.1 implementation other than
the router's own llhttp): the router must refuse it with a 400 in the API's one-line
JSON and close the connection, and the backend must see nothing of it. A property
test feeds generated request bytes and holds that whatever the router forwards, h11
reads as exactly one request, the same one h11 reads in what the client sent.
The answers' side: a backend whose answer's framing is ambiguous is the shard's
failure (a 500 naming the shard), and nothing of it reaches the client.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import h11
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.router.app import METHODS, ROUTES
from tests import test_router
from tests.test_router import Loop, Running, start_run

loop = test_router.loop  # the fixtures, shared
serve = test_router.serve

OK_BODY = b'{"id":"x","object":"text_completion","choices":[{"text":"ok","index":0}]}'


@dataclass
class Seen:
    """One request as the backend's h11 read it."""

    method: bytes
    target: bytes
    body: bytes


@dataclass
class Recorder:
    """A backend that keeps every byte each connection sent it, reads them with h11 and
    answers each request it reads with a small JSON; ``answer`` replaces that answer's
    bytes (the answers' side of the suite)."""

    loop: Loop
    answer: bytes | None = None
    received: list[bytes] = field(default_factory=list)  # per connection, every byte
    seen: list[Seen] = field(default_factory=list)
    broken: list[str] = field(default_factory=list)  # what h11 could not read

    def __post_init__(self) -> None:
        self.server = self.loop.run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = int(self.server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.received)
        self.received.append(b"")
        conn = h11.Connection(h11.SERVER)
        request: h11.Request | None = None
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    self.received[index] += data
                    conn.receive_data(data)
                    if not data:
                        return
                elif isinstance(event, h11.Request):
                    request, body = event, b""
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage) and request is not None:
                    self.seen.append(Seen(request.method, request.target, body))
                    writer.write(self.answer or _json_answer(OK_BODY))
                    await writer.drain()
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed):
                    return
        except h11.RemoteProtocolError as exc:
            self.broken.append(str(exc))
        except (ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        self.loop.run(self._close())

    async def _close(self) -> None:
        self.server.close()  # on the server's own loop: not thread-safe from here


def _json_answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


@pytest.fixture
def recorder(loop: Loop) -> Iterator[Recorder]:
    made = Recorder(loop)
    yield made
    made.close()


@pytest.fixture
def running(sqlite_url: str, serve: Callable[..., Running], recorder: Recorder) -> Running:
    start_run(sqlite_url, [recorder.base_url])
    return serve(sqlite_url, window_s=3600)


def exchange(port: int, data: bytes) -> bytes:
    """``data`` on one fresh connection; what the router writes back until it closes the
    connection or has answered the first request whole (read with h11), or stops
    writing for 10 s."""
    reader = h11.Connection(h11.CLIENT)
    reader.send(h11.Request(method="GET", target="/", headers=[("host", "r")]))
    reader.send(h11.EndOfMessage())  # h11 reads answers only to a request it sent
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
                if _answered(reader, chunk):
                    break
        except TimeoutError:
            pass
    return got


def _answered(reader: h11.Connection, chunk: bytes) -> bool:
    reader.receive_data(chunk)
    try:
        while (event := reader.next_event()) is not h11.NEED_DATA:
            if isinstance(event, h11.EndOfMessage):
                return True
            if isinstance(event, h11.ConnectionClosed):
                return True
    except h11.RemoteProtocolError:
        return False  # read on to the close
    return False


def _refused(got: bytes) -> str:
    """The router's 400: one JSON line, the connection closed after it."""
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), got[:200]
    assert b"connection: close" in head.lower()
    message = json.loads(body)["error"]["message"]
    assert "\n" not in message
    return str(message)


SMUGGLED = b"GET /v1/smuggled-by-client HTTP/1.1\r\nHost: backend\r\n\r\n"


def _post(*headers: bytes, body: bytes = SMUGGLED) -> bytes:
    return b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n%s\r\n%s" % (
        b"".join(h + b"\r\n" for h in headers),
        body,
    )


CL = b"Content-Length: %d" % len(SMUGGLED)

# Each: a request two parsers could read two ways, and a word its refusal must say.
AMBIGUOUS: dict[str, tuple[bytes, str]] = {
    "connection names content-length": (_post(b"Connection: Content-Length", CL), "Content-Length"),
    "connection names it among others": (
        _post(b"Connection: keep-alive ,  CONTENT-LENGTH", CL),
        "Content-Length",
    ),
    "connection names transfer-encoding": (
        _post(b"Connection: Transfer-Encoding", b"Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
    ),
    "connection names host": (_post(b"Connection: Host", CL), "Host"),
    "length and chunks": (
        _post(CL, b"Transfer-Encoding: chunked", body=b"0\r\n\r\n" + SMUGGLED),
        "Content-Length",  # llhttp refuses it first, in its own words
    ),
    "two lengths, differing": (_post(CL, b"Content-Length: 0"), "Content-Length"),
    "two lengths, equal": (_post(CL, CL), "Content-Length"),
    "a list of lengths": (
        _post(b"Content-Length: %d, %d" % (len(SMUGGLED), len(SMUGGLED))),
        "Content-Length",
    ),
    "a signed length": (_post(b"Content-Length: +%d" % len(SMUGGLED)), "Content-Length"),
    "a hex length": (_post(b"Content-Length: 0x10"), "Content-Length"),
    "an endless length": (_post(b"Content-Length: 99999999999999999999999"), "Content-Length"),
    "chunked twice in one header": (
        _post(b"Transfer-Encoding: chunked, chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
    ),
    "a coding before chunked": (
        _post(b"Transfer-Encoding: gzip, chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
    ),
    "two transfer-encoding headers": (
        _post(b"Transfer-Encoding: chunked", b"Transfer-Encoding: chunked", body=b"0\r\n\r\n"),
        "Transfer-Encoding",
    ),
    "an obs-fold": (_post(b"X-A: a", b" folded", CL), ""),
    "a NUL in a value": (_post(b"X-A: a\x00b", CL), ""),
    "a bare CR in a value": (_post(b"X-A: a\rb", CL), ""),
    "a chunk size out of range": (
        _post(b"Transfer-Encoding: chunked", body=b"fffffffffffffffffffff\r\nx\r\n0\r\n\r\n"),
        "",
    ),
    "two hosts": (_post(b"Host: other", CL), "Host"),
}


@pytest.mark.parametrize("case", sorted(AMBIGUOUS))
def test_an_ambiguous_request_is_refused_and_nothing_of_it_forwarded(case, running, recorder):
    data, word = AMBIGUOUS[case]
    got = exchange(running.router.port, data)
    message = _refused(got)
    assert word in message, message
    # Nothing reached the backend: not the request, not what followed it.
    assert recorder.seen == [] and recorder.received == []
    # The router still serves the next client, and its backend connections are sound.
    answer = exchange(
        running.router.port,
        _post(b"Content-Length: 2", b"Connection: close", body=b"{}"),
    )
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert [(s.method, s.target, s.body) for s in recorder.seen] == [
        (b"POST", b"/v1/completions", b"{}")
    ]


def test_the_reported_smuggling_reaches_no_backend_as_a_second_request(running, recorder):
    """The reproduction in the issue, byte for byte."""
    data = (
        b"POST /v1/completions HTTP/1.1\r\nHost: r\r\nConnection: Content-Length\r\n"
        b"Content-Length: 53\r\n\r\nGET /v1/smuggled-by-client HTTP/1.1\r\nHost: backend\r\n\r\n"
    )
    assert "Connection names Content-Length" in _refused(exchange(running.router.port, data))
    assert all(b"smuggled" not in r for r in recorder.received)


def test_a_forwarded_request_carries_the_routers_own_framing(running, recorder):
    """Whatever the client framed, the backend gets the length the router read — one
    Content-Length line, or chunks — and never the client's own framing lines."""
    for data, body in (
        (_post(b"content-length:   2  ", body=b"{}"), b"{}"),
        (_post(b"Transfer-Encoding: CHUNKED", body=b"2\r\n{}\r\n0\r\n\r\n"), b"{}"),
    ):
        assert exchange(running.router.port, data).startswith(b"HTTP/1.1 200 ")
        assert recorder.seen[-1].body == body
    raw = b"".join(recorder.received)  # one kept-alive connection, or two
    heads = [m.lower() for m in re.findall(rb"POST [^\r]*\r\n.*?\r\n\r\n", raw, re.S)]
    assert len(heads) == 2, raw
    assert heads[0].count(b"content-length") == 1 and b"content-length: 2" in heads[0]
    assert heads[1].count(b"transfer-encoding: chunked") == 1 and b"content-length" not in heads[1]


# ── the property: what the router forwards, h11 reads as the client's one request ──

_NAMES = st.sampled_from(
    [b"Content-Length", b"content-length", b"Transfer-Encoding", b"Connection", b"Host", b"X-A"]
)
_VALUES = st.one_of(
    st.sampled_from(
        [
            b"0",
            b"2",
            b"5",
            b"53",
            b"chunked",
            b"close",
            b"keep-alive",
            b"Content-Length",
            b"transfer-encoding",
            b"host",
            b"r",
            b" 2",
            b"2 ",
            b"2, 2",
            b"gzip, chunked",
        ]
    ),
    st.binary(max_size=6),
)
_BODIES = st.one_of(
    st.just(b""),
    st.just(b"{}"),
    st.just(b"2\r\n{}\r\n0\r\n\r\n"),
    st.just(SMUGGLED),
    st.binary(max_size=60),
)


def _h11_requests(data: bytes) -> list[Seen] | None:
    """What h11, as a server, reads in ``data``: the whole requests, in order, up to
    the first it cannot read (None: it cannot read the first)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    conn.receive_data(b"")
    seen: list[Seen] = []
    request, body = None, b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return seen
            if event is h11.PAUSED:  # answer it, then on to the next request
                conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
                conn.send(h11.EndOfMessage())
                conn.start_next_cycle()
            elif isinstance(event, h11.Request):
                request, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and request is not None:
                seen.append(Seen(request.method, request.target, body))
    except h11.RemoteProtocolError:
        return seen or None
    except h11.LocalProtocolError:  # it cannot answer what it read: no further requests
        return seen


def _routable(seen: Seen) -> bool:
    return seen.method in METHODS and seen.target.split(b"?")[0].decode() in ROUTES


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=4), body=_BODIES)
def test_what_the_router_forwards_h11_reads_as_the_requests_the_client_sent(
    headers, body, running, recorder
):
    recorder.seen.clear()
    recorder.received.clear()
    recorder.broken.clear()
    data = b"POST /v1/completions HTTP/1.1\r\nHost: r\r\n%s\r\n%s" % (
        b"".join(b"%s: %s\r\n" % pair for pair in headers),
        body,
    )
    exchange(running.router.port, data)
    assert recorder.broken == [], f"h11 could not read what the router forwarded: {recorder.broken}"
    if not recorder.seen:
        return  # refused, or cut: nothing forwarded
    original = _h11_requests(data)
    assert original, "the router forwarded requests h11 reads nowhere in the client's bytes"
    routable = [r for r in original if _routable(r)]
    assert recorder.seen == routable[: len(recorder.seen)], (recorder.seen, original)


# ── the answers' side ────────────────────────────────────────────────────────

ANSWERS: dict[str, bytes] = {
    "connection names content-length": (
        b"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 2\r\n\r\n{}"
        b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nsmuggled!"
    ),
    "length and chunks": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n"
    ),
    "two lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x",
    "a coding the router does not take": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
    ),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_an_answer_with_ambiguous_framing_is_the_shards_failure_and_never_passed_on(
    case, running, recorder
):
    recorder.answer = ANSWERS[case]
    got = exchange(running.router.port, _post(b"Content-Length: 2", body=b"{}"))
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 "), got[:200]
    assert b"x-fleetledger-shard: 0" in head
    error = json.loads(body.split(b"HTTP/1.1")[0])["error"]
    assert error["type"] == "backend_error" and "malformed answer" in error["message"]
    assert b"smuggled" not in got and b"HTTP/1.1" not in body


def test_read_head_called_as_before_lowers_the_names_itself():
    from fleetledger.router.proxy import read_head

    headers = [(b"Content-Type", b"text/event-stream"), (b"Content-Length", b"2"), (b"X-A", b"1")]
    read = read_head(headers)
    assert read.event_stream and read.lines == [
        b"Content-Type: text/event-stream\r\n",
        b"X-A: 1\r\n",
    ]
    assert read_head(headers, [n.lower() for n, _ in headers]) == read
