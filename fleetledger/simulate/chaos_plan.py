"""A chaos campaign's plans: which faults a trial injects, where and when, from its seed.

Pure: a plan is a function of the seed and the settings (and of ``only``, which holds
every trial to one scenario and phase), so a seed replays its trial. Running a plan is
:mod:`fleetledger.simulate.campaign`; judging it, :mod:`fleetledger.simulate.oracle`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

from fleetledger.simulate.spec import SimulationSpec, simulation_config

__all__ = [
    "DEFAULT_SETTINGS",
    "KINDS",
    "PHASES",
    "VLLM_KINDS",
    "Fault",
    "TrialPlan",
    "TrialSettings",
    "cells",
    "kinds_of",
    "plan_trial",
    "stratified_plans",
    "trial_seeds",
]

Phase = Literal[
    "rollouts", "refit_start", "mid_broadcast", "reload", "restart", "readmit", "after_probe"
]
PHASES: tuple[Phase, ...] = get_args(Phase)
FaultKind = Literal["kill", "kill_engine", "freeze", "pause", "kill_replacement", "kill_controller"]
Scenario = Literal[
    "kill", "kill_engine", "freeze", "pause", "kill_replacement", "two_shards", "kill_controller"
]
KINDS: tuple[Scenario, ...] = (
    "kill",
    "freeze",
    "pause",
    "kill_replacement",
    "two_shards",
    "kill_controller",
)
VLLM_KINDS: tuple[Scenario, ...] = (*(k for k in KINDS if k != "two_shards"), "kill_engine")
"""A vLLM engine also has an engine core process to kill under its live actor. A vLLM
fleet is two engines (three start too slowly together on two cores): two faults on both
would leave no survivor, so two shards close together is the simulated campaign's."""


def kinds_of(settings: TrialSettings) -> tuple[Scenario, ...]:
    """The scenarios a campaign on ``settings`` draws. With the router in the loop the
    controller is not killed: the router is the controller's actor and would go with it,
    and what is judged there is the router's hold on requests."""
    kinds = VLLM_KINDS if settings.engine == "vllm" else KINDS
    return tuple(k for k in kinds if k != "kill_controller") if settings.router else kinds


# Where a fault of each scenario may land. A fault during a restart or the re-admitting
# refit needs a shard restarting first: the plan kills another shard early for it.
_SHARD_PHASES: tuple[Phase, ...] = PHASES
_CONTROLLER_PHASES: tuple[Phase, ...] = ("rollouts", "refit_start", "mid_broadcast", "after_probe")


