"""The chaos campaign's oracle: a trial judged from its ledger and its fault log alone.

What must hold whatever moment a fault chose:

- every DEAD names a shard a fault hit, in the incarnation it hit, by the rule that
  fault should trigger: a kill by a confirmed death, a freeze by its probe streak (or
  its reported streak, or condemnation as the silent participant of a refit), a
  replacement killed while it loads by the failed restart. No untouched shard is ever
  condemned; a pause shorter than the condemnation bound condemns nothing;
- a pause was held as planned: one the campaign held past the condemnation bound
  (measured between its two signals) is the campaign's own failure, said as such — the
  controller is right to condemn it, and the trial proves nothing of pauses;
- a kill is recorded (the shard's incarnation does reach DEAD);
- the run completes, every prompt committed exactly once; none hangs. A run may instead
  end failed by its fleet falling below ``min_healthy_shards`` when the trial's own
  lethal faults put every missing shard out (a vLLM fleet is two shards: a fault on the
  survivor while the other restarts leaves none) — the controller's right verdict,
  counted apart (``exhausted_by_faults``); with one missing shard no fault explains, it
  is a failure;
- a refit in flight when a death is recorded completes (recovered) within
  ``REFIT_AFTER_DEATH_BOUND_S`` of the death;
- after the trial, no process of its fleet is left running;
- a run whose controller was SIGKILLed reads back: its membership from the snapshot and
  tail equals the fold of its whole log;
- each fault's cost, derived from the ledger alone, equals what the loop itself counted,
  and with the router in the loop no request waits on a shard that left past one poll
  (:mod:`fleetledger.simulate.account_oracle`).

Pure but for the one function that reads the ledger (:func:`judge_from_log`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetledger.events.models import RecordedEvent
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.membership import membership_document
from fleetledger.projections.shard_states import SERVING, Input, ShardState
from fleetledger.queries.views import load_view
from fleetledger.simulate.account_oracle import Death, Leave, cost_problems, wait_problems
from fleetledger.simulate.campaign import Injection, TrialOutcome, processes_left
from fleetledger.simulate.spec import ADAPTER
from fleetledger.store.errors import UnknownRun
from fleetledger.store.log import EventLog

__all__ = ["REFIT_AFTER_DEATH_BOUND_S", "Verdict", "judge", "judge_from_log"]

REFIT_AFTER_DEATH_BOUND_S = 10.0
"""A refit open at (or started after) a recorded death completes within this: the
refit timeout (2 s) + 2 × grace (1 s) bounds a push, the probes and the rebuild take
well under a second; the rest is the machine's margin (2 cores, shared)."""

# Which rules may condemn a shard hit by each kind of fault.
_DEATH_RULES: Mapping[str, frozenset[Input]] = {
    "kill": frozenset({Input.ACTOR_DIED, Input.ENGINE_DIED}),
    "kill_engine": frozenset({Input.ENGINE_DIED}),
    "freeze": frozenset({Input.PROBE_FAILED, Input.REPORTED_FAILURE, Input.CONDEMNED}),
    "kill_replacement": frozenset({Input.RESTART_FAILED, Input.ACTOR_DIED}),
    "pause": frozenset(),
}


