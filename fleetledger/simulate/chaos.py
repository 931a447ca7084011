"""Injecting chaos into a live simulated fleet: real signals on the shards' processes.

``kill`` and ``freeze`` are SIGKILL and SIGSTOP on the shard's current process — looked
up again after a restart replaced it — so what the controller sees is what it would see
of a real engine; ``wedge`` and ``blip`` are faults inside the simulated engine, and on
a vLLM engine a wedge is its engine core SIGSTOPped (``/health`` still answers).
``kill-engine`` SIGKILLs a vLLM engine's core only: the actor lives on and Ray reports
nothing — a death only the engine's own health check (or a request) sees. Frozen
processes are thawed when the simulation ends, or they would outlive it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import ray

from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.simulate.spec import Chaos


class ChaosInjector:
    def __init__(
        self,
        ledger: Ledger,
        fleet: RayShardFleet,
        echo: Callable[[str], None],
        *,
        real_engine: bool = False,
    ) -> None:
        """``real_engine``: the shards run real engines (vLLM): a wedge stops the
        engine core under the live actor instead of setting a simulated fault."""
        self._ledger = ledger
        self._fleet = fleet
        self._echo = echo
        self._real_engine = real_engine
        # shard -> (restart attempts when the pid was read, pid); read when first needed,
        # so a shard that dies while the run is wired does not fail the wiring.
        self._pids: dict[int, tuple[int, int]] = {}
        self._frozen: list[int] = []

    def pid_of(self, shard: int) -> int:
        """The shard's current process: looked up again after a restart replaced it."""
        attempts = self._ledger.membership.restart_attempts[shard]
        known_at, pid = self._pids.get(shard, (-1, 0))
        if known_at != attempts:
            pid = ray.get(self._fleet.handle(shard).pid.remote(), timeout=5.0)
            self._pids[shard] = (attempts, pid)
        return pid

    def inject(self, chaos: Chaos) -> None:
        try:
            self._inject(chaos)
        except Exception as exc:  # a callback's exception would vanish into asyncio's log
            self._echo(
                f"  chaos: {chaos.action} shard {chaos.shard} during step {chaos.step} not "
                f"done: {type(exc).__name__}: {exc}"
            )

    def _inject(self, chaos: Chaos) -> None:
        pid = self.pid_of(chaos.shard)
        if chaos.action == "kill":
            os.kill(pid, signal.SIGKILL)
        elif chaos.action == "freeze":
            os.kill(pid, signal.SIGSTOP)
            self._frozen.append(pid)
        elif chaos.action == "kill-engine":  # vLLM only (the spec refuses it otherwise)
            pid = ray.get(self._fleet.handle(chaos.shard).engine_pid.remote(), timeout=5.0)
            os.kill(pid, signal.SIGKILL)
        elif self._real_engine:  # wedge: the engine core stops, the actor still answers
            pid = ray.get(self._fleet.handle(chaos.shard).engine_pid.remote(), timeout=5.0)
            os.kill(pid, signal.SIGSTOP)
            self._frozen.append(pid)
        else:
            fault, times = ("hang", None) if chaos.action == "wedge" else ("fail", 1)
            # Told without waiting: the event loop must not block on an actor call.
            self._fleet.handle(chaos.shard).set_fault.remote(fault, times)
        self._echo(
            f"  chaos: {chaos.action} shard {chaos.shard} (pid {pid}) during step {chaos.step}"
        )

    def thaw(self) -> None:
        for pid in self._frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
