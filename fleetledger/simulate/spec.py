"""What a simulated run is asked to be: its shape, its clocks, and the chaos to inject.

Validated when built, so a typo on the command line is one line naming the option, not
a run that starts and then does nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from fleetledger.config import ControllerConfig
from fleetledger.events.models import shard_outside
from fleetledger.simulate.account import RoutedWait, Tally

ChaosAction = Literal["kill", "freeze", "wedge", "blip", "kill-engine"]
CHAOS_ACTIONS: tuple[ChaosAction, ...] = ("kill", "freeze", "wedge", "blip", "kill-engine")

EngineKind = Literal["sim", "vllm"]
ENGINES: tuple[EngineKind, ...] = ("sim", "vllm")


@dataclass(frozen=True, slots=True)
class Chaos:
    """One fault to inject: ``action`` on ``shard`` during ``step`` (1-based).

    ``kill`` SIGKILLs the shard's process, ``freeze`` SIGSTOPs it, ``wedge`` makes every
    later generation hang while probes still answer (a vLLM engine: its engine core is
    SIGSTOPped, the real wedge), ``blip`` fails its next generation once with a
    transport error (the simulated engine only), ``kill-engine`` SIGKILLs a vLLM
    engine's core process only: the actor lives on, and Ray never reports the death.
    """

    action: ChaosAction
    shard: int
    step: int


_CHAOS = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*$")


def parse_chaos(action: ChaosAction, spec: str) -> Chaos:
    """Parse ``SHARD@STEP`` (e.g. ``2@5``: shard 2 during step 5)."""
    match = _CHAOS.match(spec)
    if match is None:
        raise ValueError(f"--{action} {spec!r}: expected SHARD@STEP, e.g. 2@5")
    return Chaos(action, int(match.group(1)), int(match.group(2)))


def simulation_config(
    *,
    probe_interval_s: float = 0.5,
    probe_timeout_s: float = 0.25,
    restart_dead_shards: bool = False,
    generation_timeout_s: float | None = 5.0,
    min_healthy_shards: int = 1,
    stall_timeout_s: float = 60.0,
    stall_action: Literal["warn", "abort"] = "warn",
    deep_probe: bool = False,
    refit_timeout_s: float = 2.0,
) -> ControllerConfig:
    """The controller configuration of a simulated run: fleet health on, short clocks."""
    return ControllerConfig.model_validate(
        {
            "fleet_health": {
                "enabled": True,
                "probe_interval_s": probe_interval_s,
                "probe_timeout_s": probe_timeout_s,
                "restart_dead_shards": restart_dead_shards,
                "min_healthy_shards": min_healthy_shards,
                "deep_probe": deep_probe,
            },
            "rollout_failure": {"backoff_base_s": 0.05, "max_backoff_s": 1.0},
            "timeouts": {"generation_timeout_s": generation_timeout_s},
            "watchdog": {
                "interval_s": 0.5,
                "stall_timeout_s": stall_timeout_s,
                "stall_action": stall_action,
            },
            "refit": {"refit_timeout_s": refit_timeout_s, "grace_s": 1.0},
        }
    )


def routed_config(config: ControllerConfig) -> ControllerConfig:
    """``config`` with its router enabled, as ``--router`` runs it: the bound on one
    backend call inside the rollout's innermost deadline (the configuration's own rule),
    so the router gives up on an engine before the rollout gives up on the router."""
    data = config.model_dump(mode="json", exclude_unset=True)
    router = data.setdefault("router", {})
    router["enabled"] = True
    timeouts = config.timeouts
    deadline = next(
        (d for d in (timeouts.generation_timeout_s, timeouts.rollout_timeout_s) if d is not None),
        None,
    )
    if deadline is not None and config.router.backend_bound_s > deadline:
        router["backend_timeout_s"] = deadline
    return ControllerConfig.model_validate(data)


ADAPTER = "simulate.rollouts"
"""The adapter the loop's outcome windows are reported under."""


