"""A tiny asynchronous RL loop embedding fleetledger, from docs/controller.md alone.

Its own engine (``TinyEngine``: a Ray actor implementing fleetledger's
``GenerationShard`` and joining the refit communicator through ``CommunicatorActor``),
its own trainer and training loop; fleetledger probes, condemns, restarts and refits the
fleet, and the run lands in a ledger that ``fleetledger explain RUN --db DB`` explains.

    python examples/tiny_rl.py --db sqlite:///run.db --run demo --kill 1@2 --await-restarts 30
    fleetledger explain demo --db sqlite:///run.db

``--kill SHARD@STEP`` SIGKILLs a shard's process during that step; with
``fleet_health.restart_dead_shards`` (on in fleet.toml) the controller restarts it, it is
STALE, and it serves again once a refit includes it. ``--await-restarts S`` waits (at
most S seconds) before the last step until no restart is pending, so the last refit
takes every replacement back.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path

import ray
import torch

from fleetledger.adapters.deadlines import RolloutDeadlines
from fleetledger.adapters.retry_policy import (
    PromptSkipped,
    RetryPolicy,
    RolloutAbandoned,
    RolloutCounters,
    run_rollout,
)
from fleetledger.adapters.shard_selector import ShardSelector
from fleetledger.config import ControllerConfig
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import GenerationReports, RayShardFleet, local_ray
from fleetledger.controller.refit_recovery import RefitCoordinator, RunFailed
from fleetledger.logs import configure_logging
from fleetledger.shards.contract import Generation, GenerationRequest, GenerationShard
from fleetledger.shards.naming import shard_actor_name
from fleetledger.store.log import EventLog
from fleetledger.transports.ray_members import CommunicatorActor, TrainerRank
from fleetledger.transports.restartable import RestartAwareSynchronizer

HERE = Path(__file__).resolve().parent
PROMPTS_PER_STEP = 6


# ── the framework's own engine and trainer (nothing fleetledger-specific but the bases) ──


class TinyEngine(GenerationShard, CommunicatorActor):
    """A "model" of a few tensors; a generation is a score of the prompt under them."""

    def __init__(self, index: int) -> None:
        self.index, self.version = index, 0

    async def is_alive(self, deep: bool = False) -> bool:
        return True

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(0.02)  # "decoding"
        weights = self._member().tensors  # the receive buffers the refit fills
        score = sum(float(t.sum()) for t in weights.values()) + len(request.prompt)
        return Generation(
            request.prompt_id, request.group_id, self.index, self.version, f"{score:.3f}", 1
        )

    async def weight_version(self) -> int:
        return self.version

    async def set_weight_version(self, version: int) -> int:
        self.version = version
        return version

    async def refit_broadcast(self, version: int) -> dict[str, object]:
        received = await super().refit_broadcast(version)
        self.version = version  # the engine serves from these weights now
        return received

    async def base_url(self) -> str:
        return f"ray://{ray.get_runtime_context().get_actor_name()}?pid={os.getpid()}"

    async def pid(self) -> int:
        return os.getpid()


class TinyTrainer(TrainerRank):
    """Rank 0 of the refit communicator: a step nudges every parameter by the rewards."""

    def __init__(self) -> None:
        super().__init__(total_bytes=1 << 16)
        self.version = 0

    async def step(self, rewards: Sequence[float]) -> int:
        await asyncio.sleep(0.1)  # "training"
        for tensor in self._member().tensors.values():
            tensor.add_(torch.tensor(sum(rewards) / len(rewards) * 1e-3))
        self.version += 1
        return self.version


def reward(generation: Generation) -> float:
    return float(generation.text) % 1.0


# ── the training loop, with fleetledger wired in ────────────────────────────────────


def main(argv: Sequence[str] | None = None) -> str:
    args = parse_args(argv)
    configure_logging(args.log)  # shard transitions, one line each, on stderr
    config = ControllerConfig.from_file(args.config)
    with local_ray(), EventLog.open(args.db) as log:
        prefix = f"tiny-{args.run}"

        def new_engine(shard: int) -> ray.actor.ActorHandle:  # used at start and by restarts
            return (
                ray.remote(TinyEngine)
                .options(name=shard_actor_name(prefix, shard), num_cpus=0, max_restarts=0)
                .remote(shard)
            )

        fleet = RayShardFleet.spawn(args.shards, new_engine)
        trainer = ray.remote(TinyTrainer).options(num_cpus=0).remote()
        try:
            fleet_config = config.fleet_config(
                shard_count=args.shards, train_world_size=1, base_urls=fleet.base_urls()
            )
            ledger = Ledger.start(log, args.run, fleet_config)
            return asyncio.run(train(args, config, ledger, fleet, trainer))
        finally:
            fleet.shutdown()
            ray.kill(trainer)


async def train(args, config, ledger, fleet, trainer) -> str:  # noqa: ANN001
    steps_done, halted = 0, asyncio.Event()
    loop = asyncio.get_running_loop()
    selector = ShardSelector.for_ledger(ledger)
    counters = RolloutCounters()
    controller = FleetController(
        ledger,
        fleet,
        config,
        progress=lambda: TrainingProgress(
            counters.committed, steps_done, selector.total_in_flight, steps_done < args.steps
        ),
        rollouts=counters.snapshot,
        on_halt=lambda cause: loop.call_soon_threadsafe(halted.set),
    ).start()
    bound, grace = config.refit.refit_timeout_s or 300.0, config.refit.grace_s
    sync = RestartAwareSynchronizer(  # receive buffers: allocated by the first reconcile
        fleet, [trainer], refit_timeout_s=bound, grace_s=grace, settle_s=bound + grace
    )
    coordinator = RefitCoordinator(
        ledger,
        sync,
        fleet,
        refit_timeout_s=bound,
        grace_s=grace,
        probe_timeout_s=config.fleet_health.probe_timeout_s,
        recovering=controller.watchdog.recovering,
    )
    reports = GenerationReports(ledger, adapter="tiny_rl.rollouts")
    policy = RetryPolicy.from_config(config.rollout_failure)
    t = config.timeouts
    deadlines = RolloutDeadlines(
        stream_s=t.rollout_timeout_s,
        generation_s=t.generation_timeout_s,
        environment_s=t.env_timeout_s,
    )

    async def attempt(a) -> Generation:  # noqa: ANN001 - an Attempt[int]
        request = GenerationRequest(str(a.prompt_id), a.group_id, prompt=str(a.prompt_id))
        try:
            async with deadlines.generation():
                generation = await fleet.generate(a.shard, request)
        except Exception as exc:
            reports.failure(a.shard, exc)  # before the retry re-selects
            raise
        reports.success(a.shard)
        return generation

    try:
        for step in range(1, args.steps + 1):
            if halted.is_set():
                break
            if step == args.steps and args.await_restarts:
                await restarts_done(ledger, args.await_restarts)
            if args.kill and args.kill[1] == step:  # chaos: SIGKILL, mid-rollouts
                pid = ray.get(fleet.handle(args.kill[0]).pid.remote(), timeout=30)
                loop.call_later(0.01, os.kill, pid, signal.SIGKILL)
            prompts = [f"s{step}p{k}" for k in range(PROMPTS_PER_STEP)]
            rollouts = (
                run_rollout(
                    attempt, select_shard=selector.acquire, policy=policy,
                    counters=counters, prompt_id=p,
                )
                for p in prompts
            )  # fmt: skip
            # One prompt per group here; a dropped (or skipped) prompt gives no row at all.
            results = await asyncio.gather(*rollouts, return_exceptions=True)
            for failed in (r for r in results if isinstance(r, BaseException)):
                if not isinstance(failed, PromptSkipped):
                    raise failed
            generations = [r for r in results if isinstance(r, Generation)]
            reports.flush()
            version = await trainer.step.remote([reward(g) for g in generations])
            steps_done += 1
            await asyncio.to_thread(coordinator.refit, version)
            print(f"step {step}: v{version} serving {list(ledger.membership.serving)}")
    except RolloutAbandoned as exc:
        return controller.end_run_failed(str(exc))
    except RunFailed as exc:  # the coordinator ended the run with this cause
        return str(exc)
    except BaseException as exc:  # Ctrl-C included: the run still ends with a cause
        interrupted = isinstance(exc, KeyboardInterrupt | asyncio.CancelledError)
        outcome = "aborted" if interrupted else "failed"
        ledger.end_run_if_open(outcome, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        controller.stop()
    return ledger.end_run_if_open("completed", f"{steps_done} of {args.steps} steps done")


async def restarts_done(ledger: Ledger, timeout_s: float) -> None:
    """Wait until no shard is DEAD or RESTARTING (the restarter is done), or timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if not {"DEAD", "RESTARTING"} & set(ledger.membership.states):
            return
        await asyncio.sleep(0.1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="ledger URL, e.g. sqlite:///run.db")
    parser.add_argument("--run", required=True, help="run id")
    parser.add_argument("--config", default=HERE / "fleet.toml", type=Path)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--kill",
        type=lambda v: tuple(int(x) for x in v.split("@")),
        metavar="SHARD@STEP",
        help="SIGKILL this shard's process during this step",
    )
    parser.add_argument("--await-restarts", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--log", default="info", help="log level (shard transitions: info)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print(main())
