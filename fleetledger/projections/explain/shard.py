"""A shard's explanation: why it is in its state at one seq, and everything around it.

Rules of this file:

- The answer is the shard's last transition, explained by ``because.BECAUSE`` for its
  input, followed by what holds whatever moved it: the refit a STALE shard waits for,
  whether it was ever condemned, a refusal that named it.
- The view and the history must agree on when the shard last moved; if they do not,
  they were folded from different events and the explanation is refused, not guessed.
- Pure: no I/O, no clock. ``.text`` is for people, ``.as_json()`` for ``--json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from fleetledger.events.models import RecordedEvent, iso_at
from fleetledger.projections.explain.because import BECAUSE, Why
from fleetledger.projections.explain.evidence import (
    Cited,
    CitedCause,
    SpanTally,
    check_entries,
    check_shard,
    evidence_needed,
    raw_causes,
    transitions_of,
)
from fleetledger.projections.explain.fleet import LayoutSummary, open_refit_at, started_at_us
from fleetledger.projections.explain.words import (
    TEXT_LIMIT,
    CauseQuotes,
    count_of,
    seq_list,
    shard_list,
)
from fleetledger.projections.fleet_view import FleetView, ProjectionError
from fleetledger.projections.history import (
    DecisionEntry,
    Entry,
    RefitEntry,
    RestartEntry,
    TransitionEntry,
)
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.shard_states import Input, ShardState

_CONDEMNED_STATES = frozenset({ShardState.DEAD, ShardState.RETIRED})


@dataclass(frozen=True)
class ShardExplanation(JsonForm):
    """Why one shard is in its state at one seq of one run."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("kind", "at", "since_at", "summary")
    kind: ClassVar[str] = "shard"

    run: str
    seq: int
    at_us: int
    shard: int
    state: ShardState
    since_seq: int
    since_at_us: int | None
    rule: str
    input: Input | None  # the input of the transition that put it there; None: never moved
    because: tuple[str, ...]
    evidence: tuple[Cited, ...]
    chain: tuple[TransitionEntry, ...]
    restarts: tuple[RestartEntry, ...]
    decisions: tuple[DecisionEntry, ...]
    restart_attempts: int
    max_restart_attempts_per_shard: int
    probe_failures: int
    reported_failures: int
    unhealthy_threshold: int
    weight_version: int
    trainer_weight_version: int
    serving: bool
    absent: bool
    suspected: bool
    epoch: int
    serving_set: tuple[int, ...]
    absent_set: tuple[int, ...]
    suspected_set: tuple[int, ...]
    layout: LayoutSummary
    open_refit: RefitEntry | None
    base_url: str
    probe_tally: SpanTally | None
    causes: tuple[CitedCause, ...] = ()  # the causes its evidence recorded, raw text included

    @property
    def at(self) -> str:
        return iso_at(self.at_us)

    @property
    def since_at(self) -> str | None:
        return None if self.since_at_us is None else iso_at(self.since_at_us)

    @property
    def summary(self) -> str:
        """The answer in one sentence: the first line a reader needs."""
        return f"shard {self.shard} is {self.state} since seq {self.since_seq}: " + (
            "; ".join(self.because) + "."
        )

    def _membership(self) -> str:
        if self.serving:
            role = "serving (gets traffic, joins the next refit)"
        elif self.absent:
            role = "absent (no traffic, no rank in the next refit)"
        else:
            role = "not serving, not absent (no traffic, joins the next refit)"
        return (
            f"{role}; epoch {self.epoch}, serving {list(self.serving_set)}, absent "
            f"{list(self.absent_set)}, suspected {list(self.suspected_set)}"
        )

    def _restarts(self) -> str:
        line = (
            f"{self.restart_attempts} of max_restart_attempts_per_shard "
            f"{self.max_restart_attempts_per_shard} used"
        )
        by_action: dict[str, list[int]] = {}
        for r in self.restarts:
            by_action.setdefault(r.action, []).append(r.seq)
        if by_action:
            line += " (" + "; ".join(f"{a} at {seq_list(s)}" for a, s in by_action.items()) + ")"
        return line

    @property
    def raw_text(self) -> str:
        """The text, then the raw text of every cause it cites (``explain --raw``)."""
        return self.text + "\n" + raw_causes(self.causes)

    @property
    def text(self) -> str:
        """For people: each cause printed once (``CauseQuotes``), the layout as this
        shard's place in it (a line that grew with the fleet before)."""
        quotes = CauseQuotes()
        for t in self.chain:
            quotes.learn(t.cause, t.seq)
        when = "" if self.since_at_us is None else f" ({iso_at(self.since_at_us)})"
        lines = [
            f"run {self.run}, as of seq {self.seq} ({iso_at(self.at_us)})",
            self.summary,
            f"rule: {self.rule} — at seq {self.since_seq}{when}",
        ]
        if self.evidence:
            lines.append("evidence:")
            lines += [f"  {c.line}" for c in self.evidence]
        if self.chain:
            shown = self.chain[-TEXT_LIMIT:]
            lines.append(f"how it got here ({count_of(len(self.chain), 'transition')}):")
            if len(self.chain) > len(shown):
                lines.append(f"  … {len(self.chain) - len(shown)} earlier (see --json)")
            lines += [
                f"  seq {t.seq} ({iso_at(t.at_us)}): {t.before} → {t.after} — {t.rule}"
                for t in shown
            ]
        else:
            lines.append("how it got here: no transition recorded")
        lines += [f"decision: {d.decision} at seq {d.seq}: {d.detail}" for d in self.decisions]
        lines.append(f"restarts: {self._restarts()}")
        lines.append(
            f"streaks: {count_of(self.probe_failures, 'failed probe')}, "
            f"{count_of(self.reported_failures, 'reported failure')} "
            f"(unhealthy_threshold {self.unhealthy_threshold})"
        )
        behind = (
            ""
            if self.weight_version == self.trainer_weight_version
            else f", behind the trainer's last completed refit at version "
            f"{self.trainer_weight_version}"
        )
        lines.append(f"weights: version {self.weight_version}{behind}")
        if self.open_refit is not None:
            o = self.open_refit
            joined = "includes it" if self.shard in o.participants else "does not include it"
            lines.append(
                f"open refit: weight version {o.weight_version} since seq {o.started_seq} over "
                f"{shard_list(o.participants)}; it {joined}"
            )
        lines.append(f"membership: {self._membership()}")
        lines.append(f"layout: {self.layout.describe_shard(self.shard)}")
        lines.append(f"base URL: {self.base_url}")
        return "\n".join(quotes.once(line) for line in lines)


