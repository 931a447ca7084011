"""The router's event loop: uvloop where it is installed, asyncio's own otherwise.

Why: the router's request path is mostly the event loop's own work (accepting,
reading, writing sockets); uvloop does that work in C, and measured on this project's
machines it is most of the difference between the router with and without it
(``bench/bench_router.py``). It stays optional: a platform without a wheel (Windows)
still gets a working router.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["event_loop_runner", "loop_name"]


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # optional, not on every platform
    except ImportError:
        return None
    return uvloop.new_event_loop


def event_loop_runner() -> asyncio.Runner:
    """A runner whose loop is uvloop's where it is installed."""
    return asyncio.Runner(loop_factory=_loop_factory())


def loop_name() -> str:
    """Which event loop the router runs on, for its start-up line."""
    return "uvloop" if _loop_factory() is not None else "asyncio"