# With the router in the loop, nothing on the rollout side sees Ray's word on an actor's
# death: a killed engine is connections refused, each a reported failure, and the
# reported streak may condemn it before the death is confirmed — a right rule there.
_SEEN_AS_FAILURES = frozenset({"kill", "kill_engine"})


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    false_deaths: int = 0
    lost_prompts: int = 0
    hung: bool = False
    exhausted_by_faults: bool = False  # the run failed, rightly: the faults left too few
    # (fault kind, phase) -> seconds from the injection to the death, to the refit after
    detection_s: dict[tuple[str, str], float] = field(default_factory=dict)
    recovery_s: dict[tuple[str, str], float] = field(default_factory=dict)
    costs_checked: int = 0  # faults whose cost was held against the loop's own count
    # seconds each request on a shard that left waited past its leaving (router in loop)
    left_waits_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def judge(
    outcome: TrialOutcome,
    events: Sequence[RecordedEvent],
    *,
    left_running: Sequence[int] = (),
    read_back: str | None = None,
) -> Verdict:
    """Judge one trial from its ledger's events and its fault log (see the module)."""
    verdict = Verdict()
    if outcome.outcome == "hung":
        verdict.hung = True
        verdict.problems.append(f"hung: {outcome.cause}")
    _late(outcome.injections, events)
    injected = [i for i in outcome.injections if not i.skipped]
    overran = [i for i in injected if _overran(i, outcome.condemnation_s)]
    for injection in overran:
        verdict.problems.append(
            f"injector overran: shard {injection.fault.shard}'s pause was held "
            f"{injection.held_s:.2f}s (planned {injection.fault.pause_s:.2f}s), past the "
            f"condemnation bound {outcome.condemnation_s:g}s: the trial judges no pause"
        )
    walk = _walk(events, injected)
    deaths, refits_done, leaves = walk.deaths, walk.refits_done, walk.leaves
    unexplained_exhaustion = walk.unexplained_exhaustion
    explained: list[Death] = []
    for shard, incarnation, rule, seq, at_us, during_refit in deaths:
        cause = _cause(injected, shard, incarnation, at_us)
        if cause is None:
            verdict.false_deaths += 1
            verdict.problems.append(
                f"false death: shard {shard} (incarnation {incarnation}) DEAD at seq {seq} "
                f"by {rule.value}, and no fault hit it"
            )
            continue
        if any(cause is i for i in overran) and rule in _DEATH_RULES["freeze"]:
            continue  # a pause held past the bound is a freeze: said above, no false death
        rules = _DEATH_RULES[cause.fault.kind]
        if outcome.routed and cause.fault.kind in _SEEN_AS_FAILURES:
            rules = rules | {Input.REPORTED_FAILURE}
        if rule not in rules:
            verdict.false_deaths += 1
            verdict.problems.append(
                f"wrong rule: shard {shard} DEAD at seq {seq} by {rule.value} after a "
                f"{cause.fault.kind}"
            )
            continue
        explained.append(Death(shard, incarnation, seq, at_us, cause.at_us))
        key = (cause.fault.kind, cause.fault.phase)
        verdict.detection_s.setdefault(key, (at_us - cause.at_us) / 1e6)
        after = [at for s, at in refits_done if s > seq]
        # Bounded: the refit a death interrupted. (The next refit after a death outside
        # one waits for the training step, and in a campaign for the replacement.)
        if after and during_refit:
            verdict.recovery_s.setdefault(key, (after[0] - cause.at_us) / 1e6)
            if (after[0] - at_us) / 1e6 > REFIT_AFTER_DEATH_BOUND_S:
                verdict.problems.append(
                    f"slow recovery: the refit after shard {shard}'s death at seq {seq} "
                    f"completed {(after[0] - at_us) / 1e6:.1f}s later "
                    f"(bound {REFIT_AFTER_DEATH_BOUND_S:g}s)"
                )
    for injection in injected:
        kind, shard = injection.fault.kind, injection.fault.shard
        if kind == "kill" and not any(
            s == shard and inc == injection.incarnation and at >= injection.at_us
            for s, inc, _, _, at, _ in deaths
        ):
            if outcome.outcome == "completed":
                verdict.problems.append(f"kill not recorded: shard {shard} never DEAD")
    if outcome.plan.scenario == "kill_controller":
        if outcome.outcome not in ("killed", "completed"):
            verdict.problems.append(f"controller trial ended {outcome.outcome}: {outcome.cause}")
        if read_back is not None:
            verdict.problems.append(read_back)
    elif outcome.outcome == "failed" and unexplained_exhaustion == [] and not verdict.false_deaths:
        verdict.exhausted_by_faults = True
    elif outcome.outcome != "completed":
        unexplained = (
            f" (shards {unexplained_exhaustion} were missing and no fault explains them)"
            if unexplained_exhaustion
            else ""
        )
        verdict.problems.append(f"run {outcome.outcome}: {outcome.cause}{unexplained}")
    else:
        for prompt in outcome.expected_prompts:
            times = outcome.committed_prompts.get(prompt, 0)
            if times != 1:
                verdict.lost_prompts += 1
                verdict.problems.append(f"prompt {prompt} committed {times} times")
    _account(verdict, outcome, events, explained, leaves, injected)
    if left_running:
        verdict.problems.append(f"processes left running: {sorted(left_running)}")
    return verdict


@dataclass
class _Walk:
    """What the oracle reads in the trial's events, in one pass."""

    # shard, incarnation, input, seq, at, and whether a refit was in flight at the death
    deaths: list[tuple[int, int, Input, int, int, bool]] = field(default_factory=list)
    refits_done: list[tuple[int, int]] = field(default_factory=list)  # (seq, at_us)
    unexplained_exhaustion: list[int] | None = None  # missing shards no fault explains
    leaves: list[Leave] = field(default_factory=list)  # shards out of serving, when


