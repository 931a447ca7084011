"""Forwarding one request to one backend: the router's pass-through, and nothing else.

Rules of this file, and why:

- **Pass-through, not a redirect.** The request body goes to the backend intact and
  the backend's status, headers and body come back as they are (a 400 stays a 400).
  A redirect would put the client's socket back on an engine directly, and the next
  dead engine would hang it again.
- **Streamed both ways in 64 KiB chunks**, each written as it arrives: a completion
  carrying per-token logprobs is large and on every rollout's critical path, and an
  SSE stream must reach the client event by event.
- **Hop-by-hop headers are stripped** (RFC 9110 §7.6.1: ``Connection`` and every
  header it names, ``Keep-Alive``, ``Proxy-*``, ``TE``, ``Trailer``,
  ``Transfer-Encoding``, ``Upgrade``) along with ``Host``; ``Content-Length`` is kept
  only where the body is passed with the same framing, so a re-chunked body never
  carries a length.
- **A backend failure is never aiohttp's 504.** A timeout or connection error before
  the backend answered becomes a 500 with a JSON body; after the answer started, the
  client's connection is cut without the final chunk, so a truncated body can never
  pass for a complete one. Either way it is the backend's failure, reported as such.
- **A client that goes away is nobody's failure**: it is told apart from a backend
  failure (which side raised) and not counted against the shard.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "CHUNK_BYTES",
    "SHARD_HEADER",
    "Forwarded",
    "error_response",
    "forward",
    "forwarded_headers",
]

SHARD_HEADER = "x-fleetledger-shard"
"""The response header naming the shard that answered (added to the backend's own)."""

CHUNK_BYTES = 64 * 1024
_DETAIL_BYTES = 4096  # of an error body, kept for the taxonomy (e.g. "maximum context length")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def forwarded_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], *, keep_length: bool
) -> CIMultiDict[str]:
    """``headers`` without the hop-by-hop ones (and those ``Connection`` names), without
    ``Host``, and without ``Content-Length`` unless ``keep_length``."""
    named = {
        token.strip().lower()
        for value in headers.getall("Connection", [])
        for token in value.split(",")
        if token.strip()
    }
    drop = HOP_BY_HOP | named | {"host"}
    if not keep_length:
        drop = drop | {"content-length"}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        if name.lower() not in drop:
            out.add(name, value)
    return out


def error_response(status: int, kind: str, message: str) -> web.Response:
    """An answer of the router's own, in the OpenAI error shape clients parse."""
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status)


@dataclass(slots=True)
class Forwarded:
    """What happened to one forwarded request, for the outcome window and the metrics."""

    response: web.StreamResponse
    status: int | None = None  # the backend's status, when it answered
    error: BaseException | None = None  # the backend's timeout or connection error
    detail: str = ""  # the start of an error body, for the taxonomy
    client_gone: bool = False
    backend_wait_s: float = 0.0  # from sending the request to the backend's headers
    first_byte_at: float | None = None  # monotonic time the client's answer started


class _ClientBody:
    """The client's request body as 64 KiB chunks, noting whether reading it failed
    (the client's fault) so the error is not blamed on the backend."""

    def __init__(self, request: web.Request) -> None:
        self._content = request.content
        self.failed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._content.iter_chunked(CHUNK_BYTES):
                yield chunk
        except (aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError):
            self.failed = True
            raise


async def forward(
    request: web.Request,
    session: aiohttp.ClientSession,
    origin: str,
    *,
    shard: int,
) -> Forwarded:
    """Send ``request`` to the backend at ``origin`` and stream its answer back."""
    target = origin + request.rel_url.path_qs
    body = _ClientBody(request) if request.body_exists else None
    headers = forwarded_headers(
        request.headers, keep_length=request.headers.get("Transfer-Encoding") is None
    )
    sent_at = time.monotonic()
    try:
        async with session.request(
            request.method,
            target,
            headers=headers,
            data=body.chunks() if body is not None else None,
            allow_redirects=False,
        ) as upstream:
            waited = time.monotonic() - sent_at
            return await _stream_back(request, upstream, waited, shard)
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        if body is not None and body.failed:
            return Forwarded(web.Response(status=400), client_gone=True)
        message = (
            f"backend of shard {shard} ({origin}) failed before answering: "
            f"{type(exc).__name__}: {exc}"
        )
        return Forwarded(error_response(500, "backend_error", message), error=exc)


async def _stream_back(
    request: web.Request, upstream: aiohttp.ClientResponse, waited: float, shard: int
) -> Forwarded:
    chunked = "chunked" in upstream.headers.get("Transfer-Encoding", "").lower()
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    response.headers.extend(forwarded_headers(upstream.headers, keep_length=not chunked))
    # Which shard answered: a client that counts outcomes per shard, or a person reading
    # a trace, need not guess it from the router's log.
    response.headers[SHARD_HEADER] = str(shard)
    done = Forwarded(response, status=upstream.status, backend_wait_s=waited)
    head = bytearray()
    try:
        await response.prepare(request)
    except ConnectionError:
        done.client_gone = True
        return done
    done.first_byte_at = time.monotonic()
    while True:
        try:
            chunk = await upstream.content.read(CHUNK_BYTES)
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            # The answer has started: cut the client's connection without the final
            # chunk, so a truncated body never reads as a complete one.
            done.error = exc
            if request.transport is not None:
                request.transport.abort()
            return done
        if not chunk:
            break
        if upstream.status >= 400 and len(head) < _DETAIL_BYTES:
            head += chunk[: _DETAIL_BYTES - len(head)]
        try:
            await response.write(chunk)
        except ConnectionError:
            done.client_gone = True
            return done
    try:
        await response.write_eof()
    except ConnectionError:
        done.client_gone = True
    done.detail = head.decode("utf-8", errors="replace")
    return done
