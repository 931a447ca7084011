"""The simulated engine's OpenAI-compatible face, through the real ``openai`` client.

What a router or a rollout client sees of a simulated shard must be what it would see of
a vLLM engine, faults included: a data failure is a 400, a transport failure a dropped
connection, a wedge a request that never answers while ``/health`` does.
"""

from __future__ import annotations

import os
import urllib.request

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
openai = pytest.importorskip("openai")

from fleetledger.controller.ray_fleet import RayShardFleet  # noqa: E402
from fleetledger.engines.simulated import simulated_shard_factory  # noqa: E402


@pytest.fixture(scope="module")
def fleet(ray_cluster):
    fleet = RayShardFleet.spawn(
        1, simulated_shard_factory(f"http-{os.getpid()}", generation_s=0.0, serve_http=True)
    )
    yield fleet
    fleet.shutdown()


@pytest.fixture
def client(fleet):
    ray.get(fleet.handle(0).set_fault.remote("none"), timeout=30)
    return openai.OpenAI(base_url=fleet.base_urls()[0], api_key="unused", max_retries=0, timeout=5)


def test_the_base_url_is_its_http_app_and_the_models_route_names_it(fleet, client):
    assert fleet.base_urls()[0].startswith("http://127.0.0.1:")
    assert [m.id for m in client.models.list().data] == ["fleetledger-sim"]


def test_completions_chat_and_streams_are_the_shards_generations(fleet, client):
    served = ray.get(fleet.handle(0).served.remote(), timeout=30)
    text = client.completions.create(model="fleetledger-sim", prompt="2+2=", max_tokens=3)
    assert "shard 0" in text.choices[0].text and text.usage.completion_tokens == 3
    chat = client.chat.completions.create(
        model="fleetledger-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert "shard 0" in chat.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model="fleetledger-sim",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            stream=True,
        )
    )
    assert "shard 0" in "".join(c.choices[0].delta.content or "" for c in chunks)
    assert ray.get(fleet.handle(0).served.remote(), timeout=30) == served + 3


def test_a_data_fault_is_a_400_and_a_transport_fault_drops_the_connection(fleet, client):
    ray.get(fleet.handle(0).set_fault.remote("error", 1), timeout=30)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="fleetledger-sim", prompt="x", max_tokens=1)
    ray.get(fleet.handle(0).set_fault.remote("fail", 1), timeout=30)
    with pytest.raises(openai.APIConnectionError):
        client.completions.create(model="fleetledger-sim", prompt="x", max_tokens=1)
    assert client.completions.create(model="fleetledger-sim", prompt="x", max_tokens=1).choices


def test_a_wedged_engine_answers_health_and_never_completes(fleet, client):
    ray.get(fleet.handle(0).set_fault.remote("hang"), timeout=30)
    health = fleet.base_urls()[0].removesuffix("/v1") + "/health"
    with urllib.request.urlopen(health, timeout=5) as answer:
        assert answer.status == 200
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.5).completions.create(
            model="fleetledger-sim", prompt="x", max_tokens=1
        )
