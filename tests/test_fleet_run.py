"""The run's lifetime as one construct, and the seams an embedding uses, on real Ray actors.

``FleetRun`` starts the ledger, the controller and the refit machinery and, however the
block ends — completed, an exception, an interrupt, a failure while starting — records
the run's end with its cause and stops the controller. The trainer here is an actor of
the embedder's own kind: a ``TrainerRank`` built from its own ``torch.nn.Module``, whose
trained parameters are what the engines receive (``received_weights``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
torch = pytest.importorskip("torch")

from fleetledger.config import ControllerConfig  # noqa: E402
from fleetledger.controller.ray_fleet import RayShardFleet  # noqa: E402
from fleetledger.embedding import FleetRun  # noqa: E402
from fleetledger.engines.simulated import SimulatedRefitShard, simulated_shard_factory  # noqa: E402
from fleetledger.queries import load_view  # noqa: E402
from fleetledger.shards.contract import Generation, GenerationRequest, GenerationShard  # noqa: E402
from fleetledger.shards.naming import actor_prefix  # noqa: E402
from fleetledger.store.log import EventLog  # noqa: E402
from fleetledger.transports.ray_members import TrainerRank, parameters_of  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_cluster")

SHARDS = 2


class LinearTrainer(TrainerRank):
    """The embedder's trainer: its own model, trained in place, broadcast as it is."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 4)
        super().__init__(module=self.model)

    async def train_step(self, version: int) -> str:  # type: ignore[override]
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(float(version))  # what an optimizer does: in place
        return "ok"

    async def weights(self) -> dict[str, list[float]]:
        return {n: p.detach().flatten().tolist() for n, p in self.model.named_parameters()}


class ReceivingShard(SimulatedRefitShard):
    """A shard that reads what it received through the public accessor."""

    async def received(self) -> dict[str, list[float]]:
        return {n: t.flatten().tolist() for n, t in self.received_weights().items()}


@pytest.fixture
def fleet(request: pytest.FixtureRequest) -> Iterator[RayShardFleet]:
    prefix = actor_prefix(f"fleet-run-{request.node.name[-20:]}")
    factory = simulated_shard_factory(prefix, shard_class=ReceivingShard)
    fleet = RayShardFleet.spawn(SHARDS, factory)
    yield fleet
    fleet.shutdown()


@pytest.fixture
def trainer() -> Iterator[object]:
    handle = ray.remote(LinearTrainer).options(num_cpus=0).remote()
    yield handle
    ray.kill(handle)


def _config() -> ControllerConfig:
    return ControllerConfig.model_validate(
        {"fleet_health": {"enabled": True, "probe_interval_s": 0.5, "probe_timeout_s": 0.25}}
    )


def _ended(url: str, run: str) -> tuple[str, str]:
    with EventLog.open(url) as log:
        ended = load_view(log, run).ended
    assert ended is not None, "the run was left open"
    return ended.outcome, ended.cause


def _controller_threads(run: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(f"-{run}")]


def test_a_block_that_completes_ends_the_run_completed_and_the_engines_hold_the_trained_model(
    fleet: RayShardFleet, trainer: object, sqlite_url: str
) -> None:
    with FleetRun(sqlite_url, "done", _config(), fleet, [trainer], max_steps=2) as run:
        for version in (1, 2):
            ray.get(trainer.train_step.remote(version))
            outcome = run.refit(version)
            assert outcome.participants == (0, 1)
            run.step_done()
        trained = ray.get(trainer.weights.remote())
        for shard in fleet.shards:  # what the engine received is the trainer's own model
            assert ray.get(fleet.handle(shard).received.remote()) == trained
    assert _ended(sqlite_url, "done") == ("completed", "2 of 2 steps done")
    assert _controller_threads("done") == []  # stopped


def test_an_exception_in_the_block_ends_the_run_failed_with_its_one_line_and_goes_on(
    fleet: RayShardFleet, trainer: object, sqlite_url: str
) -> None:
    with pytest.raises(ZeroDivisionError):
        with FleetRun(sqlite_url, "broken", _config(), fleet, [trainer], max_steps=3) as run:
            run.refit(1)
            _ = 1 / 0
    assert _ended(sqlite_url, "broken") == ("failed", "ZeroDivisionError: division by zero")
    assert _controller_threads("broken") == []


def test_an_interrupt_ends_the_run_aborted(
    fleet: RayShardFleet, trainer: object, sqlite_url: str
) -> None:
    with pytest.raises(KeyboardInterrupt):
        with FleetRun(sqlite_url, "stopped", _config(), fleet, [trainer], max_steps=3):
            raise KeyboardInterrupt
    assert _ended(sqlite_url, "stopped") == ("aborted", "interrupted: KeyboardInterrupt")


def test_a_failure_while_starting_ends_the_run_it_began_and_stops_the_controller(
    fleet: RayShardFleet, trainer: object, sqlite_url: str
) -> None:
    bad = {"settle_s": -1.0}  # refused by the synchronizer, after the run began
    with pytest.raises(ValueError, match="settle_s must be >= 0"):
        with FleetRun(
            sqlite_url, "half", _config(), fleet, [trainer], max_steps=1, synchronizer_options=bad
        ):
            pytest.fail("the block must not run")
    outcome, cause = _ended(sqlite_url, "half")
    assert (outcome, cause) == (
        "failed",
        "the run could not start: ValueError: settle_s must be >= 0, got -1.0",
    )
    assert _controller_threads("half") == []


def test_async_with_starts_and_ends_without_blocking_the_loop(
    fleet: RayShardFleet, trainer: object, sqlite_url: str
) -> None:
    async def main() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        async with FleetRun(sqlite_url, "async", _config(), fleet, [trainer], max_steps=1) as run:
            await trainer.train_step.remote(1)
            await run.refit_async(1)
            run.step_done()
        ticker.cancel()
        return ticks

    assert asyncio.run(main()) > 0  # the loop ran while the run started, refit and ended
    assert _ended(sqlite_url, "async") == ("completed", "1 of 1 steps done")


def test_a_trainer_rank_broadcasts_its_modules_own_tensors_and_refuses_none() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    params = parameters_of(model)
    assert list(params) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    for name, p in model.named_parameters():  # the same storage: no buffers of its own
        assert params[name].data_ptr() == p.data_ptr() and params[name].dtype == p.dtype
    with pytest.raises(ValueError, match="ReLU has no parameters to broadcast"):
        parameters_of(torch.nn.ReLU())
    with pytest.raises(ValueError, match=r"module=.*or total_bytes=.*not both"):
        TrainerRank()


class PlainEngine(GenerationShard):
    """An engine that serves no HTTP and says nothing of its address."""

    async def is_alive(self, deep: bool = False) -> bool:
        return True

    async def generate(self, request: GenerationRequest) -> Generation:
        raise NotImplementedError

    async def weight_version(self) -> int:
        return 0

    async def set_weight_version(self, version: int) -> int:
        return version


def test_an_engine_without_a_base_url_is_recorded_at_its_actors_address() -> None:
    named = ray.remote(PlainEngine).options(name="plain-engine-7", num_cpus=0).remote()
    unnamed = ray.remote(PlainEngine).options(num_cpus=0).remote()
    try:
        assert ray.get(named.base_url.remote()) == "ray://plain-engine-7"
        assert ray.get(unnamed.base_url.remote()) == f"ray://{unnamed._actor_id.hex()}"
    finally:
        ray.kill(named)
        ray.kill(unnamed)
    assert asyncio.run(PlainEngine().base_url()) is None  # not in an actor: no address
