"""The router as a named Ray actor: one stable address that survives the router's death.

The port is reserved once, by whoever starts the router (:func:`start_router_actor`
calls ``reserve_port`` when not given one), and passed in, so a router that Ray restarts
after a crash binds the same address: the rollout clients were given one URL and never
re-resolve it. Everything the router knows comes from the ledger, which is what makes
letting Ray restart it safe (unlike an engine, whose weights nobody would track): the
restarted router reads the run's membership before it serves its first request.

The socket is bound in the actor's constructor, so a port that is taken fails the
actor's creation, not a background task later.
"""

from __future__ import annotations

import asyncio
import os

import ray
from ray.actor import ActorHandle
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from fleetledger.config import RouterConfig
from fleetledger.router.app import Router, reserve_port

__all__ = ["RouterActor", "router_actor_name", "start_router_actor"]


def router_actor_name(run: str) -> str:
    return f"fleetledger-router-{run}"


class RouterActor:
    """Serves a :class:`Router` on the actor's event loop from construction on."""

    def __init__(
        self,
        db_url: str,
        run: str,
        config: RouterConfig | None,
        host: str,
        port: int,
        window_s: float,
    ) -> None:
        self._router = Router(db_url, run, config, host=host, port=port, window_s=window_s)
        # An async actor's constructor runs on its event loop (Ray 2.60): serving starts
        # here, so a router Ray restarted serves without anyone calling it.
        self._started = asyncio.get_running_loop().create_task(self._router.start())

    async def url(self) -> str:
        await asyncio.shield(self._started)
        return self._router.url

    async def pid(self) -> int:
        return os.getpid()

    async def flush(self) -> int | None:
        """Hand the pending outcome window to the ledger; returns once it is durable (its
        seq, or None if there was none). Call it before ending the run: a window handed
        over after the run ended is refused (:meth:`Router.flush`)."""
        await asyncio.shield(self._started)
        return await self._router.flush()

    async def stop(self) -> None:
        """Stop serving and hand the last outcome window over."""
        await asyncio.shield(self._started)
        await self._router.stop()


def start_router_actor(
    db_url: str,
    run: str,
    *,
    config: RouterConfig | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    window_s: float = 1.0,
    namespace: str | None = None,
    timeout_s: float = 60.0,
) -> tuple[ActorHandle, str]:
    """Start the run's router actor on a reserved port; (handle, URL) once it serves.

    ``max_restarts=-1``: Ray brings a crashed router back on the same port, and it
    learns the membership from the ledger at once.
    """
    port = reserve_port(host) if port is None else port
    # Pinned to this node: the port was reserved here, and a router Ray restarts must
    # come back at the same address, not on whichever node has room.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    handle = (
        ray.remote(RouterActor)
        .options(
            name=router_actor_name(run),
            namespace=namespace,
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=-1,
            scheduling_strategy=here,
        )
        .remote(db_url, run, config, host, port, window_s)
    )
    try:
        url: str = ray.get(handle.url.remote(), timeout=timeout_s)
    except BaseException:
        ray.kill(handle, no_restart=True)  # a router that never served must not linger
        raise
    return handle, url