@dataclass(frozen=True)
class TrialSettings:
    """The fleet and clocks every trial of a campaign runs with."""

    shards: int = 3
    steps: int = 3
    groups_per_step: int = 2
    group_size: int = 3
    generation_s: float = 0.2
    reload_s: float = 0.15
    startup_s: float = 0.4
    weights_bytes: int = 16_000_000
    probe_interval_s: float = 0.5
    probe_timeout_s: float = 0.25
    refit_timeout_s: float = 2.0
    trial_timeout_s: float = 120.0
    engine: Literal["sim", "vllm"] = "sim"
    router: bool = False  # the loop's rollouts through the run's router (simulate --router)

    @classmethod
    def for_engine(cls, engine: str, *, router: bool = False) -> TrialSettings:
        """The campaign's settings for ``engine``: a vLLM engine takes ~12 s to start, its
        refit of the tiny model ~0.2 s, and two of them share two cores."""
        if engine == "vllm":
            return cls(
                engine="vllm",
                router=router,
                shards=2,
                generation_s=0.3,  # a rollout's window (a tiny model's generation)
                startup_s=8.0,  # an engine loading: the window to kill a replacement in
                probe_interval_s=1.0,
                probe_timeout_s=0.5,
                refit_timeout_s=10.0,
                trial_timeout_s=600.0,
            )
        return cls(router=router)

    @property
    def condemnation_s(self) -> float:
        """How long a silent shard takes to be condemned by its probe streak, at least:
        the threshold's probe rounds, one interval apart (unhealthy_threshold 3)."""
        return 2 * self.probe_interval_s

    def spec(self, run: str, stage_dir: str) -> SimulationSpec:
        config = simulation_config(
            probe_interval_s=self.probe_interval_s,
            probe_timeout_s=self.probe_timeout_s,
            restart_dead_shards=True,
            refit_timeout_s=self.refit_timeout_s,
        )
        if self.engine == "vllm":
            return SimulationSpec(
                shards=self.shards,
                steps=self.steps,
                groups_per_step=self.groups_per_step,
                group_size=self.group_size,
                # A step at least one probe interval long, so every step has a probe
                # round: a tiny model's rollouts and refit take well under a second, and
                # "after_probe of step N" used to miss its step and then the run's end
                # (every after_probe trial of a stratified vLLM campaign's first round).
                train_s=self.probe_interval_s,
                config=config,
                run=run,
                engine="vllm",
                await_restarts_s=240.0,
                router=self.router,
            )
        return SimulationSpec(
            shards=self.shards,
            steps=self.steps,
            groups_per_step=self.groups_per_step,
            group_size=self.group_size,
            generation_s=self.generation_s,
            train_s=0.02,
            config=config,
            run=run,
            weights_bytes=self.weights_bytes,
            reload_s=self.reload_s,
            startup_s=self.startup_s,
            stage_dir=stage_dir,
            # The last refit re-admits every replacement: a fault aimed at a restart or at
            # the re-admitting refit always has its phase.
            await_restarts_s=30.0,
            router=self.router,
        )