def explain_shard(
    view: FleetView,
    entries: Sequence[Entry],
    shard: int,
    evidence: Mapping[int, RecordedEvent],
    tally: SpanTally | None = None,
) -> ShardExplanation:
    """Why ``shard`` is in its state in ``view``; ``entries`` replay the same events."""
    check_shard(view, shard)
    check_entries(view, entries)
    record = view.shards[shard]
    chain = transitions_of(entries, shard)
    last_seq = chain[-1].seq if chain else 1
    if last_seq != record.since_seq:
        raise ProjectionError(
            f"run {view.run!r}: shard {shard}'s last transition in the history is at seq "
            f"{last_seq}, but the view says it is {record.state} since seq "
            f"{record.since_seq}; replay the same events the view folded"
        )
    wanted = evidence_needed(view, entries, shard)
    needed = wanted.seqs
    if chain:
        link = chain[-1]
        because = BECAUSE[link.input](Why(view, shard, link, chain, entries, evidence, tally))
        cited = sorted(set(needed) - {1})
        since_at: int | None = link.at_us
    else:
        because = [f"it has been {record.state} since the run started; no rule has moved it"]
        cited = []
        since_at = started_at_us(entries, evidence)
    state = record.state
    if state is ShardState.STALE:
        opened = view.open_refit
        if opened is not None and shard in opened.shards:
            because.append(
                f"the refit to weight version {opened.weight_version} open since seq "
                f"{opened.seq} includes it"
            )
        else:
            because.append("no open refit includes it: it waits for the next one")
    if state is not ShardState.RETIRED and not any(t.after in _CONDEMNED_STATES for t in chain):
        because.append("it has never been condemned (no transition to DEAD or RETIRED)")
    for d in entries:
        if (
            isinstance(d, DecisionEntry)
            and d.decision == "condemnation_refused"
            and shard in d.subjects
            and d.seq >= record.since_seq
        ):
            because.append(
                f"condemnation was refused at seq {d.seq}: it was one of the suspects "
                f"({shard_list(d.subjects)}), so none was condemned"
            )
    restarts = tuple(e for e in entries if isinstance(e, RestartEntry) and e.shard == shard)
    decisions = tuple(
        e
        for e in entries
        if isinstance(e, DecisionEntry) and shard in e.subjects and e.decision != "weights_partial"
    )
    return ShardExplanation(
        run=view.run,
        seq=view.seq,
        at_us=view.at_us,
        shard=shard,
        state=state,
        since_seq=record.since_seq,
        since_at_us=since_at,
        rule=record.since_rule,
        input=chain[-1].input if chain else None,
        because=tuple(because),
        evidence=tuple(Cited.of(seq, evidence, shard) for seq in cited),
        chain=tuple(chain),
        restarts=restarts,
        decisions=decisions,
        restart_attempts=record.restart_attempts,
        max_restart_attempts_per_shard=view.config.max_restart_attempts_per_shard,
        probe_failures=record.probe_failures,
        reported_failures=record.reported_failures,
        unhealthy_threshold=view.config.unhealthy_threshold,
        weight_version=record.weight_version,
        trainer_weight_version=view.weight_version,
        serving=record.serving,
        absent=record.absent,
        suspected=record.suspected,
        epoch=view.epoch,
        serving_set=view.serving,
        absent_set=view.absent,
        suspected_set=view.suspected,
        layout=LayoutSummary.of(view),
        open_refit=open_refit_at(view, entries, evidence),
        base_url=record.base_url,
        probe_tally=tally,
        causes=CitedCause.all_of(wanted.to_read, evidence, shard),
    )
