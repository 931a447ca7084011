"""The controller's judgements as pure functions: a verdict, the reason, the evidence.

Shaped like torchft's ``quorum_compute(now, state, opt) -> (members, reason)``: each
function reads a :class:`FleetView` (and the facts its caller passes in) and returns a
frozen decision; it appends nothing and acts on nothing. The controller records exactly
what a decision returns — the verdict picks the event, the reason is its text — so a
replay explains the judgement in the words it was taken with, and the tests assert on
the verdict, the reason and the evidence (the seqs the verdict rests on).

Rules of this file:

- **Condemnation.** A refit aborted with nothing newly absent: exactly one suspect —
  and, when the transport named shards, one of those — is condemned as the silent
  participant. No suspect, several, or a lone suspect the transport did not name is a
  refusal whose reason says what was found: condemning then would be a guess.
- **Restart.** A DEAD shard is restarted while its budget lasts and retired once one
  more attempt would exceed it (``restart_attempts + 1 > max_restart_attempts_per_shard``)
  — the rule the fold applies to ``restart_requested``, so the verdict and the fold
  agree and old logs fold as they always did. An interrupted RESTARTING is re-driven;
  any other state, or an ended run, leaves nothing to do.
- **Exhaustion.** Fewer than ``min_healthy_shards`` serving: the run should stop, with
  the counts per state as its cause.
- **A failed refit: recover or fail.** Only a failure the fleet can cause — a bound
  that expired (ours or the transport's), a peer lost (a dead or silent party, the
  runtime's actor error), an aborted communicator (a death recorded mid-push) — enters
  the recovery that probes, may condemn a lone suspect, rebuilds and retries. A
  deterministic failure (a shape or checksum mismatch, a bug: the same push would fail
  the same way) and a lost device context end the run with that error: probing then
  would turn a bug into the condemnation of whichever shard happened to be suspect.
  When the parties of one failure disagree, deterministic wins (the others' timeouts
  are its consequence), then a lost peer, then a timeout, then an abort.
- No I/O, no clock, no randomness: a decision is a function of the view and its inputs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Generic, TypeVar

from fleetledger.events.models import clip_text
from fleetledger.projections.shard_states import (
    RESTART_EXHAUSTED_RULE,
    RESTART_REQUESTED_RULE,
    ShardRecord,
    ShardState,
    restart_budget_exceeded,
)

if TYPE_CHECKING:
    from fleetledger.projections.fleet_view import FleetView

__all__ = [
    "Condemnation",
    "CondemnationVerdict",
    "Decision",
    "Exhaustion",
    "ExhaustionDecision",
    "ExhaustionVerdict",
    "RefitFailureDecision",
    "RefitFailureKind",
    "RefitFailureVerdict",
    "RestartDecision",
    "RestartVerdict",
    "decide_condemnation",
    "decide_exhaustion",
    "decide_refit_failure",
    "decide_restart",
    "refit_failure_kind",
]


class CondemnationVerdict(StrEnum):
    CONDEMN = "condemn"
    REFUSE = "refuse"


class RestartVerdict(StrEnum):
    RESTART = "restart"
    RETIRE = "retire"
    REDRIVE = "redrive"  # record the interrupted restart as failed, then decide again
    NOTHING = "nothing"


class ExhaustionVerdict(StrEnum):
    EXHAUSTED = "exhausted"
    ENOUGH = "enough"


class RefitFailureVerdict(StrEnum):
    RECOVER = "recover"
    FAIL = "fail"


class RefitFailureKind(StrEnum):
    """What a failed refit says about its cause: the typed fact the verdict reads.

    Defined here, not in ``weight_sync``, because the decision reads it and projections
    import nothing above ``events``; ``weight_sync.RefitFailed`` carries it.
    """

    TIMED_OUT = "timed out"  # a bound expired: someone hung (frozen, or very slow)
    PEER_LOST = "peer lost"  # a party died, or its connection did
    ABORTED = "aborted"  # the communicator was aborted under the push (a recorded death)
    DETERMINISTIC = "deterministic"  # the same push fails the same way: a mismatch, a bug


V = TypeVar("V", bound=StrEnum)


@dataclass(frozen=True, slots=True)
class Decision(Generic[V]):
    """What was decided, the one line the controller records, and the seqs behind it."""

    verdict: V
    reason: str
    evidence: tuple[int, ...]


def _seqs(*groups: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted({seq for group in groups for seq in group}))


# ── condemnation ───────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Condemnation(Decision[CondemnationVerdict]):
    """``shard``: the one condemned; ``end_cause``: what a refusal ends the run with."""

    suspected: tuple[int, ...]
    shard: int | None = None
    end_cause: str = ""


class _Finding(StrEnum):
    LONE = "the lone suspect"
    NO_SUSPECT = "no suspect"
    SEVERAL = "several suspects"
    NOT_NAMED = "the lone suspect, not among the shards the transport named"


@dataclass(frozen=True, slots=True)
class _Judgement:
    verdict: CondemnationVerdict
    found: str  # what was found, in words: {suspects} {shard} {named}
    reason: str  # the recorded text: {version} {found} {shard} {failure}
    end_cause: str  # the run's cause on a refusal: {version} {found} {failure}


_NO_NAME = "refit v{version} aborted and no silent participant could be named: {found}"
_GUESS = "refit v{version} aborted with nothing absent and {found}: condemning one would be a guess"

# The texts are the ones the recovery has always recorded: explanations and old logs
# quote them.
_JUDGEMENTS: dict[_Finding, _Judgement] = {
    _Finding.LONE: _Judgement(
        CondemnationVerdict.CONDEMN,
        "",
        "refit v{version} aborted with nothing absent and shard {shard} the only suspect: "
        "{failure}",
        "",
    ),
    _Finding.NO_SUSPECT: _Judgement(
        CondemnationVerdict.REFUSE, "no shard is suspected", _GUESS, _NO_NAME + " ({failure})"
    ),
    _Finding.SEVERAL: _Judgement(
        CondemnationVerdict.REFUSE,
        "shards {suspects} are suspected",
        _GUESS,
        _NO_NAME + " ({failure})",
    ),
    # The transport saw someone else hang: blaming the suspect would be wrong.
    _Finding.NOT_NAMED: _Judgement(
        CondemnationVerdict.REFUSE,
        "the only suspect, shard {shard}, is not among the shards the transport named ({named})",
        "refit v{version}: {found}",
        _NO_NAME,
    ),
}


def _finding(suspected: tuple[int, ...], named: Collection[int]) -> _Finding:
    if not suspected:
        return _Finding.NO_SUSPECT
    if len(suspected) > 1:
        return _Finding.SEVERAL
    if named and suspected[0] not in named:
        return _Finding.NOT_NAMED
    return _Finding.LONE


def decide_condemnation(
    view: FleetView,
    *,
    named: Collection[int],
    version: int,
    failure: str,
    unanswered: Collection[int] = (),
) -> Condemnation:
    """Whom to condemn after refit ``version`` aborted with nothing newly absent.

    ``named``: the shards the transport saw hang or raise (empty when it named none);
    ``failure``: the abort's reason, quoted; ``unanswered``: the participants that failed
    the probe the recovery has just recorded. Evidence: the abort and, per suspect, the
    transition that put it in its state and the streaks that made it suspect.

    The suspects are the view's, and a STALE shard that both the transport named and the
    recovery's probe found silent: a STALE shard's probes are not folded (it serves
    nothing), so a freeze after its weights were marked partial leaves no suspicion in
    the view. Story: two faults close together, the second a freeze during the reload of
    a refit cut by the first, ended the run with a healthy survivor left.
    """
    suspected = tuple(
        sorted(
            {
                *view.suspected,
                *(s for s in unanswered if s in named and view.shards[s].state is ShardState.STALE),
            }
        )
    )
    finding = _finding(suspected, named)
    judgement = _JUDGEMENTS[finding]
    shard = suspected[0] if len(suspected) == 1 else None
    found = judgement.found.format(suspects=list(suspected), shard=shard, named=sorted(named))
    fields = {"version": version, "found": found, "shard": shard, "failure": failure}
    records = [view.shards[s] for s in suspected]
    abort = () if view.last_abort is None else (view.last_abort.seq,)
    return Condemnation(
        verdict=judgement.verdict,
        reason=clip_text(judgement.reason.format(**fields)),
        evidence=_seqs(abort, *(_suspicion(r) for r in records)),
        suspected=suspected,
        shard=shard if judgement.verdict is CondemnationVerdict.CONDEMN else None,
        end_cause=clip_text(judgement.end_cause.format(**fields)),
    )


def _suspicion(r: ShardRecord) -> tuple[int, ...]:
    return (r.since_seq, *r.probe_evidence, *r.reported_evidence)


# ── restart ────────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class RestartDecision(Decision[RestartVerdict]):
    """``attempt``: the attempt a ``restart_requested`` now would count as."""

    shard: int
    attempt: int


# What a shard's state asks of the restarter; a state not listed asks nothing.
_RESTART_BY_STATE: dict[ShardState, RestartVerdict] = {
    ShardState.DEAD: RestartVerdict.RESTART,  # or RETIRE, past the budget
    ShardState.RESTARTING: RestartVerdict.REDRIVE,
}

_RESTART_REASONS: dict[RestartVerdict, str] = {
    # The fold's own rule texts for restart_requested: the verdict and the replay agree.
    RestartVerdict.RESTART: RESTART_REQUESTED_RULE,
    RestartVerdict.RETIRE: RESTART_EXHAUSTED_RULE,
    RestartVerdict.REDRIVE: "the restart in progress was interrupted (no controller drove it)",
    RestartVerdict.NOTHING: "shard {shard} is {state}, not DEAD: nothing to restart",
}


def decide_restart(view: FleetView, shard: int) -> RestartDecision:
    """What the restarter should do for ``shard`` now (evidence: the seq that put it in
    its state, or the end of the run)."""
    record = view.shards[shard]
    budget = view.config.max_restart_attempts_per_shard
    attempt = record.restart_attempts + 1
    if view.ended is not None:
        return RestartDecision(
            RestartVerdict.NOTHING,
            f"the run ended at seq {view.ended.seq}: nothing to restart",
            (view.ended.seq,),
            shard,
            attempt,
        )
    verdict = _RESTART_BY_STATE.get(record.state, RestartVerdict.NOTHING)
    if verdict is RestartVerdict.RESTART and restart_budget_exceeded(attempt, budget):
        verdict = RestartVerdict.RETIRE
    reason = _RESTART_REASONS[verdict].format(
        restart_attempts=attempt, max_restarts=budget, shard=shard, state=record.state.value
    )
    return RestartDecision(verdict, reason, (record.since_seq,), shard, attempt)


# ── exhaustion ─────────────────────────────────────────────────────────────────


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """How many shards serve against the floor, with the count of every state."""

    serving: int
    min_healthy_shards: int
    counts: dict[str, int]

    def describe(self) -> str:
        states = ", ".join(f"{k} {v}" for k, v in self.counts.items() if v)
        return (
            f"only {self.serving} generation shard(s) serving, below min_healthy_shards="
            f"{self.min_healthy_shards}; fleet: {states}"
        )


@dataclass(frozen=True, slots=True)
class ExhaustionDecision(Decision[ExhaustionVerdict]):
    exhaustion: Exhaustion

    @property
    def exhausted(self) -> bool:
        return self.verdict is ExhaustionVerdict.EXHAUSTED


def decide_exhaustion(view: FleetView) -> ExhaustionDecision:
    """Whether the fleet fell below ``min_healthy_shards`` serving.

    Evidence: the transitions that put each shard where it counts — out of serving when
    exhausted, into serving when not.
    """
    facts = Exhaustion(len(view.serving), view.config.min_healthy_shards, view.counts())
    exhausted = facts.serving < facts.min_healthy_shards
    evidence = _seqs(r.since_seq for r in view.shards if r.serving is not exhausted)
    if exhausted:
        return ExhaustionDecision(ExhaustionVerdict.EXHAUSTED, facts.describe(), evidence, facts)
    reason = (
        f"{facts.serving} shards serve, not below min_healthy_shards={facts.min_healthy_shards}"
    )
    return ExhaustionDecision(ExhaustionVerdict.ENOUGH, reason, evidence, facts)


# ── a failed refit: recover or fail ────────────────────────────────────────────────

# Which kind speaks for a failure whose parties saw different things (first wins).
_KIND_PRECEDENCE = (
    RefitFailureKind.DETERMINISTIC,
    RefitFailureKind.PEER_LOST,
    RefitFailureKind.TIMED_OUT,
    RefitFailureKind.ABORTED,
)

_RECOVERABLE = frozenset(
    {RefitFailureKind.TIMED_OUT, RefitFailureKind.PEER_LOST, RefitFailureKind.ABORTED}
)

_REFIT_FAILURE_REASONS: dict[RefitFailureKind | None, str] = {
    # None: the context is lost, whatever the kind (no rebuild can work on it).
    None: "refit v{version}: the trainer's device context is lost: {failure}",
    RefitFailureKind.DETERMINISTIC: (
        "refit v{version} failed deterministically, so it is not retried and no shard is "
        "condemned for it: {failure}"
    ),
    RefitFailureKind.TIMED_OUT: "refit v{version} timed out; recovering: {failure}",
    RefitFailureKind.PEER_LOST: "refit v{version} lost a peer; recovering: {failure}",
    RefitFailureKind.ABORTED: "refit v{version} was aborted; recovering: {failure}",
}


def refit_failure_kind(kinds: Iterable[RefitFailureKind]) -> RefitFailureKind | None:
    """The kind that speaks for one failure seen differently by its parties (``None``:
    no party failed). Deterministic first: a party that raised a bug leaves the others
    waiting in the collective, and their timeouts must not make the bug look like a
    hang worth condemning somebody for."""
    seen = set(kinds)
    return next((kind for kind in _KIND_PRECEDENCE if kind in seen), None)


@dataclass(frozen=True, slots=True)
class RefitFailureDecision(Decision[RefitFailureVerdict]):
    """``kind`` and ``context_lost``: the facts the verdict was taken on."""

    kind: RefitFailureKind
    context_lost: bool

    @property
    def recover(self) -> bool:
        return self.verdict is RefitFailureVerdict.RECOVER


def decide_refit_failure(
    view: FleetView,
    *,
    version: int,
    kind: RefitFailureKind,
    context_lost: bool,
    failure: str,
) -> RefitFailureDecision:
    """Whether refit ``version``, failed as ``kind``, enters the recovery or ends the run.

    ``failure``: the failure, quoted (the reason and the run's cause quote it). Evidence:
    the refit that failed (its ``refit_started``), when one is open.
    """
    recover = kind in _RECOVERABLE and not context_lost
    template = _REFIT_FAILURE_REASONS[None if context_lost else kind]
    evidence = () if view.open_refit is None else (view.open_refit.seq,)
    return RefitFailureDecision(
        verdict=RefitFailureVerdict.RECOVER if recover else RefitFailureVerdict.FAIL,
        reason=clip_text(template.format(version=version, failure=failure)),
        evidence=evidence,
        kind=kind,
        context_lost=context_lost,
    )
