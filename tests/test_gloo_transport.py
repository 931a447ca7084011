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
from fleetledger.events.log import EventLog
from fleetledger.projections.rank_layout import RankLayoutError
from tests.builders import fleet_config

pytestmark = pytest.mark.slow

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip("torch", reason="torch is not installed: pip install -e '.[dev]'")

from fleetledger.weight_sync import (  # noqa: E402
    NoCollective,
    Party,
    PushReport,
    ReconcileOutcome,
    RefitFailed,
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
