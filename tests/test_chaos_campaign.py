"""The chaos campaign: its plans, its oracle, and a seeded slice of real trials.

The slice runs real simulated fleets (Ray actor processes, gloo, the live controller)
with faults injected by real signals at moments drawn from each trial's seed; the
oracle reads only the ledger and the fault log. The full campaign (≥ 300 trials) is run
by hand: ``python bench/chaos_campaign.py --trials 300`` (bench/README.md).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.controller.ledger import Ledger
from fleetledger.events.models import FailureCount, RolloutFates, ShardOutcomes
from fleetledger.simulate.account import RoutedWait, Tally
from fleetledger.simulate.account_oracle import (
    LEFT_WAIT_BOUND_S,
    Death,
    Leave,
    _since,
    wait_problems,
)
from fleetledger.simulate.campaign import (
    Injection,
    TrialOutcome,
    _Driver,
    _Follower,
    run_trial,
)
from fleetledger.simulate.chaos_plan import (
    KINDS,
    VLLM_KINDS,
    Fault,
    TrialPlan,
    TrialSettings,
    cells,
    plan_trial,
    stratified_plans,
    trial_seeds,
)
from fleetledger.simulate.oracle import judge, judge_from_log
from fleetledger.simulate.spec import ADAPTER
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

SETTINGS = TrialSettings()


@given(st.integers(min_value=0, max_value=2**31))
@settings(max_examples=300, deadline=None)
def test_a_plan_is_a_pure_function_of_its_seed_and_always_well_formed(seed):
    plan = plan_trial(seed)
    assert plan == plan_trial(seed)  # a seed replays its trial
    assert plan.scenario in KINDS
    assert 1 <= len(plan.faults) <= 2
    for fault in plan.faults:
        assert 1 <= fault.step <= SETTINGS.steps
        assert fault.delay_s >= 0
        if fault.kind == "kill_controller":
            assert fault.shard is None
        else:
            assert fault.shard is not None and 0 <= fault.shard < SETTINGS.shards
        if fault.kind == "pause":  # shorter than the condemnation bound: must not die
            assert 0 < fault.pause_s < SETTINGS.condemnation_s
    if plan.faults[-1].phase in ("restart", "readmit"):  # someone restarts first
        first = plan.faults[0]
        assert first.kind == "kill" and first.phase == "rollouts"
    if plan.scenario == "kill_replacement":
        assert plan.faults[0].shard == plan.faults[1].shard
    if plan.scenario == "two_shards":
        assert plan.faults[-1].shard != plan.faults[-2].shard


def test_only_a_vllm_campaign_kills_engine_cores():
    vllm = TrialSettings.for_engine("vllm")
    sim_kinds = {plan_trial(seed).scenario for seed in trial_seeds(2, 300)}
    vllm_kinds = {plan_trial(seed, vllm).scenario for seed in trial_seeds(2, 300)}
    assert "kill_engine" not in sim_kinds
    assert vllm_kinds == set(VLLM_KINDS)


@pytest.mark.parametrize("engine", ["sim", "vllm"])
def test_the_cells_are_exactly_what_random_trials_draw(engine):
    """A stratified campaign covers the cells a random one can draw, and no other."""
    settings = TrialSettings.for_engine(engine)
    drawn = {plan_trial(seed, settings).label for seed in trial_seeds(3, 2000)}
    assert drawn == {f"{kind}@{phase}" for kind, phase in cells(settings)}


@given(st.integers(min_value=0, max_value=2**31), st.integers(min_value=1, max_value=3))
@settings(max_examples=50, deadline=None)
def test_a_stratified_campaign_runs_every_cell_per_cell_times_each_round_whole(seed, per_cell):
    vllm = TrialSettings.for_engine("vllm")
    table = cells(vllm)
    plans = list(stratified_plans(seed, per_cell, vllm))
    assert len(plans) == per_cell * len(table)
    for round_ in range(per_cell):  # round after round: a campaign stopped early is even
        chunk = plans[round_ * len(table) : (round_ + 1) * len(table)]
        assert [p.label for p in chunk] == [f"{k}@{ph}" for k, ph in table]
    # Each trial replays alone from its seed, held to its cell.
    for plan in plans:
        scenario, _, phase = plan.label.partition("@")
        assert plan_trial(plan.seed, vllm, (scenario, phase)) == plan  # type: ignore[arg-type]


def test_a_cell_the_engine_cannot_draw_is_refused_in_one_line():
    with pytest.raises(ValueError, match="kill_replacement@reload: a kill_replacement trial"):
        plan_trial(1, SETTINGS, ("kill_replacement", "reload"))
    with pytest.raises(ValueError, match="per_cell must be >= 1"):
        list(stratified_plans(1, 0))


def test_every_kind_and_phase_is_drawn():
    plans = [plan_trial(seed) for seed in trial_seeds(1, 400)]
    assert {p.scenario for p in plans} == set(KINDS)
    assert {p.faults[-1].phase for p in plans} == {
        "rollouts",
        "refit_start",
        "mid_broadcast",
        "reload",
        "restart",
        "readmit",
        "after_probe",
    }


# ── the oracle, on ledgers written by hand ────────────────────────────────────


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "judged", fleet_config(3, train_world_size=1))
    log.close()


def _outcome(ledger: Ledger, *hits: tuple[str, int], outcome: str = "completed") -> TrialOutcome:
    injections = [
        Injection(Fault(kind, shard, "rollouts", 1, 0.0), at_us=1, pid=1, incarnation=0)
        for kind, shard in hits
    ]
    scenario = hits[0][0] if hits else "kill"
    return TrialOutcome(
        TrialPlan(0, scenario, tuple(i.fault for i in injections)),  # type: ignore[arg-type]
        ledger.run,
        outcome,
        "",
        injections,
    )


def _judge(ledger: Ledger, outcome: TrialOutcome):
    return judge(outcome, list(ledger.log.read(ledger.run, 0)))


def test_a_kill_recorded_as_a_death_is_no_false_death(ledger):
    ledger.actor_died(1, "ActorDiedError: killed")
    verdict = _judge(ledger, _outcome(ledger, ("kill", 1)))
    assert verdict.ok, verdict.problems
    assert verdict.false_deaths == 0


def test_a_dead_shard_no_fault_hit_is_a_false_death(ledger):
    ledger.actor_died(1, "ActorDiedError: killed")
    for _ in range(3):
        ledger.record_probes({2: _failed()})
    verdict = _judge(ledger, _outcome(ledger, ("kill", 1)))
    assert verdict.false_deaths == 1
    assert any("shard 2" in p and "no fault hit it" in p for p in verdict.problems)


def test_a_paused_shard_that_dies_is_a_false_death(ledger):
    for _ in range(3):
        ledger.record_probes({0: _failed()})
    verdict = _judge(ledger, _outcome(ledger, ("pause", 0)))
    assert verdict.false_deaths == 1
    assert any("after a pause" in p for p in verdict.problems)


def _paused(ledger: Ledger, held_s: float) -> TrialOutcome:
    outcome = _outcome(ledger, ("pause", 0))
    outcome.injections[0].held_s = held_s
    outcome.condemnation_s = SETTINGS.condemnation_s
    return outcome


def test_a_pause_the_campaign_held_past_the_bound_is_the_campaigns_failure_not_a_death(ledger):
    """The story of the vLLM campaign: a pause planned under the bound but held past it
    (the injector blocked) is condemned rightly; the trial fails as the injector's."""
    for _ in range(3):
        ledger.record_probes({0: _failed()})
    verdict = _judge(ledger, _paused(ledger, SETTINGS.condemnation_s + 0.6))
    assert verdict.false_deaths == 0
    assert [p for p in verdict.problems if "injector overran" in p] == [
        f"injector overran: shard 0's pause was held {SETTINGS.condemnation_s + 0.6:.2f}s "
        f"(planned 0.00s), past the condemnation bound {SETTINGS.condemnation_s:g}s: the "
        "trial judges no pause"
    ]


