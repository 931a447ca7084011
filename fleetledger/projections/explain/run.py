"""A run's explanation: how it ended, or where it stands, and the trouble on the way.

Rules of this file:

- How a run ended is what its ``run_ended`` recorded; "why" is the last *decisive*
  finding before it — a fact of the kind that ends a run by itself (a refit aborted
  with the device context lost, an abort no later refit recovered, a refused
  condemnation, an exhausted fleet, a stall with action ``abort``). A run without such
  a fact has no "why", rather than an invented one.
- Findings are data: ``FINDINGS`` maps every history entry type to what it may say
  about trouble (most say nothing), so every entry is considered exactly once.
- A run that has not ended is described where it stands: the last progress, the refit
  still open, the shards that are not HEALTHY.
- Pure: no I/O, no clock. ``.text`` is for people, ``.as_json()`` for ``--json``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fleetledger.events.models import RecordedEvent, RunEnded, iso_at
from fleetledger.projections.explain.evidence import (
    CitedCause,
    check_entries,
    lost_transitions,
    raw_causes,
)
from fleetledger.projections.explain.fleet import LayoutSummary, open_refit_at, started_at_us
from fleetledger.projections.explain.words import (
    TEXT_LIMIT,
    CauseQuotes,
    progress_counts,
    seconds,
    shard_list,
)
from fleetledger.projections.fault_cost import FaultCost
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.history import (
    DecisionEntry,
    EndEntry,
    Entry,
    EpochEntry,
    RefitEntry,
    RestartEntry,
    StallEntry,
    TransitionEntry,
)
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.served_weights import ServedWeights
from fleetledger.projections.shard_states import ShardState

_LOST_STATES = frozenset({ShardState.DEAD, ShardState.RETIRED})


@dataclass(frozen=True, slots=True)
class Finding(JsonForm):
    """A recorded fact of the kind that ends runs, in words."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("at",)

    seq: int
    at_us: int
    # context_lost | refit_aborted | shard_lost | condemnation_refused | fleet_exhausted | stall
    kind: str
    text: str
    shards: tuple[int, ...]
    decisive: bool  # the kind that can end a run by itself (not a recovered abort)
    cause: str = ""  # the death or failure cause its text quotes, if any

    @property
    def at(self) -> str:
        return iso_at(self.at_us)

    @property
    def line(self) -> str:
        return f"seq {self.seq} ({iso_at(self.at_us)}): {self.text}"


# ── what each entry says about trouble: (entry, view, all entries) → a finding ───


def _refit_finding(e: RefitEntry, view: FleetView, entries: Sequence[Entry]) -> Finding | None:
    if e.outcome != "aborted":
        return None
    if e.context_lost:
        return Finding(
            e.seq,
            e.at_us,
            "context_lost",
            f"refit to weight version {e.weight_version} aborted with the device context lost "
            f"mid-transfer: no rebuild can succeed ({e.reason})",
            e.participants,
            True,
        )
    later = [
        r
        for r in entries
        if isinstance(r, RefitEntry) and r.outcome == "completed" and r.seq > e.seq
    ]
    text = (
        f"refit to weight version {e.weight_version} over {shard_list(e.participants)} aborted "
        f"after {seconds(e.duration_us)}: {e.reason}"
    )
    if later:
        done = later[0]
        text += (
            f"; recovered: the refit to weight version {done.weight_version} over "
            f"{shard_list(done.participants)} completed at seq {done.seq}"
        )
    else:
        text += "; no refit completed after it"
    return Finding(e.seq, e.at_us, "refit_aborted", text, e.participants, not later)


def _refusal_finding(e: DecisionEntry) -> Finding:
    suspects = e.subjects
    if not suspects:
        why = "no shard was suspected, so there was nothing to go on"
    elif len(suspects) == 1:
        why = f"the only suspect was {shard_list(suspects)}"
    else:
        why = (
            f"{len(suspects)} suspects ({shard_list(suspects)}): there is no telling which one "
            "broke the refit, so condemning one would be a guess"
        )
    return Finding(
        e.seq,
        e.at_us,
        "condemnation_refused",
        f"condemnation refused: {why}; recorded reason: {e.detail}",
        suspects,
        True,
    )


def _decision_finding(
    e: DecisionEntry, view: FleetView, entries: Sequence[Entry]
) -> Finding | None:
    if e.decision == "condemnation_refused":
        return _refusal_finding(e)
    if e.decision == "fleet_exhausted":
        return Finding(e.seq, e.at_us, "fleet_exhausted", f"fleet exhausted: {e.detail}", (), True)
    return None  # partial weights, a condemnation, a retirement: their transitions speak


def _stall_finding(e: StallEntry, view: FleetView, entries: Sequence[Entry]) -> Finding:
    text = (
        f"stall detected: no progress for {e.idle_s:g} s at "
        f"{progress_counts(e.committed_groups, e.train_steps)}, {e.in_flight} in flight "
        f"(action {e.action})"
    )
    if e.in_flight == 0:
        text += (
            "; nothing was in flight, so nothing could fail or time out: only the missing "
            "progress shows the wedge"
        )
    return Finding(e.seq, e.at_us, "stall", text, (), e.action == "abort")


