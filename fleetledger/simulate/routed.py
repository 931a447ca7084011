"""Rollouts through the router: what a rollout client that was given one URL does.

With ``simulate --router`` the loop does not pick shards: it sends every generation to
the run's router over HTTP (the ``openai`` client, as a user would), the router picks
the least outstanding serving shard from the ledger and reports each shard's outcomes
itself. The retry policy still runs on this side — a 500 from a backend that failed is
infrastructure and retried, and the router will have avoided that backend meanwhile.
Before the loop ends the run it has the router hand its last outcome window over
(:meth:`RoutedRollouts.flush_outcomes`): a window handed over after the end is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ray.actor import ActorHandle

from fleetledger.adapters.least_outstanding import InFlight
from fleetledger.events.attestation import read_attestation
from fleetledger.shards.contract import Generation, GenerationRequest
from fleetledger.simulate.account import Ended, LoopAccount

__all__ = ["ROUTED", "SHARD_HEADER", "RoutedRollouts"]

ROUTED = -1
"""The shard a routed attempt is "sent to": the router decides, not the loop."""

SHARD_HEADER = "x-fleetledger-shard"
"""The response header in which the router names the shard that served (or, on its own
500 and 503, the shard the failure is about)."""
RESENT_FROM_HEADER = "x-fleetledger-resent-from"
"""The response header naming the shard a re-sent request left."""


FLUSH_TIMEOUT_S = 30.0
"""Bound of the router's flush: its requests in flight settle (5 s), then one append."""


class RoutedRollouts:
    def __init__(
        self,
        url: str,
        model: str,
        *,
        timeout_s: float | None,
        router: ActorHandle | None = None,
    ) -> None:
        """``router``: the router's actor (:class:`RouterActor`), asked to flush."""
        import openai  # the vllm extras' (a simulated run without --router needs none)

        self.url = url
        self.model = model
        self._router = router
        self._client = openai.AsyncOpenAI(
            base_url=url, api_key="unused", max_retries=0, timeout=timeout_s or 600.0
        )
        self._in_flight = InFlight()  # one "shard": the router, which chooses the real one
        self.account: LoopAccount | None = None  # told each request's wait, where given

    @property
    def total_in_flight(self) -> int:
        return self._in_flight.total

    @contextmanager
    def acquire(self) -> Iterator[int]:
        self._in_flight.take((ROUTED,))
        try:
            yield ROUTED
        finally:
            self._in_flight.release(ROUTED)

    async def generate(self, request: GenerationRequest) -> Generation:
        import openai

        account = self.account
        if account is None:
            return (await self._generate(request))[1]
        started = account.now_us()
        shard: int | None = None
        resent_from: int | None = None
        ended: Ended = "deadline"  # cancelled by the loop's generation deadline
        try:
            raw, generation = await self._generate(request)
        except openai.APIStatusError as exc:
            shard = _shard(exc.response.headers, SHARD_HEADER)
            left = exc.status_code == 503 and shard is not None
            ended = "shard_left" if left else "error"
            raise
        except openai.APIError:
            ended = "error"
            raise
        else:
            shard = _shard(raw.headers, SHARD_HEADER)
            resent_from = _shard(raw.headers, RESENT_FROM_HEADER)
            ended = "answered"
            return generation
        finally:
            account.waited(started, shard, resent_from, ended)

    async def _generate(self, request: GenerationRequest) -> tuple[Any, Generation]:
        raw = await self._client.completions.with_raw_response.create(
            model=self.model,
            prompt=request.prompt,
            max_tokens=request.max_tokens,
            user=request.prompt_id,
        )
        completion = raw.parse()
        shard = _shard(raw.headers, SHARD_HEADER)
        attested = read_attestation(raw.headers)
        return raw, Generation(
            prompt_id=request.prompt_id,
            group_id=request.group_id,
            shard=ROUTED if shard is None else shard,
            # The engine's word, passed on by the router (-1: nobody said).
            weight_version=-1 if attested is None else attested.start,
            text=completion.choices[0].text,
            tokens=completion.usage.completion_tokens if completion.usage else 0,
            weight_version_end=None if attested is None else attested.end,
            weights_partial=attested is not None and attested.partial,
        )

    async def flush_outcomes(self) -> int | None:
        """Have the router hand its pending outcome window to the ledger; returns once it
        is durable (its seq; None: nothing pending, or no router actor to ask)."""
        if self._router is None:
            return None
        seq: int | None = await asyncio.wait_for(
            self._router.flush.remote(), timeout=FLUSH_TIMEOUT_S
        )
        return seq

    async def close(self) -> None:
        await self._client.close()


def _shard(headers: Any, name: str) -> int | None:
    value = headers.get(name)
    return int(value) if value is not None and value.isdigit() else None
