"""``fleetledger simulate``: an asynchronous RL loop on a local Ray cluster, with chaos.

A trainer actor steps; N generation shards — simulated (``engines.simulated``, the
default) or real vLLM engines (``engines.vllm_shard``, ``engine="vllm"``) — serve
rollouts through the least-outstanding selector under the retry policy; after every
step the trainer's parameters (a few MB of tensors, or a real model's) are broadcast
to every shard that is not absent over a gloo communicator rebuilt whenever the
membership changes, a failed push is recovered, and with vLLM every refit is checked by
logprobs against the trainer's own forward pass; the live controller probes, watches for stalls and
(optionally) restarts dead shards. Everything lands in the ledger, so the run is
replayed and explained afterwards like any real one.

The composition root: ``wiring`` is the one place the controller meets a transport and
an engine, which the controller itself never imports.
"""

from fleetledger.simulate.loop import run_simulation
from fleetledger.simulate.spec import (
    Chaos,
    RefitRecord,
    SimulationResult,
    SimulationSpec,
    parse_chaos,
    simulation_config,
)

__all__ = [
    "Chaos",
    "RefitRecord",
    "SimulationResult",
    "SimulationSpec",
    "parse_chaos",
    "run_simulation",
    "simulation_config",
]