def _transition_finding(
    e: TransitionEntry, view: FleetView, entries: Sequence[Entry]
) -> Finding | None:
    if e.after not in _LOST_STATES:
        return None
    now = view.shards[e.shard].state
    still = "" if now is e.after else f" (it is {now} now)"
    text = f"shard {e.shard} {e.before} → {e.after}: {e.rule}{still}"
    return Finding(e.seq, e.at_us, "shard_lost", text, (e.shard,), False, e.cause)


def _no_finding(e: Entry, view: FleetView, entries: Sequence[Entry]) -> None:
    return None


# History entry type → what it says about trouble (None: nothing).
FINDINGS: dict[type[Entry], Callable[[Any, FleetView, Sequence[Entry]], Finding | None]] = {
    TransitionEntry: _transition_finding,
    EpochEntry: _no_finding,
    RefitEntry: _refit_finding,
    RestartEntry: _no_finding,  # a failed restart is found by its transition to DEAD
    DecisionEntry: _decision_finding,
    StallEntry: _stall_finding,
    EndEntry: _no_finding,  # the end is the headline, not trouble on the way
}


def _findings(view: FleetView, entries: Sequence[Entry]) -> list[Finding]:
    found = (FINDINGS[type(e)](e, view, entries) for e in entries)
    return [f for f in found if f is not None]


@dataclass(frozen=True, slots=True)
class ProgressSummary(JsonForm):
    """The last progress the watchdog recorded; ``at_us`` None when it was not supplied."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("at",)

    seq: int
    at_us: int | None
    committed_groups: int
    train_steps: int
    in_flight: int

    @property
    def at(self) -> str | None:
        return None if self.at_us is None else iso_at(self.at_us)


@dataclass(frozen=True, slots=True)
class ShardLine(JsonForm):
    """One shard that is not HEALTHY, with the rule that put it there."""

    shard: int
    state: ShardState
    since_seq: int
    rule: str
    suspected: bool
    cause: str = ""  # the death or failure cause its rule quotes, if any

    @property
    def line(self) -> str:
        note = " (suspected)" if self.suspected and self.state is not ShardState.SUSPECT else ""
        return f"shard {self.shard} {self.state}{note} since seq {self.since_seq}: {self.rule}"


@dataclass(frozen=True)
class RunExplanation(JsonForm):
    """Why a run ended, or where it stands, as of one seq."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("kind", "at", "started_at", "summary")
    kind: ClassVar[str] = "run"

    run: str
    seq: int
    at_us: int
    started_at_us: int | None
    ended: EndEntry | None
    why: Finding | None  # the last decisive finding before the end (or the view's seq)
    findings: tuple[Finding, ...]
    progress: ProgressSummary | None
    stalls: tuple[StallEntry, ...]
    open_refit: RefitEntry | None
    last_completed_refit: RefitEntry | None
    not_healthy: tuple[ShardLine, ...]
    epoch: int
    serving: tuple[int, ...]
    absent: tuple[int, ...]
    suspected: tuple[int, ...]
    trainer_weight_version: int
    layout: LayoutSummary
    causes: tuple[CitedCause, ...] = ()  # the causes of the lost shards, raw text included
    served: ServedWeights = field(default_factory=ServedWeights)  # rollouts by weights
    faults: tuple[FaultCost, ...] = ()  # what each fault cost, in order

    @property
    def at(self) -> str:
        return iso_at(self.at_us)

    @property
    def started_at(self) -> str | None:
        return None if self.started_at_us is None else iso_at(self.started_at_us)

    @property
    def summary(self) -> str:
        """The answer in one sentence: how the run ended, or that it has not."""
        if self.ended is not None:
            e = self.ended
            return f"run {self.run} ended {e.outcome} at seq {e.seq} ({iso_at(e.at_us)}): {e.cause}"
        return (
            f"run {self.run} has not ended: as of seq {self.seq} ({iso_at(self.at_us)}) no "
            "run_ended is recorded"
        )

    def _progress(self) -> str:
        p = self.progress
        if p is None:
            return "progress: none was ever reported"
        when = "" if p.at_us is None else f" ({iso_at(p.at_us)})"
        ago = ""
        if p.at_us is not None and p.seq < self.seq:
            ago = (
                f"; nothing newer in the {self.seq - p.seq} events and "
                f"{seconds(self.at_us - p.at_us)} up to seq {self.seq}"
            )
        return (
            f"last progress at seq {p.seq}{when}: "
            f"{progress_counts(p.committed_groups, p.train_steps)}, {p.in_flight} in flight{ago}"
        )

    def _refit(self) -> str:
        o = self.open_refit
        if o is not None:
            return (
                f"refit open: weight version {o.weight_version} over {shard_list(o.participants)} "
                f"since seq {o.started_seq} ({iso_at(o.started_at_us)}), "
                f"{seconds(self.at_us - o.started_at_us)} before seq {self.seq}; no completion "
                "or abort was recorded"
            )
        done = self.last_completed_refit
        if done is None:
            return "refits: none open, none completed"
        return (
            f"refits: none open; the last completed was weight version {done.weight_version} "
            f"over {shard_list(done.participants)} at seq {done.seq}"
        )

    @property
    def raw_text(self) -> str:
        """The text, then the raw text of every cause it cites (``explain --raw``)."""
        return self.text + "\n" + raw_causes(self.causes)

    @property
    def text(self) -> str:
        """For people: each cause printed once (``CauseQuotes``)."""
        quotes = CauseQuotes()
        for f in self.findings:
            quotes.learn(f.cause, f.seq)
        for s in self.not_healthy:
            quotes.learn(s.cause, s.since_seq)
        lines = [self.summary]
        if self.ended is not None and self.why is not None:
            lines.append(f"why: {self.why.text} (seq {self.why.seq})")
        if self.findings:
            head = f"trouble recorded, in order ({len(self.findings)}):"
            lines += _the_last(head, [f.line for f in self.findings], "--json")
        else:
            lines.append(
                "trouble recorded: none (no abort, refusal, exhaustion, stall, lost shard)"
            )
        if self.faults:
            head = f"what each fault cost ({len(self.faults)}; table: --cost):"
            lines += _the_last(head, [f.line for f in self.faults], "--cost")
        lines.append(self._progress())
        if self.stalls:
            last = self.stalls[-1]
            lines.append(
                f"stalls: {len(self.stalls)} recorded, the last at seq {last.seq} "
                f"(idle {last.idle_s:g} s, {last.in_flight} in flight, action {last.action})"
            )
        else:
            lines.append("stalls: none recorded")
        lines.append(self._refit())
        lines.append(self.served.describe())
        lines.append(
            f"fleet: epoch {self.epoch}, serving {list(self.serving)}, absent "
            f"{list(self.absent)}, suspected {list(self.suspected)}; trainer weights at version "
            f"{self.trainer_weight_version}"
        )
        lines.append(f"layout: {self.layout.describe()}")
        if self.not_healthy:
            lines.append("not HEALTHY:")
            lines += [f"  {s.line}" for s in self.not_healthy]
        else:
            lines.append("every shard is HEALTHY")
        return "\n".join(quotes.once(line) for line in lines)


