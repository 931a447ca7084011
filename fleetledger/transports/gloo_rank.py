"""One process's side of the refit communicator on torch.distributed (gloo on CPU).

Every trainer rank and every generation worker holds a :class:`CommunicatorMember`. It
never touches the default process group — vLLM creates its own in the engine process, and
a second ``init_process_group`` would collide with it — but builds a dedicated
``ProcessGroupGloo`` per rebuild over a fresh ``TCPStore``. (On GPUs the same member
would build NCCL over the same store; the contract does not change.)

Rules carried from the failure stories:

- **Bind first, release afterwards, and never on a hot thread.** Rank 0 (always a
  trainer) opens the new store before anyone joins; the previous group is released only
  once the new one exists. Released means handed to the graveyard (:class:`_Graveyard`):
  one daemon thread per process that aborts the group (NCCL's abort can block forever;
  on gloo in torch 2.13 it is a no-op) and *holds* it until no collective is parked in
  it any more, and only then drops it. Story: a gloo group's destructor joins its worker
  threads, so it waits for an op still parked in it — up to the op timeout. The group
  used to be dropped wherever its last reference went, and that was often the traceback
  of the push that left it (an exception cycle freed by the garbage collector on the
  actor's event-loop thread): both survivors of a kill at refit time stopped answering
  probes for over 1.5 s and were condemned as dead. Nothing of ours keeps a group in a
  frame that an exception carries away (:meth:`CommunicatorMember.broadcast` lets go of
  it before it raises), and whoever drops the last reference after the graveyard did,
  drops a group with no op parked in it: its destructor returns at once.
- **Abort, never destroy**: destroying is a collective that a dead rank cannot join.
- **Every push is bounded** by ``refit_timeout_s`` (``None``: unbounded, explicitly):
  each collective by the group's op timeout, and the whole push by a deadline checked
  while it waits (the op timeout alone would allow one timeout per tensor).
- **A push in flight can be aborted.** A gloo survivor may see no error at all when a
  peer dies: measured here, killing an interior rank of the broadcast tree leaves every
  survivor — the root too — parked until the op timeout, 300 s by default. Since
  ``abort()`` is a no-op in gloo, the member waits for each collective in short slices
  (``Work.wait(slice)``) and leaves, raising :class:`CollectiveAborted`, once its group
  is aborted (:meth:`CommunicatorMember.abort`, or a newer build replacing it). What
  stays parked is gloo's own worker thread inside the old group, which nothing reuses:
  the next build is a new group with threads of its own, joined on a thread of its own
  (``ray_members``), and a receiver takes fresh buffers so the orphaned receive cannot
  write into the weights the next push verifies.

The errors a push raises are typed, so the controller side can tell a communication
failure (:class:`PeerLost`, :class:`CollectiveTimedOut`), an aborted group
(:class:`CollectiveAborted`, :class:`NoCommunicator`) and a deterministic error (any
other exception: a bug, a mismatch) apart without reading messages.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CollectiveAborted",
    "CollectiveTimedOut",
    "CommunicatorMember",
    "NoCommunicator",
    "PeerLost",
    "TensorSpec",
    "checksum",
]

TensorSpec = Mapping[str, tuple[tuple[int, ...], str]]
"""Parameter name → (shape, dtype name): what a receiver allocates to receive into."""

STORE_HOST = "127.0.0.1"
"""Where rank 0's store listens by default: loopback, right when every rank is on one
machine. A fleet across machines passes the trainer's reachable address instead
(``GlooBroadcastSynchronizer(store_host=...)``) and sets ``GLOO_SOCKET_IFNAME`` to the
interface the ranks share."""

ABORT_POLL_S = 0.1
"""How often a member waiting in a collective looks whether its group was aborted."""

UNBOUNDED = timedelta(days=365)
"""The op timeout of a group built with ``collective_timeout_s=None``: gloo needs a
finite one, and a year is unbounded for a refit (aborting still releases the wait)."""


class PeerLost(RuntimeError):
    """The collective itself failed: a peer closed or reset its connection."""


class CollectiveTimedOut(TimeoutError):
    """The push exceeded ``refit_timeout_s``: gloo's op timeout, or the push's deadline."""


class CollectiveAborted(RuntimeError):
    """This member's group was aborted (or replaced by a newer build) mid-collective."""


