"""The trainer side of a real model: the weights a vLLM shard serves come from here.

A trainer rank (rank 0 of the refit communicator) holding the same architecture as the
engines (``transformers``, loaded from the same directory). Its parameters *are* the
tensors it broadcasts (shared storage), so a train step changes what the next refit
pushes without a copy.

A refit is checked the way the reference's ``gen_kl_error`` checks it: the engine
generates greedily from a fixed prompt and returns each sampled token's logprob; the
trainer runs its own forward pass over the same tokens; the largest absolute
difference is the refit's ``logprob_max_abs_diff``. Stale weights, a misnamed tensor or
a prefix cache that outlived the reload all show up there, by orders of magnitude.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import ray
import torch
from ray.actor import ActorHandle

from fleetledger.transports.ray_members import TrainerRank

__all__ = ["CHECK_PROMPT", "PolicyTrainer", "logprob_max_abs_diff", "refit_logprob_diff"]

CHECK_PROMPT = "What is 2+2? The answer is"
"""The fixed prompt every refit is checked on."""

CHECK_TOKENS = 8


def logprob_max_abs_diff(engine: Sequence[float], trainer: Sequence[float]) -> float:
    """The largest |engine − trainer| over the same tokens (both must be as long)."""
    if len(engine) != len(trainer) or not engine:
        raise ValueError(
            f"logprobs to compare differ in length or are empty: engine {len(engine)}, "
            f"trainer {len(trainer)}"
        )
    return max(abs(a - b) for a, b in zip(engine, trainer, strict=True))


def refit_logprob_diff(
    trainer: ActorHandle, shards: Sequence[ActorHandle], *, timeout_s: float = 60.0
) -> float | None:
    """After a refit: each shard generates greedily from :data:`CHECK_PROMPT`, the
    trainer scores the same tokens; the largest difference over all of them (``None``
    with no shard to check)."""
    if not shards:
        return None
    prompt: list[int] = ray.get(trainer.check_prompt_ids.remote(), timeout=timeout_s)
    scored = ray.get([s.score.remote(prompt, CHECK_TOKENS) for s in shards], timeout=timeout_s)
    theirs = ray.get(
        [trainer.logprobs.remote(prompt, one["token_ids"]) for one in scored], timeout=timeout_s
    )
    return max(
        logprob_max_abs_diff(one["logprobs"], own) for one, own in zip(scored, theirs, strict=True)
    )


class PolicyTrainer(TrainerRank):
    """A trainer actor over a Hugging Face causal LM: one optimiser step per train step."""

    def __init__(
        self, model_dir: str, *, learning_rate: float = 0.05, train_s: float = 0.0
    ) -> None:
        # Not TrainerRank.__init__: the tensors are the model's, not random ones.
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        self._model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self._model.train()
        self._tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self._optimizer = torch.optim.SGD(self._model.parameters(), lr=learning_rate)
        self._member().tensors = {
            name: param.data for name, param in self._model.named_parameters()
        }
        self._train_s = train_s
        self._version = 0

    async def step(self, rewards: Sequence[float]) -> int:
        """One optimiser step on a reward-weighted language-model loss over the check
        prompt: real gradients, so every refit pushes weights that changed."""
        if not rewards:
            raise ValueError("a train step needs at least one rollout row")
        await asyncio.sleep(self._train_s)
        ids = self._tokenizer(CHECK_PROMPT, return_tensors="pt").input_ids
        weight = 0.5 + sum(rewards) / len(rewards)
        self._optimizer.zero_grad()
        loss = self._model(input_ids=ids, labels=ids).loss * weight
        loss.backward()
        with torch.no_grad():
            self._optimizer.step()
        self._version += 1
        return self._version

    async def train_step(self, version: int) -> str:
        raise NotImplementedError("a policy trainer steps on rollouts: call step(rewards)")

    async def check_prompt_ids(self) -> list[int]:
        return list(self._tokenizer(CHECK_PROMPT).input_ids)

    async def logprobs(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> list[float]:
        """This model's logprob of each of ``token_ids`` following ``prompt_ids``."""
        if not token_ids:
            return []
        ids = torch.tensor([list(prompt_ids) + list(token_ids)])
        with torch.no_grad():
            logits = self._model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits, dim=-1)
        start = len(prompt_ids)
        return [float(logp[start - 1 + k, token]) for k, token in enumerate(token_ids)]

    async def version(self) -> int:
        return self._version

    async def describe(self) -> dict[str, Any]:
        return {
            "parameters": sum(t.numel() for t in self._member().tensors.values()),
            "bytes": sum(t.numel() * t.element_size() for t in self._member().tensors.values()),
        }