def _the_last(head: str, items: Sequence[str], see: str) -> list[str]:
    """``head``, then the last ``TEXT_LIMIT`` of ``items`` indented, saying how many
    earlier ones ``see`` shows."""
    shown = items[-TEXT_LIMIT:]
    lines = [head]
    if len(items) > len(shown):
        lines.append(f"  … {len(items) - len(shown)} earlier (see {see})")
    return lines + [f"  {line}" for line in shown]


def explain_run(
    view: FleetView,
    entries: Sequence[Entry],
    evidence: Mapping[int, RecordedEvent],
    faults: Sequence[FaultCost] = (),
) -> RunExplanation:
    """Why the run in ``view`` ended, or where it stands; ``entries`` replay the same events."""
    check_entries(view, entries)
    findings = _findings(view, entries)
    ended = next((e for e in reversed(entries) if isinstance(e, EndEntry)), None)
    decisive = [f for f in findings if f.decisive]
    progress = None
    final = None if view.ended is None else evidence.get(view.ended.seq)
    if final is not None and isinstance(final.event, RunEnded) and final.event.progress:
        p_end = final.event.progress  # recorded as the run ended: the last there is
        progress = ProgressSummary(
            final.seq, final.at_us, p_end.committed_groups, p_end.train_steps, p_end.in_flight
        )
    elif view.progress is not None:
        p = view.progress
        recorded = evidence.get(p.seq)
        progress = ProgressSummary(
            p.seq,
            None if recorded is None else recorded.at_us,
            p.committed_groups,
            p.train_steps,
            p.in_flight,
        )
    completed = [e for e in entries if isinstance(e, RefitEntry) and e.outcome == "completed"]
    since = {  # the cause of each shard's last transition, which its line quotes
        e.shard: e.cause
        for e in entries
        if isinstance(e, TransitionEntry) and e.seq == view.shards[e.shard].since_seq
    }
    return RunExplanation(
        run=view.run,
        seq=view.seq,
        at_us=view.at_us,
        started_at_us=started_at_us(entries, evidence),
        ended=ended,
        why=decisive[-1] if decisive else None,
        findings=tuple(findings),
        progress=progress,
        stalls=tuple(e for e in entries if isinstance(e, StallEntry)),
        open_refit=open_refit_at(view, entries, evidence),
        last_completed_refit=completed[-1] if completed else None,
        not_healthy=tuple(
            ShardLine(
                r.index, r.state, r.since_seq, r.since_rule, r.suspected, since.get(r.index, "")
            )
            for r in view.shards
            if r.state is not ShardState.HEALTHY
        ),
        epoch=view.epoch,
        serving=view.serving,
        absent=view.absent,
        suspected=view.suspected,
        trainer_weight_version=view.weight_version,
        layout=LayoutSummary.of(view),
        served=view.served,
        faults=tuple(faults),
        causes=tuple(
            c
            for t in lost_transitions(entries)
            for c in CitedCause.all_of((t.seq,), evidence, t.shard)
        ),
    )