class NoCommunicator(RuntimeError):
    """A push arrived with no group (never built, or aborted): rebuild first."""


def _collective_error(exc: BaseException, where: str) -> Exception:
    """gloo's (or the store's) own error, typed: every gloo error is a plain
    ``RuntimeError`` — the store's are ``DistError`` subclasses of it — and its text says
    whether the wait timed out or a connection went. Raised only around torch's
    communication calls, so our own checks' errors stay what they are."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if "timed out" in text.lower():
        return CollectiveTimedOut(f"{where}: {text}")
    return PeerLost(f"{where}: {text}")


def checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 over the tensors' bytes in name order: what every receiver must match."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


class _Communicator:
    """One build's group, the store it was built over, and the collectives parked in it.

    ``aborted`` is set when the build is aborted or replaced: a push waiting in it
    leaves. ``parked`` holds the ``Work`` of every collective a push left behind (gloo
    cannot cancel it), ``pushes`` counts the pushes still inside: the graveyard drops the
    group only once no push is inside and every parked collective completed.
    """

    __slots__ = (
        "__weakref__",
        "_lock",
        "aborted",
        "buried",
        "group",
        "parked",
        "pushes",
        "store",
    )

    def __init__(self, group: Any, store: Any) -> None:
        self.group = group
        self.store = store
        self.aborted = threading.Event()
        self.parked: list[Any] = []
        self.pushes = 0
        self.buried = 0.0  # when the graveyard took it (monotonic seconds)
        self._lock = threading.Lock()

    def enter(self) -> None:
        with self._lock:
            self.pushes += 1

    def leave(self, parked: Any = None) -> None:
        """A push leaves, leaving ``parked`` behind (its collective's ``Work``) if given."""
        with self._lock:
            if parked is not None:
                self.parked.append(parked)
            self.pushes -= 1

    def settled(self) -> bool:
        """No push of ours is inside the group and no collective is parked in it."""
        with self._lock:
            # A push that has not seen the abort yet would drop the last reference itself
            # on its way out, and wait out its op there.
            return self.pushes == 0 and all(work.is_completed() for work in self.parked)


class _Graveyard:
    """Aborted communicators, held until nothing is parked in them, dropped off hot threads.

    One daemon thread per process, started with the first burial. It aborts each group
    (a no-op on gloo; NCCL's may block, and blocks only this thread), keeps it while any
    collective is parked in it, and drops it once they all completed — so the group's
    destructor, which joins gloo's worker threads, never waits for an op and never runs
    on a thread that answers probes. The held groups live in this thread's own frame,
    which interpreter exit never tears down: a group whose op never completes (an
    unbounded op timeout) is not destroyed at exit either.
    """

    def __init__(self) -> None:
        self._arrivals: queue.SimpleQueue[_Communicator] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def bury(self, communicator: _Communicator) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="refit-graveyard", daemon=True
                )
                self._thread.start()
        self._arrivals.put(communicator)

    def _run(self) -> None:
        held: list[_Communicator] = []
        while True:
            try:
                arrived = self._arrivals.get(timeout=REAP_POLL_S if held else None)
            except queue.Empty:
                arrived = None
            if arrived is not None:
                try:
                    arrived.group.abort()
                except Exception:  # a group that cannot abort is held and dropped all the same
                    pass
                arrived.buried = time.monotonic()
                held.append(arrived)
                del arrived
            # The settled ones' destructors run here, with no op parked in them — and
            # not before every member had RELEASE_GRACE_S to hear of the abort: dropping
            # a group closes its connections, and a peer still parked would see its
            # receive fail (a lost peer) instead of the abort it is about to be told of.
            now = time.monotonic()
            held = [
                communicator
                for communicator in held
                if not (communicator.settled() and now - communicator.buried >= RELEASE_GRACE_S)
            ]


REAP_POLL_S = 0.2
"""How often the graveyard looks whether a held group's parked collectives completed."""

