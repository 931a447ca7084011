"""Every answer of a vLLM engine's OpenAI server, stamped with the weights behind it.

vLLM's own server says nothing of which weights generated an answer, and vLLM publishes
a weight version only once an update has finished, so the engine's actor wraps the
server's ASGI app in this: each answer's head carries the engine's attestation
(``fleetledger.events.attestation``), read from the actor's :class:`HeldWeights`.

- **A stream**: its head is held back until the first event, which vLLM sends once the
  first token exists, so the head names the version that token came from; the line
  before ``data: [DONE]`` names the version of the last.
- **A whole answer** is written once the last token exists (its end is the version
  then); its first token was not watched, so its start is the version held when it
  arrived — or, where a load was in progress then (generation paused until the load
  ends), the version that load installed (:meth:`HeldWeights.start_of`).

Nothing else of the answer changes: status, other headers and bytes pass as they are.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fleetledger.events.attestation import attestation_headers, end_comment
from fleetledger.shards.held_weights import HeldWeights

__all__ = ["AttestingApp"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DONE = b"data: [DONE]"


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"content-type" and value.startswith(b"text/event-stream")
        for name, value in headers
    )


def _stamped(head: Message, start: int, end: int | None, partial: bool) -> Message:
    extra = [(k.encode(), v.encode()) for k, v in attestation_headers(start, end, partial)]
    return {**head, "headers": [*head.get("headers", []), *extra]}


class _Answer:
    """One answer on its way out: its head held until its first body message."""

    def __init__(self, held: HeldWeights, send: Send) -> None:
        self.held = held
        self.send = send
        self.arrived = held.arrival()
        self.head: Message | None = None
        self.streaming = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.head = message
            self.streaming = _is_event_stream(list(message.get("headers", [])))
            return
        if kind == "http.response.body" and self.head is not None:
            await self.send(self._head_now(self.head))
            self.head = None
        if kind == "http.response.body" and self.streaming:
            body: bytes = message.get("body", b"")
            if body.startswith(_DONE):  # vLLM's last event: the end line goes before it
                message = {**message, "body": end_comment(self.held.version) + body}
        await self.send(message)

    def _head_now(self, head: Message) -> Message:
        held = self.held
        if self.streaming:  # the first event: the first token exists now
            return _stamped(head, held.version, None, held.partial)
        start = held.start_of(self.arrived)
        return _stamped(head, start, held.version, held.partial)


class AttestingApp:
    """``app``, with every HTTP answer stamped from ``held``."""

    def __init__(self, app: ASGIApp, held: HeldWeights) -> None:
        self.app = app
        self.held = held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _Answer(self.held, send))
