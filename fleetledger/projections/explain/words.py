"""Event words: what one event says, and the small phrases every explanation shares.

Rules of this file:

- What an event says is data: ``EVENT_WORDS`` maps every event type to the function
  that puts it in one line, and a test holds it to the event vocabulary (no type
  missing, none extra). The line says only what the event recorded, never a judgement.
- The phrases (seq lists, shard lists, counts, durations) are the only way the
  explanations write those things, so the same fact reads the same everywhere. The
  shard list is ``shard_states``'s own, since a rule text names shards with it too.
- Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from fleetledger.events.models import (
    ActorDeathConfirmed,
    CondemnationRefused,
    Event,
    FailureCount,
    FleetExhausted,
    OutcomeWindowReported,
    ProbeDeath,
    ProbeFailure,
    ProbeRound,
    ProgressReported,
    RefitAborted,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartFailed,
    RestartRequested,
    RunEnded,
    RunStarted,
    ShardRetired,
    SilentParticipantCondemned,
    StallDetected,
    WeightsMarkedPartial,
)
from fleetledger.projections.shard_states import failure_tally, shard_list  # shared phrases

# How many transitions / findings ``.text`` lists before it summarises the rest
# (``as_json`` always carries every one).
TEXT_LIMIT = 12


def seq_list(seqs: Sequence[int]) -> str:
    """A list of seqs as read aloud: 'seq 4', 'seqs 4, 7, 9'."""
    if len(seqs) == 1:
        return f"seq {seqs[0]}"
    return "seqs " + ", ".join(str(s) for s in seqs)


def count_of(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def progress_counts(committed_groups: int, train_steps: int) -> str:
    """Progress is the pair (committed rollout groups, completed train steps)."""
    return f"{count_of(committed_groups, 'committed group')}, {count_of(train_steps, 'train step')}"


def seconds(delta_us: int) -> str:
    return f"{delta_us / 1e6:.1f} s"


class CauseQuotes:
    """Each cause printed once per answer: whole where it first appears, then
    ``same cause as seq N`` (N: the seq that recorded it).

    Story: a death's cause used to be quoted by the summary, the rule, the evidence and
    the transition of one explanation — Ray's kilobyte four times. The causes an answer
    may print are registered first (:meth:`learn`, from the transitions it shows); every
    text the answer prints, in order, then passes through :meth:`once`. Short texts
    ("gone") are never replaced: a reference must be shorter than what it stands for.
    """

    MIN_LENGTH = 24

    def __init__(self) -> None:
        self._seq: dict[str, int] = {}
        self._printed: set[str] = set()
        self._pattern: re.Pattern[str] | None = None

    def learn(self, cause: str, seq: int) -> None:
        if len(cause) >= self.MIN_LENGTH and cause not in self._seq:
            self._seq[cause] = seq
            self._pattern = None

    def once(self, text: str) -> str:
        if not self._seq:
            return text
        if self._pattern is None:  # longest first: a cause that holds another wins
            causes = sorted(self._seq, key=len, reverse=True)
            self._pattern = re.compile("|".join(re.escape(c) for c in causes))
        return self._pattern.sub(self._quote, text)

    def _quote(self, found: re.Match[str]) -> str:
        cause = found.group()
        if cause in self._printed:
            return f"same cause as seq {self._seq[cause]}"
        self._printed.add(cause)
        return cause


def infra_failures_of(event: OutcomeWindowReported, shard: int) -> list[FailureCount]:
    """The infra failures ``event`` reported for ``shard``: the only ones a streak counts."""
    for o in event.outcomes:
        if o.shard == shard:
            return [f for f in o.failures if f.category == "infra"]
    return []


# ── what one event says (``shard``: whose part of an adapter window) ─────────────


def death_words(death: ActorDeathConfirmed | ProbeDeath) -> str:
    """A recorded death, whoever saw it: the actor's (the runtime's word), or the engine's
    under a live actor (its own word) — never the one called the other."""
    error = death.told or "no detail"
    if death.what == "engine":
        return f"the engine of shard {death.shard} died under its live actor: {error}"
    return f"actor death of shard {death.shard} confirmed by the runtime: {error}"


def _actor_death(e: ActorDeathConfirmed, shard: int | None) -> str:
    return death_words(e)


def _probe_round(e: ProbeRound, shard: int | None) -> str:
    """About one shard: what its own probe event said; about the round: the counts.

    A round of one shard (what a v1 ``probe_succeeded`` / ``probe_failed`` row reads as)
    is about that shard whoever asks, so an old ledger's evidence reads as it always did.
    """
    named = e.shards_named()
    about = shard if shard in named else (named[0] if len(named) == 1 else None)
    if about is not None:
        result = e.result_of(about)
        if result == "ok":
            return f"probe of shard {about} answered"
        if isinstance(result, ProbeFailure):
            detail = f": {result.told}" if result.told else ""
            probe = "deep probe" if result.deep else "probe"
            return f"{probe} of shard {about} failed ({result.kind}{detail})"
        if isinstance(result, ProbeDeath):
            return death_words(result)
    parts = [f"{len(e.ok)} answered"]
    if e.failed:
        parts.append(f"{len(e.failed)} failed ({shard_list([f.shard for f in e.failed])})")
    if e.died:
        parts.append(f"{len(e.died)} confirmed dead ({shard_list([d.shard for d in e.died])})")
    about = "" if shard is None else f" (no probe of shard {shard})"
    return f"probe round of {count_of(len(e.shards_named()), 'shard')}: " + ", ".join(parts) + about


def _outcomes(e: OutcomeWindowReported, shard: int | None) -> str:
    chosen = [o for o in e.outcomes if shard is None or o.shard == shard]
    if not chosen:
        return f"adapter {e.adapter} reported nothing about shard {shard}"
    parts = []
    for o in chosen:
        failures = ", ".join(f"{f.category} {failure_tally(f)}" for f in o.failures)
        parts.append(
            f"shard {o.shard}: {o.successes} successes"
            + (f", failures: {failures}" if failures else ", no failures")
        )
    return f"adapter {e.adapter} reported " + "; ".join(parts)


def _refit_started(e: RefitStarted, shard: int | None) -> str:
    return f"refit to weight version {e.weight_version} started over {shard_list(e.shards)}"


def _refit_completed(e: RefitCompleted, shard: int | None) -> str:
    return f"refit to weight version {e.weight_version} completed over {shard_list(e.shards)}"


def _refit_aborted(e: RefitAborted, shard: int | None) -> str:
    lost = " (device context lost)" if e.context_lost else ""
    return f"refit to weight version {e.weight_version} aborted{lost}: {e.reason}"


def _partial(e: WeightsMarkedPartial, shard: int | None) -> str:
    said = f"weights marked partial after the refit to weight version {e.weight_version} aborted"
    return said if e.shards is None else f"{said} (marked: {shard_list(e.shards)})"


def _restart_requested(e: RestartRequested, shard: int | None) -> str:
    return f"restart of shard {e.shard} requested"


def _restart_failed(e: RestartFailed, shard: int | None) -> str:
    return f"restart of shard {e.shard} failed: {e.told}"


def _loaded(e: ReplacementLoaded, shard: int | None) -> str:
    where = f" at {e.base_url}" if e.base_url else " at the same URL"
    return f"replacement engine for shard {e.shard} loaded{where}"


def _condemned(e: SilentParticipantCondemned, shard: int | None) -> str:
    return f"shard {e.shard} condemned as the silent participant: {e.reason}"


def _retired(e: ShardRetired, shard: int | None) -> str:
    return f"shard {e.shard} retired: {e.reason}"


def _refused(e: CondemnationRefused, shard: int | None) -> str:
    return f"condemnation refused (suspected: {shard_list(e.suspected)}): {e.reason}"


def _progress(e: ProgressReported, shard: int | None) -> str:
    return (
        f"progress: {progress_counts(e.committed_groups, e.train_steps)}, {e.in_flight} in flight"
    )


def _stall(e: StallDetected, shard: int | None) -> str:
    return (
        f"stall detected: idle {e.idle_s:g} s at "
        f"{progress_counts(e.committed_groups, e.train_steps)}, "
        f"{e.in_flight} in flight (action {e.action})"
    )


def _exhausted(e: FleetExhausted, shard: int | None) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in e.counts.items() if v)
    return (
        f"fleet exhausted: {e.serving} serving < min_healthy_shards "
        f"{e.min_healthy_shards} ({counts})"
    )


def _run_ended(e: RunEnded, shard: int | None) -> str:
    return f"run ended {e.outcome}: {e.cause}"


def _run_started(e: RunStarted, shard: int | None) -> str:
    c = e.config
    return (
        f"run started: {c.shard_count} shards × {c.workers_per_shard} workers, "
        f"{c.train_world_size} trainer ranks"
    )


# Event type → the line that says what it recorded.
EVENT_WORDS: dict[type[Event], Callable[[Any, int | None], str]] = {
    RunStarted: _run_started,
    RunEnded: _run_ended,
    ActorDeathConfirmed: _actor_death,
    ProbeRound: _probe_round,
    OutcomeWindowReported: _outcomes,
    RefitStarted: _refit_started,
    RefitCompleted: _refit_completed,
    RefitAborted: _refit_aborted,
    WeightsMarkedPartial: _partial,
    RestartRequested: _restart_requested,
    RestartFailed: _restart_failed,
    ReplacementLoaded: _loaded,
    SilentParticipantCondemned: _condemned,
    ShardRetired: _retired,
    CondemnationRefused: _refused,
    ProgressReported: _progress,
    StallDetected: _stall,
    FleetExhausted: _exhausted,
}


def describe_event(event: Event, shard: int | None = None) -> str:
    """One line saying what ``event`` recorded (about ``shard``, for adapter windows)."""
    words = EVENT_WORDS.get(type(event))
    return event.type if words is None else words(event, shard)
