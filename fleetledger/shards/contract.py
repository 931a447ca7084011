"""The shard contract: everything the fleet asks of an engine's actor, in one interface.

The fleet (``fleetledger.controller.ray_fleet``) calls an engine's actor only through
the methods declared here — never a method found by name or probed with ``hasattr`` —
so an engine that implements this class is an engine the fleet can run, and a method
the fleet starts calling is a method added here first. Four methods are required (is it
alive, generate one completion, which weights does it hold, "you now hold version v"
after a refit); three are optional, with defaults that say "this engine has nothing of
the kind" (:class:`OptionalShardMethods` lists them): its base URL, its process id, the
processes it started. Engines (``fleetledger.engines``: the simulated one, a vLLM one)
implement it inside a Ray actor; nothing here assumes which.

Every method is ``async`` on purpose: a Ray actor whose methods are coroutines runs them
on one event loop, so a generation that hangs (a wedged engine) does not stop
``is_alive`` from answering — which is exactly the failure only the *reported* streak
can catch, and an engine must be able to show it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from fleetledger.errors import FleetledgerError


class EngineDead(FleetledgerError, RuntimeError):
    """The engine under a live actor is gone: raised by ``is_alive`` and ``generate``.

    Ray's liveness sees only the actor's process. A vLLM engine core that dies under it
    (killed, out of memory) leaves an actor that answers every call while nothing can
    generate again; the fleet records this as the shard's death, as conclusively as an
    actor death, so traffic moves at once instead of after a streak of failures — as the
    engine's death (``what="engine"``), never the actor's: the actor was alive.
    """

    @property
    def message(self) -> str:
        """The engine's own account, its first line: what the ledger records for its death.

        Read it from the exception the engine raised (``runtime_deaths.engine_death_of`` finds
        it), not from Ray's task error around it, whose text is the remote traceback.
        """
        lines = [line.strip() for line in str(self).splitlines() if line.strip()]
        return lines[0] if lines else type(self).__name__


__all__ = [
    "EngineDead",
    "Generation",
    "GenerationRequest",
    "GenerationShard",
    "OptionalShardMethods",
    "RolloutDataFailure",
    "RolloutFailure",
    "checked_weight_version",
    "ray_address",
]


# ── what an engine raises besides EngineDead ───────────────────────────────────


class RolloutFailure(FleetledgerError):
    """A rollout attempt failed; carries the coordinates a raw traceback lacks.

    Story: a bare generation traceback did not say which prompt or trajectory it
    belonged to, so failures are raised typed, with shard/prompt/group attached.
    """

    default_reason = "rollout_failure"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        shard: int | str | None = None,
        prompt_id: object = None,
        group_id: object = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason
        self.shard = shard
        self.prompt_id = prompt_id
        self.group_id = group_id

    def __str__(self) -> str:
        coords = [
            f"{name}={value}"
            for name, value in (
                ("shard", self.shard),
                ("prompt", self.prompt_id),
                ("group", self.group_id),
            )
            if value is not None
        ]
        base = super().__str__()
        return f"{base} [{' '.join(coords)}]" if coords else base


class RolloutDataFailure(RolloutFailure):
    """Data: the failure is the prompt's own; another shard would fail identically.

    Raising it explicitly always wins over any infrastructure error in the chain.
    """

    default_reason = "data_failure"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation turn of one attempt of one prompt."""

    prompt_id: str
    group_id: str
    prompt: str
    max_tokens: int = 16


@dataclass(frozen=True, slots=True)
class Generation:
    """A completed generation, stamped with the shard and the weights that produced it,
    as the engine attests them: ``weight_version`` at its first token,
    ``weight_version_end`` at its last (they differ when a refit landed mid-generation;
    None: the engine did not say, read it as the start's), ``weights_partial`` where
    the engine served from weights a cut load left partial. ``-1``: nobody said which
    weights (an answer over HTTP from an engine that does not attest)."""

    prompt_id: str
    group_id: str
    shard: int
    weight_version: int
    text: str
    tokens: int
    weight_version_end: int | None = None
    weights_partial: bool = False

    @property
    def version_end(self) -> int:
        """The version at the last token (the start's where the engine did not say)."""
        return self.weight_version if self.weight_version_end is None else self.weight_version_end


class GenerationShard(ABC):
    """The controller's view of one engine (run as a Ray actor, one per shard)."""

    @abstractmethod
    async def is_alive(self, deep: bool = False) -> bool:
        """Answer a liveness probe. Must not wait behind generations.

        ``deep``: also prove the engine can generate (a one-token completion); the
        caller bounds it. A wedged engine answers a shallow probe and hangs a deep one,
        so deep probes condemn it in threshold × interval. Raise :class:`EngineDead`
        when the engine itself is gone.
        """

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> Generation:
        """Generate one completion, or raise; never return a placeholder result."""

    @abstractmethod
    async def weight_version(self) -> int:
        """The weight version this engine serves."""

    @abstractmethod
    async def set_weight_version(self, version: int) -> int:
        """Told after a refit that included this shard completed; returns the version."""

    # ── optional: the defaults say "nothing of the kind" ────────────────────

    async def base_url(self) -> str | None:
        """Where this engine is reached: an engine that serves HTTP overrides it with its
        OpenAI-compatible ``.../v1``; by default the actor's own address,
        ``ray://<actor name>`` (``ray://<actor id>`` when unnamed), so an engine reached
        only through Ray still has an address to record and ``fleet_config`` never meets
        a missing one. ``None`` only outside a Ray actor. Asked at the start and of every
        replacement, so ``replacement_loaded`` records where the new engine listens."""
        return ray_address()

    async def pid(self) -> int:
        """The actor's process: what a SIGKILL or SIGSTOP of the whole shard hits."""
        return os.getpid()

    async def child_processes(self) -> list[dict[str, object]]:
        """The processes the engine started beside its actor (a vLLM engine core), as
        :class:`~fleetledger.shards.reaping.ProcessRecord` fields, asked once the actor is
        ready: the fleet reaps them after killing the actor. None by default."""
        return []


class OptionalShardMethods(Protocol):
    """The optional part of the contract, as a protocol: the methods
    :class:`GenerationShard` implements with a default an engine may override."""

    async def base_url(self) -> str | None: ...

    async def pid(self) -> int: ...

    async def child_processes(self) -> list[dict[str, object]]: ...


def ray_address() -> str | None:
    """``ray://<actor name>`` (or ``ray://<actor id>``) of the Ray actor this runs in;
    ``None`` outside one (Ray is imported only when asked)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        actor = context.get_actor_name() or context.get_actor_id()
    except Exception:  # not in a Ray worker, or a runtime that cannot say
        return None
    return f"ray://{actor}" if actor else None


def checked_weight_version(shard: int, held: int, version: int) -> int:
    """``version``, if an engine holding ``held`` may be told it now serves it: weights
    only move forward (an older version is a refit bookkeeping bug, not an update)."""
    if version < held:
        raise ValueError(
            f"shard {shard}: weight version {version} is older than the {held} it holds"
        )
    return version
