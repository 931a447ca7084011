"""The GPU path of the vLLM engine shard: the same actor, one GPU per engine.

Runs only where a CUDA device and PyPI's (CUDA) vLLM exist; on the project's CPU
machines it is skipped, saying why. It checks what the CPU tests check of a refit:
served over HTTP, refit in place, logprobs agreeing with the trainer.
"""

from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip(
        "no CUDA device on this machine (the CPU path is tests/test_vllm_engines.py)",
        allow_module_level=True,
    )
ray = pytest.importorskip("ray")
pytest.importorskip("vllm", reason="vLLM is not installed: pip install 'fleetledger[vllm]'")

from fleetledger.controller.ray_fleet import RayShardFleet  # noqa: E402
from fleetledger.engines.models import tiny_llama  # noqa: E402
from fleetledger.engines.policy import PolicyTrainer, refit_logprob_diff  # noqa: E402
from fleetledger.engines.vllm_shard import VllmEngineSpec, vllm_shard_factory  # noqa: E402
from fleetledger.transports.restartable import RestartAwareSynchronizer  # noqa: E402


def test_a_gpu_engine_is_refit_in_place_and_agrees_with_the_trainer(ray_cluster):
    model = str(tiny_llama())
    spec = VllmEngineSpec(model=model, run_dir=tempfile.mkdtemp(), gpus=1)
    fleet = RayShardFleet.spawn(
        1, vllm_shard_factory(f"gpu-{os.getpid()}", spec), ready_timeout_s=300
    )
    trainer = ray.remote(PolicyTrainer).options(num_cpus=0).remote(model)
    try:
        assert fleet.base_urls()[0].startswith("http://127.0.0.1:")
        sync = RestartAwareSynchronizer(fleet, [trainer], refit_timeout_s=120.0)
        sync.reconcile(set())
        version = ray.get(trainer.step.remote([1.0]))
        sync.push(version)
        diff = refit_logprob_diff(trainer, [fleet.handle(0)])
        assert diff is not None and diff <= 1e-3
    finally:
        fleet.shutdown()
        ray.kill(trainer)
