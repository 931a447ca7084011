"""The backends' side of the router: kept-alive HTTP/1.1 connections to each shard's
origin, and the answers parsed off them.

Rules of this file, and why:

- **No pool cap.** A cap queues rollouts inside the router, invisibly; every request
  that finds no idle connection opens one (within the connect bound).
- **Idle connections are dropped before the backend would drop them.** uvicorn (vLLM's
  server) closes a connection idle for 5 s; a request written onto a connection the
  backend is closing at that instant fails through no fault of the shard. Connections
  idle past ``IDLE_BOUND_S`` are not reused, and one the backend closed while idle
  leaves the pool at once.
- **A connection serves one exchange at a time** and returns to the pool only after a
  whole answer that the backend allows to be followed (keep-alive); anything cut,
  failed or timed out is closed, never reused: its framing cannot be trusted.
- **The answer is handed on as it is parsed** (head, body pieces, end) to the
  exchange's callbacks, with no await per piece: streaming is a callback chain from the
  backend's socket to the client's.
- **Framing is the parser's, refused where ambiguous**
  (:mod:`fleetledger.router.framing`: the answer is the shard's failure, never passed
  on), **with three exceptions it cannot know**: an interim answer (1xx) is not the
  answer — the exchange waits for the final one, or the final one would be read as the
  next request's; an answer with neither a length nor chunks ends where
  the connection ends, so that end is the answer's end, not a failure; and an answer
  that ended before its request was wholly sent leaves the connection owing the rest of
  a body, so it is closed, never pooled (an engine answering 401 or 413 without reading
  the body would otherwise read the next request as that body).
- **A head is bounded** (``MAX_ANSWER_HEAD_BYTES``): the parser keeps a header until it
  ends, so the bytes fed while the head is open are counted, not the finished headers.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any, Protocol
from urllib.parse import urlsplit

import httptools

from fleetledger.router.framing import Unframed, read_framing

__all__ = [
    "IDLE_BOUND_S",
    "MAX_ANSWER_HEAD_BYTES",
    "BackendConnection",
    "BackendPool",
    "Listener",
    "Origin",
]

IDLE_BOUND_S = 4.0
MAX_ANSWER_HEAD_BYTES = 1024 * 1024

Headers = list[tuple[bytes, bytes]]


class Listener(Protocol):
    """What a backend connection tells about the answer in progress."""

    def head(
        self,
        status: int,
        headers: Headers,
        lowered: list[bytes],
        keep_alive: bool,
        length: int | None,
    ) -> None:
        """The answer's head (``lowered``: its names lower-cased); ``length``: its
        Content-Length (None: chunked, or to the connection's end)."""

    def body(self, chunk: bytes) -> None: ...
    def end(self) -> None: ...
    def failed(self, exc: BaseException) -> None: ...
    def cork(self) -> None: ...
    def uncork(self) -> None: ...
    @property
    def request_whole(self) -> bool: ...


class Origin:
    """Where a shard is dialled: scheme, host, port, path prefix and the Host header,
    parsed once per base URL (the routing table keeps one per backend)."""

    __slots__ = ("host", "host_header", "key", "port", "prefix", "tls")

    def __init__(self, origin: str) -> None:
        parts = urlsplit(origin)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/").encode()
        self.host_header = parts.netloc.encode()
        self.key = origin


class BackendConnection(asyncio.Protocol):
    """One connection to one origin, parsing the answers of the exchanges sent on it."""

    def __init__(self, pool: BackendPool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.listener: Listener | None = None
        self._headers: Headers = []
        self._unframed = ""  # why an answer's framing was refused
        self._keep_alive = False
        self._in_head = False
        self._head_fed = 0
        self._interim = False  # the head parsed is a 1xx: the answer is still to come
        self._until_eof = False  # the answer's body ends where the connection ends
        self.closed = False
        self.idle_since = 0.0
        self.write_paused = False
        self.on_writable: Any = None

    # ── sending ─────────────────────────────────────────────────────────────

    def send(self, listener: Listener, head: bytes) -> None:
        """Start an exchange: ``head`` (and whatever the caller writes next) goes out;
        the answer comes back to ``listener``."""
        self.listener = listener
        self.write(head)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def abort(self) -> None:
        """Drop the connection (never reused) and forget the exchange on it."""
        self.listener = None
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # ── the transport's events ──────────────────────────────────────────────

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        listener = self.listener
        if listener is not None:
            listener.cork()
        try:
            self._parser.feed_data(data)
            if self._in_head:
                self._head_fed += len(data)
                if self._head_fed > MAX_ANSWER_HEAD_BYTES:
                    why = f"answer head larger than {MAX_ANSWER_HEAD_BYTES} bytes"
                    self._fail(ConnectionError(f"{self.origin.key}: {why}"))
        except httptools.HttpParserError as exc:
            why = self._unframed or str(exc)
            self._fail(ConnectionError(f"malformed answer from {self.origin.key}: {why}"))
        finally:
            if listener is not None:
                listener.uncork()

    def eof_received(self) -> bool | None:
        # Not reused from here on, even before connection_lost says so a turn later.
        self.closed = True
        self._pool.forget(self)
        if self._until_eof and self.listener is not None:
            self._until_eof = False
            self.on_message_complete()  # the end of the connection is the answer's end
        return None

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._until_eof and self.listener is not None and exc is None:
            self._until_eof = False
            self.on_message_complete()
        if self.listener is not None:
            self._fail(exc or ConnectionResetError(f"{self.origin.key} closed the connection"))

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_writable is not None:
            self.on_writable()

    # ── the parser's events ─────────────────────────────────────────────────

    def on_message_begin(self) -> None:
        self._headers = []
        self._in_head = True
        self._head_fed = 0

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._in_head = False
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:  # the router never asks to switch protocols
                raise ConnectionError(f"{self.origin.key} switched protocols unasked")
            self._interim = True
            return
        lowered = [name.lower() for name, _ in self._headers]
        try:
            framing = read_framing(self._headers, lowered, request=False)
        except Unframed as refused:
            self._unframed = str(refused)
            raise  # the parser stops: this answer is the shard's failure, never passed on
        self._keep_alive = self._parser.should_keep_alive()
        framed = framing.chunked or framing.length is not None
        self._until_eof = status not in (204, 304) and not framed
        if self.listener is not None:
            self.listener.head(status, self._headers, lowered, self._keep_alive, framing.length)

    def on_body(self, chunk: bytes) -> None:
        # An empty piece is the parser seeing the connection end mid-body: not a piece.
        if chunk and self.listener is not None:
            self.listener.body(chunk)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._until_eof = False
        listener, self.listener = self.listener, None
        if listener is None:
            return
        if self._keep_alive and not self.closed and listener.request_whole:
            self._pool.release(self)
        else:
            self.abort()
        listener.end()

    def _fail(self, exc: BaseException) -> None:
        listener = self.listener
        self.abort()
        if listener is not None:
            listener.failed(exc)


class BackendPool:
    """Idle kept-alive connections per origin (module docstring)."""

    def __init__(self, connect_bound_s: float) -> None:
        self.connect_bound_s = connect_bound_s
        self._idle: dict[str, list[BackendConnection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def acquire(self, origin: Origin) -> BackendConnection:
        """An idle connection to ``origin`` (the most recently used), or a new one."""
        idle = self._idle.get(origin.key)
        if idle:
            stale_before = time.monotonic() - IDLE_BOUND_S
            while idle:
                conn = idle.pop()
                if not conn.closed and conn.idle_since >= stale_before:
                    return conn
                conn.abort()
        loop = asyncio.get_running_loop()
        tls = None
        if origin.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: BackendConnection(self, origin),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            ),
            self.connect_bound_s,
        )
        return conn

    def release(self, conn: BackendConnection) -> None:
        conn.idle_since = time.monotonic()
        conn.on_writable = None
        conn.resume_reading()  # it may have been paused for a slow client's sake
        self._idle.setdefault(conn.origin.key, []).append(conn)

    def forget(self, conn: BackendConnection) -> None:
        idle = self._idle.get(conn.origin.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.abort()
        self._idle.clear()