RELEASE_GRACE_S = 2.0
"""How long an aborted group is held at least: the abort reaches every member within
milliseconds (an event-loop call), so by then each has left on the abort it was told."""

GRAVEYARD = _Graveyard()


class CommunicatorMember:
    """This process's membership in the refit communicator, one build at a time."""

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
        # gloo must use loopback on these machines (docs/reference.md M1); a caller may override.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.version = 0
        self._current: _Communicator | None = None
        self._pending_store: Any = None
        self._collective_timeout_s: float | None = 300.0
        self._lock = threading.Lock()
        self.in_flight = 0  # pushes inside a collective now (parked ones included)
        self.build: int | None = None
        self.rank: int | None = None
        self.world_size: int | None = None
        # Builds (number, store port) aborted while their rendezvous was still running:
        # when such a join completes after all, its group is buried, never installed.
        # The port too: a controller restarted over these members numbers from 1 again.
        self._aborted_builds: set[tuple[int, int]] = set()

    # ── building ────────────────────────────────────────────────────────────

    def open_store(self, world_size: int, timeout_s: float, host: str = STORE_HOST) -> int:
        """Rank 0 only: bind a fresh store on a free port of ``host`` and return the port.

        ``timeout_s`` bounds the rendezvous (see :meth:`join`)."""
        try:
            store = dist.TCPStore(
                host,
                0,
                world_size,
                True,
                timeout=timedelta(seconds=timeout_s),
                wait_for_workers=False,
            )
        except RuntimeError as exc:  # torch's DistError family: the network, not a bug
            raise _collective_error(exc, f"opening the store of a world of {world_size}") from exc
        self._pending_store = store
        return int(store.port)

    def join(
        self,
        build: int,
        port: int,
        world_size: int,
        rank: int,
        timeout_s: float,
        collective_timeout_s: float | None,
        host: str = STORE_HOST,
    ) -> dict[str, int]:
        """Join build ``build`` as ``rank`` of ``world_size`` (rank 0's store at
        ``host:port``); release the previous group.

        ``timeout_s`` bounds the rendezvous, ``collective_timeout_s`` every collective of
        the group afterwards (``None``: unbounded, but abortable). They are apart on
        purpose: measured here, about one rendezvous in five over 8 ranks stalls for ~5 s
        before it completes, so a refit timeout sized for the transfer must not also be
        the rendezvous budget.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            if self._pending_store is None:
                raise RuntimeError("rank 0 must open the store (open_store) before joining")
            store, self._pending_store = self._pending_store, None
        try:
            if rank != 0:
                store = dist.TCPStore(host, port, world_size, False, timeout=timeout)
            group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        except RuntimeError as exc:  # the rendezvous: a peer gone, a connect timed out
            raise _collective_error(exc, f"joining build {build} as rank {rank}") from exc
        group.set_timeout(
            UNBOUNDED if collective_timeout_s is None else timedelta(seconds=collective_timeout_s)
        )
        joined = _Communicator(group, store)
        del group, store  # held by the communicator alone
        with self._lock:
            # Story: a build aborted mid-rendezvous (a participant recorded dead while
            # the others waited for it) is followed at once by the next build; the old
            # rendezvous may still complete afterwards and must not replace the new
            # group, nor resurrect the build the controller gave up.
            if (build, port) in self._aborted_builds:
                self._aborted_builds.discard((build, port))
                joined.aborted.set()
                GRAVEYARD.bury(joined)
                raise CollectiveAborted(
                    f"build {build} completed after it was aborted: not installed"
                )
            self._collective_timeout_s = collective_timeout_s
            old, self._current = self._current, joined
            self.build, self.rank, self.world_size = build, rank, world_size
        if old is not None:
            old.aborted.set()  # a push still parked in the old group leaves it
            GRAVEYARD.bury(old)
        return {"build": build, "rank": rank, "world_size": world_size}

    def abort(self, build: int | None = None, port: int | None = None) -> bool:
        """Abort the current group and release a push parked in it (the group goes to the
        graveyard, never dropped here). True if there was one.

        ``build``: abort only if the current group is that build — an abort that arrives
        late, after a newer build was joined, must not tear down the new communicator.
        With ``port`` (its store's), an abort of a build not joined yet — its rendezvous
        still running — refuses that join when it completes.
        """
        with self._lock:
            if build is not None and build != self.build:
                if port is not None:
                    self._aborted_builds.add((build, port))
                return False
            old, self._current = self._current, None
        if self.in_flight and self.rank != 0:
            # The orphaned receive stays parked inside gloo, writing into these buffers
            # if it ever completes: take fresh ones (the values are partial either way).
            self.tensors = {name: t.clone() for name, t in self.tensors.items()}
        if old is None:
            return False
        old.aborted.set()
        GRAVEYARD.bury(old)
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
        communicator, tensors = self._current, self.tensors
        if communicator is None:
            raise NoCommunicator("no communicator: reconcile before pushing")
        if not tensors:
            raise RuntimeError("no tensors to push or receive into (allocate first)")
        limit = self._collective_timeout_s
        deadline = None if limit is None else time.monotonic() + limit
        with self._lock:
            self.in_flight += 1
        failure: Exception | None = None
        parked: Any = None
        communicator.enter()
        try:
            _broadcast_all(communicator, tensors, deadline, limit, f"push of v{version}")
        except _LeftParked as left:
            parked, failure = left.work, left.failure
        except Exception as exc:
            failure = exc
        finally:
            communicator.leave(parked)
            del communicator, parked
            with self._lock:
                self.in_flight -= 1
        if failure is not None:
            # Raised outside the handler and without its traceback: no frame that holds
            # the group travels with it. The group lives in the member and, once aborted,
            # in the graveyard — never in a traceback that a garbage collection on the
            # event-loop thread would be the one to free.
            raise _detached(failure)
        self.version = version
        return {
            "rank": self.rank,
            "version": version,
            "checksum": checksum(tensors),
            "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        }


class _LeftParked(Exception):
    """A push left its collective parked (aborted, or past its deadline): the ``Work``
    it leaves behind, and the failure the caller gets."""

    def __init__(self, work: Any, failure: Exception) -> None:
        super().__init__(str(failure))
        self.work = work
        self.failure = failure


def _detached(exc: Exception) -> Exception:
    """``exc`` without its traceback or the exceptions it was raised from (their frames
    hold the communicator); its message says where it failed."""
    exc.__traceback__ = exc.__context__ = exc.__cause__ = None
    return exc


def _broadcast_all(
    communicator: _Communicator,
    tensors: Mapping[str, torch.Tensor],
    deadline: float | None,
    limit: float | None,
    where: str,
) -> None:
    """Every tensor, by name, from rank 0; waited for in slices (see :func:`_wait`)."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    for name in sorted(tensors):
        work = communicator.group.broadcast([tensors[name]], opts)
        _wait(work, communicator, deadline, limit, f"{where}, tensor {name!r}")


def _wait(
    work: Any,
    communicator: _Communicator,
    deadline: float | None,
    limit: float | None,
    where: str,
) -> None:
    """Wait for one collective in slices; leave when aborted or past the deadline.

    Leaving raises :class:`_LeftParked` with the collective still parked: the push hands
    it to its communicator, which the graveyard holds until it completed."""
    poll = timedelta(seconds=ABORT_POLL_S)
    while True:
        try:
            work.wait(poll)
            return
        except RuntimeError:
            if work.is_completed() and communicator.aborted.is_set():
                # Failed because we aborted: a peer's group, aborted too, went away.
                raise CollectiveAborted(f"{where}: the communicator was aborted") from None
            if work.is_completed():  # the op itself failed, not our slice of waiting
                try:
                    work.wait()  # its own error, not the slice's "Operation timed out!"
                except RuntimeError as failed:
                    raise _collective_error(failed, where) from None
                return
        left = None
        if communicator.aborted.is_set():
            left = CollectiveAborted(f"{where}: the communicator was aborted")
        elif deadline is not None and time.monotonic() > deadline:
            left = CollectiveTimedOut(f"{where}: exceeded refit_timeout_s={limit:g}")
        if left is not None:
            raise _LeftParked(work, left)
