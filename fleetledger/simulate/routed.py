"""Rollouts through the router: what a rollout client that was given one URL does.

With ``simulate --router`` the loop does not pick shards: it sends every generation to
the run's router over HTTP (the ``openai`` client, as a user would), the router picks
the least outstanding serving shard from the ledger and reports each shard's outcomes
itself. The retry policy still runs on this side — a 500 from a backend that failed is
infrastructure and retried, and the router will have avoided that backend meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fleetledger.controller.generation_shard import Generation, GenerationRequest

__all__ = ["ROUTED", "SHARD_HEADER", "RoutedRollouts"]

ROUTED = -1
"""The shard a routed attempt is "sent to": the router decides, not the loop."""

SHARD_HEADER = "x-fleetledger-shard"
"""The response header in which the router names the shard that served."""


class RoutedRollouts:
    def __init__(self, url: str, model: str, *, timeout_s: float | None) -> None:
        import openai

        self.url = url
        self.model = model
        self._client = openai.AsyncOpenAI(
            base_url=url, api_key="unused", max_retries=0, timeout=timeout_s or 600.0
        )
        self.total_in_flight = 0

    @contextmanager
    def acquire(self) -> Iterator[int]:
        self.total_in_flight += 1
        try:
            yield ROUTED
        finally:
            self.total_in_flight = max(0, self.total_in_flight - 1)

    async def generate(self, request: GenerationRequest) -> Generation:
        raw = await self._client.completions.with_raw_response.create(
            model=self.model,
            prompt=request.prompt,
            max_tokens=request.max_tokens,
            user=request.prompt_id,
        )
        completion = raw.parse()
        shard = raw.headers.get(SHARD_HEADER)
        return Generation(
            prompt_id=request.prompt_id,
            group_id=request.group_id,
            shard=int(shard) if shard is not None and shard.isdigit() else ROUTED,
            weight_version=-1,  # not told over HTTP
            text=completion.choices[0].text,
            tokens=completion.usage.completion_tokens if completion.usage else 0,
        )

    async def close(self) -> None:
        await self._client.close()
