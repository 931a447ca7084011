"""The broadcast transport on real gloo groups between Ray actor processes.

Every test checks that the layout the transport built is the ledger's layout at that
seq. Kills and freezes are real signals on the worker processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetledger.controller.ledger import Ledger
from fleetledger.projections.rank_layout import RankLayoutError
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[dev]'")

from fleetledger.transports.gloo_broadcast import (  # noqa: E402
    UNBOUNDED_SETTLE_S,
    GlooBroadcastSynchronizer,
)
from fleetledger.weight_sync import (  # noqa: E402
    NoCollective,
    Party,
    PushReport,
    ReconcileOutcome,
    RefitFailed,
    RefitFailureKind,
)
from tests.refit_fleet import SHARDS, Fleet  # noqa: E402


@pytest.fixture
def fleet(ray_cluster: str) -> Iterator[Fleet]:
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=3.0)
    yield fleet
    fleet.close()


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "refit", fleet_config(SHARDS, train_world_size=1))
    log.close()


def _reconcile(fleet: Fleet, ledger: Ledger, *, force: bool = False) -> ReconcileOutcome:
    outcome = fleet.sync.reconcile(ledger.view.absent, force=force)
    assert fleet.sync.built_layout == ledger.view.layout()  # the contract, every time
    return outcome


def test_build_push_and_every_receiver_verified(fleet, ledger):
    assert _reconcile(fleet, ledger) is ReconcileOutcome.REBUILT
    expected = fleet.step(1)
    report = fleet.sync.push(1)
    assert isinstance(report, PushReport)
    assert report.checksum == expected and report.world_size == 1 + SHARDS
    assert report.bytes >= 2_000_000 - 64
    assert {ray.get(w.refit_checksum.remote()) for w in fleet.workers} == {expected}


def test_unchanged_membership_does_not_rebuild_and_force_does(fleet, ledger):
    _reconcile(fleet, ledger)
    assert _reconcile(fleet, ledger) is ReconcileOutcome.UNCHANGED
    assert _reconcile(fleet, ledger) is ReconcileOutcome.UNCHANGED
    assert (fleet.sync.rebuilds, fleet.sync.skipped_rebuilds) == (1, 2)
    assert _reconcile(fleet, ledger, force=True) is ReconcileOutcome.REBUILT
    assert fleet.sync.rebuilds == 2
    fleet.step(1)
    fleet.sync.push(1)  # the forced rebuild is a working communicator


def test_a_shard_killed_at_a_step_boundary_is_left_out_of_the_next_build(fleet, ledger):
    _reconcile(fleet, ledger)
    fleet.step(1)
    fleet.sync.push(1)
    os.kill(fleet.pids[1], signal.SIGKILL)
    ledger.actor_died(1, "ActorDiedError: killed at the step boundary")
    assert _reconcile(fleet, ledger) is ReconcileOutcome.REBUILT
    assert fleet.sync.built_layout.survivors == (0, 2)
    assert fleet.sync.built_layout.world_size == 3
    expected = fleet.step(2)
    assert fleet.sync.push(2).checksum == expected
    survivors = [fleet.workers[0], fleet.workers[2]]
    assert {ray.get(w.refit_checksum.remote()) for w in survivors} == {expected}


def test_a_kill_in_the_middle_of_a_broadcast_fails_the_push_then_the_smaller_world_works(
    ray_cluster, ledger
):
    fleet = Fleet(total_bytes=80_000_000, refit_timeout_s=3.0)
    try:
        _reconcile(fleet, ledger)
        fleet.step(1)
        with ThreadPoolExecutor(1) as pool:
            push = pool.submit(fleet.sync.push, 1)
            time.sleep(0.01)  # the broadcast of 80 MB takes far longer than this
            os.kill(fleet.pids[2], signal.SIGKILL)
            with pytest.raises(RefitFailed) as failed:
                push.result(timeout=120)
        # The dead party is named (dead, or failed when its socket reset first).
        assert Party.shard(2) in {**failed.value.dead, **failed.value.errors}, str(failed.value)
        assert "shard 2: " in str(failed.value)  # messages still say it the old way
        assert failed.value.kind is RefitFailureKind.PEER_LOST  # recovered, not a bug
        ledger.actor_died(2, "ActorDiedError: killed mid-broadcast")
        # The absent set is new here; on the recovery path it is forced regardless.
        assert _reconcile(fleet, ledger, force=True) is ReconcileOutcome.REBUILT
        assert fleet.sync.built_layout.world_size == 3
        expected = fleet.step(2)
        assert fleet.sync.push(2).checksum == expected
    finally:
        fleet.close()


def test_a_frozen_receiver_is_named_silent_and_the_push_is_bounded(fleet, ledger):
    _reconcile(fleet, ledger)
    fleet.step(1)
    os.kill(fleet.pids[0], signal.SIGSTOP)
    with pytest.raises(RefitFailed) as failed:
        fleet.sync.push(1)
    assert failed.value.silent_shards == (0,)
    assert 0 in failed.value.named_shards  # where a silent participant must be found
    assert Party.shard(0) in failed.value.silent
    assert not failed.value.dead
    assert failed.value.kind is RefitFailureKind.TIMED_OUT
    os.kill(fleet.pids[0], signal.SIGCONT)


def test_no_survivors_is_an_error_and_the_record_is_unchanged(fleet, ledger):
    _reconcile(fleet, ledger)
    before = (fleet.sync.built_absent, fleet.sync.built_layout)
    with pytest.raises(RankLayoutError, match="no surviving shards"):
        fleet.sync.reconcile({0, 1, 2})
    assert (fleet.sync.built_absent, fleet.sync.built_layout) == before


def test_a_worker_must_be_told_the_membership_before_it_joins(fleet):
    with pytest.raises(ray.exceptions.RayTaskError, match="told the membership of nothing"):
        ray.get(fleet.workers[0].refit_join.remote(7, 1, 2, 1, 1.0, 1.0), timeout=60)


def test_a_push_before_any_build_fails_naming_no_party(fleet):
    with pytest.raises(RefitFailed, match="no communicator: reconcile first") as failed:
        fleet.sync.push(1)
    assert (failed.value.dead, failed.value.silent, failed.value.errors) == ({}, {}, {})


def test_a_transport_without_a_collective_says_not_applicable():
    loaded: list[int] = []

    def load(version: int) -> PushReport:
        loaded.append(version)
        return PushReport(version, 0, 0, "", 0.0)

    transport = NoCollective(load)
    assert transport.reconcile({1}, force=True) is ReconcileOutcome.NOT_APPLICABLE
    assert transport.built_layout is None  # nothing built: the coordinator checks no layout
    assert transport.push(3).version == 3 and loaded == [3]


# ── the settle window, unbounded refits, aborts that release, deterministic kinds ──


def test_the_settle_window_follows_the_refit_timeout_and_is_bounded_without_one():
    """Not a fixed 10 s: a survivor that sees no error leaves at its op timeout, which is
    the refit timeout. With no refit timeout the wait for stragglers is still bounded
    (the reference's rule: the abort the recovery sends is what releases them then). An
    explicit window is kept."""

    def sync(**bounds) -> GlooBroadcastSynchronizer:
        return GlooBroadcastSynchronizer([object()], {0: [object()]}, **bounds)

    assert sync(refit_timeout_s=300.0, grace_s=60.0).settle_s == 360.0
    assert sync(refit_timeout_s=3.0, grace_s=1.0).settle_s == 4.0
    assert sync(refit_timeout_s=None, grace_s=60.0).settle_s == UNBOUNDED_SETTLE_S == 60.0
    assert sync(refit_timeout_s=None, settle_s=9.0).settle_s == 9.0
    assert sync(refit_timeout_s=300.0, settle_s=7.0).settle_s == 7.0
    with pytest.raises(ValueError, match="refit_timeout_s must be > 0 or None"):
        sync(refit_timeout_s=0.0)


def test_an_unbounded_transport_builds_and_pushes(ray_cluster, ledger):
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=None)
    try:
        assert _reconcile(fleet, ledger) is ReconcileOutcome.REBUILT
        expected = fleet.step(1)
        assert fleet.sync.push(1).checksum == expected
    finally:
        fleet.close()


def _until_parked(fleet: Fleet, shards, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while set(fleet.in_flight(shards).values()) != {1}:
        assert time.monotonic() < deadline, f"the push never started: {fleet.in_flight(shards)}"
        time.sleep(0.02)


def test_abort_releases_the_survivors_parked_in_a_push_and_the_rebuild_works(ray_cluster, ledger):
    """SIGKILL of shard 1 (an interior rank of gloo's broadcast tree) leaves every
    survivor parked in the collective until the op timeout — 300 s here, the default.
    ``abort()`` releases them at once; the rebuild over the survivors is not held up by
    anything still inside the old group, and pushes."""
    fleet = Fleet(total_bytes=80_000_000, refit_timeout_s=300.0)
    try:
        _reconcile(fleet, ledger)
        fleet.step(1)
        os.kill(fleet.pids[1], signal.SIGSTOP)  # the push cannot complete before the kill
        with ThreadPoolExecutor(1) as pool:
            push = pool.submit(fleet.sync.push, 1)
            _until_parked(fleet, (0, 2))
            os.kill(fleet.pids[1], signal.SIGKILL)
            time.sleep(1.0)  # long past Ray's "actor died" (ms): the shards see nothing
            # (The root, whose send to the victim was pending, may see its socket close.)
            assert fleet.in_flight((0, 2)) | {"trainer 0": 1} == {
                "trainer 0": 1,
                "shard 0": 1,
                "shard 2": 1,
            }
            assert not push.done()
            fleet.sync.abort()
            with pytest.raises(RefitFailed) as failed:
                push.result(timeout=60)  # released: not the 300 s op timeout
        assert Party.shard(1) in failed.value.dead
        for party in (Party.shard(0), Party.shard(2)):
            assert failed.value.errors[party].startswith("CollectiveAborted"), str(failed.value)
        # Released by the abort, or it saw the dead peer first (gloo's error, read as its
        # cause: the peer and what became of the connection, events/causes.py).
        trainer = failed.value.errors[Party.trainer(0)]
        assert trainer.startswith(("CollectiveAborted", "communicator peer")), trainer
        assert failed.value.kind is RefitFailureKind.PEER_LOST  # the death speaks for it
        assert fleet.in_flight((0, 2)) == {"trainer 0": 0, "shard 0": 0, "shard 2": 0}
        assert (fleet.sync.built_absent, fleet.sync.built_layout) == (None, None)
        ledger.actor_died(1, "ActorDiedError: killed mid-broadcast")
        assert _reconcile(fleet, ledger, force=True) is ReconcileOutcome.REBUILT
        expected = fleet.step(2)
        assert fleet.sync.push(2).checksum == expected
        assert {ray.get(fleet.workers[s].refit_checksum.remote()) for s in (0, 2)} == {expected}
    finally:
        fleet.close()


def test_an_abort_gives_up_a_build_in_progress_and_the_next_build_works(fleet, ledger):
    """A member frozen as a build begins parks it (the membership call never returns);
    an abort from another thread — the coordinator's, when the ledger records the member
    dead — ends it at once as an abort, not a silent member at the end of the bound."""
    _reconcile(fleet, ledger)
    os.kill(fleet.pids[2], signal.SIGSTOP)
    with ThreadPoolExecutor(1) as pool:
        build = pool.submit(fleet.sync.reconcile, ledger.view.absent, force=True)
        deadline = time.monotonic() + 60
        while fleet.sync.building is None:
            assert time.monotonic() < deadline and not build.done(), "the build never began"
            time.sleep(0.01)
        fleet.sync.abort(gone={2})
        with pytest.raises(RefitFailed) as failed:
            build.result(timeout=60)
    assert failed.value.kind is RefitFailureKind.ABORTED
    assert (failed.value.stage, failed.value.silent) == ("membership", {})
    assert (fleet.sync.building, fleet.sync.built_layout) == (None, None)
    os.kill(fleet.pids[2], signal.SIGCONT)
    assert _reconcile(fleet, ledger) is ReconcileOutcome.REBUILT
    expected = fleet.step(1)
    assert fleet.sync.push(1).checksum == expected


def test_a_rendezvous_completing_after_its_build_was_aborted_is_not_installed(fleet, ledger):
    """The members are told the build was aborted while its rendezvous runs; when it
    completes after all, every member refuses it and keeps the communicator it had."""
    _reconcile(fleet, ledger)
    build, layout = fleet.sync.builds + 1, fleet.sync.built_layout
    members = [fleet.trainer, *fleet.workers]
    ray.get([w.refit_membership.remote(build, layout.as_dict()) for w in fleet.workers])
    port = ray.get(fleet.trainer.refit_open_store.remote(layout.world_size, 60.0), timeout=60)
    aborted = ray.get([m.refit_abort.remote(build, port) for m in members], timeout=60)
    assert [a["aborted"] for a in aborted] == [False] * len(members)  # not theirs yet
    joins = [
        m.refit_join.remote(build, port, layout.world_size, rank, 60.0, 3.0)
        for rank, m in enumerate(members)
    ]
    for join in joins:
        with pytest.raises(Exception, match="completed after it was aborted: not installed"):
            ray.get(join, timeout=120)
    expected = fleet.step(1)
    assert fleet.sync.push(1).checksum == expected  # the communicator they had still works


def test_a_late_abort_of_an_old_build_leaves_the_new_communicator_alone(fleet, ledger):
    _reconcile(fleet, ledger)
    old_build = fleet.sync.builds
    _reconcile(fleet, ledger, force=True)
    aborted = ray.get([w.refit_abort.remote(old_build) for w in fleet.workers], timeout=60)
    assert [a["aborted"] for a in aborted] == [False] * SHARDS
    expected = fleet.step(1)
    assert fleet.sync.push(1).checksum == expected


def test_a_checksum_mismatch_on_a_receiver_is_deterministic(ray_cluster, ledger):
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=3.0, faulty=2)
    try:
        _reconcile(fleet, ledger)
        ray.get(fleet.workers[2].arm_corruption.remote(), timeout=60)
        fleet.step(1)
        with pytest.raises(RefitFailed) as failed:
            fleet.sync.push(1)
        assert failed.value.stage == "verify"
        assert list(failed.value.errors) == [Party.shard(2)]
        assert "checksum" in failed.value.errors[Party.shard(2)]
        assert failed.value.kind is RefitFailureKind.DETERMINISTIC
    finally:
        fleet.close()


def test_a_value_error_in_a_member_is_deterministic_and_releases_the_others(ray_cluster, ledger):
    """At the default refit timeout: the others wait in the collective for a member that
    never joins; a deterministic failure has no rebuild to settle for, so they are
    released at once instead of after the settle window (360 s)."""
    fleet = Fleet(total_bytes=2_000_000, refit_timeout_s=300.0, faulty=0)
    try:
        _reconcile(fleet, ledger)
        ray.get(fleet.workers[0].arm_fault.remote("receive spec mismatch"), timeout=60)
        fleet.step(1)
        with ThreadPoolExecutor(1) as pool:
            push = pool.submit(fleet.sync.push, 1)
            with pytest.raises(RefitFailed) as failed:
                push.result(timeout=120)
        assert failed.value.kind is RefitFailureKind.DETERMINISTIC
        assert failed.value.errors[Party.shard(0)] == "ValueError: receive spec mismatch"
        assert isinstance(failed.value.__cause__, ValueError)
        assert fleet.sync.built_layout is None  # the communicator is gone: rebuild first
        assert fleet.in_flight((1, 2)) == {"trainer 0": 0, "shard 1": 0, "shard 2": 0}
    finally:
        fleet.close()