DEFAULT_SETTINGS = TrialSettings()


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on ``shard`` (``None``: the controller), ``delay_s`` after
    ``phase`` of ``step`` is seen to begin; a pause is thawed after ``pause_s``."""

    kind: FaultKind
    shard: int | None
    phase: Phase
    step: int
    delay_s: float
    pause_s: float = 0.0


@dataclass(frozen=True)
class TrialPlan:
    seed: int
    scenario: Scenario
    faults: tuple[Fault, ...]

    @property
    def label(self) -> str:
        main = self.faults[-1]
        return f"{self.scenario}@{main.phase}"


def plan_trial(
    seed: int,
    settings: TrialSettings = DEFAULT_SETTINGS,
    only: tuple[Scenario, Phase] | None = None,
) -> TrialPlan:
    """The scenario of trial ``seed``: a pure function of the seed (and ``only``: a
    scenario and phase every trial is held to, the moments still drawn from the seed)."""
    rng = random.Random(seed)
    scenario: Scenario = rng.choice(kinds_of(settings))
    if only is not None:
        scenario = only[0]
        if only[1] not in _phases_of(scenario):
            raise ValueError(
                f"{scenario}@{only[1]}: a {scenario} trial lands in "
                f"{', '.join(_phases_of(scenario))}, not {only[1]}"
            )
    shards = list(range(settings.shards))
    rng.shuffle(shards)
    if scenario == "kill_controller":
        phase = rng.choice(_phases_of(scenario)) if only is None else only[1]
        step = rng.randint(1, settings.steps - 1)
        return TrialPlan(seed, scenario, (Fault("kill_controller", None, phase, step, 0.0),))
    if scenario == "kill_replacement":
        # The first kill makes a restart; the replacement is killed while it loads.
        step = rng.randint(1, settings.steps - 2)
        first = Fault("kill", shards[0], "rollouts", step, rng.uniform(0.02, 0.15))
        again = Fault(
            "kill_replacement", shards[0], "restart", step, rng.uniform(0, settings.startup_s)
        )
        return TrialPlan(seed, scenario, (first, again))
    # Two faults close together land in one phase of their own: a restart or a
    # re-admission would need a third fault first (1-2 faults a trial).
    phase: Phase = rng.choice(_phases_of(scenario)) if only is None else only[1]
    faults: list[Fault] = []
    target = shards[-1]
    if phase in ("restart", "readmit"):
        # A shard must be restarting first: another one is killed early in the run.
        step = rng.randint(1, settings.steps - 2)
        faults.append(Fault("kill", shards[0], "rollouts", step, rng.uniform(0.02, 0.15)))
        if phase == "readmit":
            target = rng.choice(shards)  # the re-admitted shard itself, or a survivor
    else:
        step = rng.randint(1, settings.steps)
    if scenario == "two_shards":
        kinds: list[FaultKind] = [rng.choice(("kill", "freeze")), rng.choice(("kill", "freeze"))]
        others = [s for s in shards if s != target and not (faults and s == faults[0].shard)]
        second = others[0] if others else shards[1]
        faults.append(Fault(kinds[0], target, phase, step, _delay(rng, phase, settings)))
        faults.append(Fault(kinds[1], second, phase, step, rng.uniform(0.0, 0.05)))
        return TrialPlan(seed, scenario, tuple(faults))
    kind: FaultKind = scenario  # kill, kill_engine, freeze or pause
    pause = rng.uniform(0.1, settings.condemnation_s * 0.6) if kind == "pause" else 0.0
    faults.append(Fault(kind, target, phase, step, _delay(rng, phase, settings), pause))
    return TrialPlan(seed, scenario, tuple(faults))


def _phases_of(scenario: Scenario) -> tuple[Phase, ...]:
    """The phases a fault of ``scenario`` may land in (the last fault's, for a label)."""
    if scenario == "kill_controller":
        return _CONTROLLER_PHASES
    if scenario == "kill_replacement":
        return ("restart",)
    if scenario == "two_shards":
        return (*_CONTROLLER_PHASES, "reload")
    return _SHARD_PHASES


def cells(settings: TrialSettings = DEFAULT_SETTINGS) -> tuple[tuple[Scenario, Phase], ...]:
    """Every scenario × phase cell a campaign on ``settings``' engine can draw, in a
    fixed order: what a stratified campaign covers (a random one leaves rare cells out —
    the vLLM campaign's 20 random trials drew one pause)."""
    kinds = kinds_of(settings)
    return tuple((kind, phase) for kind in kinds for phase in _phases_of(kind))


def stratified_plans(
    seed: int, per_cell: int, settings: TrialSettings = DEFAULT_SETTINGS
) -> Iterator[TrialPlan]:
    """``per_cell`` trials of every cell, the cells interleaved (round after round, so a
    campaign stopped early has covered every cell as often as it could); each trial's
    moments drawn from its own seed, so any of them replays with ``--only CELL
    --replay SEED``."""
    if per_cell < 1:
        raise ValueError(f"per_cell must be >= 1, got {per_cell}")
    table = cells(settings)
    seeds = trial_seeds(seed, per_cell * len(table))
    for _ in range(per_cell):
        for cell in table:
            yield plan_trial(next(seeds), settings, cell)


def _delay(rng: random.Random, phase: Phase, settings: TrialSettings) -> float:
    """How long after the phase is seen to begin: anywhere inside it."""
    windows: dict[Phase, float] = {
        "rollouts": settings.generation_s * 0.9,
        "refit_start": 0.01,
        "mid_broadcast": 0.01,
        "reload": settings.reload_s * 0.9,
        "restart": settings.startup_s * 0.9,
        "readmit": 0.05,
        "after_probe": 0.02,
    }
    return rng.uniform(0.0, windows[phase])


def trial_seeds(seed: int, trials: int) -> Iterator[int]:
    """The seeds of a campaign: one per trial, each replaying its trial alone."""
    rng = random.Random(seed)
    for _ in range(trials):
        yield rng.randrange(1, 2**31)
