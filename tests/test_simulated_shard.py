"""The simulated shard, called directly (its Ray life is in test_chaos_ray.py)."""

from __future__ import annotations

import asyncio

import pytest

from fleetledger.adapters.failure_taxonomy import FailureKind, classify_exception
from fleetledger.engines.simulated import SimulatedShard
from fleetledger.shards.contract import GenerationRequest

REQUEST = GenerationRequest(prompt_id="p1", group_id="g1", prompt="2+2=")


def test_generation_is_stamped_with_shard_and_weights():
    async def scenario():
        shard = SimulatedShard(3, generation_s=0)
        await shard.set_weight_version(4)
        result = await shard.generate(REQUEST)
        return result, await shard.served(), await shard.weight_version()

    result, served, version = asyncio.run(scenario())
    assert (result.shard, result.weight_version, result.prompt_id) == (3, 4, "p1")
    assert (served, version) == (1, 4)


@pytest.mark.parametrize(
    ("fault", "kind"), [("fail", FailureKind.INFRA), ("error", FailureKind.DATA)]
)
def test_faults_raise_what_the_taxonomy_expects(fault, kind):
    async def scenario():
        shard = SimulatedShard(0, generation_s=0)
        await shard.set_fault(fault)
        await shard.generate(REQUEST)

    with pytest.raises(Exception) as caught:
        asyncio.run(scenario())
    assert classify_exception(caught.value).kind is kind


def test_a_hung_engine_still_answers_probes():
    async def scenario():
        shard = SimulatedShard(0, generation_s=0)
        await shard.set_fault("hang")
        generation = asyncio.ensure_future(shard.generate(REQUEST))
        alive = await asyncio.wait_for(shard.is_alive(), 5)
        await asyncio.sleep(0.05)
        stuck = not generation.done()
        generation.cancel()
        return alive, stuck

    assert asyncio.run(scenario()) == (True, True)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: SimulatedShard(-1), "index must be >= 0"),
        (lambda: SimulatedShard(0, generation_s=-1), "generation_s must be >= 0"),
    ],
)
def test_bad_construction_is_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_controls_are_refused():
    shard = SimulatedShard(0)
    with pytest.raises(ValueError, match="unknown fault 'explode'"):
        asyncio.run(shard.set_fault("explode"))  # type: ignore[arg-type]
    asyncio.run(shard.set_weight_version(5))
    with pytest.raises(ValueError, match="older than the 5"):
        asyncio.run(shard.set_weight_version(4))
