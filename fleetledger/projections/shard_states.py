"""Shard lifecycle: the states, the per-shard record, and the transition tables.

Rules of this file:

- Everything that moves a shard between states lives here, as data: ``RULES`` maps
  (input, current state) to an ordered tuple of branches, each a guard, a target state
  and the rule text a replay prints. A state absent from an input's row ignores that
  input entirely, counters included ("ignored unless serving").
- ``EFFECTS`` holds what an accepted input does to the counters, applied before the
  guards are read. The special cases that a table cannot hold are written out below
  the tables, with the reason.
- The transition that must not exist: ``DEAD``/``RESTARTING``/``STALE`` → ``HEALTHY``
  by anything but a completed refit. A restarted engine holds the weights it loaded at
  start-up; re-admitting it because it answers probes would feed training rollouts
  from stale weights — invisible, and worse than the outage that caused it.
- No I/O, no clock: time comes from the event being applied.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only: the state machine itself needs no event model
    from fleetledger.events.models import FailureCount


class ShardState(enum.StrEnum):
    HEALTHY = "HEALTHY"  # serving, at the trainer's weights
    SUSPECT = "SUSPECT"  # failing but still serving: one blip must not cost a shard
    DEAD = "DEAD"  # quarantined: absent from traffic and from the refit communicator
    RESTARTING = "RESTARTING"  # a replacement engine is coming up
    STALE = "STALE"  # alive with old or partial weights: joins refits, gets no traffic
    RETIRED = "RETIRED"  # terminal


SERVING = frozenset({ShardState.HEALTHY, ShardState.SUSPECT})
# Absent is not the complement of serving: SUSPECT and STALE shards are alive and join
# a refit. Treating STALE as absent would abort the very refit that recovers it.
ABSENT = frozenset({ShardState.DEAD, ShardState.RESTARTING, ShardState.RETIRED})
ALIVE_NOT_ABSENT = frozenset(ShardState) - ABSENT
ALL_BUT_RETIRED = frozenset(ShardState) - {ShardState.RETIRED}


class Input(enum.StrEnum):
    """What one event means for one shard."""

    PROBE_OK = "probe ok"
    PROBE_FAILED = "probe failed"
    ACTOR_DIED = "actor death confirmed"
    # The engine core died under an actor that still answers: as conclusive as the
    # actor's death, but not the same fact (the actor was alive; only the engine said so).
    ENGINE_DIED = "engine death confirmed"
    REPORTED_SUCCESS = "reported success"
    REPORTED_FAILURE = "reported failure"
    RESTART_REQUESTED = "restart requested"
    RESTART_FAILED = "restart failed"
    REPLACEMENT_LOADED = "replacement loaded"
    WEIGHTS_PARTIAL = "weights marked partial"
    REFIT_COMPLETED = "refit completed"
    CONDEMNED = "condemned as silent participant"
    RETIRE = "retired"


@dataclass(slots=True)
class ShardRecord:
    """Everything the fold knows about one shard."""

    index: int
    base_url: str
    state: ShardState = ShardState.HEALTHY
    probe_failures: int = 0
    probe_successes: int = 0
    reported_failures: int = 0
    restart_attempts: int = 0
    state_before_partial: ShardState | None = None
    weight_version: int = 0
    last_ok_at_us: int | None = None
    last_error: str = ""
    # Seqs of the events behind the current streaks: the evidence a replay cites.
    probe_evidence: tuple[int, ...] = ()
    reported_evidence: tuple[int, ...] = ()
    # The transition that put the shard in its current state.
    since_seq: int = 1
    since_at_us: int = 0  # the run's start until a transition stamps it
    since_rule: str = "run started"

    @property
    def serving(self) -> bool:
        return self.state in SERVING

    @property
    def absent(self) -> bool:
        return self.state in ABSENT

    @property
    def suspected(self) -> bool:
        return self.state is ShardState.SUSPECT or (
            self.state is ShardState.STALE and self.state_before_partial is ShardState.SUSPECT
        )


@dataclass(slots=True)  # not frozen: frozen dataclasses pay for __setattr__ bypass per field
class Signal:
    """One input for one shard, with what the event said about it."""

    input: Input
    seq: int
    at_us: int
    count: int = 1  # reported failures in one window
    text: str = ""  # error text, reason, new base URL, or which shards were marked partial
    weight_version: int = 0


@dataclass(frozen=True, slots=True)
class Thresholds:
    unhealthy: int
    healthy: int
    max_restarts: int


@dataclass(frozen=True, slots=True)
class Transition:
    """A state change, with the event that caused it and the rule that fired."""

    seq: int
    at_us: int
    shard: int
    before: ShardState
    after: ShardState
    input: Input
    rule: str
    evidence: tuple[int, ...]  # seqs that support the rule (streak members, or the cause)
    cause: str = ""  # what the rule quotes of a death or failure (``CAUSE_INPUTS``); "" else


# Inputs whose text is a death or failure cause (what the rule quotes): an answer prints
# each cause once and refers back to it after (``explain.words.CauseQuotes``).
CAUSE_INPUTS = frozenset(
    {
        Input.PROBE_FAILED,
        Input.ACTOR_DIED,
        Input.ENGINE_DIED,
        Input.REPORTED_FAILURE,
        Input.RESTART_FAILED,
    }
)


def failure_tally(f: FailureCount) -> str:
    """``timeout ×2 (TimeoutError: no reply)``: a reported failure's reason, its count
    and what the first said, as a rule text and the explanations write it (windows
    recorded before the example existed read ``timeout ×2``)."""
    said = f" ({f.example})" if f.example else ""
    return f"{f.reason} ×{f.count}{said}"


def shard_list(shards: Sequence[int]) -> str:
    """A list of shards as read aloud: 'no shard', 'shard 2', 'shards 0, 1 and 3'.

    Here because a rule text names shards with it (weights marked partial on some
    shards); the explanations' words use this one phrase too.
    """
    if not shards:
        return "no shard"
    if len(shards) == 1:
        return f"shard {shards[0]}"
    return "shards " + ", ".join(str(s) for s in shards[:-1]) + f" and {shards[-1]}"


# ── guards ─────────────────────────────────────────────────────────────────────

Guard = Callable[[ShardRecord, Thresholds], bool]


def always(_r: ShardRecord, _t: Thresholds) -> bool:
    return True


def probe_failures_reached(r: ShardRecord, t: Thresholds) -> bool:
    return r.probe_failures >= t.unhealthy


def probe_successes_reached(r: ShardRecord, t: Thresholds) -> bool:
    return r.probe_successes >= t.healthy


def reported_failures_reached(r: ShardRecord, t: Thresholds) -> bool:
    return r.reported_failures >= t.unhealthy


def restart_budget_exceeded(attempts: int, max_restarts: int) -> bool:
    """The restart budget rule, shared with the restart decision: attempt n of a budget
    of m is allowed while n <= m."""
    return attempts > max_restarts


def restart_budget_exhausted(r: ShardRecord, t: Thresholds) -> bool:
    return restart_budget_exceeded(r.restart_attempts, t.max_restarts)


def was_suspect_before_partial(r: ShardRecord, _t: Thresholds) -> bool:
    return r.state_before_partial is ShardState.SUSPECT


@dataclass(frozen=True, slots=True)
class Branch:
    guard: Guard
    target: ShardState | None  # None: the input is taken, the state stays
    rule: str  # formatted with the record's fields, the thresholds and the signal
    clear_reported: bool = False


def _stay(rule: str = "") -> Branch:
    return Branch(always, None, rule)


H, S, D, R, ST, RT = (
    ShardState.HEALTHY,
    ShardState.SUSPECT,
    ShardState.DEAD,
    ShardState.RESTARTING,
    ShardState.STALE,
    ShardState.RETIRED,
)

_PROBE_STREAK_DEAD = Branch(
    probe_failures_reached,
    D,
    "{probe_failures} consecutive failed probes ≥ unhealthy_threshold {unhealthy} (last: {text})",
)
_REPORTED_STREAK_DEAD = Branch(
    reported_failures_reached,
    D,
    "{reported_failures} consecutive reported failures ≥ unhealthy_threshold {unhealthy} "
    "(last: {text})",
)
_ACTOR_DIED = Branch(always, D, "actor death confirmed by the runtime: {text}")
_ENGINE_DIED = Branch(always, D, "the engine died under its live actor: {text}")
_CONDEMNED = Branch(always, D, "condemned as the silent participant: {text}")
_RETIRE = Branch(always, RT, "retired: {text}")
# Also the restart decision's reasons (``decisions.decide_restart``), word for word.
RESTART_EXHAUSTED_RULE = (
    "restart attempts exhausted ({restart_attempts} > max_restart_attempts_per_shard "
    "{max_restarts})"
)
RESTART_REQUESTED_RULE = "restart requested (attempt {restart_attempts} of {max_restarts})"
_RESTART = (
    Branch(restart_budget_exhausted, RT, RESTART_EXHAUSTED_RULE),
    Branch(always, R, RESTART_REQUESTED_RULE),
)
# ``{aside}``: the shards marked, when the event named them; old events read as before.
_PARTIAL = Branch(always, ST, "weights partial: refit at version {weight_version} aborted{aside}")
_REFIT_RESTORES = (
    Branch(
        was_suspect_before_partial,
        S,
        "refit completed at weight version {weight_version}; it was SUSPECT before the "
        "abort, so it stays suspected",
    ),
    Branch(
        always,
        H,
        "refit completed at weight version {weight_version}",
        clear_reported=True,
    ),
)

# (input, current state) -> branches, first matching guard wins.
RULES: dict[Input, dict[ShardState, tuple[Branch, ...]]] = {
    Input.PROBE_OK: {
        H: (_stay(),),
        S: (
            Branch(
                probe_successes_reached,
                H,
                "{probe_successes} consecutive successful probes ≥ healthy_threshold {healthy}",
            ),
            _stay(),
        ),
    },
    Input.PROBE_FAILED: {
        H: (_PROBE_STREAK_DEAD, Branch(always, S, "failed probe: {text}")),
        S: (_PROBE_STREAK_DEAD, _stay()),
    },
    Input.ACTOR_DIED: {H: (_ACTOR_DIED,), S: (_ACTOR_DIED,), ST: (_ACTOR_DIED,)},
    Input.ENGINE_DIED: {H: (_ENGINE_DIED,), S: (_ENGINE_DIED,), ST: (_ENGINE_DIED,)},
    # A wedged engine still answers probes, so only this streak can condemn it.
    Input.REPORTED_FAILURE: {
        H: (_REPORTED_STREAK_DEAD, Branch(always, S, "reported failure: {text}")),
        S: (_REPORTED_STREAK_DEAD, _stay()),
    },
    Input.REPORTED_SUCCESS: {state: (_stay(),) for state in ALL_BUT_RETIRED},
    Input.RESTART_REQUESTED: {state: _RESTART for state in ALL_BUT_RETIRED},
    Input.RESTART_FAILED: {
        state: (Branch(always, D, "restart failed: {text}"),) for state in ALL_BUT_RETIRED
    },
    Input.REPLACEMENT_LOADED: {
        state: (Branch(always, ST, "replacement loaded; it holds start-up weights until a refit"),)
        for state in ALL_BUT_RETIRED
    },
    Input.WEIGHTS_PARTIAL: {H: (_PARTIAL,), S: (_PARTIAL,), ST: (_PARTIAL,)},
    # Absent shards were not in the communicator, so a completed refit cannot have
    # reached them: the reference promotes any non-retired shard; we do not resurrect.
    Input.REFIT_COMPLETED: {H: (_stay(),), S: (_stay(),), ST: _REFIT_RESTORES},
    Input.CONDEMNED: {H: (_CONDEMNED,), S: (_CONDEMNED,), ST: (_CONDEMNED,)},
    Input.RETIRE: {state: (_RETIRE,) for state in ALL_BUT_RETIRED},
}


# ── counter effects, applied when the input is taken, before the guards ────────


def count_probe_success(r: ShardRecord, at_us: int) -> None:
    """A successful probe: the probe streak ends and the success is counted. (The one
    inlined copy, in ``FleetView.apply_page``, says why it exists.)"""
    r.probe_failures = 0
    r.probe_evidence = ()
    r.probe_successes += 1
    r.last_ok_at_us = at_us


def _probe_ok(r: ShardRecord, s: Signal) -> None:
    count_probe_success(r, s.at_us)


def _probe_failed(r: ShardRecord, s: Signal) -> None:
    r.probe_successes = 0
    r.probe_failures += 1
    r.probe_evidence = (*r.probe_evidence, s.seq)
    r.last_error = s.text


def _reported_failure(r: ShardRecord, s: Signal) -> None:
    r.reported_failures += s.count
    r.reported_evidence = (*r.reported_evidence, s.seq)
    r.last_error = s.text


def _clear_reported_streak(r: ShardRecord) -> None:
    r.reported_failures = 0
    r.reported_evidence = ()


def _reported_success(r: ShardRecord, _s: Signal) -> None:
    _clear_reported_streak(r)


def _note_error(r: ShardRecord, s: Signal) -> None:
    r.last_error = s.text


def _restart_requested(r: ShardRecord, _s: Signal) -> None:
    r.restart_attempts += 1


def _replacement_loaded(r: ShardRecord, s: Signal) -> None:
    r.probe_failures = r.probe_successes = 0
    r.probe_evidence = ()
    r.state_before_partial = None  # a fresh engine inherits no suspicion
    if s.text:
        r.base_url = s.text


def _weights_partial(r: ShardRecord, _s: Signal) -> None:
    # Marked partial twice (two aborts in a row): keep the state from before the first,
    # or a suspect would be laundered into HEALTHY by the second abort.
    if r.state is not ShardState.STALE:
        r.state_before_partial = r.state


def _refit_completed(r: ShardRecord, s: Signal) -> None:
    r.weight_version = s.weight_version
    if r.state is ShardState.STALE:
        r.probe_failures = r.probe_successes = 0
        r.probe_evidence = ()
        r.last_ok_at_us = s.at_us


def _nothing(_r: ShardRecord, _s: Signal) -> None:
    return None


EFFECTS: dict[Input, Callable[[ShardRecord, Signal], None]] = {
    Input.PROBE_OK: _probe_ok,
    Input.PROBE_FAILED: _probe_failed,
    Input.ACTOR_DIED: _note_error,
    Input.ENGINE_DIED: _note_error,
    Input.REPORTED_SUCCESS: _reported_success,
    Input.REPORTED_FAILURE: _reported_failure,
    Input.RESTART_REQUESTED: _restart_requested,
    Input.RESTART_FAILED: _note_error,
    Input.REPLACEMENT_LOADED: _replacement_loaded,
    Input.WEIGHTS_PARTIAL: _weights_partial,
    Input.REFIT_COMPLETED: _refit_completed,
    Input.CONDEMNED: _note_error,  # counters untouched: a judgement, not an observation
    Input.RETIRE: _note_error,
}


def _evidence(r: ShardRecord, signal: Signal, branch: Branch) -> tuple[int, ...]:
    if branch.guard is probe_failures_reached:
        return r.probe_evidence
    if branch.guard is reported_failures_reached:
        return r.reported_evidence
    return (signal.seq,)


# Almost every event of a long run is a successful probe of a HEALTHY shard, whose row
# is one unconditional "stay": the fold takes it without building a Signal. That the
# table's row says so is pinned by tests/test_shard_states.py.
def healthy_probe_ok(r: ShardRecord, at_us: int) -> bool:
    """Apply a successful probe if the shard is HEALTHY (never a transition)."""
    if r.state is not ShardState.HEALTHY:
        return False
    count_probe_success(r, at_us)
    return True


# A success an adapter reported is a "stay" in every state but RETIRED (which ignores
# it): it clears the reported streak and can never move a shard (pinned by the tests
# too).
def reported_success_quiet(r: ShardRecord) -> None:
    """Apply a reported success (never a transition), without building a Signal."""
    if r.state is not ShardState.RETIRED:
        _clear_reported_streak(r)


def all_healthy_probes_ok(shards: Sequence[ShardRecord], ok: Sequence[int], at_us: int) -> bool:
    """Apply a round of successful probes if every shard in it is HEALTHY (no transition
    can follow); False, and nothing applied, if one is not or is out of range."""
    count = len(shards)
    healthy = ShardState.HEALTHY
    for shard in ok:
        if shard >= count or shards[shard].state is not healthy:
            return False
    for shard in ok:
        count_probe_success(shards[shard], at_us)
    return True


def step(r: ShardRecord, signal: Signal, t: Thresholds) -> Transition | None:
    """Apply one signal to one shard; returns the transition if the state changed."""
    branches = RULES[signal.input].get(r.state)
    if branches is None:
        return None  # this state ignores this input, counters included
    EFFECTS[signal.input](r, signal)
    for branch in branches:
        if branch.guard(r, t):
            break
    else:  # pragma: no cover - every row ends with an unconditional branch
        raise AssertionError(f"no branch of {signal.input} matched in {r.state}")
    if branch.clear_reported:
        r.reported_failures = 0
        r.reported_evidence = ()
    if branch.target is None or branch.target is r.state:
        return None
    rule = branch.rule.format(
        probe_failures=r.probe_failures,
        probe_successes=r.probe_successes,
        reported_failures=r.reported_failures,
        restart_attempts=r.restart_attempts,
        unhealthy=t.unhealthy,
        healthy=t.healthy,
        max_restarts=t.max_restarts,
        weight_version=signal.weight_version,
        text=signal.text or "no detail",
        aside=f" ({signal.text})" if signal.text else "",
    )
    transition = Transition(
        signal.seq,
        signal.at_us,
        r.index,
        r.state,
        branch.target,
        signal.input,
        rule,
        _evidence(r, signal, branch),
        signal.text if signal.input in CAUSE_INPUTS else "",
    )
    if r.state is ShardState.STALE:
        r.state_before_partial = None  # only meaningful while STALE
    r.state = branch.target
    r.since_seq = signal.seq
    r.since_at_us = signal.at_us
    r.since_rule = rule
    return transition
