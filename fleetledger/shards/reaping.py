"""Reaping the processes an engine started, once its shard's actor is gone.

A vLLM engine in a Ray actor runs its model in a child process (``VLLM::EngineCore``,
~0.6–1 GB). Ray kills an actor's process group when the actor dies; a child that left
the group, or a cluster run with that cleanup off, survives as an orphan holding its
memory for the rest of the machine's life — and three engines fill a small node. So
the fleet records each engine's children when it is ready (pid *and* start time: a pid
is reused, a start time is not) and kills what is left of them after the actor.

A record names its node: one on this node is killed here; one on another node by a
small task pinned to that node.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import structlog

__all__ = ["ProcessRecord", "children_of_this_process", "reap"]

_log = structlog.get_logger("fleetledger.reaping")

GONE_WAIT_S = 2.0
"""How long the actor's own cleanup is given before a recorded child is killed."""


@dataclass(frozen=True, slots=True)
class ProcessRecord:
    pid: int
    create_time: float
    name: str
    node_id: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def children_of_this_process(node_id: str) -> list[ProcessRecord]:
    """Every descendant of the calling process, as records (what an engine reports)."""
    import psutil

    records = []
    for child in psutil.Process().children(recursive=True):
        try:
            records.append(ProcessRecord(child.pid, child.create_time(), child.name(), node_id))
        except psutil.NoSuchProcess:
            continue
    return records


def _kill_here(records: Iterable[ProcessRecord], wait_s: float) -> list[int]:
    """Kill the records' processes that still run (same pid *and* start time)."""
    import psutil

    alive = []
    for record in records:
        try:
            process = psutil.Process(record.pid)
            if abs(process.create_time() - record.create_time) < 0.01:
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    if not alive:
        return []
    _, alive = psutil.wait_procs(alive, timeout=wait_s)  # the actor's own cleanup first
    killed = []
    for process in alive:
        try:
            # psutil's kill checks the start time again: a pid reused meanwhile is
            # another process, and is left alone (NoSuchProcess).
            process.kill()
            killed.append(process.pid)
        except psutil.Error:  # gone meanwhile, reused, or not ours to kill
            continue
    psutil.wait_procs(alive, timeout=wait_s)
    return killed


def reap(records: Iterable[ProcessRecord], *, wait_s: float = GONE_WAIT_S) -> list[int]:
    """Kill what is left of ``records`` after their actor died; the pids killed.

    Records of another node are reaped by a task pinned to it (bounded; a node that is
    itself gone took its processes with it).
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    by_node: dict[str, list[ProcessRecord]] = {}
    for record in records:
        by_node.setdefault(record.node_id, []).append(record)
    killed: list[int] = []
    started = time.monotonic()
    for node, group in by_node.items():
        if here is None or node == here:
            killed += _kill_here(group, wait_s)
            continue
        task = ray.remote(_kill_here).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        )
        try:
            killed += ray.get(task.remote(group, wait_s), timeout=wait_s * 3 + 10)
        except Exception as exc:  # the node is gone, or unreachable: nothing to reap there
            _log.warning("engine processes on another node not reaped", node=node, problem=str(exc))
    if killed:
        _log.warning(
            "engine processes outlived their actor and were killed",
            pids=killed,
            seconds=round(time.monotonic() - started, 3),
        )
    return killed
