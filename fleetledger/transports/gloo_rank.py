"""One process's side of the refit communicator on torch.distributed (gloo on CPU).

Every trainer rank and every generation worker holds a :class:`CommunicatorMember`. It
never touches the default process group — vLLM creates its own in the engine process, and
a second ``init_process_group`` would collide with it — but builds a dedicated
``ProcessGroupGloo`` per rebuild over a fresh ``TCPStore``. (On GPUs the same member
would build NCCL over the same store; the contract does not change.)

Rules carried from the failure stories:

- **Bind first, release afterwards, and bound the release.** Rank 0 (always a trainer)
  opens the new store before anyone joins; the previous group is released only once the
  new one exists, on a daemon thread that is never joined: aborting a group whose peer
  is frozen can block forever (NCCL), and an ordinary worker thread would move that wedge
  to interpreter exit. (On gloo in torch 2.13 ``abort()`` is a no-op: the old group is
  simply dropped, and a survivor still inside its collective leaves at the op timeout.)
- **Abort, never destroy**: destroying is a collective that a dead rank cannot join.
- **Every push is bounded** by ``refit_timeout_s``: each collective by the group's op
  timeout, and the whole push by a deadline checked between tensors (the op timeout
  alone would allow one timeout per tensor). A gloo survivor may see no error at all
  when a peer dies.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CommunicatorMember", "TensorSpec", "checksum"]

TensorSpec = Mapping[str, tuple[tuple[int, ...], str]]
"""Parameter name → (shape, dtype name): what a receiver allocates to receive into."""

STORE_HOST = "127.0.0.1"


def checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the tensors' bytes in name order: what every receiver must match."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _release(group: Any, store: Any) -> None:
    """Abort a previous group without waiting for it (see the module docstring).

    The store travels with the group into the thread, so it stays bound until the
    group it serves has been aborted.
    """

    def release(group: Any, _store: Any) -> None:
        try:
            group.abort()
        except Exception:  # a group that cannot abort is dropped all the same
            pass

    threading.Thread(target=release, args=(group, store), name="refit-release", daemon=True).start()


class CommunicatorMember:
    """This process's membership in the refit communicator, one build at a time."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
        # gloo must use loopback on these machines (docs/reference.md M1); a caller may override.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.version = 0
        self._group: Any = None
        self._store: Any = None
        self._pending_store: Any = None
        self._collective_timeout_s = 300.0
        self.build: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None

    # ── building ────────────────────────────────────────────────────────────

    def open_store(self, world_size: int, timeout_s: float) -> int:
        """Rank 0 only: bind a fresh store on a free port and return the port.

        ``timeout_s`` bounds the rendezvous (see :meth:`join`)."""
        store = dist.TCPStore(
            STORE_HOST,
            0,
            world_size,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self._pending_store = store
        return int(store.port)

    def join(
        self,
        build: int,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float,
        collective_timeout_s: float,
    ) -> dict[str, int]:
        """Join build ``build`` as ``rank`` of ``world_size``; release the previous group.

        ``timeout_s`` bounds the rendezvous, ``collective_timeout_s`` every collective of
        the group afterwards. They are apart on purpose: measured here, about one
        rendezvous in five over 8 ranks stalls for ~5 s before it completes, so a refit
        timeout sized for the transfer must not also be the rendezvous budget.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            if self._pending_store is None:
                raise RuntimeError("rank 0 must open the store (open_store) before joining")
            store, self._pending_store = self._pending_store, None
        else:
            store = dist.TCPStore(STORE_HOST, port, world_size, False, timeout=timeout)
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        group.set_timeout(timedelta(seconds=collective_timeout_s))
        self._collective_timeout_s = collective_timeout_s
        old_group, old_store = self._group, self._store
        self._group, self._store = group, store
        self.build, self.rank, self.world_size = build, rank, world_size
        if old_group is not None:
            _release(old_group, old_store)
        return {"build": build, "rank": rank, "world_size": world_size}

    def abort(self) -> bool:
        """Abort the current group (bounded: on a daemon thread). True if there was one."""
        group, store = self._group, self._store
        self._group = self._store = None
        if group is None:
            return False
        _release(group, store)
        return True

    # ── pushing ─────────────────────────────────────────────────────────────

    def allocate(self, spec: TensorSpec) -> None:
        """A receiver allocates the tensors it will receive into."""
        self.tensors = {
            name: torch.zeros(shape, dtype=getattr(torch, dtype))
            for name, (shape, dtype) in spec.items()
        }

    def spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return {
            name: (tuple(t.shape), str(t.dtype).removeprefix("torch."))
            for name, t in self.tensors.items()
        }

    def broadcast(self, version: int) -> dict[str, Any]:
        """Take part in one push from rank 0; returns the checksum of what this rank holds."""
        group = self._group
        if group is None:
            raise RuntimeError("no communicator: reconcile before pushing")
        if not self.tensors:
            raise RuntimeError("no tensors to push or receive into (allocate first)")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        deadline = time.monotonic() + self._collective_timeout_s
        for name in sorted(self.tensors):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"push of v{version} exceeded refit_timeout_s="
                    f"{self._collective_timeout_s:g} before tensor {name!r}"
                )
            group.broadcast([self.tensors[name]], opts).wait()
        self.version = version
        return {
            "rank": self.rank,
            "version": version,
            "checksum": checksum(self.tensors),
            "bytes": sum(t.numel() * t.element_size() for t in self.tensors.values()),
        }
