"""Why a shard moved: the sentences for the transition that put it in its state.

Rules of this file:

- The sentences are data: ``BECAUSE`` maps the ``Input`` of the shard's last
  transition to the function that explains it, and a test holds it to every input the
  fold's ``RULES`` can move a shard with (no input missing, none extra).
- Every sentence is a fact the ledger holds — the transition's rule and evidence, an
  event the caller supplied, a threshold of the run — or a rule of the fold
  (``shard_states``), never a guess. When an event it wants was not supplied, the
  sentence falls back to the transition's own rule text.
- Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    OutcomeWindowReported,
    ProbeDeath,
    ProbeFailure,
    ProbeRound,
    RecordedEvent,
    ReplacementLoaded,
    RestartFailed,
    ShardRetired,
    SilentParticipantCondemned,
    WeightsMarkedPartial,
)
from fleetledger.projections.explain.evidence import SpanTally, last_abort_before
from fleetledger.projections.explain.words import infra_failures_of, seq_list, shard_list
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.history import Entry, TransitionEntry
from fleetledger.projections.shard_states import Input, ShardState


@dataclass(frozen=True, slots=True)
class Why:
    """What the sentence builders read (one shard, one view)."""

    view: FleetView
    shard: int
    link: TransitionEntry  # the transition being explained: the chain's last
    chain: Sequence[TransitionEntry]
    entries: Sequence[Entry]
    evidence: Mapping[int, RecordedEvent]
    tally: SpanTally | None

    def event(self, seq: int) -> Event | None:
        recorded = self.evidence.get(seq)
        return None if recorded is None else recorded.event

    @property
    def unhealthy(self) -> int:
        return self.view.config.unhealthy_threshold

    @property
    def previous(self) -> TransitionEntry | None:
        """The transition before the one being explained."""
        return self.chain[-2] if len(self.chain) > 1 else None

    def made_suspect_before(self, seq: int) -> TransitionEntry | None:
        found = [t for t in self.chain if t.after is ShardState.SUSPECT and t.seq <= seq]
        return found[-1] if found else None


def _reported_failure(w: Why) -> list[str]:
    seqs = w.link.evidence
    reasons: list[str] = []
    total = 0
    complete = True
    for seq in seqs:
        event = w.event(seq)
        if not isinstance(event, OutcomeWindowReported):
            complete = False
            continue
        for failure in infra_failures_of(event, w.shard):
            total += failure.count
            if f"infra {failure.reason}" not in reasons:
                reasons.append(f"infra {failure.reason}")
    what = f"{seq_list(seqs)}: {', '.join(reasons)}" if reasons else seq_list(seqs)
    if w.link.after is not ShardState.DEAD:
        count = f"{total}" if complete else "a"
        return [
            f"adapters reported a failure ({what}): reported streak {count} of "
            f"unhealthy_threshold {w.unhealthy}; a SUSPECT shard still serves, so one blip "
            "costs no traffic"
        ]
    if complete:
        out = [
            f"{total} consecutive reported failures ({what}) ≥ unhealthy_threshold {w.unhealthy}"
        ]
    else:
        out = [f"{w.link.rule} ({what})"]
    t = w.tally
    if t is not None:
        if t.probes_ok:
            out.append(
                f"probes kept succeeding ({t.probes_ok} successful probes in that span), so only "
                "the reported streak could condemn it"
            )
        elif t.probes_failed:
            out.append(
                f"probes failed too ({t.probes_failed} failed probes in that span), but the "
                "reported streak reached the threshold first"
            )
        else:
            out.append(
                "no probe of it was recorded in that span: the reported streak alone condemned it"
            )
    return out


def _probe_failed(w: Why) -> list[str]:
    seqs = w.link.evidence
    kinds: list[str] = []
    for seq in seqs:
        event = w.event(seq)
        if isinstance(event, ProbeRound):  # the shard's failure inside the round
            event = event.result_of(w.shard)
        if isinstance(event, ProbeFailure):
            kind = f"{event.kind}: {event.told}" if event.told else event.kind
            if kind not in kinds:
                kinds.append(kind)
    what = f"{seq_list(seqs)}: {', '.join(kinds)}" if kinds else seq_list(seqs)
    if w.link.after is ShardState.DEAD:
        return [
            f"{len(seqs)} consecutive failed probes ({what}) ≥ unhealthy_threshold {w.unhealthy}",
            "no actor death was confirmed: the probe streak condemned it",
        ]
    return [
        f"a probe failed ({what}): probe streak {len(seqs)} of unhealthy_threshold "
        f"{w.unhealthy}; a SUSPECT shard still serves, so one failed probe costs no traffic"
    ]


def _death_error(w: Why) -> str:
    """': <the recorded error>' of the death behind the link, or '' when not supplied."""
    event: object = w.event(w.link.seq)
    if isinstance(event, ProbeRound):  # a death a probe round saw
        event = event.result_of(w.shard)
    if isinstance(event, ActorDeathConfirmed | ProbeDeath) and event.told:
        return f": {event.told}"
    return ""


def _actor_died(w: Why) -> list[str]:
    return [
        f"the runtime confirmed its actor is gone (seq {w.link.seq}{_death_error(w)}); a "
        f"confirmed death is conclusive, so it went {w.link.before} → DEAD at once, without "
        "counting failures"
    ]


def _engine_died(w: Why) -> list[str]:
    # The actor answered: Ray's liveness saw nothing; the engine's own error is the fact.
    return [
        f"the engine died under its live actor (seq {w.link.seq}{_death_error(w)}); an "
        f"engine's death is as conclusive as its actor's, so it went {w.link.before} → DEAD "
        "at once, without counting failures",
        "its actor was alive, so the runtime saw no death: the engine's own error is the evidence",
    ]


def _condemned(w: Why) -> list[str]:
    event = w.event(w.link.seq)
    reason = event.reason if isinstance(event, SilentParticipantCondemned) else w.link.rule
    out = [
        f"condemned as the silent participant at seq {w.link.seq} ({reason}): a judgement "
        "after an aborted refit, not an actor death"
    ]
    abort = last_abort_before(w.entries, w.link.seq)
    if abort is not None:
        out.append(
            f"the refit to weight version {abort.weight_version} over "
            f"{shard_list(abort.participants)} aborted at seq {abort.seq} ({abort.reason})"
        )
    previous = w.previous
    if previous is not None and previous.after is ShardState.STALE:
        if previous.before is ShardState.SUSPECT:
            suspect = w.made_suspect_before(previous.seq)
            since = f" (since seq {suspect.seq}: {suspect.rule})" if suspect else ""
            out.append(f"it was SUSPECT before the abort{since}")
        else:
            out.append(f"it was {previous.before} before the abort")
    return out


def _partial(w: Why) -> list[str]:
    abort = last_abort_before(w.entries, w.link.seq)
    event = w.event(w.link.seq)
    marked = "every shard not absent"  # what the event meant before it could name shards
    if isinstance(event, WeightsMarkedPartial) and event.shards is not None:
        marked = shard_list(event.shards)
    if abort is not None:
        what = (
            f"the refit to weight version {abort.weight_version} aborted at seq {abort.seq} "
            f"({abort.reason}), and the weights of {marked} were marked partial "
            f"at seq {w.link.seq}"
        )
    else:
        what = f"its weights were marked partial at seq {w.link.seq} ({w.link.rule})"
    out = [what]
    if w.link.before is ShardState.SUSPECT:
        out.append(
            "it was SUSPECT before the abort, so it counts as a suspect, and a completed refit "
            "returns it to SUSPECT, not HEALTHY"
        )
    return out


def _restart_requested(w: Why) -> list[str]:
    if w.link.after is ShardState.RETIRED:
        return [
            f"{w.link.rule}: the restart requested at seq {w.link.seq} was one more than the "
            "budget allows",
            "RETIRED is terminal: nothing moves it again",
        ]
    return [
        f"a restart was requested at seq {w.link.seq} ({w.link.rule}); it serves again only "
        "after a replacement loads (STALE) and a refit that includes it completes"
    ]


def _restart_failed(w: Why) -> list[str]:
    event = w.event(w.link.seq)
    error = event.told if isinstance(event, RestartFailed) else w.link.rule
    r = w.view.shards[w.shard]
    return [
        f"the restart failed at seq {w.link.seq} ({error}); "
        f"{r.restart_attempts} of max_restart_attempts_per_shard "
        f"{w.view.config.max_restart_attempts_per_shard} restart attempts used"
    ]


def _loaded(w: Why) -> list[str]:
    event = w.event(w.link.seq)
    url = event.base_url if isinstance(event, ReplacementLoaded) and event.base_url else None
    where = f" at {url}" if url else ""
    return [
        f"a replacement engine loaded{where} at seq {w.link.seq}; it holds start-up weights, so "
        "it gets no traffic until a refit that includes it completes"
    ]


def _refit_completed(w: Why) -> list[str]:
    if w.link.after is ShardState.SUSPECT:
        return [f"{w.link.rule} (seq {w.link.seq}); its reported streak was kept"]
    return [
        f"a refit that included it completed at seq {w.link.seq} ({w.link.rule}), replacing "
        "its partial or start-up weights"
    ]


def _probe_ok(w: Why) -> list[str]:
    return [f"probes answered again: {w.link.rule} (at seq {w.link.seq})"]


def _retired(w: Why) -> list[str]:
    event = w.event(w.link.seq)
    reason = event.reason if isinstance(event, ShardRetired) else w.link.rule
    return [f"retired at seq {w.link.seq}: {reason}", "RETIRED is terminal: nothing moves it again"]


# Input of the transition that put the shard in its state → the sentences that explain it.
BECAUSE: dict[Input, Callable[[Why], list[str]]] = {
    Input.REPORTED_FAILURE: _reported_failure,
    Input.PROBE_FAILED: _probe_failed,
    Input.ACTOR_DIED: _actor_died,
    Input.ENGINE_DIED: _engine_died,
    Input.CONDEMNED: _condemned,
    Input.WEIGHTS_PARTIAL: _partial,
    Input.RESTART_REQUESTED: _restart_requested,
    Input.RESTART_FAILED: _restart_failed,
    Input.REPLACEMENT_LOADED: _loaded,
    Input.REFIT_COMPLETED: _refit_completed,
    Input.PROBE_OK: _probe_ok,
    Input.RETIRE: _retired,
}