def test_a_pause_held_as_planned_that_condemns_is_a_false_death(ledger):
    for _ in range(3):
        ledger.record_probes({0: _failed()})
    verdict = _judge(ledger, _paused(ledger, SETTINGS.condemnation_s * 0.5))
    assert verdict.false_deaths == 1
    assert not any("injector overran" in p for p in verdict.problems)


@pytest.fixture
def two_shards(sqlite_url: str) -> Iterator[Ledger]:
    log = EventLog.open(sqlite_url)
    yield Ledger.start(log, "two", fleet_config(2, train_world_size=1, min_healthy_shards=1))
    log.close()


def test_a_fleet_the_faults_left_too_few_fails_rightly(two_shards):
    """A vLLM trial's fleet is two shards: a kill of one, then of the other while the
    first restarts, leaves none — the exhaustion is the controller's right verdict."""
    ledger = two_shards
    ledger.actor_died(0, "ActorDiedError: killed")
    ledger.actor_died(1, "ActorDiedError: killed")
    ledger.declare_exhausted()
    ledger.end_run("failed", "only 0 generation shard(s) serving")
    outcome = _outcome(ledger, ("kill", 0), ("kill", 1), outcome="failed")
    verdict = _judge(ledger, outcome)
    assert verdict.ok, verdict.problems
    assert verdict.exhausted_by_faults


