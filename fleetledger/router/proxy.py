"""Forwarding one request to one backend: the router's pass-through, and nothing else.

Rules of this file, and why:

- **Pass-through, not a redirect.** The request body goes to the backend intact and
  the backend's status, headers and body come back as they are (a 400 stays a 400).
  A redirect would put the client's socket back on an engine directly, and the next
  dead engine would hang it again.
- **Streamed both ways as the bytes arrive**: each piece the backend sends is written
  to the client from the callback that parsed it (a completion carrying per-token
  logprobs is large and on every rollout's critical path, and an SSE stream must reach
  the client event by event). When the client cannot take more, the backend's socket
  stops being read until it can.
- **Hop-by-hop headers are stripped** (RFC 9110 §7.6.1: ``Connection`` and every
  header it names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``) along with ``Host`` (the backend's own is sent)
  and ``Expect`` (the router answers ``100-continue`` itself); ``Content-Length`` is
  kept only where the body is passed with the same framing, so a re-chunked body never
  carries a length.
- **A backend failure is never a gateway's 504.** A timeout or connection error before
  the backend answered becomes a 500 with a JSON body; after the answer started, the
  client's connection is cut without the final chunk, so a truncated body can never
  pass for a complete one. Either way it is the backend's failure, reported as such.
- **A client that goes away is nobody's failure**: it is told apart from a backend
  failure (which side failed) and not counted against the shard; the backend's
  connection is dropped, so an engine stops generating what nobody will read.
- **The weights behind every answer are the engine's word.** An engine that attests
  (``fleetledger.events.attestation``: every engine of fleetledger's does) stamps its
  answer with the version at its first token and at its last; the router passes that
  on untouched and counts the answer under it. Only where the engine says nothing (a
  foreign engine) does the router put its own view of the ledger in its place — the
  shard's version when the request was routed, ``-end`` where it moved by the head or
  by the stream's end — and says so: ``x-fleetledger-weight-version-source: ledger``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import NamedTuple

from fleetledger.events.attestation import (
    VERSION_SOURCE_HEADER,
    WEIGHT_VERSION_END_HEADER,
    WEIGHT_VERSION_HEADER,
    WEIGHTS_HEADER,
)
from fleetledger.router.backends import BackendConnection, BackendPool, Headers, Origin
from fleetledger.router.front import Front, Inbound

__all__ = [
    "RESEND_HEADER",
    "RESENT_FROM_HEADER",
    "SHARD_HEADER",
    "WEIGHT_VERSION_END_HEADER",
    "WEIGHT_VERSION_HEADER",
    "Exchange",
    "Forwarded",
    "answer",
    "error_answer",
    "forward",
    "read_head",
]

SHARD_HEADER = "x-fleetledger-shard"
"""The response header naming the shard that answered (added to the backend's own), or,
on the router's own 500 ``backend_error`` and 503 ``shard_left``, the shard it is about."""
RESENT_FROM_HEADER = "x-fleetledger-resent-from"
"""A response header: the answer was re-sent here after the shard it names left the
fleet with the request unanswered."""
RESEND_HEADER = b"x-fleetledger-resend"
"""A request header: ``never`` keeps a request off every shard but the first (a re-sent
generation is generated twice where the first engine had begun)."""
_SHARD = SHARD_HEADER.encode()
_RESENT_FROM = RESENT_FROM_HEADER.encode()
_ATTESTED = WEIGHT_VERSION_HEADER.encode()
_WEIGHTS = WEIGHTS_HEADER.encode()
_FROM_LEDGER = b"%s: ledger\r\n" % VERSION_SOURCE_HEADER.encode()

_DETAIL_BYTES = 4096  # of an error body, kept for the taxonomy (e.g. "maximum context length")

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"expect", b"content-length"}
_NO_BODY_STATUSES = frozenset({204, 304})


class ReadHead(NamedTuple):
    """A message's headers, read once: the lines to forward, whether it is an event
    stream, and the version the engine attests at the answer's first token (None: it
    said none). Its framing is :func:`~fleetledger.router.framing.read_framing`'s."""

    lines: list[bytes]  # ``b"Name: value\r\n"``, what is passed on
    event_stream: bool
    attested: int | None = None
    partial: bool = False  # the engine said its weights were partial


