"""The simulated engine: a generation shard that answers like an engine and misbehaves
on request, run as a Ray actor — the fast default shard of tests and ``simulate``.

Faults are the engine's own failures (a transport error, a data error, a wedge);
killing and freezing are done from outside with real signals on :meth:`pid`, so what
the controller sees is what it would see of a real engine's process.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, NamedTuple

import ray
from ray.actor import ActorHandle

from fleetledger.shards.contract import (
    Generation,
    GenerationRequest,
    GenerationShard,
    RolloutDataFailure,
)
from fleetledger.shards.held_weights import HeldWeights
from fleetledger.shards.naming import ShardFactory, shard_actor_name
from fleetledger.transports.ray_members import CommunicatorActor

__all__ = [
    "DEEP_PROBE_BOUND_S",
    "FAULTS",
    "Fault",
    "SimulatedRefitShard",
    "SimulatedShard",
    "Token",
    "simulated_shard_factory",
]

DEEP_PROBE_BOUND_S = 10.0
"""How long a deep probe of a wedged simulated engine waits before failing (the probe
round gives up far earlier; this only keeps abandoned probes from piling up)."""

Fault = Literal["none", "fail", "error", "hang"]
FAULTS: tuple[Fault, ...] = ("none", "fail", "error", "hang")


class Token(NamedTuple):
    """One generated token: its text, and the weights it was generated from."""

    text: str
    version: int
    partial: bool


class SimulatedShard(GenerationShard):
    """A shard whose generation takes ``generation_s`` and can be told to misbehave.

    Faults (``set_fault``): ``fail`` raises a transport error (infrastructure: the
    adapter should retry elsewhere), ``error`` raises the over-long-prompt failure as an
    explicit data failure (the prompt's, whichever shard serves it), ``hang`` parks every
    generation forever while probes still answer (the wedged engine). Killing and
    freezing are done from outside with real signals on :meth:`pid`.
    """

    def __init__(
        self,
        index: int,
        *,
        generation_s: float = 0.01,
        weight_version: int = 0,
        serve_http: bool = False,
    ) -> None:
        """``serve_http``: also serve an OpenAI-compatible app on loopback
        (``engines.simulated_http``), and report its URL as the base URL."""
        if index < 0:
            raise ValueError(f"shard index must be >= 0, got {index}")
        if generation_s < 0:
            raise ValueError(f"generation_s must be >= 0, got {generation_s}")
        self._index = index
        self._generation_s = generation_s
        self._held = HeldWeights(index, weight_version)
        self._fault: Fault = "none"
        self._fault_left: int | None = None  # generations the fault still applies to
        self._served = 0
        self._serve_http = serve_http
        self._http: asyncio.Task[str] | None = None

    # ── the interface ───────────────────────────────────────────────────────

    async def is_alive(self, deep: bool = False) -> bool:
        if self._serve_http:
            await self.start_http()  # alive means reachable where the run says it is
        if deep and self._fault == "hang":  # a deep probe generates: the wedge holds it
            # Bounded here as a real engine bounds it, so probes do not pile up forever.
            await asyncio.sleep(DEEP_PROBE_BOUND_S)
            raise TimeoutError(f"shard {self._index}: the deep probe did not complete")
        return True

    async def start_http(self) -> str:
        """Serve the OpenAI-compatible app (once); its base URL."""
        if self._http is None:
            self._http = asyncio.ensure_future(self._start_http())
        return await asyncio.shield(self._http)

    async def _start_http(self) -> str:
        from aiohttp import web

        from fleetledger.engines.simulated_http import simulated_app  # aiohttp: HTTP only

        runner = web.AppRunner(simulated_app(self.generate, self.tokens), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    async def tokens(self, request: GenerationRequest) -> AsyncIterator[Token]:
        """The generation, token by token (``generation_s`` spread over ``max_tokens``),
        each stamped with the version held as it was generated: a refit that lands
        mid-generation shows in the tokens after it, as on a real engine. Faults act
        before the first token."""
        fault = self._take_fault()
        if fault == "hang":
            await asyncio.Event().wait()  # never set: the wedged engine
        count = max(request.max_tokens, 1)
        if fault != "none":
            await asyncio.sleep(self._generation_s)
        if fault == "fail":
            raise ConnectionResetError(f"shard {self._index}: engine connection reset")
        if fault == "error":
            # Said explicitly: across the runtime's boundary any other error is this
            # shard's failure (infrastructure), not the prompt's.
            raise RolloutDataFailure(
                f"shard {self._index}: prompt {request.prompt_id} exceeds the maximum context "
                "length",
                reason="context_length",
                shard=self._index,
                prompt_id=request.prompt_id,
            )
        step = self._generation_s / count
        said = f"{request.prompt} → shard {self._index}:"  # the first token's text says where
        for _ in range(count):
            await asyncio.sleep(step)
            held = self._held
            yield Token(f"{said} v{held.version}", held.version, held.partial)
            said = ""
        self._served += 1

    async def generate(self, request: GenerationRequest) -> Generation:
        pieces = [token async for token in self.tokens(request)]
        return Generation(
            prompt_id=request.prompt_id,
            group_id=request.group_id,
            shard=self._index,
            weight_version=pieces[0].version,
            text="".join(p.text for p in pieces),
            tokens=request.max_tokens,
            weight_version_end=pieces[-1].version,
            weights_partial=any(p.partial for p in pieces),
        )

    async def weight_version(self) -> int:
        return self._held.version

    async def base_url(self) -> str | None:
        """Its HTTP server's ``.../v1`` when it serves one, else the contract's default:
        ``ray://<actor name>``."""
        if self._serve_http:
            return await self.start_http()
        return await super().base_url()

    async def set_weight_version(self, version: int) -> int:
        """Told the refit completed: for this engine, whose weights arrive with the word
        (no communicator), that is when its load completes."""
        if version != self._held.version or self._held.partial:
            self._held.load_completes(version)
        return version

    # ── the simulation's own controls ───────────────────────────────────────

    async def pid(self) -> int:
        """The process to signal (SIGKILL, SIGSTOP) in chaos tests."""
        return os.getpid()

    async def set_fault(self, fault: Fault, times: int | None = None) -> Fault:
        """Misbehave from now on, or only for the next ``times`` generations."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
        if times is not None and times < 1:
            raise ValueError(f"times must be >= 1 or None (for good), got {times}")
        self._fault = fault
        self._fault_left = times
        return fault

    def _take_fault(self) -> Fault:
        fault = self._fault
        if self._fault_left is not None and fault != "none":
            self._fault_left -= 1
            if self._fault_left == 0:
                self._fault, self._fault_left = "none", None
        return fault

    async def set_generation_s(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"generation_s must be >= 0, got {seconds}")
        self._generation_s = seconds
        return seconds

    async def served(self) -> int:
        return self._served


class SimulatedRefitShard(SimulatedShard, CommunicatorActor):
    """A simulated engine that is also a member of the refit communicator: killing its
    process takes its rank with it, as with a real engine's weight-sync worker.

    Like a real engine it receives a push into staging buffers and then loads it (for
    ``reload_s``): a push cut before the load leaves the weights it serves whole. It
    also takes ``startup_s`` to come up, as an engine loads its model. ``stage_dir``
    (chaos campaigns): the actor writes its pid there as it starts (``shard-N.pid``)
    and each refit stage as it enters it (``shard-N.stage``: receiving, loading, idle),
    so faults can be aimed at a phase from outside, with real signals.
    """

    _refit_staged = True

    def __init__(
        self,
        index: int,
        *,
        reload_s: float = 0.0,
        startup_s: float = 0.0,
        stage_dir: str | None = None,
        **engine: Any,
    ) -> None:
        self._stage_dir = stage_dir
        self._told = False  # whether a stage or pid file was written: the folder existed
        self._tell("pid", str(os.getpid()), index)
        if reload_s < 0 or startup_s < 0:
            raise ValueError(f"reload_s and startup_s must be >= 0, got {reload_s}, {startup_s}")
        if startup_s:
            time.sleep(startup_s)  # the engine loading its model: the actor is not up yet
        super().__init__(index, **engine)
        self._reload_s = reload_s
        self._stage = "idle"
        self._enter("idle")

    def _tell(self, what: str, text: str, index: int | None = None) -> None:
        if self._stage_dir is None:
            return
        name = f"shard-{self._index if index is None else index}.{what}"
        path = os.path.join(self._stage_dir, name)
        try:
            with open(f"{path}.{os.getpid()}", "w") as out:
                out.write(text)
        except FileNotFoundError:
            if not self._told:
                raise  # the folder never existed: a wrong stage_dir, said at once
            # The campaign's trial is over and its folder gone: a shard it froze was
            # thawed at teardown and is finishing a push nobody watches any more.
            return
        self._told = True
        os.replace(f"{path}.{os.getpid()}", path)

    def _enter(self, stage: str) -> None:
        self._stage = stage
        self._tell("stage", stage)

    async def refit_broadcast(self, version: int) -> dict[str, Any]:
        self._enter("receiving")
        try:
            received = await super().refit_broadcast(version)
            self.refit_load_begins(version)
            self._held.load_begins(version)
            self._enter("loading")
            try:
                if self._reload_s:
                    await asyncio.sleep(self._reload_s)
            except BaseException:
                self._held.load_failed()
                raise
            self._held.load_completes(version)  # it now serves from these weights
        finally:
            self._enter("idle")
        return received

    async def refit_stage(self) -> str:
        """Where a refit is: ``receiving``, ``loading`` or ``idle`` (as the vLLM engine)."""
        return self._stage


def simulated_shard_factory(
    prefix: str,
    *,
    generation_s: float = 0.01,
    namespace: str | None = None,
    shard_class: type[SimulatedShard] = SimulatedShard,
    serve_http: bool = False,
    resources: Callable[[int], Mapping[str, float]] | None = None,
    **options: Any,
) -> ShardFactory:
    """A factory of named simulated shard actors (no CPU reserved: they mostly wait).

    ``shard_class`` may add methods (e.g. ``SimulatedRefitShard``'s communicator member);
    ``serve_http``: each also serves its OpenAI-compatible app (its base URL).
    ``resources``: the custom Ray resources shard ``i`` asks for (to place it on a node).
    ``options``: passed to the shard class as they are (``SimulatedRefitShard``'s
    ``reload_s``, ``startup_s``, ``stage_dir``).
    """
    actor_class = ray.remote(shard_class)

    def create(shard: int) -> ActorHandle:
        return actor_class.options(
            name=shard_actor_name(prefix, shard),
            namespace=namespace,
            num_cpus=0,
            max_restarts=0,  # restarts are decisions: the controller records and makes them
            resources=dict(resources(shard)) if resources is not None else None,
        ).remote(shard, generation_s=generation_s, serve_http=serve_http, **options)

    return create
