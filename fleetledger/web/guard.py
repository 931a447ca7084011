"""``serve``'s connections held to bounds: a head must arrive in time, an idle connection
is closed, the open ones are capped, and every refusal is the API's one JSON line.

A hostile pass found a request whose head never ended held open past 90 s;
under ``ulimit -n 1024``, 1,100 of them left normal requests unanswered for 15 s and
wrote 555,487 lines of accept tracebacks to stderr in 25 s; and malformed HTTP got
aiohttp's own multi-line text (echoing the request) and a traceback in the log per
request. So, per connection (:class:`GuardedHandler`, aiohttp's request handler with
these rules):

- a request's head must be whole within ``head_s`` of the connection opening or of the
  last answer: else a 408 and the close (the keep-alive idle bound is aiohttp's own,
  ``idle_s``);
- beyond ``max_connections`` open, a new one is answered 503 at once and closed — the
  cap and the accept burst sit well under the process's file limit, so accepts do not
  fail for want of a descriptor;
- aiohttp's own refusals (400, 413, 417, 431) are ``{"error", "status"}`` like every
  other answer, logged in one line, never with a traceback;
- an accept that fails anyway (the file limit reached by other means) is said in one
  line per kind, not a traceback per retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import sys
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from fleetledger.logs import get_logger
from fleetledger.web.problems import problem_body

__all__ = ["GuardedHandler", "Limits", "accept_burst", "quiet_accept_errors"]

_log = get_logger("fleetledger.web")


def _quarter_of_the_file_limit(most: int) -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return most
    return max(8, min(most, soft // 4))


def _default_max_connections() -> int:
    """A quarter of the process's soft file limit, at most 1,000: the accepts of one
    burst (another quarter, :func:`accept_burst`), the ledger's connections and the
    runtime need the rest, so an accept never fails for want of a descriptor."""
    return _quarter_of_the_file_limit(1000)


def accept_burst() -> int:
    """How many connections one turn of the loop accepts (the listen backlog): each is
    refused only a turn later, so a burst must fit in the descriptors left."""
    return _quarter_of_the_file_limit(128)


@dataclass
class Limits:
    """The bounds, and the count of connections open now."""

    head_s: float = 10.0
    idle_s: float = 15.0
    max_connections: int = field(default_factory=_default_max_connections)
    open: int = 0


def _answer(status: int, message: str) -> bytes:
    body = json.dumps(problem_body(status, message)).encode()
    reason = {408: b"Request Timeout", 503: b"Service Unavailable"}.get(status, b"Error")
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: application/json; charset=utf-8\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, reason, len(body), body)
    )


class GuardedHandler(RequestHandler):
    """aiohttp's request handler, with the module's bounds."""

    def __init__(self, manager: Server, *, loop: asyncio.AbstractEventLoop, limits: Limits,
                 **kwargs: Any) -> None:  # fmt: skip
        super().__init__(manager, loop=loop, keepalive_timeout=limits.idle_s, **kwargs)
        self._limits = limits
        self._refused = False
        self._counted = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._heads_seen = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        limits = self._limits
        if limits.open >= limits.max_connections:
            self._refused = True
            message = f"the server holds {limits.open} connections, its most: try again shortly"
            transport.write(_answer(503, message))  # type: ignore[attr-defined]
            transport.close()
            return
        limits.open += 1
        self._counted = True
        super().connection_made(transport)
        self.expect_head()

    def expect_head(self) -> None:
        """A request's head is due within ``head_s`` from now."""
        self._disarm()
        self._heads_seen = self._request_count
        self._head_timer = self._loop.call_later(self._limits.head_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._request_count > self._heads_seen or self.transport is None:
            return
        message = f"no whole request head within {self._limits.head_s:g} s"
        _log.info("connection closed", why=message)
        self.transport.write(_answer(408, message))
        self.force_close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._request_count > self._heads_seen:
            self._disarm()  # a head arrived: the handler's time now, not the head's

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        self._disarm()
        if self._counted:
            self._counted = False
            self._limits.open -= 1
        super().connection_lost(exc)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's own refusal (a malformed request, a head too large, …) in the API's
        shape, logged in one line."""
        why = " ".join(str(message or exc or "").split())[:300] or "(no message)"
        if status < 500:
            why = f"malformed HTTP request: {why}"
        _log.info("request refused", status=status, why=why)
        if request.writer.output_size > 0:
            raise ConnectionError("an answer had begun: the connection is cut")
        response = web.Response(
            status=status,
            text=json.dumps(problem_body(status, why)),
            content_type="application/json",
        )
        response.force_close()
        return response


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """An accept that fails (the file limit) said once per kind, not a traceback each
    retry (asyncio retries every second, and logged each with its traceback). Written
    straight to stderr: with no descriptor left, a logger that opens or imports
    anything fails, and a failing handler is a traceback again."""
    said: set[str] = set()

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if "accept" not in message:
            loop.default_exception_handler(context)
            return
        exc = context.get("exception")
        kind = " ".join((f"{message}: {exc}" if exc else message).split())
        if kind not in said:
            said.add(kind)
            with contextlib.suppress(Exception):
                print(f"fleetledger: warning: connections refused: {kind}", file=sys.stderr)

    loop.set_exception_handler(handle)
