"""Reaping engine processes that outlive their actor: real processes, real signals.

A process started in a session of its own (``start_new_session``) is outside its
parent's process group — what Ray's cleanup kills — which is how an engine's child
survives its actor. Ray is not needed: records of this node are reaped here.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

psutil = pytest.importorskip("psutil")

from fleetledger.shards.reaping import ProcessRecord, reap  # noqa: E402


def _orphan() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )


def _record(process: subprocess.Popen[bytes], *, create_time: float | None = None) -> ProcessRecord:
    started = psutil.Process(process.pid).create_time()
    return ProcessRecord(process.pid, started if create_time is None else create_time, "x", "n")


def test_a_recorded_process_that_outlived_its_actor_is_killed():
    orphan = _orphan()
    try:
        assert reap([_record(orphan)], wait_s=0.2) == [orphan.pid]
        orphan.wait(timeout=10)
        assert not psutil.pid_exists(orphan.pid)
    finally:
        orphan.kill()


def test_a_reused_pid_is_left_alone():
    """Same pid, another start time: another process, which must survive."""
    bystander = _orphan()
    try:
        stale = _record(bystander, create_time=psutil.Process(bystander.pid).create_time() - 60)
        assert reap([stale], wait_s=0.2) == []
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_a_process_already_gone_is_nothing_to_reap():
    gone = _orphan()
    record = _record(gone)
    gone.kill()
    gone.wait(timeout=10)
    assert reap([record], wait_s=0.2) == []
