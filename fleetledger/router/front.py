"""The client's side of the router: HTTP/1.1 requests parsed off the socket, answers
written back to it.

Why not a web framework: the router's whole job is a request path a few tens of
microseconds long, and a framework's request objects, middleware chain and per-chunk
awaits cost more than the routing itself (measured: the aiohttp router managed a
third of what SMG does on the same machine). Here the parser (httptools, llhttp's
binding) calls back as bytes arrive, and a request becomes an :class:`Inbound` the
moment its headers are complete; its body, if any, is handed on as it arrives.

Rules of this file, and why:

- **One request at a time per connection, in order.** HTTP/1.1 answers go back in
  the order requests came; requests pipelined behind the first wait their turn, parsed
  and queued.
- **Bounded buffering.** A head larger than ``MAX_HEAD_BYTES`` is answered 431 and the
  connection closed (counted as it is fed: the parser holds a header until it ends); a
  body that nobody is consuming yet stops the socket's reading past
  ``BODY_BUFFER_BYTES``, and so do more than ``MAX_QUEUED`` requests pipelined behind
  the one being answered, and a client that is not reading its answers — the client
  waits, the router's memory does not grow.
- **A request that cannot be read ends the connection, after what is owed.** Requests
  parsed before it are answered first, in order; then the refusal (400, 431), then the
  close. A request whose framing two parsers could read two ways is one of them
  (:mod:`fleetledger.router.framing`): nothing of it, or after it, is forwarded. A
  body whose framing breaks mid-way cannot be answered at all: the connection is cut.
  An upgrade (h2c included) is refused, never forwarded.
- **Flow control towards the client**: when the client's socket cannot take more, the
  transport says so (``pause_writing``) and whoever feeds it (the backend connection
  streaming an answer) is paused until it can.
- **A client that goes away** is told to whoever is answering it (``on_lost``), so a
  generation nobody will read is cut at the backend instead of run to its end.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httptools
import structlog

from fleetledger.router.framing import Unframed, read_framing

__all__ = ["BODY_BUFFER_BYTES", "MAX_HEAD_BYTES", "MAX_QUEUED", "Front", "Inbound"]

_log = structlog.get_logger("fleetledger.router")

MAX_HEAD_BYTES = 64 * 1024
BODY_BUFFER_BYTES = 1024 * 1024
MAX_QUEUED = 8

Headers = list[tuple[bytes, bytes]]


class Inbound:
    """One request as the client sent it: method, target, headers, and its body as it
    arrives (``chunks`` until a ``sink`` takes them, then straight to the sink)."""

    __slots__ = (
        "_buffered",
        "chunked",
        "chunks",
        "complete",
        "expect_continue",
        "failed",
        "front",
        "has_body",
        "headers",
        "keep_alive",
        "length",
        "lowered",
        "method",
        "on_complete",
        "sink",
        "target",
        "version",
    )

    def __init__(self, front: Front, method: bytes, target: bytes, headers: Headers) -> None:
        self.front = front
        self.method = method
        self.target = target
        self.headers = headers
        self.version = b"1.1"
        self.keep_alive = True
        self.has_body = False
        self.chunked = False
        self.length: int | None = None  # the body's Content-Length, as the router read it
        self.lowered: list[bytes] = []  # the headers' names, lower-cased once
        self.expect_continue = False
        self.chunks: list[bytes] = []
        self._buffered = 0
        self.complete = False
        self.failed = False  # the client went away before its body was whole
        self.sink: Callable[[bytes], None] | None = None
        self.on_complete: Callable[[], None] | None = None

    @property
    def path(self) -> str:
        return self.target.split(b"?", 1)[0].decode("latin-1")

    def take_body(self, sink: Callable[[bytes], None], on_complete: Callable[[], None]) -> None:
        """Hand the body to ``sink`` from now on (what arrived so far first); call
        ``on_complete`` once it is whole (at once if it already is)."""
        for chunk in self.chunks:
            sink(chunk)
        self.chunks = []
        self._buffered = 0
        self.sink = sink
        self.on_complete = on_complete
        self.front.resume_reading("body")
        if self.complete:
            on_complete()

    def _arrived(self, chunk: bytes) -> None:
        if self.sink is not None:
            self.sink(chunk)
            return
        self.chunks.append(chunk)
        self._buffered += len(chunk)
        if self._buffered > BODY_BUFFER_BYTES:
            self.front.pause_reading("body")

    def _whole(self) -> None:
        self.complete = True
        if self.on_complete is not None:
            self.on_complete()


class Front(asyncio.Protocol):
    """One client connection (module docstring). ``handle(front, inbound)`` answers one
    request; it is awaited before the next request on the connection is handed over."""

    def __init__(self, handle: Callable[[Front, Inbound], Awaitable[None]]) -> None:
        self._handle = handle
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: Headers = []
        self._head_bytes = 0  # of the head's finished parts
        self._in_head = False
        self._head_fed = 0  # bytes fed while the head was open and stayed open
        self._current: Inbound | None = None  # being parsed
        self._queue: deque[Inbound] = deque()
        self._serving = False
        self._paused_for: set[str] = set()
        self._refusal: tuple[int, str] | None = None  # owed once what is queued is answered
        self._unframed = ""  # why a request's framing was refused
        self._writable: asyncio.Future[None] | None = None
        self.closed = False
        self._corked: list[bytes] | None = None
        self.write_paused = False
        self.on_writable: Callable[[], None] | None = None
        self.on_lost: Callable[[], None] | None = None

    # ── the transport's events ──────────────────────────────────────────────

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # the framing was lost: nothing after it can be trusted
        was_in_head = self._in_head
        try:
            self._parser.feed_data(data)
            if was_in_head and self._in_head:
                self._head_fed += len(data)
                if self._head_fed > MAX_HEAD_BYTES:
                    raise _HeadTooLarge
        except httptools.HttpParserUpgrade:
            self._unreadable(400, "the router does not upgrade connections (HTTP/1.1 only)")
        except _HeadTooLarge:
            self._unreadable(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
        except httptools.HttpParserError as exc:
            if self._head_bytes > MAX_HEAD_BYTES:  # raised from on_url/on_header below
                self._unreadable(431, f"request head larger than {MAX_HEAD_BYTES} bytes")
            elif self._unframed:  # raised from on_headers_complete below
                self._unreadable(400, f"refused: {self._unframed}")
            else:
                self._unreadable(400, f"malformed HTTP request: {exc}")

    def _unreadable(self, status: int, message: str) -> None:
        self._refusal = (status, message)
        self.pause_reading("refused")
        current = self._current
        if current is not None and not current.complete:
            if self._queue and self._queue[-1] is current:
                # Not handed to anyone yet (its framing broke in the bytes that brought
                # its head): refused like any request that cannot be read.
                self._queue.pop()
                self._current = None
                if not self._serving:
                    self.refuse(status, message)
            else:
                self.abort()  # a body broke mid-way on its way on: no answer can be right
        elif not self._serving:
            self.refuse(status, message)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        for inbound in (self._current, *self._queue):
            if inbound is not None and not inbound.complete:
                inbound.failed = True
        if self.on_lost is not None:
            self.on_lost()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.on_writable is not None:
            self.on_writable()
        waiter, self._writable = self._writable, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ── the parser's events ─────────────────────────────────────────────────

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_bytes = 0
        self._in_head = True
        self._head_fed = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        self._count(len(name) + len(value))

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge

    def on_headers_complete(self) -> None:
        self._in_head = False
        parser = self._parser
        if parser.should_upgrade():
            return  # refused as the parser stops (data_received), never queued
        lowered = [name.lower() for name, _ in self._headers]
        try:
            framing = read_framing(self._headers, lowered, request=True)
        except Unframed as refused:
            self._unframed = str(refused)
            raise  # the parser stops here: nothing of this request goes anywhere
        inbound = Inbound(self, parser.get_method(), self._url, self._headers)
        inbound.version = parser.get_http_version().encode()
        inbound.keep_alive = parser.should_keep_alive()
        inbound.length, inbound.chunked = framing.length, framing.chunked
        inbound.lowered = lowered
        inbound.has_body = framing.chunked or bool(framing.length)
        inbound.expect_continue = framing.expect_continue
        self._current = inbound
        self._queue.append(inbound)
        if len(self._queue) > MAX_QUEUED:
            self.pause_reading("queue")
        if not self._serving:
            self._serving = True
            asyncio.get_running_loop().create_task(self._serve())

    def on_body(self, chunk: bytes) -> None:
        if chunk and self._current is not None:
            self._current._arrived(chunk)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current._whole()
            self._current = None

    # ── answering ───────────────────────────────────────────────────────────

    async def _serve(self) -> None:
        path = ""
        try:
            while self._queue and not self.closed:
                if self.write_paused:  # the client is not reading what it was given
                    self._writable = asyncio.get_running_loop().create_future()
                    await self._writable
                    continue
                inbound = self._queue.popleft()
                path = inbound.path
                if len(self._queue) <= MAX_QUEUED // 2:
                    self.resume_reading("queue")
                await self._handle(self, inbound)
                if not inbound.keep_alive or not inbound.complete:
                    self.close()
            if self._refusal is not None and not self.closed:
                self.refuse(*self._refusal)
        except Exception as exc:
            # A defect of the router's own: said, and the client's connection cut (it
            # may hold half an answer), rather than a request left waiting forever.
            _log.error("router failed a request", path=path, error=f"{type(exc).__name__}: {exc}")
            self.abort()
        finally:
            self._serving = False

    def write(self, data: bytes) -> None:
        if self._corked is not None:
            self._corked.append(data)
        elif self.transport is not None and not self.closed:
            self.transport.write(data)

    def cork(self) -> None:
        """Hold writes until :meth:`uncork`, then send them as one: an answer's head and
        the body parsed from the same read leave in one send, not two."""
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        corked, self._corked = self._corked, None
        if corked:
            self.write(b"".join(corked) if len(corked) > 1 else corked[0])

    def close(self) -> None:
        """Close once everything written is sent (what is corked included)."""
        self.uncork()
        if self.transport is not None and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Cut the connection at once (no final chunk): a truncated answer must never
        read as a complete one."""
        self._corked = None
        if self.transport is not None:
            self.transport.abort()

    def pause_reading(self, reason: str) -> None:
        """Stop reading the client's socket for ``reason`` until :meth:`resume_reading`
        for the same reason (reading resumes when no reason is left)."""
        if self.transport is not None and not self._paused_for and not self.closed:
            self.transport.pause_reading()
        self._paused_for.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self._paused_for:
            return
        self._paused_for.discard(reason)
        if self.transport is not None and not self._paused_for and not self.closed:
            self.transport.resume_reading()

    def refuse(self, status: int, message: str) -> None:
        """Answer a request that could not be parsed, then close: the stream's framing
        is lost, nothing after it can be trusted."""
        error = {"message": message, "type": "bad_request", "code": status}
        body = json.dumps({"error": error}).encode()
        self.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Connection: close\r\n\r\n%s" % (status, _REASONS.get(status, b""), len(body), body)
        )
        self.close()


class _HeadTooLarge(Exception):
    pass


_REASONS = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}
