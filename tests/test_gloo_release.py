"""An aborted gloo group is released where its destructor cannot stall a survivor.

Story: a kill as a refit started aborted the communicator under a push; about
0.7 s later both survivors stopped answering probes for over 1.5 s and were condemned.
A gloo group's destructor joins its worker threads, so it waits for an op still parked
in it — until the op timeout. The group was dropped wherever its last reference went:
often the traceback of the push that left it, freed by a garbage collection on the
actor's event-loop thread. Measured with the members below (op timeout 20 s): dropping
the aborted push's failure took 19.08 s before the graveyard, 0.14 s after.

Three real gloo members in this process (threads, a real TCPStore on loopback): rank 1
pushes while the root never does, so its collective is parked for real.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[dev]'")

from fleetledger.transports.gloo_rank import (  # noqa: E402
    CollectiveAborted,
    CommunicatorMember,
)

OP_TIMEOUT_S = 120.0
"""The parked collective's own timeout: what a stalled survivor would wait for."""


@pytest.fixture
def members() -> Iterator[list[CommunicatorMember]]:
    members = [CommunicatorMember({"w": torch.zeros(1024)}) for _ in range(3)]
    port = members[0].open_store(3, 30.0)
    joins = [
        threading.Thread(target=m.join, args=(1, port, 3, rank, 30.0, OP_TIMEOUT_S))
        for rank, m in enumerate(members)
    ]
    for t in joins:
        t.start()
    for t in joins:
        t.join()
    yield members
    for m in members:
        m.abort()


def _parked_push_aborted(member: CommunicatorMember) -> BaseException:
    """Rank ``member`` pushes alone (its collective parks), is aborted, and leaves."""
    failures: list[BaseException] = []

    def push() -> None:
        try:
            member.broadcast(1)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=push)
    thread.start()
    while not member.in_flight:
        threading.Event().wait(0.01)
    threading.Event().wait(0.3)  # inside gloo's wait, not before it
    assert member.abort(1)
    thread.join()
    (failure,) = failures
    return failure


def _frames(exc: BaseException) -> Iterator[object]:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        link = todo.pop()
        if link is None or id(link) in seen:
            continue
        seen.add(id(link))
        tb = link.__traceback__
        while tb is not None:
            yield tb.tb_frame
            tb = tb.tb_next
        todo += [link.__cause__, link.__context__]


def test_an_aborted_push_carries_no_frame_that_holds_its_group(members):
    failure = _parked_push_aborted(members[1])
    assert isinstance(failure, CollectiveAborted)
    held = [
        name
        for frame in _frames(failure)
        for name, value in frame.f_locals.items()  # type: ignore[attr-defined]
        if "ProcessGroup" in type(value).__name__ or type(value).__name__ == "_Communicator"
    ]
    assert held == []


def test_the_graveyard_holds_the_group_while_its_collective_is_parked(members):
    communicator = weakref.ref(members[1]._current)
    failure = _parked_push_aborted(members[1])
    del failure
    gc.collect()
    # Rank 1's receive is still parked (the root never sent): the group is held, not
    # dropped — dropping it would make its destructor wait out the op timeout.
    assert communicator() is not None
    assert communicator().parked and not communicator().settled()
    # The others leave the group: the parked receive fails, and the graveyard lets go.
    for m in members:
        m.abort()
    deadline = threading.Event()
    while communicator() is not None and not deadline.wait(0.05):
        gc.collect()
    assert communicator() is None


def test_dropping_an_aborted_push_does_not_wait_for_its_parked_collective(members):
    failures = [_parked_push_aborted(members[1])]
    # Dropped and collected on another thread, as the event loop's collector would: it
    # returns long before the parked op's timeout (it used to wait the timeout out).
    dropped = threading.Event()

    def drop() -> None:
        failures.clear()
        gc.collect()
        dropped.set()

    threading.Thread(target=drop, daemon=True).start()
    assert dropped.wait(OP_TIMEOUT_S / 4), "dropping the failure waited for the parked op"
