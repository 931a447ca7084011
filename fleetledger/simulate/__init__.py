"""``fleetledger simulate``: an asynchronous RL loop on a local Ray cluster, with chaos.

A trainer actor steps; N simulated generation shards (``engines.simulated``) serve
rollouts through the least-outstanding selector under the retry policy; after every
step the trainer's parameters (a few MB of tensors) are broadcast to every shard that
is not absent over a gloo communicator rebuilt whenever the membership changes, and a
failed push is recovered; the live controller probes, watches for stalls and
(optionally) restarts dead shards. Everything lands in the ledger, so the run is
replayed and explained afterwards like any real one.

The composition root: ``wiring`` is the one place the controller meets a transport and
an engine, which the controller itself never imports.
"""

from fleetledger.simulate.loop import run_simulation
from fleetledger.simulate.spec import (
    Chaos,
    SimulationResult,
    SimulationSpec,
    parse_chaos,
    simulation_config,
)

__all__ = [
    "Chaos",
    "SimulationResult",
    "SimulationSpec",
    "parse_chaos",
    "run_simulation",
    "simulation_config",
]
