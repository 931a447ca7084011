"""What the router tests share: an event loop in a thread for servers the synchronous
tests talk to, an aiohttp app served on a free port of 127.0.0.1, waiting for a
condition, and one HTTP call."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from aiohttp import web


class Loop:
    """An asyncio loop in a thread, for servers the synchronous test code talks to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class ServedApp:
    """An aiohttp app on a free port of 127.0.0.1, on ``loop``."""

    def __init__(self, loop: Loop, app: web.Application) -> None:
        self.loop = loop
        self.runner = web.AppRunner(app, access_log=None)
        self.port = loop.run(self._start())

    async def _start(self) -> int:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"  # as a shard records it

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"  # as an external router lists it

    def stop(self) -> None:
        self.loop.run(self.runner.cleanup())


def wait_until(condition: Callable[[], bool], what: str, bound_s: float = 30.0) -> None:
    """Wait for ``condition``; bounded only so a broken part fails instead of hanging."""
    deadline = time.monotonic() + bound_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)


def call(
    method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30
) -> tuple[int, bytes]:
    """One HTTP request with a JSON body (or none): (status, body), error statuses too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
