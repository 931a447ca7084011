"""Which engine a simulated run drives: the simulated one (the fast default) or vLLM.

Each choice is what the wiring needs from an engine kind: a factory of shard actors, a
trainer that is rank 0 of the refit communicator and steps on rollouts, how long a
shard may take to come up, and how a refit is checked. A vLLM run checks every refit
by logprobs (the engines' against the trainer's forward pass); a simulated engine has no
model, so its refits are checked by the transport's checksums alone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.controller.runtime_deaths import actor_death_of
from fleetledger.engines.simulated import SimulatedRefitShard, simulated_shard_factory
from fleetledger.shards.naming import ShardFactory
from fleetledger.simulate.spec import SimulationSpec
from fleetledger.simulate.trainer import SimulatedTrainer

__all__ = ["EngineChoice", "choose_engine"]

RefitCheck = Callable[[RayShardFleet, Sequence[int]], float | None]
"""(fleet, shards the refit reached) → the largest logprob difference, or None."""


@dataclass(frozen=True)
class EngineChoice:
    factory: ShardFactory
    trainer: ActorHandle
    ready_timeout_s: float
    check_refit: RefitCheck
    real: bool  # a real engine: chaos "wedge" stops its engine core


def _no_check(_fleet: RayShardFleet, _shards: Sequence[int]) -> None:
    return None


def choose_engine(spec: SimulationSpec, prefix: str, teardown: ExitStack) -> EngineChoice:
    """Build what ``spec.engine`` needs; everything it starts is torn down by ``teardown``."""
    if spec.engine == "sim":
        trainer = (
            ray.remote(SimulatedTrainer)
            .options(num_cpus=0)
            .remote(spec.weights_bytes, spec.train_s)
        )
        teardown.callback(ray.kill, trainer)
        factory = simulated_shard_factory(
            prefix,
            generation_s=spec.generation_s,
            shard_class=SimulatedRefitShard,
            serve_http=spec.router,  # the router reaches shards over HTTP
            reload_s=spec.reload_s,
            startup_s=spec.startup_s,
            stage_dir=spec.stage_dir,
        )
        return EngineChoice(factory, trainer, 60.0, _no_check, real=False)
    return _vllm(spec, prefix, teardown)


def _vllm(spec: SimulationSpec, prefix: str, teardown: ExitStack) -> EngineChoice:
    # vLLM and transformers load only when the run asks for real engines.
    from fleetledger.engines.models import resolve_model  # torch
    from fleetledger.engines.policy import PolicyTrainer, refit_logprob_diff  # transformers
    from fleetledger.engines.vllm_shard import VllmEngineSpec, vllm_shard_factory  # vllm

    model = str(resolve_model(spec.model))
    # The run's own directory: vLLM's socket files, caches and each refit's weights
    # file; removed after the fleet is (callbacks run in reverse order).
    run_dir = tempfile.mkdtemp(prefix=f"fl-vllm-{os.getpid()}-")
    teardown.callback(shutil.rmtree, run_dir, True)
    trainer = ray.remote(PolicyTrainer).options(num_cpus=0).remote(model, train_s=spec.train_s)
    teardown.callback(ray.kill, trainer)
    factory = vllm_shard_factory(prefix, VllmEngineSpec(model=model, run_dir=run_dir))

    def check(fleet: RayShardFleet, shards: Sequence[int]) -> float | None:
        # Shard by shard: one that died after its refit completed (the chaos campaign
        # killed one in the last moment of its reload) has nothing left to check, and its
        # death is the probes' to record; it must not end the run from here.
        diffs = []
        for shard in shards:
            try:
                diffs.append(refit_logprob_diff(trainer, [fleet.handle(shard)]))
            except Exception as exc:
                if actor_death_of(exc) is None:
                    raise
        return max((d for d in diffs if d is not None), default=None)

    # Engines start concurrently on few cores: one takes ~15-20 s alone, more together.
    return EngineChoice(factory, trainer, 60.0 + 30.0 * spec.shards, check, real=True)
