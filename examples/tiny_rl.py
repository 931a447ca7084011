"""A tiny asynchronous RL loop embedding fleetledger, from docs/controller.md alone.

Its own engine (``TinyEngine``: a Ray actor implementing fleetledger's
``GenerationShard`` and joining the refit communicator through ``CommunicatorActor``),
its own trainer (``TinyTrainer``: a ``torch.nn.Linear`` trained by SGD, whose parameters
are what every refit pushes) and its own loop; fleetledger probes, condemns, restarts
and refits the fleet, and the run lands in a ledger ``fleetledger explain`` explains.

    python examples/tiny_rl.py --db sqlite:///run.db --run demo --kill 1@2 --await-restarts 30
    fleetledger explain demo --db sqlite:///run.db

An engine answers a prompt with its model's output for the prompt's features; the reward
is how close that is to the task's target. The trainer learns the target from each
step's rewarded samples, so the reward rises only because the refits deliver its weights.
``--kill SHARD@STEP`` SIGKILLs a shard during that step, ``--freeze SHARD@STEP``
SIGSTOPs one (the probes condemn it); the controller restarts both, and a replacement
serves again once a refit includes it. ``--await-restarts S`` waits (at most S seconds)
before the last step until no restart is pending, so the last refit takes every
replacement back.
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

from fleetledger.adapters.retry_policy import PromptSkipped, RetryPolicy, run_rollout
from fleetledger.config import ControllerConfig
from fleetledger.controller.ray_fleet import RayShardFleet, local_ray
from fleetledger.embedding import FleetRun
from fleetledger.logs import configure_logging
from fleetledger.shards.contract import Generation, GenerationRequest, GenerationShard
from fleetledger.shards.naming import shard_actor_name
from fleetledger.transports.ray_members import CommunicatorActor, TrainerRank

HERE = Path(__file__).resolve().parent
PROMPTS_PER_STEP = 8
FEATURES = 4
TARGET = torch.tensor([1.5, -2.0, 0.5, 3.0])  # the task: y = TARGET · x


def features(prompt: str) -> torch.Tensor:
    """A prompt's features, the same in every process (the engine's and the trainer's)."""
    seed = sum(ord(c) * (i + 1) for i, c in enumerate(prompt))
    return torch.randn(FEATURES, generator=torch.Generator().manual_seed(seed))


def reward(prompt: str, generation: Generation) -> float:
    return -abs(float(generation.text) - float(TARGET @ features(prompt)))


# ── the framework's own engine and trainer (nothing fleetledger-specific but the bases) ──


class TinyEngine(GenerationShard, CommunicatorActor):
    """Serves the model the last refit delivered: ``received_weights()``."""

    def __init__(self, index: int) -> None:
        self.index, self.version = index, 0

    async def is_alive(self, deep: bool = False) -> bool:
        if deep:  # prove it can generate, not only answer (fleet_health.deep_probe)
            await self.generate(GenerationRequest("probe", "probe", "probe"))
        return True

    async def generate(self, request: GenerationRequest) -> Generation:
        await asyncio.sleep(0.02)  # "decoding"
        weights = self.received_weights()  # empty until the first refit: output 0
        out = float(weights["weight"] @ features(request.prompt)) if weights else 0.0
        return Generation(
            prompt_id=request.prompt_id, group_id=request.group_id, shard=self.index,
            weight_version=self.version, text=f"{out:.4f}", tokens=1,
        )  # fmt: skip

    async def weight_version(self) -> int:
        return self.version

    async def set_weight_version(self, version: int) -> int:
        self.version = version
        return version

    async def refit_broadcast(self, version: int) -> dict[str, object]:
        received = await super().refit_broadcast(version)
        self.version = version  # the engine serves from these weights now
        return received

    async def base_url(self) -> str:  # a new process at every restart: say which
        return f"ray://{ray.get_runtime_context().get_actor_name()}?pid={os.getpid()}"