def _walk(events: Sequence[RecordedEvent], injected: Sequence[Injection]) -> _Walk:
    walk = _Walk()
    view = None
    in_refit = False  # from a refit's start, through its aborts, to its completion
    out_since: dict[int, int] = {}  # shard -> when it left serving
    for recorded in events:
        if view is None:
            view = fold([recorded])
            continue
        kind = recorded.event.type
        in_refit = (in_refit or kind == "refit_started") and kind != "refit_completed"
        for t in view.apply(recorded):
            if t.before in SERVING and t.after not in SERVING:
                out_since[t.shard] = t.at_us
            elif t.before not in SERVING and t.after in SERVING and t.shard in out_since:
                walk.leaves.append(Leave(t.shard, out_since.pop(t.shard), t.at_us))
            if t.after is ShardState.DEAD:
                incarnation = view.shards[t.shard].restart_attempts
                walk.deaths.append((t.shard, incarnation, t.input, t.seq, t.at_us, in_refit))
        if kind == "refit_completed":
            walk.refits_done.append((recorded.seq, recorded.at_us))
        if kind == "fleet_exhausted" and walk.unexplained_exhaustion is None:
            walk.unexplained_exhaustion = [
                record.index
                for record in view.shards
                if not record.serving
                and _lethal_cause(injected, record.index, view, recorded.at_us) is None
            ]
    walk.leaves += [Leave(shard, at_us, None) for shard, at_us in out_since.items()]
    return walk


def _account(
    verdict: Verdict,
    outcome: TrialOutcome,
    events: Sequence[RecordedEvent],
    deaths: list[Death],
    leaves: list[Leave],
    injected: Sequence[Injection],
) -> None:
    """The loop's own account against the ledger (see the module): costs where the loop
    picked its shards and the run completed, waits where the router did."""
    if outcome.routed:
        problems, verdict.left_waits_s = wait_problems(outcome.waits, leaves)
        verdict.problems += problems
        return
    if outcome.outcome != "completed" or not outcome.tallies:
        return  # ended by its controller, or the loop ran in a killed controller's process
    hits: dict[tuple[int, int], list[int]] = {}
    for i in injected:
        if i.fault.shard is not None and i.incarnation is not None:
            hits.setdefault((i.fault.shard, i.incarnation), []).append(i.at_us)
    verdict.problems += cost_problems(events, deaths, leaves, outcome.tallies, hits, ADAPTER)
    verdict.costs_checked = len(deaths)


def _late(injections: Sequence[Injection], events: Sequence[RecordedEvent]) -> None:
    """A fault injected after the run's end landed on nothing the run could see (its
    phase came in the run's last moments, the fleet was going down): skipped, said so in
    the trial's line. Seen once in 120 trials: a kill 5 ms after ``run_ended``."""
    ended = next((r for r in reversed(events) if r.event.type == "run_ended"), None)
    if ended is None:
        return
    for injection in injections:
        if not injection.skipped and injection.at_us > ended.at_us:
            injection.skipped = f"injected after the run ended (seq {ended.seq})"


_LETHAL = frozenset({"kill", "kill_engine", "freeze", "kill_replacement"})


def _lethal_cause(
    injected: Sequence[Injection], shard: int, view: FleetView, at_us: int
) -> Injection | None:
    """The fault that put ``shard`` out of serving by ``at_us``: one that kills or
    freezes it, in any incarnation up to its current one (a killed shard's replacement
    that is still loading is missing because of that kill)."""
    current = view.shards[shard].restart_attempts
    for incarnation in range(current, -1, -1):
        cause = _cause(injected, shard, incarnation, at_us)
        if cause is not None and cause.fault.kind in _LETHAL:
            return cause
    return None


def _overran(injection: Injection, bound_s: float) -> bool:
    held = injection.held_s
    return injection.fault.kind == "pause" and held is not None and 0 < bound_s <= held


def _cause(
    injected: Sequence[Injection], shard: int, incarnation: int, at_us: int
) -> Injection | None:
    """The fault that hit ``shard``'s ``incarnation`` before ``at_us`` (the latest)."""
    hits = [
        i
        for i in injected
        if i.fault.shard == shard and i.incarnation == incarnation and i.at_us <= at_us
    ]
    return hits[-1] if hits else None


def judge_from_log(log: EventLog, outcome: TrialOutcome) -> Verdict:
    """Read the trial's run back from the ledger and judge it; its processes must be gone."""
    try:
        events = list(log.read(outcome.run, 0))
    except UnknownRun:
        events = []  # the trial failed before its run was recorded: judged as it ended
    read_back = None
    if outcome.plan.scenario == "kill_controller" and events:
        # The run's membership as a reader gets it (snapshot + tail) must be the fold of
        # the whole log: what a restarted controller would resume from.
        resumed = membership_document(load_view(log, outcome.run))
        whole = membership_document(fold(events))
        if resumed != whole:
            read_back = "membership read back from the ledger differs from the log's fold"
    return judge(
        outcome,
        events,
        left_running=processes_left(outcome.pids_seen),
        read_back=read_back,
    )