def read_head(headers: Headers, lowered: list[bytes] | None = None) -> ReadHead:
    """``headers`` in one pass (``lowered``: their names lower-cased, once, where they
    were parsed — this is on every request's path twice): the lines to pass on —
    without the hop-by-hop ones and those ``Connection`` names, ``Host``, ``Expect``,
    and the framing (``Content-Length``, ``Transfer-Encoding``), which the router
    writes itself from the numbers it read."""
    if lowered is None:  # the old call (before 0.2): the names lowered here
        lowered = [name.lower() for name, _ in headers]
    drop = _NOT_FORWARDED
    event_stream = False
    for low, (_, value) in zip(lowered, headers, strict=True):
        if low == b"connection":
            drop = drop | {t.strip().lower() for t in value.split(b",") if t.strip()}
        elif low == b"content-type":
            event_stream = value.startswith(b"text/event-stream")
    lines = [
        b"%s: %s\r\n" % pair for low, pair in zip(lowered, headers, strict=True) if low not in drop
    ]
    # An engine's attestation, looked for apart: a scan of the names in C, not two more
    # comparisons per header of every message (a request never carries one).
    attested: int | None = None
    partial = False
    if _ATTESTED in lowered:
        value = headers[lowered.index(_ATTESTED)][1].strip()
        attested = int(value) if value.isdigit() else None
        partial = _WEIGHTS in lowered and headers[lowered.index(_WEIGHTS)][1].strip() == b"partial"
    return ReadHead(lines, event_stream, attested, partial)


def _discard(_chunk: bytes) -> None:
    pass


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


def answer(
    front: Front,
    inbound: Inbound,
    status: int,
    body: bytes,
    content_type: bytes = b"application/json",
    extra: bytes = b"",
) -> None:
    """Write a whole answer of the router's own (its head alone to a HEAD request)."""
    connection = b"" if inbound.keep_alive else b"Connection: close\r\n"
    front.write(
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n%s"
        % (
            status,
            _reason(status),
            content_type,
            len(body),
            connection,
            extra,
            b"" if inbound.method == b"HEAD" else body,
        )
    )


