"""Communicator members as Ray actor methods: trainer ranks and generation workers.

``CommunicatorActor`` is a mixin for *async* Ray actors (a generation shard is one): the
collective calls run on a worker thread, so the actor's event loop keeps answering
liveness probes while a push is in flight — a probe that waited behind a hung collective
would condemn the wrong shard. Each collective call gets a thread of its own, so a call
parked in an aborted group never holds up the next build's join (nor interpreter exit).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from fleetledger.transports.gloo_rank import (
    STORE_HOST,
    CommunicatorMember,
    TensorSpec,
    checksum,
)

__all__ = [
    "CommunicatorActor",
    "GenerationWorker",
    "TrainerRank",
    "make_parameters",
    "parameters_of",
]

T = TypeVar("T")


async def _on_daemon_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking collective call off the event loop on a thread of its own.

    Not ``asyncio.to_thread``: its pool has a handful of non-daemon threads, so a few
    wedged collectives would queue the next rebuild's join behind them (the member would
    look silent) and hold up interpreter exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, result, None)

    threading.Thread(target=run, name="refit-collective", daemon=True).start()
    return await future


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


class CommunicatorActor:
    """Refit methods for an async Ray actor; the member is created on first use."""

    _refit_member: CommunicatorMember | None = None
    # The generation side must be told a build's membership before it joins it (the
    # engine needs its new rank offsets); trainers are never excluded and need not be.
    _refit_needs_membership: bool = True
    _refit_announced: tuple[int, dict[str, Any]] | None = None
    # Where a push lands. False: in place — the received tensors are the weights this
    # member serves, so a receive that began is a load that began. True: into staging
    # buffers, loaded afterwards; the engine calls ``refit_load_begins`` when it starts
    # loading (the simulated and the vLLM engine do).
    _refit_staged: bool = False
    _refit_loading: int | None = None  # the version whose load this member last began

    def _member(self) -> CommunicatorMember:
        if self._refit_member is None:
            self._refit_member = CommunicatorMember()
        return self._refit_member

    async def refit_open_store(
        self, world_size: int, timeout_s: float, host: str = STORE_HOST
    ) -> int:
        return self._member().open_store(world_size, timeout_s, host)

    async def refit_membership(self, build: int, layout: dict[str, Any]) -> int:
        """Told the membership of build ``build`` (its rank layout) before joining it."""
        self._refit_announced = (build, layout)
        return build

    async def refit_join(
        self,
        build: int,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float,
        collective_timeout_s: float | None,
        host: str = STORE_HOST,
    ) -> dict[str, int]:
        announced = self._refit_announced
        if self._refit_needs_membership and (announced is None or announced[0] != build):
            told = "nothing" if announced is None else f"build {announced[0]}"
            raise RuntimeError(
                f"asked to join build {build} but told the membership of {told}: the "
                "generation side must hear the new membership before the build"
            )
        return await _on_daemon_thread(
            self._member().join,
            build,
            port,
            world_size,
            rank,
            timeout_s,
            collective_timeout_s,
            host,
        )

    async def refit_broadcast(self, version: int) -> dict[str, Any]:
        if not self._refit_staged:
            self.refit_load_begins(version)  # received in place: the receive is the load
        return await _on_daemon_thread(self._member().broadcast, version)

    def refit_load_begins(self, version: int) -> None:
        """This member starts changing the weights it serves to ``version``: from here on
        a failed refit may leave them partial (what an abort reports)."""
        self._refit_loading = version

    async def refit_abort(
        self, build: int | None = None, port: int | None = None
    ) -> dict[str, Any]:
        """Abort the group (only if it is ``build``, when given) and release a push parked
        in it; say whether it was aborted and which version's load this member last began
        (``loading``: ``None``, never). With ``port``, a join of that build still in its
        rendezvous is refused when it completes. On the event loop, not a thread: it only
        sets a flag and hands the group to the graveyard, so it answers even while a
        collective is parked."""
        return {"aborted": self._member().abort(build, port), "loading": self._refit_loading}

    async def refit_in_flight(self) -> int:
        """Pushes of this member still inside a collective (parked ones included)."""
        return self._member().in_flight

    async def refit_allocate(self, spec: TensorSpec) -> None:
        self._member().allocate(spec)

    async def refit_checksum(self) -> str:
        return checksum(self._member().tensors)

    def received_weights(self) -> Mapping[str, torch.Tensor]:
        """The weights the last push delivered to this member, by parameter name (a
        read-only mapping over the receive buffers, not a copy): what an engine loads
        once a push lands (in its ``refit_broadcast`` override, after ``super()``'s).
        Empty before the first allocation; overwritten by the next push."""
        return MappingProxyType(self._member().tensors)


def parameters_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s parameters by name, as the tensors it trains (detached, same storage).

    Refused in one line: a module without parameters, or one whose parameter is not
    contiguous (a broadcast sends a tensor's storage as it lies).
    """
    params = {name: p.detach() for name, p in module.named_parameters()}
    if not params:
        raise ValueError(f"{type(module).__name__} has no parameters to broadcast")
    for name, tensor in params.items():
        if not tensor.is_contiguous():
            raise ValueError(
                f"parameter {name!r} of {type(module).__name__} is not contiguous: a refit "
                "broadcasts storage as it lies; make it contiguous before training"
            )
    return params


def make_parameters(
    total_bytes: int, *, tensors: int = 8, seed: int = 0
) -> dict[str, torch.Tensor]:
    """A small model's parameters: ``tensors`` float32 tensors adding up to ~total_bytes."""
    if total_bytes < 4 * tensors:
        raise ValueError(f"total_bytes={total_bytes} is too small for {tensors} float32 tensors")
    generator = torch.Generator().manual_seed(seed)
    per_tensor = total_bytes // 4 // tensors
    return {
        f"layer{i}.weight": torch.randn(per_tensor, generator=generator) for i in range(tensors)
    }


class TrainerRank(CommunicatorActor):
    """A trainer rank: holds the parameters, changes them each step, is rank 0's root.

    ``module``: the caller's own model (a ``torch.nn.Module``), whose parameters are what
    this rank broadcasts — their names, shapes and dtypes, the very tensors (no copy), so
    what the optimizer changes in place is what the next refit pushes. A trainer actor
    subclasses this and hands its model over::

        class MyTrainer(TrainerRank):
            def __init__(self) -> None:
                self.model = torch.nn.Linear(16, 4)
                super().__init__(module=self.model)

    ``total_bytes`` instead: random parameters of about that size (benches and tests,
    with :meth:`train_step` to change them).
    """

    _refit_needs_membership = False

    def __init__(
        self,
        total_bytes: int | None = None,
        *,
        module: torch.nn.Module | None = None,
        seed: int = 0,
    ) -> None:
        if (total_bytes is None) == (module is None):
            raise ValueError(
                "TrainerRank: give the module whose parameters it broadcasts "
                "(module=), or total_bytes= for random test parameters; not both"
            )
        self._member().tensors = (
            parameters_of(module)
            if module is not None
            else make_parameters(int(total_bytes or 0), seed=seed)
        )

    async def train_step(self, version: int) -> str:
        """Change every parameter (deterministically for ``version``); return the checksum."""
        for tensor in self._member().tensors.values():
            tensor.mul_(0.5).add_(float(version))
        return checksum(self._member().tensors)

    async def spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return self._member().spec()


class GenerationWorker(CommunicatorActor):
    """A generation worker with nothing but its communicator membership (for tests)."""

    async def pid(self) -> int:
        return os.getpid()

    async def is_alive(self, deep: bool = False) -> bool:
        return True
