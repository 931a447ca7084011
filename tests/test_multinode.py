"""A fleet that spans two Ray nodes, a PostgreSQL ledger with several writers, a node lost.

The head and a second node are started with ``ray start`` on this machine, each with
its own resources; two simulated shards (serving OpenAI HTTP) live on each. The
controller (this process), the router (``fleetledger router``, a process of its own) and
a rollout adapter (another process) all write the same run on PostgreSQL. The second
node's raylet is SIGKILLed: every shard on it is recorded dead, traffic through the
router and the next refit move to the head's shards, and the run's seqs stay gap-free.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytest.importorskip("aiohttp", reason="the router needs aiohttp: pip install -e '.[dev]'")

from fleetledger.controller.fleet_controller import (  # noqa: E402
    FleetController,
    TrainingProgress,
)
from fleetledger.controller.ledger import Ledger  # noqa: E402
from fleetledger.controller.ray_fleet import RayShardFleet  # noqa: E402
from fleetledger.controller.refit_recovery import RefitCoordinator  # noqa: E402
from fleetledger.engines.simulated import (  # noqa: E402
    SimulatedRefitShard,
    simulated_shard_factory,
)
from fleetledger.projections.shard_states import ShardState  # noqa: E402
from fleetledger.router.app import reserve_port  # noqa: E402
from fleetledger.simulate import simulation_config  # noqa: E402
from fleetledger.store.log import EventLog  # noqa: E402
from fleetledger.transports.ray_members import TrainerRank  # noqa: E402
from fleetledger.transports.restartable import RestartAwareSynchronizer  # noqa: E402
from tests.multinode import TwoNodeCluster, node_ip  # noqa: E402

CONSOLE = Path(sys.executable).parent / "fleetledger"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster():
    # Short: Ray's socket paths live under it.
    cluster = TwoNodeCluster(Path(tempfile.mkdtemp(prefix="flmn-")))
    try:
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.close()


def _adapter(router_url: str, db: str, run: str, count: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "tests.router_client", router_url, db, run, str(count)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def _until_router_serves(router_url: str, backends: int, timeout_s: float = 60.0) -> None:
    """Until the router's own gauge says it routes to ``backends`` shards."""
    metrics = router_url.removesuffix("/v1") + "/metrics"
    want = f"fleetledger_router_serving_backends {float(backends)}"
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(metrics, timeout=10) as answer:
            if want in answer.read().decode():
                return
        assert time.monotonic() < deadline, f"the router never served {backends} backends"
        time.sleep(0.1)


def _node_of(shard: int) -> dict[str, float]:
    return {"fl_head" if shard < 2 else "fl_second": 1}


def test_losing_a_node_records_its_shards_dead_and_the_run_goes_on(cluster, migrated_postgres_url):
    db = migrated_postgres_url
    run = f"multinode-{uuid.uuid4().hex[:6]}"
    fleet = RayShardFleet.spawn(
        4,
        simulated_shard_factory(
            f"mn-{os.getpid()}",
            generation_s=0.2,  # long enough for eight requests at a time to overlap
            shard_class=SimulatedRefitShard,
            serve_http=True,
            resources=_node_of,
        ),
        ready_timeout_s=120,
    )
    trainer = ray.remote(TrainerRank).options(num_cpus=0, resources=_node_of(0)).remote(1_000_000)
    config = simulation_config(probe_interval_s=0.5, probe_timeout_s=0.4)
    log = EventLog.open(db)
    ledger = Ledger.start(
        log,
        run,
        config.fleet_config(shard_count=4, train_world_size=1, base_urls=fleet.base_urls()),
    )
    controller = FleetController(
        ledger, fleet, config, progress=lambda: TrainingProgress(0, 0, 0, True)
    ).start()
    # The store at the address Ray advertises for the trainer's node, as across machines.
    sync = RestartAwareSynchronizer(
        fleet, [trainer], refit_timeout_s=10.0, grace_s=2.0, store_host=node_ip()
    )
    coordinator = RefitCoordinator(
        ledger, sync, fleet, refit_timeout_s=10.0, grace_s=2.0, probe_timeout_s=1.0
    )
    port = reserve_port()
    errors = (cluster.temp_dir / "router.err").open("w")
    router = subprocess.Popen(
        [str(CONSOLE), "router", run, "--db", db, "--port", str(port), "--window-s", "0.3"],
        stdout=subprocess.PIPE,
        stderr=errors,
        text=True,
    )
    router_exit = None
    try:
        ready, _, _ = select.select([router.stdout], [], [], 120)
        assert ready, "the router printed no URL within 120 s"
        router_url = router.stdout.readline().strip()
        assert router_url == f"http://127.0.0.1:{port}/v1", router_url
        ray.get(trainer.train_step.remote(1))
        assert coordinator.refit(1).participants == (0, 1, 2, 3)
        before = _adapter(router_url, db, run, 40)
        assert sorted(before["served"]) == ["0", "1", "2", "3"]  # spread over both nodes

        cluster.kill_second_node()
        deadline = time.monotonic() + 180
        while not all(ledger.membership.states[s] == ShardState.DEAD.value for s in (2, 3)):
            assert time.monotonic() < deadline, f"states: {ledger.membership.states}"
            time.sleep(0.2)
            ledger.catch_up()
        assert [ledger.membership.states[s] for s in (0, 1)] == ["HEALTHY", "HEALTHY"]

        ray.get(trainer.train_step.remote(2))
        outcome = coordinator.refit(2)
        assert outcome.participants == (0, 1)
        _until_router_serves(router_url, 2)  # it has read the deaths from the ledger
        after = _adapter(router_url, db, run, 20)
        assert sorted(after["served"]) == ["0", "1"] and after["statuses"] == {"200": 20}
    finally:
        router.send_signal(signal.SIGTERM)
        try:
            router_exit = router.wait(timeout=60)
        except subprocess.TimeoutExpired:
            router.kill()
        errors.close()
        controller.stop()
        fleet.shutdown()
        ray.kill(trainer)
    assert router_exit == 0
    ledger.end_run("completed", "the test is done")
    ledger.catch_up()
    events = list(log.read(run, 0))
    assert [r.seq for r in events] == list(range(1, len(events) + 1))  # gap-free
    windows = [r.event for r in events if r.event.type == "outcome_window_reported"]
    assert {w.adapter for w in windows} >= {"router", "rollouts"}  # three writers in all
    assert ledger.view.state_of(2) is ShardState.DEAD
    assert ledger.view.state_of(3) is ShardState.DEAD
    log.close()