def test_an_exhaustion_a_missing_shard_no_fault_explains_is_a_failure(two_shards):
    ledger = two_shards
    ledger.actor_died(0, "ActorDiedError: killed")
    ledger.actor_died(1, "ActorDiedError: killed")  # no fault hit shard 1
    ledger.declare_exhausted()
    ledger.end_run("failed", "only 0 generation shard(s) serving")
    verdict = _judge(ledger, _outcome(ledger, ("kill", 0), outcome="failed"))
    assert not verdict.exhausted_by_faults
    assert any("shards [1] were missing and no fault explains them" in p for p in verdict.problems)


def test_an_exhaustion_after_a_pause_is_a_failure(two_shards):
    ledger = two_shards
    ledger.actor_died(0, "ActorDiedError: killed")
    for _ in range(3):
        ledger.record_probes({1: _failed()})
    ledger.declare_exhausted()
    ledger.end_run("failed", "only 0 generation shard(s) serving")
    verdict = _judge(ledger, _outcome(ledger, ("kill", 0), ("pause", 1), outcome="failed"))
    assert not verdict.exhausted_by_faults and verdict.false_deaths == 1


def test_a_frozen_shard_condemned_by_its_probe_streak_is_right(ledger):
    for _ in range(3):
        ledger.record_probes({0: _failed()})
    assert _judge(ledger, _outcome(ledger, ("freeze", 0))).ok


def test_a_killed_shard_never_recorded_dead_is_a_problem(ledger):
    verdict = _judge(ledger, _outcome(ledger, ("kill", 2)))
    assert any("kill not recorded" in p for p in verdict.problems)


def test_a_completed_run_must_commit_every_prompt_exactly_once(ledger):
    outcome = _outcome(ledger, ("pause", 0))
    outcome.expected_prompts = ("a", "b", "c")
    outcome.committed_prompts = {"a": 1, "b": 2}
    verdict = _judge(ledger, outcome)
    assert verdict.lost_prompts == 2
    assert {p for p in verdict.problems if "committed" in p} == {
        "prompt b committed 2 times",
        "prompt c committed 0 times",
    }


def _failed():
    from fleetledger.controller.ledger import ProbeResult

    return ProbeResult("timeout", "no answer within probe_timeout_s=0.25")


# ── a seeded slice of real trials ────────────────────────────────────────────

SLICE = tuple(trial_seeds(20, 20))
"""20 trials drawn from one seed: each its own test (a failure names its seed, and no
test runs past the suite's per-test timeout)."""


def test_the_slice_draws_every_scenario_kind():
    assert {plan_trial(seed).scenario for seed in SLICE} == set(KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLICE)
def test_a_seeded_trial_passes_the_oracle(seed, ray_cluster, campaign_db):
    """No false death, no hung run, no lost prompt, no process left; a controller
    SIGKILLed mid-run leaves a ledger whose membership reads back whole."""
    db, log = campaign_db
    outcome = run_trial(plan_trial(seed), db, ray_address=ray_cluster)
    verdict = judge_from_log(log, outcome)
    assert verdict.problems == [], f"seed {seed} ({outcome.plan.label}), run {outcome.run}"


ROUTED = TrialSettings(router=True)
ROUTED_SLICE = tuple(trial_seeds(35, 2))


@pytest.mark.slow
@pytest.mark.parametrize("seed", ROUTED_SLICE)
def test_a_frozen_shard_holds_no_request_through_the_router_past_one_poll(
    seed, ray_cluster, campaign_db
):
    """The loop's rollouts through the run's router; a shard frozen while they are in
    flight: every request on it ends within the bound of its condemnation (re-sent or
    cut), none waits to its deadline — held by the oracle against the ledger."""
    db, log = campaign_db
    plan = plan_trial(seed, ROUTED, ("freeze", "rollouts"))
    outcome = run_trial(plan, db, settings=ROUTED, ray_address=ray_cluster)
    verdict = judge_from_log(log, outcome)
    assert verdict.problems == [], f"seed {seed} ({outcome.plan.label}), run {outcome.run}"
    assert verdict.left_waits_s, "no request was in flight on the frozen shard"


