"""The router as a named Ray actor: a crash brings it back on the same address, knowing
the run's membership from the ledger before its first answer."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
openai = pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from fleetledger.controller.ledger import Ledger  # noqa: E402
from fleetledger.controller.ray_fleet import RayShardFleet  # noqa: E402
from fleetledger.engines.simulated import simulated_shard_factory  # noqa: E402
from fleetledger.router.actor import start_router_actor  # noqa: E402
from fleetledger.simulate import simulation_config  # noqa: E402
from fleetledger.store.log import EventLog  # noqa: E402


def _served_by(client: openai.OpenAI) -> str:
    raw = client.completions.with_raw_response.create(
        model="fleetledger-sim", prompt="x", max_tokens=1
    )
    return raw.headers["x-fleetledger-shard"]


def test_a_killed_router_actor_comes_back_on_its_port_with_the_true_membership(
    ray_cluster, sqlite_url
):
    fleet = RayShardFleet.spawn(
        2, simulated_shard_factory(f"ra-{os.getpid()}", generation_s=0.0, serve_http=True)
    )
    log = EventLog.open(sqlite_url)
    run = f"router-actor-{uuid.uuid4().hex[:6]}"
    config = simulation_config()
    ledger = Ledger.start(
        log,
        run,
        config.fleet_config(shard_count=2, train_world_size=1, base_urls=fleet.base_urls()),
    )
    handle, url = start_router_actor(sqlite_url, run, window_s=0.2)
    try:
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=10)
        assert _served_by(client) == "0"
        pid = ray.get(handle.pid.remote())
        os.kill(pid, signal.SIGKILL)
        ledger.actor_died(0, "recorded while the router was down")
        deadline = time.monotonic() + 60
        while True:  # Ray restarts it; it binds the same port
            try:
                answered = _served_by(client)
                break
            except openai.APIConnectionError:
                assert time.monotonic() < deadline, "the router did not come back"
                time.sleep(0.1)
        assert answered == "1"  # its very first answer knows shard 0 is DEAD
        assert ray.get(handle.url.remote()) == url and ray.get(handle.pid.remote()) != pid
    finally:
        try:
            ray.get(handle.stop.remote(), timeout=30)
        finally:
            ray.kill(handle)
            fleet.shutdown()
            log.close()