class TinyTrainer(TrainerRank):
    """Rank 0 of the refit communicator: broadcasts its own model's parameters."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(FEATURES, 1, bias=False)
        torch.nn.init.zeros_(self.model.weight)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.2)
        super().__init__(module=self.model)
        self.version = 0

    async def step(self, prompts: Sequence[str]) -> int:
        x = torch.stack([features(p) for p in prompts])
        loss = ((self.model(x).squeeze(1) - x @ TARGET) ** 2).mean()  # the rewards' gradient
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()  # in place: what the next refit pushes
        self.version += 1
        return self.version


# ── the training loop, with fleetledger wired in ────────────────────────────────────


def main(argv: Sequence[str] | None = None) -> list[float]:
    args = parse_args(argv)
    configure_logging(args.log)  # shard transitions, one line each, on stderr
    config = ControllerConfig.from_file(args.config)
    with local_ray():
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
            run = FleetRun(args.db, args.run, config, fleet, [trainer], max_steps=args.steps)
            return asyncio.run(train(args, run, fleet, trainer))
        finally:
            fleet.shutdown()
            ray.kill(trainer)


async def train(args, run: FleetRun, fleet: RayShardFleet, trainer) -> list[float]:  # noqa: ANN001
    policy = RetryPolicy.from_config(run.config.rollout_failure)
    rewards: list[float] = []
    async with run:  # the run ends with its cause however this block ends

        async def attempt(a) -> Generation:  # noqa: ANN001 - an Attempt[str]
            request = GenerationRequest(str(a.prompt_id), a.group_id, prompt=str(a.prompt_id))
            try:
                generation = await fleet.generate(a.shard, request)
            except Exception as exc:
                run.reports.failure(a.shard, exc)  # before the retry re-selects
                raise
            run.reports.success(a.shard)
            return generation

        for step in range(1, args.steps + 1):
            if run.controller.halted:
                break
            if step == args.steps and args.await_restarts:
                await restarts_done(run, args.await_restarts)
            for how, chaos in (("kill", args.kill), ("freeze", args.freeze)):
                if chaos and chaos[1] == step:
                    pid = await fleet.handle(chaos[0]).pid.remote()
                    sig = signal.SIGKILL if how == "kill" else signal.SIGSTOP
                    asyncio.get_running_loop().call_later(0.01, os.kill, pid, sig)
            prompts = [f"s{step}p{k}" for k in range(PROMPTS_PER_STEP)]
            results = await asyncio.gather(
                *(run_rollout(attempt, select_shard=run.selector.acquire, policy=policy,
                              counters=run.counters, prompt_id=p) for p in prompts),
                return_exceptions=True,
            )  # fmt: skip
            for failed in (r for r in results if isinstance(r, BaseException)):
                if not isinstance(failed, PromptSkipped):  # a dropped prompt gives no row
                    raise failed
            done = [(p, g) for p, g in zip(prompts, results, strict=True)
                    if isinstance(g, Generation)]  # fmt: skip
            rewards.append(sum(reward(p, g) for p, g in done) / max(len(done), 1))
            run.reports.flush()
            version = await trainer.step.remote([p for p, _ in done])
            await run.refit_async(version)
            run.step_done()
            print(f"step {step}: v{version} reward {rewards[-1]:.3f} serving "
                  f"{list(run.ledger.membership.serving)}")  # fmt: skip
    return rewards


async def restarts_done(run: FleetRun, timeout_s: float) -> None:
    """Wait until no shard is DEAD or RESTARTING (the restarter is done), or timeout_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if not {"DEAD", "RESTARTING"} & set(run.ledger.membership.states):
            return
        await asyncio.sleep(0.1)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True, help="ledger URL, e.g. sqlite:///run.db")
    parser.add_argument("--run", required=True, help="run id")
    parser.add_argument("--config", default=HERE / "fleet.toml", type=Path)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    for chaos in ("kill", "freeze"):
        parser.add_argument(
            f"--{chaos}",
            type=lambda v: tuple(int(x) for x in v.split("@")),
            metavar="SHARD@STEP",
            help=f"{'SIGKILL' if chaos == 'kill' else 'SIGSTOP'} this shard during this step",
        )
    parser.add_argument("--await-restarts", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--log", default="info", help="log level (shard transitions: info)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    print("rewards:", " ".join(f"{r:.3f}" for r in main()))