def _error_body(status: int, kind: str, message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def error_answer(
    front: Front, inbound: Inbound, status: int, kind: str, message: str, extra: bytes = b""
) -> None:
    """An answer of the router's own, in the OpenAI error shape clients parse."""
    answer(front, inbound, status, _error_body(status, kind, message), extra=extra)


def _opted_out(inbound: Inbound) -> bool:
    """Whether the client asked never to have its request re-sent to another shard
    (``x-fleetledger-resend: never``): read only when a re-send is due."""
    return any(
        name.lower() == RESEND_HEADER and value.strip().lower() == b"never"
        for name, value in inbound.headers
    )


@dataclass(slots=True)
class Forwarded:
    """What happened to one forwarded request, for the outcome window and the metrics."""

    status: int | None = None  # the backend's status, when it answered
    error: BaseException | None = None  # the backend's timeout or connection error
    detail: str = ""  # the start of an error body, for the taxonomy
    client_gone: bool = False
    backend_wait_s: float = 0.0  # from sending the request to the backend's head
    first_byte_at: float | None = None  # monotonic time the client's answer started
    answered: int = 0  # the status the client was given (0: none, the connection was cut)
    attested: int | None = None  # the version the engine attested at the first token
    partial: bool = False  # ... and said its weights were partial
    left: str = ""  # why the router ended it: the ledger says its shard left the fleet
    resend: bool = False  # ended before any answer byte: send it to a serving shard


class Exchange:
    """One request in flight to one backend: the listener of the backend connection
    (``head``, ``body``, ``end``, ``failed``) and of the client's (``client_lost``,
    ``client_writable``). Resolves ``done`` once, with what happened."""

    __slots__ = (
        "_body",
        "_chunked_out",
        "_detail",
        "_event_stream",
        "_held_for_client",
        "_request_whole",
        "_sent_at",
        "conn",
        "done",
        "front",
        "inbound",
        "may_resend",
        "outcome",
        "resent_from",
        "shard",
        "timer",
        "version_at",
        "version_now",
    )

    def __init__(
        self,
        front: Front,
        inbound: Inbound,
        conn: BackendConnection,
        shard: int,
        version_at: int,
        version_now: Callable[[], int | None],
    ) -> None:
        self.front = front
        self.inbound = inbound
        self.conn = conn
        self.shard = shard
        self.version_at = version_at
        self.version_now = version_now
        self.outcome = Forwarded()
        self.done: asyncio.Future[Forwarded] = asyncio.get_running_loop().create_future()
        self.timer: asyncio.TimerHandle | None = None
        self._detail = bytearray()
        self._chunked_out = False
        self._event_stream = False
        self._held_for_client = False  # the backend's socket paused: the client is slow
        self._request_whole = not (inbound.has_body or inbound.chunked)
        self._sent_at = time.monotonic()
        # The body as sent, kept to re-send it (not a chunked upload: re-framing it is
        # not worth a rare re-send).
        self._body: list[bytes] | None = None if inbound.chunked else []
        self.may_resend = False
        self.resent_from: int | None = None  # the shard that left before this re-send

    @property
    def request_whole(self) -> bool:
        """Whether the whole request went to the backend (an answer may come sooner)."""
        return self._request_whole

    # ── the backend's side ──────────────────────────────────────────────────

    def head(
        self,
        status: int,
        headers: Headers,
        lowered: list[bytes],
        keep_alive: bool,
        length: int | None,
    ) -> None:
        now = time.monotonic()
        outcome = self.outcome
        outcome.status = status
        outcome.backend_wait_s = now - self._sent_at
        front = self.front
        if front.closed:
            self.client_lost()
            return
        read = read_head(headers, lowered)
        keep_length = length is not None
        lines = read.lines
        if keep_length:
            lines.append(b"Content-Length: %d\r\n" % length)
        lines.append(b"%s: %d\r\n" % (_SHARD, self.shard))
        if self.resent_from is not None:
            lines.append(b"%s: %d\r\n" % (_RESENT_FROM, self.resent_from))
        outcome.attested = read.attested
        outcome.partial = read.partial
        if read.attested is None:  # a foreign engine: the ledger's view, said as such
            self._ledger_versions(lines)
        bodyless = status in _NO_BODY_STATUSES or 100 <= status < 200
        keep_client = self.inbound.keep_alive
        if not keep_length and not bodyless:
            if self.inbound.version == b"1.1":
                lines.append(b"Transfer-Encoding: chunked\r\n")
                self._chunked_out = True
            else:
                keep_client = False  # HTTP/1.0: the end of the body is the connection's
        if not keep_client:
            self.inbound.keep_alive = False
            lines.append(b"Connection: close\r\n")
        self._event_stream = read.event_stream
        front.write(b"HTTP/1.1 %d %s\r\n%s\r\n" % (status, _reason(status), b"".join(lines)))
        outcome.answered = status
        outcome.first_byte_at = time.monotonic()
        front.on_writable = self.client_writable
        front.on_lost = self.client_lost

    def _ledger_versions(self, lines: list[bytes]) -> None:
        lines.append(b"%s: %d\r\n" % (WEIGHT_VERSION_HEADER.encode(), self.version_at))
        lines.append(_FROM_LEDGER)
        now_version = self.version_now()
        if now_version is not None and now_version != self.version_at:
            lines.append(b"%s: %d\r\n" % (WEIGHT_VERSION_END_HEADER.encode(), now_version))
            self.version_at = now_version  # the stream's comment names a later move only

    def body(self, chunk: bytes) -> None:
        outcome = self.outcome
        if outcome.status is not None and outcome.status >= 400:
            room = _DETAIL_BYTES - len(self._detail)
            if room > 0:
                self._detail += chunk[:room]
        front = self.front
        if self._chunked_out:
            front.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        else:
            front.write(chunk)
        if front.write_paused:
            self._held_for_client = True
            self.conn.pause_reading()

    def end(self) -> None:
        if self._chunked_out:
            tail = b"0\r\n\r\n"
            if self._event_stream and self.outcome.attested is None:
                moved = self.version_now()
                if moved is not None and moved != self.version_at:
                    comment = b": %s %d\n\n" % (WEIGHT_VERSION_END_HEADER.encode(), moved)
                    tail = b"%x\r\n%s\r\n%s" % (len(comment), comment, tail)
            self.front.write(tail)
        elif not self.inbound.keep_alive:
            self.front.close()
        self._finish()

    def failed(self, exc: BaseException) -> None:
        outcome = self.outcome
        outcome.error = exc
        if outcome.first_byte_at is not None:
            # The answer has started: cut the client's connection without the final
            # chunk, so a truncated body never reads as a complete one.
            outcome.answered = 0
            self.front.abort()
        elif self.inbound.failed or self.front.closed:
            outcome.error = None
            outcome.client_gone = True
        else:
            message = (
                f"backend of shard {self.shard} ({self.conn.origin.key}) failed before "
                f"answering: {type(exc).__name__}: {exc}"
            )
            shard = b"%s: %d\r\n" % (_SHARD, self.shard)
            error_answer(self.front, self.inbound, 500, "backend_error", message, extra=shard)
            outcome.answered = 500
        self._finish()

    def timed_out(self, bound_s: float) -> None:
        if self.done.done():
            return
        self.conn.abort()
        if self._held_for_client:
            # The backend was waiting on the client, not the other way round: the
            # client's connection is cut (the bound holds), the shard is not blamed.
            self.outcome.client_gone = True
            self.outcome.answered = 0
            self.front.abort()
            self._finish()
            return
        self.failed(TimeoutError(f"no whole answer within the backend bound of {bound_s:g} s"))

    # ── the client's side ───────────────────────────────────────────────────

    def client_lost(self) -> None:
        if self.done.done():
            return
        self.conn.abort()
        self.outcome.client_gone = True
        self._finish()

    def leave(self, why: str) -> None:
        """The ledger says this exchange's shard left the fleet: end it now, never wait on
        the shard. Nothing answered yet: re-sent to a serving shard where it may be
        (``Forwarded.resend``), else a JSON 503 saying ``why``. An answer already
        flowing is cut — an event stream after an error event saying ``why`` — so a
        truncated body never passes for a complete one."""
        if self.done.done():
            return
        self.conn.abort()
        outcome = self.outcome
        outcome.left = why
        front = self.front
        if outcome.first_byte_at is not None:
            if self._event_stream and self._chunked_out:
                event = b"data: %s\n\n" % _error_body(503, "shard_left", why)
                front.write(b"%x\r\n%s\r\n" % (len(event), event))
            outcome.answered = 0
            front.abort()
        elif self.inbound.failed or front.closed:
            outcome.client_gone = True
        elif self.may_resend and self._resendable() and not _opted_out(self.inbound):
            self.inbound.chunks = self._body  # the next forward sends it again
            self.inbound.expect_continue = False  # the client was told to go on once
            outcome.resend = True
        else:
            shard = b"%s: %d\r\n" % (_SHARD, self.shard)
            error_answer(front, self.inbound, 503, "shard_left", why, extra=shard)
            outcome.answered = 503
        self._finish()

    def _resendable(self) -> bool:
        return self._body is not None and self._request_whole

    def client_writable(self) -> None:
        self._held_for_client = False
        self.conn.resume_reading()

    def cork(self) -> None:
        self.front.cork()

    def uncork(self) -> None:
        self.front.uncork()

    def _finish(self) -> None:
        if self.done.done():
            return
        if self.timer is not None:
            self.timer.cancel()
        self.front.on_writable = None
        self.front.on_lost = None
        inbound = self.inbound
        if not inbound.complete:  # what the client still sends goes nowhere now
            inbound.sink = _discard
            inbound.on_complete = None
        self.outcome.detail = self._detail.decode("utf-8", errors="replace")
        self.done.set_result(self.outcome)

    # ── the client's body, onwards ──────────────────────────────────────────

    def send_body(self, chunk: bytes) -> None:
        if self._body is not None:
            self._body.append(chunk)
        self.conn.write(chunk)
        self._hold_client_while_backend_full()

    def send_body_chunked(self, chunk: bytes) -> None:
        if chunk:
            self.conn.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self._hold_client_while_backend_full()

    def end_body_chunked(self) -> None:
        self.conn.write(b"0\r\n\r\n")
        self.client_body_done()

    def client_body_done(self) -> None:
        self._request_whole = True
        self.conn.on_writable = None

    def _hold_client_while_backend_full(self) -> None:
        # An upload faster than the backend reads it waits in the client's socket, not
        # in the router's memory.
        if self.conn.write_paused:
            self.front.pause_reading("upload")
            self.conn.on_writable = self._backend_writable

    def _backend_writable(self) -> None:
        self.front.resume_reading("upload")


async def forward(
    front: Front,
    inbound: Inbound,
    pool: BackendPool,
    origin: Origin,
    *,
    shard: int,
    bound_s: float,
    version_at: int,
    version_now: Callable[[], int | None],
    may_resend: bool = False,
    in_flight: dict[Exchange, str] | None = None,
    base_url: str = "",
    resent_from: int | None = None,
) -> Forwarded:
    """Send ``inbound`` to the backend at ``origin`` and stream its answer back to the
    client; returns what happened once the exchange is over. ``in_flight``: holds the
    exchange (as going to ``base_url``) while it is under way, so the router can end it
    with :meth:`Exchange.leave` when its shard leaves the fleet; ``may_resend``: it may
    then be re-sent elsewhere; ``resent_from``: this is such a re-send, off that shard
    (the answer says so)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    if inbound.expect_continue:
        front.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if front.closed:
        return Forwarded(client_gone=True)
    try:
        conn = await pool.acquire(origin)
    except (OSError, TimeoutError) as exc:
        if inbound.failed or front.closed:
            return Forwarded(client_gone=True)
        message = (
            f"backend of shard {shard} ({origin.key}) failed before answering: "
            f"{type(exc).__name__}: {exc or 'connect timed out'}"
        )
        named = b"%s: %d\r\n" % (_SHARD, shard)
        error_answer(front, inbound, 500, "backend_error", message, extra=named)
        return Forwarded(error=exc, answered=500)
    exchange = Exchange(front, inbound, conn, shard, version_at, version_now)
    exchange.may_resend = may_resend
    exchange.resent_from = resent_from
    if in_flight is not None:
        in_flight[exchange] = base_url
    try:
        front.on_lost = exchange.client_lost
        if front.closed:
            exchange.client_lost()
            return await exchange.done
        exchange.timer = loop.call_at(deadline, exchange.timed_out, bound_s)
        chunked_in = inbound.chunked
        lines = read_head(inbound.headers, inbound.lowered).lines
        if chunked_in:
            lines.append(b"Transfer-Encoding: chunked\r\n")
        elif inbound.length is not None:
            lines.append(b"Content-Length: %d\r\n" % inbound.length)
        head = b"%s %s%s HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            inbound.method,
            origin.prefix,
            inbound.target,
            origin.host_header,
            b"".join(lines),
        )
        if inbound.complete and not chunked_in:
            # The whole body is here (a rollout's request usually is): head and body in one
            # send.
            exchange._request_whole = True
            conn.send(exchange, b"".join((head, *inbound.chunks)))
            exchange._body, inbound.chunks = inbound.chunks, []
        else:
            conn.send(exchange, head)
        if (inbound.has_body or chunked_in) and not (inbound.complete and not chunked_in):
            if chunked_in:
                inbound.take_body(exchange.send_body_chunked, exchange.end_body_chunked)
            else:
                inbound.take_body(exchange.send_body, exchange.client_body_done)
        return await exchange.done
    finally:
        if in_flight is not None:
            del in_flight[exchange]
