"""What the controller may ask of a generation shard, and a simulated shard that answers.

The interface is the least the controller needs from an engine: is it alive, generate
one completion, which weights does it hold, and "you now hold version v" after a refit.
A real vLLM engine implements it inside a Ray actor exactly as the simulation does; no
method here assumes a simulation (faults and process ids are the simulation's own
extras, used by the chaos tests and ``fleetledger simulate``).

Every method is ``async`` on purpose: a Ray actor whose methods are coroutines runs them
on one event loop, so a generation that hangs (a wedged engine) does not stop
``is_alive`` from answering — which is exactly the failure only the *reported* streak
can catch, and the simulation must be able to produce it.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FAULTS",
    "Fault",
    "Generation",
    "GenerationRequest",
    "GenerationShard",
    "SimulatedShard",
]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation turn of one attempt of one prompt."""

    prompt_id: str
    group_id: str
    prompt: str
    max_tokens: int = 16


@dataclass(frozen=True, slots=True)
class Generation:
    """A completed generation, stamped with the shard and the weights that produced it."""

    prompt_id: str
    group_id: str
    shard: int
    weight_version: int
    text: str
    tokens: int


class GenerationShard(ABC):
    """The controller's view of one engine (run as a Ray actor, one per shard)."""

    @abstractmethod
    async def is_alive(self) -> bool:
        """Answer a liveness probe. Must not wait behind generations."""

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> Generation:
        """Generate one completion, or raise; never return a placeholder result."""

    @abstractmethod
    async def weight_version(self) -> int:
        """The weight version this engine serves."""

    @abstractmethod
    async def set_weight_version(self, version: int) -> int:
        """Told after a refit that included this shard completed; returns the version."""


Fault = Literal["none", "fail", "error", "hang"]
FAULTS: tuple[Fault, ...] = ("none", "fail", "error", "hang")


class SimulatedShard(GenerationShard):
    """A shard whose generation takes ``generation_s`` and can be told to misbehave.

    Faults (``set_fault``): ``fail`` raises a transport error (infrastructure: the
    adapter should retry elsewhere), ``error`` raises the engine's over-long-prompt
    ``ValueError`` (data), ``hang`` parks every generation forever while probes still
    answer (the wedged engine). Killing and freezing are done from outside with real
    signals on :meth:`pid`.
    """

    def __init__(self, index: int, *, generation_s: float = 0.01, weight_version: int = 0) -> None:
        if index < 0:
            raise ValueError(f"shard index must be >= 0, got {index}")
        if generation_s < 0:
            raise ValueError(f"generation_s must be >= 0, got {generation_s}")
        self._index = index
        self._generation_s = generation_s
        self._weight_version = weight_version
        self._fault: Fault = "none"
        self._fault_left: int | None = None  # generations the fault still applies to
        self._served = 0

    # ── the interface ───────────────────────────────────────────────────────

    async def is_alive(self) -> bool:
        return True

    async def generate(self, request: GenerationRequest) -> Generation:
        fault = self._take_fault()
        if fault == "hang":
            await asyncio.Event().wait()  # never set: the wedged engine
        await asyncio.sleep(self._generation_s)
        if fault == "fail":
            raise ConnectionResetError(f"shard {self._index}: engine connection reset")
        if fault == "error":
            raise ValueError(
                f"shard {self._index}: prompt {request.prompt_id} exceeds the maximum context "
                "length"
            )
        self._served += 1
        text = f"{request.prompt} → shard {self._index} @ v{self._weight_version}"
        return Generation(
            prompt_id=request.prompt_id,
            group_id=request.group_id,
            shard=self._index,
            weight_version=self._weight_version,
            text=text,
            tokens=request.max_tokens,
        )

    async def weight_version(self) -> int:
        return self._weight_version

    async def set_weight_version(self, version: int) -> int:
        if version < self._weight_version:
            raise ValueError(
                f"shard {self._index}: weight version {version} is older than the "
                f"{self._weight_version} it holds"
            )
        self._weight_version = version
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