@dataclass(frozen=True)
class SimulationSpec:
    shards: int = 4
    steps: int = 5
    groups_per_step: int = 4
    group_size: int = 4
    generation_s: float = 0.05
    train_s: float = 0.05
    chaos: tuple[Chaos, ...] = ()
    config: ControllerConfig = field(default_factory=simulation_config)
    run: str | None = None
    metrics_port: int | None = None
    weights_bytes: int = 4_000_000
    engine: EngineKind = "sim"
    model: str | None = None  # vllm only: a local Hugging Face model (default: tiny Llama)
    router: bool = False  # rollouts over HTTP through the run's router
    # Before the last refit, wait at most this long until no shard is DEAD or RESTARTING.
    await_restarts_s: float | None = None
    # The simulated engine's own clocks (chaos campaigns aim faults at them): how long a
    # refit's load takes after the bytes are in, how long an engine takes to come up, and
    # where each shard writes its pid and refit stage (SimulatedRefitShard).
    reload_s: float = 0.0
    startup_s: float = 0.0
    stage_dir: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"--engine {self.engine}: expected one of {', '.join(ENGINES)}")
        if self.model is not None and self.engine != "vllm":
            raise ValueError("--model is for --engine vllm (the simulated engine has no model)")
        for c in self.chaos:
            if self.engine == "vllm" and c.action == "blip":
                raise ValueError(
                    f"--blip {c.shard}@{c.step}: a blip is a fault of the simulated engine; "
                    "a vLLM engine is killed, frozen or wedged for real"
                )
            if self.engine != "vllm" and c.action == "kill-engine":
                raise ValueError(
                    f"--kill-engine {c.shard}@{c.step}: only a vLLM engine has an engine core "
                    "process (--engine vllm); kill a simulated shard with --kill"
                )
        if self.await_restarts_s is not None:
            if not self.config.fleet_health.restart_dead_shards:
                raise ValueError(
                    f"--await-restarts {self.await_restarts_s:g} needs --restart: without it "
                    "no dead shard is restarted, so there is nothing to wait for"
                )
            if not self.await_restarts_s > 0:
                raise ValueError(f"--await-restarts {self.await_restarts_s:g}: must be > 0 seconds")
        if self.router and not self.config.router.enabled:
            # The run records the router it really runs (its run_started said "no
            # router", and a 300 s backend bound under a 5 s generation deadline).
            object.__setattr__(self, "config", routed_config(self.config))
        for name in ("shards", "steps", "groups_per_step", "group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("generation_s", "train_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.weights_bytes < 1024:
            raise ValueError(f"weights must be at least 1 KB, got {self.weights_bytes} bytes")
        for c in self.chaos:
            problem = shard_outside(c.shard, self.shards)
            if problem is not None:
                raise ValueError(f"--{c.action} {c.shard}@{c.step}: {problem}")
            if not 1 <= c.step <= self.steps:
                raise ValueError(
                    f"--{c.action} {c.shard}@{c.step}: step {c.step} is outside 1..{self.steps}"
                )


@dataclass(frozen=True, slots=True)
class RefitRecord:
    """One refit of the run: the version pushed, the shards it reached, and — with a
    real engine — the largest logprob difference between them and the trainer."""

    weight_version: int
    shards: tuple[int, ...]
    logprob_max_abs_diff: float | None

    def as_json(self) -> dict[str, object]:
        return {
            "weight_version": self.weight_version,
            "shards": list(self.shards),
            "logprob_max_abs_diff": self.logprob_max_abs_diff,
        }


@dataclass(frozen=True)
class SimulationResult:
    run: str
    outcome: str
    cause: str
    steps_done: int
    counters: dict[str, object]
    refits: tuple[RefitRecord, ...] = ()
    # prompt id -> how many times the trainer received it in a committed group
    committed_prompts: Mapping[str, int] = field(default_factory=dict)
    # what the loop itself saw end on each shard, and each request through the router
    tallies: tuple[Tally, ...] = ()
    waits: tuple[RoutedWait, ...] = ()