# ── the injector holds a pause as planned ─────────────────────────────────────


def _process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class _AnsweredWhileRunning(_Follower):
    """A follower whose pid lookups behave like the Ray call a vLLM engine's actor answers:
    a stopped process never answers, and the caller gives up after 2 s. (The lookup is a
    stand-in for the actor call; the process, its signals and its state are real.)"""

    def __init__(self, pid: int) -> None:
        self.target = pid
        self.view = None
        self.asked: list[tuple[str, str]] = []  # (thread name, process state when asked)

    def read(self, shard: int, what: str) -> str | None:
        state = _process_state(self.target)
        self.asked.append((threading.current_thread().name, state))
        deadline = time.monotonic() + 2.0
        while _process_state(self.target) == "T":
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        return str(self.target)

    def poll(self) -> list:
        return []


def test_the_driver_never_asks_a_stopped_shard_anything_while_it_holds_the_pause():
    """The pids are collected on a thread of their own: a lookup the stopped process
    cannot answer blocks that thread, never the driver, which thaws on time and says how
    long it held the process."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        follower = _AnsweredWhileRunning(target.pid)
        vllm = TrialSettings.for_engine("vllm")
        fault = Fault("pause", 0, "rollouts", 1, 0.0, pause_s=1.2)
        done = threading.Event()
        driver = _Driver(TrialPlan(1, "pause", (fault,)), follower, vllm, done)
        watcher = threading.Thread(
            target=driver.pid_watcher.run, args=(done,), name="chaos-pids", daemon=True
        )
        watcher.start()
        injection = driver.injections[0]
        driver._inject(injection)
        done.set()
        watcher.join(10)
        assert injection.skipped == "" and injection.pid == target.pid
        assert injection.held_s is not None and injection.held_s >= fault.pause_s
        # While the process was stopped, only the pid watcher asked it anything.
        askers = {thread for thread, state in follower.asked if state == "T"}
        assert askers <= {"chaos-pids"}, askers
        assert target.pid in driver.pids_seen
        assert _process_state(target.pid) != "T"  # thawed
    finally:
        target.kill()
        target.wait()


# ── the loop's own account against the ledger ────────────────────────────────


def _now_us() -> int:
    return time.time_ns() // 1000


def _window(ledger: Ledger, shard: int, *, ok: int = 0, redispatched: int = 0) -> None:
    fates = RolloutFates(redispatched=redispatched) if redispatched else None
    ledger.report_outcomes(ADAPTER, [ShardOutcomes(shard=shard, successes=ok, fates=fates)])


def _tallies(shard: int, at_us: int, **seen: int) -> tuple[Tally, ...]:
    return tuple(Tally(at_us, shard, what) for what, n in seen.items() for _ in range(n))


def test_a_deaths_cost_equal_to_what_the_loop_counted_is_right(ledger):
    injected = _now_us()
    ledger.actor_died(1, "ActorDiedError: killed")
    _window(ledger, 1, redispatched=2)
    _window(ledger, 0, ok=2)
    outcome = _outcome(ledger, ("kill", 1))
    outcome.injections[0].at_us = injected
    outcome.tallies = (
        *_tallies(1, _now_us(), redispatched=2),
        *_tallies(0, _now_us(), success=2),
    )
    verdict = _judge(ledger, outcome)
    assert verdict.ok, verdict.problems
    assert verdict.costs_checked == 1


def test_a_cost_that_differs_from_the_loops_count_is_a_problem(ledger):
    injected = _now_us()
    ledger.actor_died(1, "ActorDiedError: killed")
    _window(ledger, 1, redispatched=2)
    outcome = _outcome(ledger, ("kill", 1))
    outcome.injections[0].at_us = injected
    outcome.tallies = _tallies(1, _now_us(), redispatched=3)  # one fate never reported
    problems = _judge(ledger, outcome).problems
    seq = ledger.view.seq - 1
    assert (
        f"cost: shard 1's death at seq {seq}: the ledger says 2 in flight (2 re-dispatched, "
        "0 dropped, 0 ended), the loop counted 3 in flight (3 re-dispatched, 0 dropped, 0 ended)"
    ) in problems
    assert "windows: shard 1 redispatched: the ledger has 2, the loop counted 3" in problems


def test_a_success_the_loop_saw_and_no_window_holds_is_a_problem(ledger):
    _window(ledger, 0, ok=1)
    outcome = _outcome(ledger)
    outcome.tallies = _tallies(0, _now_us(), success=2)
    assert _judge(ledger, outcome).problems == [
        "windows: shard 0 success: the ledger has 1, the loop counted 2"
    ]


def test_fates_of_an_earlier_fault_no_success_followed_belong_to_the_death():
    """A pause, then a kill of the same incarnation with no success between: the ledger
    cannot tell their failures apart, and the oracle does not ask it to."""
    death = Death(shard=1, incarnation=0, seq=9, at_us=3_000, injected_us=2_000)
    hits = {(1, 0): [1_000, 2_000]}
    assert _since(death, hits, _tallies(1, 1_500, redispatched=1)) == 1_000
    assert _since(death, hits, _tallies(1, 1_500, success=1)) == 2_000


def _wait(started: float, ended: float, shard: int | None, how: str, resent_from=None):
    return RoutedWait(int(started * 1e6), int(ended * 1e6), shard, resent_from, how)


def test_a_request_held_past_the_bound_after_its_shard_left_is_a_problem():
    leaves = [Leave(shard=1, at_us=10_000_000, back_us=None)]
    quick = _wait(9.5, 10.6, 1, "shard_left")
    resent = _wait(9.0, 10.5, 2, "answered", resent_from=1)
    held = _wait(9.5, 10.0 + LEFT_WAIT_BOUND_S + 1, 1, "error")
    problems, pasts = wait_problems([quick, resent, held], leaves)
    assert pasts == pytest.approx([0.6, 0.5, LEFT_WAIT_BOUND_S + 1])
    assert problems == [
        f"a request waited {LEFT_WAIT_BOUND_S + 1:.2f}s on shard 1 after it left the fleet "
        f"(bound {LEFT_WAIT_BOUND_S:g}s; it ended error)"
    ]


def test_a_routed_request_that_waits_to_its_deadline_is_a_problem_and_says_who_left():
    leaves = [Leave(shard=2, at_us=1_000_000, back_us=2_000_000)]
    problems, _ = wait_problems([_wait(0.5, 5.5, None, "deadline")], leaves)
    assert problems == [
        "a request through the router waited 5.00s, to its deadline, while shard(s) [2] "
        "left the fleet"
    ]


def test_a_request_the_router_ended_as_left_on_a_shard_the_ledger_had_serving_is_a_problem():
    problems, _ = wait_problems([_wait(1.0, 1.2, 0, "shard_left")], [])
    assert problems == [
        "the router ended a request on shard 0 as left, and the ledger has it serving from "
        "1000000 to 1200000"
    ]
    answered, _ = wait_problems([_wait(1.0, 9.0, 0, "answered")], [])
    assert answered == []  # answered by the shard it was sent to


def test_a_kill_injected_after_the_run_ended_is_skipped_not_unrecorded(ledger):
    ledger.end_run_if_open("completed", "3 of 3 steps done")
    outcome = _outcome(ledger, ("kill", 2))
    outcome.injections[0].at_us = _now_us() + 5_000  # 5 ms after the end
    verdict = _judge(ledger, outcome)
    assert verdict.ok, verdict.problems
    assert outcome.injections[0].skipped == f"injected after the run ended (seq {ledger.view.seq})"


def test_a_killed_shard_condemned_by_the_routers_failures_is_right_only_when_routed(ledger):
    """Through the router a killed engine is connections refused, reported failures;
    without it the loop sees Ray's word on the death, and a reported streak is wrong."""
    for _ in range(3):
        ledger.report_outcomes(
            "router",
            [
                ShardOutcomes(
                    shard=1,
                    failures=(FailureCount(category="infra", reason="backend_error", count=1),),
                )
            ],
        )
    outcome = _outcome(ledger, ("kill", 1))
    assert any(p.startswith("wrong rule: shard 1") for p in _judge(ledger, outcome).problems)
    outcome.routed = True
    assert _judge(ledger, outcome).ok
