"""The composition root of ``fleetledger simulate``: every part of a live run, wired once.

The controller never imports a transport or an engine (the layering); this is where
they meet. :func:`wire` builds the whole run in one place, in the order the failure
stories ask for: the fleet comes up before the run is recorded (a cluster that cannot
start leaves no half-begun run behind); once the run is recorded, every way out ends it
with a cause. What it built is torn down by :meth:`Wiring.close`, also when building
failed half-way.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Literal

from ray.actor import ActorHandle

from fleetledger.adapters.shard_selector import ShardSelector
from fleetledger.controller.fleet_controller import FleetController, TrainingProgress
from fleetledger.controller.ledger import Ledger
from fleetledger.controller.ray_fleet import RayShardFleet
from fleetledger.controller.refit_recovery import RefitCoordinator
from fleetledger.embedding import refit_machinery
from fleetledger.shards.naming import actor_prefix
from fleetledger.simulate.chaos import ChaosInjector
from fleetledger.simulate.engines import EngineChoice, RefitCheck, choose_engine
from fleetledger.simulate.routed import RoutedRollouts
from fleetledger.simulate.spec import SimulationSpec
from fleetledger.store.log import EventLog
from fleetledger.transports.restartable import RestartAwareSynchronizer


@dataclass(frozen=True)
class LoopHooks:
    """What the controller asks of the training loop it watches."""

    progress: Callable[[], TrainingProgress]
    rollouts: Callable[[], Mapping[str, object]]
    on_halt: Callable[[str], None]


@dataclass(frozen=True)
class Wiring:
    run: str
    log: EventLog
    ledger: Ledger
    fleet: RayShardFleet
    trainer: ActorHandle
    sync: RestartAwareSynchronizer
    selector: ShardSelector
    controller: FleetController
    coordinator: RefitCoordinator
    chaos: ChaosInjector
    check_refit: RefitCheck
    routed: RoutedRollouts | None  # --router: rollouts over HTTP through the router
    metrics_server: ThreadingHTTPServer | None
    _teardown: ExitStack

    def end_if_open(self, outcome: Literal["failed", "aborted"], cause: str) -> None:
        end_if_open(self.ledger, outcome, cause)

    def close(self) -> None:
        """Stop the controller, then the servers, thaw frozen shards, free the actors."""
        self._teardown.close()


def end_if_open(ledger: Ledger, outcome: Literal["failed", "aborted"], cause: str) -> None:
    ledger.end_run_if_open(outcome, cause)


def wire(
    spec: SimulationSpec, log: EventLog, run: str, hooks: LoopHooks, echo: Callable[[str], None]
) -> Wiring:
    """Bring up the fleet, record the run, and build everything that drives it.

    Runs inside a Ray cluster (``local_ray``). The controller is built, not started:
    the caller starts it once it holds the wiring its hooks read.
    """
    prefix = actor_prefix(run)
    with ExitStack() as teardown:
        engine = choose_engine(spec, prefix, teardown)
        fleet = RayShardFleet.spawn(
            spec.shards, engine.factory, ready_timeout_s=engine.ready_timeout_s
        )
        teardown.callback(fleet.shutdown)
        # Each shard's address as it reports it: ray://<actor> for a simulated engine
        # (the contract's default), the HTTP base URL a vLLM engine serves its app on.
        fleet_config = spec.config.fleet_config(
            shard_count=spec.shards, train_world_size=1, base_urls=fleet.base_urls()
        )
        ledger = Ledger.start(log, run, fleet_config)
        echo(f"run {run}: {spec.shards} shards, {spec.steps} steps → {log.database.display_url}")
        # From here on the run is recorded: every way out ends it with a cause.
        try:
            wiring = _drive(spec, log, run, ledger, fleet, engine, hooks, echo, teardown)
        except KeyboardInterrupt:
            end_if_open(ledger, "aborted", "interrupted (SIGINT) while starting the simulation")
            raise
        except Exception as exc:
            end_if_open(ledger, "failed", f"simulation failed: {type(exc).__name__}: {exc}")
            raise
        return wiring  # it holds the teardown now: the stack left here is empty


def _drive(
    spec: SimulationSpec,
    log: EventLog,
    run: str,
    ledger: Ledger,
    fleet: RayShardFleet,
    engine: EngineChoice,
    hooks: LoopHooks,
    echo: Callable[[str], None],
    teardown: ExitStack,
) -> Wiring:
    trainer = engine.trainer
    chaos = ChaosInjector(ledger, fleet, echo, real_engine=engine.real)
    teardown.callback(chaos.thaw)  # runs before the fleet is shut down (stack order)
    controller = FleetController(
        ledger,
        fleet,
        spec.config,
        progress=hooks.progress,
        rollouts=hooks.rollouts,
        on_halt=hooks.on_halt,
        restart_ready_timeout_s=engine.ready_timeout_s,
    )
    server = None
    if spec.metrics_port is not None:
        server, _ = controller.metrics.serve(spec.metrics_port)
        teardown.callback(server.server_close)
        teardown.callback(server.shutdown)
        echo(f"metrics on http://127.0.0.1:{server.server_port}/metrics")
    teardown.callback(controller.stop)  # first out: nothing probes a fleet being freed
    # The library's refit path (embedding.refit_machinery): the restart-aware transport
    # asks the trainer for the receive-buffer spec at its first reconcile and has every
    # shard (and every replacement) allocate before it joins; refit_timeout_s None is
    # unbounded, as configured, and a death recorded mid-push still aborts the push.
    sync, coordinator = refit_machinery(
        ledger, fleet, [trainer], spec.config, controller, allocate_timeout_s=120
    )
    return Wiring(
        run=run,
        log=log,
        ledger=ledger,
        fleet=fleet,
        trainer=trainer,
        sync=sync,
        selector=ShardSelector.for_ledger(ledger),
        controller=controller,
        coordinator=coordinator,
        chaos=chaos,
        check_refit=engine.check_refit,
        routed=_router(spec, log, run, echo, teardown) if spec.router else None,
        metrics_server=server,
        _teardown=teardown.pop_all(),
    )


def _router(
    spec: SimulationSpec, log: EventLog, run: str, echo: Callable[[str], None], teardown: ExitStack
) -> RoutedRollouts:
    """The run's router as a named Ray actor on a reserved port, and the rollout client
    that talks to it. The router reads the membership from this run's ledger, so it
    needs the ledger's URL (with its password: it writes outcome windows)."""
    import ray

    from fleetledger.router.actor import start_router_actor  # aiohttp: only with --router

    db_url = log.database.url.render(hide_password=False)
    handle, url = start_router_actor(db_url, run, config=spec.config.router, window_s=0.5)
    teardown.callback(ray.kill, handle)
    teardown.callback(lambda: ray.get(handle.stop.remote(), timeout=30))  # flush, then kill
    with urllib.request.urlopen(f"{url}/models", timeout=30) as answer:
        model = json.load(answer)["data"][0]["id"]
    echo(f"router on {url} (model {model})")
    return RoutedRollouts(
        url, model, timeout_s=spec.config.timeouts.generation_timeout_s, router=handle
    )
