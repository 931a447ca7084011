"""What the caller must read: the events an explanation cites, and probe counts over a span.

Rules of this file:

- The explanations read nothing themselves. ``evidence_needed`` names the seqs to read
  (``EvidenceRequest.seqs``) and the span whose probes to count (``span``); the caller
  reads them and passes them in — as a mapping seq → event, and a ``SpanTally`` from
  ``tally_span`` over the span's events or from ``ProbeTallies`` counted during the
  replay. So explaining the same events always prints the same words, wherever they
  were read.
- An event asked for but not supplied is cited as "not read", never guessed at.
- The history entries and the view must come from the same events: ``check_entries``
  refuses a history that reaches past the view, or the words would contradict.
- Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    OutcomeWindowReported,
    ProbeDeath,
    ProbeFailure,
    ProbeRound,
    RecordedEvent,
    RestartFailed,
    iso_at,
    shard_outside,
)
from fleetledger.projections.explain.words import TEXT_LIMIT, describe_event
from fleetledger.projections.fleet_view import FleetView, ProjectionError
from fleetledger.projections.history import Entry, RefitEntry, TransitionEntry
from fleetledger.projections.json_form import JsonForm
from fleetledger.projections.shard_states import Input, ShardState

# Transitions whose explanation cites the refit abort behind them.
_AFTER_AN_ABORT = frozenset({Input.CONDEMNED, Input.WEIGHTS_PARTIAL})


@dataclass(frozen=True, slots=True)
class Cited(JsonForm):
    """One event an explanation rests on; ``at_us`` is None when it was not supplied."""

    JSON_DERIVED: ClassVar[tuple[str, ...]] = ("at",)

    seq: int
    at_us: int | None
    what: str

    @classmethod
    def of(cls, seq: int, evidence: Mapping[int, RecordedEvent], shard: int | None) -> Cited:
        recorded = evidence.get(seq)
        if recorded is None:
            return cls(seq, None, "event not read (not supplied to the explanation)")
        return cls(seq, recorded.at_us, describe_event(recorded.event, shard))

    @property
    def at(self) -> str | None:
        return None if self.at_us is None else iso_at(self.at_us)

    @property
    def line(self) -> str:
        when = "" if self.at_us is None else f" ({iso_at(self.at_us)})"
        return f"seq {self.seq}{when}: {self.what}"


@dataclass(frozen=True, slots=True)
class CitedCause(JsonForm):
    """A death or failure cause an explanation cites: the facts read from it
    (``events/causes.py``) and the raw text, which ``explain --raw`` and ``--json`` show
    and the text never does."""

    seq: int
    shard: int
    line: str
    cause: dict[str, Any]

    @property
    def raw(self) -> str:
        raw: str = self.cause.get("raw", "")
        return raw

    @classmethod
    def all_of(
        cls, seqs: Iterable[int], evidence: Mapping[int, RecordedEvent], shard: int
    ) -> tuple[CitedCause, ...]:
        """The causes ``shard``'s cited events recorded, in seq order."""
        out: list[CitedCause] = []
        for seq in sorted(set(seqs)):
            recorded = evidence.get(seq)
            if recorded is None:
                continue
            for said in causes_in(recorded.event, shard):
                facts = said.facts
                if facts is not None:
                    out.append(cls(seq, shard, said.told, facts.model_dump(mode="json")))
        return tuple(out)


def raw_causes(causes: Sequence[CitedCause]) -> str:
    """The raw text of each cause, under its seq and shard (``explain --raw``)."""
    if not causes:
        return "raw causes: none cited"
    lines = ["raw causes:"]
    for c in causes:
        lines.append(f"  seq {c.seq}, shard {c.shard}:")
        lines += [f"    {line.expandtabs(4)}" for line in c.raw.splitlines() or [""]]
    return "\n".join(lines)


SaysCause = ActorDeathConfirmed | ProbeFailure | ProbeDeath | RestartFailed


def causes_in(event: Event, shard: int) -> list[SaysCause]:
    """The records in ``event`` that say a cause about ``shard``."""
    if isinstance(event, ActorDeathConfirmed | RestartFailed):
        return [event] if event.shard == shard else []
    if isinstance(event, ProbeRound):
        return [r for r in (*event.failed, *event.died) if r.shard == shard]
    return []


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """The events an explanation cites: read them and pass them in.

    ``seqs`` go into the ``evidence`` mapping; ``span`` (inclusive) is the stretch of the
    run whose probes ``tally_span`` should count for the shard, or None. ``causes``: the
    seqs of the other causes the answer prints (its transitions'), read into the mapping
    too, for their raw text (``--raw``, ``--json``) — not cited as evidence.
    """

    seqs: tuple[int, ...]
    span: tuple[int, int] | None
    causes: tuple[int, ...] = ()

    @property
    def to_read(self) -> tuple[int, ...]:
        return tuple(sorted({*self.seqs, *self.causes}))


@dataclass(frozen=True, slots=True)
class SpanTally(JsonForm):
    """Probe results for one shard over an inclusive span of seqs."""

    shard: int
    first_seq: int
    last_seq: int
    probes_ok: int
    probes_failed: int


def tally_span(
    events: Iterable[RecordedEvent], shard: int, first_seq: int, last_seq: int
) -> SpanTally:
    """Count ``shard``'s probe results among ``events`` with first_seq ≤ seq ≤ last_seq.

    A wedged engine still answers probes, so this count is what tells a reader that the
    reported streak, not the probes, condemned it. Streams: the span may be long.
    """
    ok = failed = 0
    for recorded in events:
        if not first_seq <= recorded.seq <= last_seq:
            continue
        event = recorded.event
        if isinstance(event, ProbeRound):
            result = event.result_of(shard)
            if result == "ok":
                ok += 1
            elif isinstance(result, ProbeFailure):  # a failure, not a death
                failed += 1
    return SpanTally(shard, first_seq, last_seq, ok, failed)


class ProbeTallies:
    """Probe results per shard, counted while the caller streams a run once.

    ``tally_span`` needs the span's events, and a long reported streak's span can be most
    of the run: reading it again costs as much as the replay. Fed the same stream as the
    replay (``replay(tallies.watch(events))``), this remembers the running counts at every
    adapter window that reported an infra failure — the only seqs a reported streak starts
    or ends at — so the tally of such a span is a subtraction.
    """

    def __init__(self) -> None:
        self._ok: dict[int, int] = {}
        self._failed: dict[int, int] = {}
        self._at: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
        # The ``ok`` lists of rounds not yet added to ``_ok``, and how many rounds had
        # each: a week of a 256-shard fleet is 31 million successes but a handful of
        # distinct lists, added up only where a count is remembered.
        self._pending: Counter[tuple[int, ...]] = Counter()

    def _settle(self) -> None:
        ok = self._ok
        for shards, rounds in self._pending.items():
            for shard in shards:
                ok[shard] = ok.get(shard, 0) + rounds
        self._pending.clear()

    def watch(self, events: Iterable[RecordedEvent]) -> Iterator[RecordedEvent]:
        """Yield ``events`` unchanged, counting probes on the way."""
        ok, failed, at, pending = self._ok, self._failed, self._at, self._pending
        # A filter over the whole run, not a dispatch: the probe round and the window
        # matter, everything else passes untouched at the cost of two checks.
        for recorded in events:
            event = recorded.event
            if isinstance(event, ProbeRound):
                if event.ok:
                    pending[event.ok] += 1
                for failure in event.failed:
                    failed[failure.shard] = failed.get(failure.shard, 0) + 1
            elif isinstance(event, OutcomeWindowReported) and any(
                o.infra_failures for o in event.outcomes
            ):
                if pending:
                    self._settle()
                at[recorded.seq] = (dict(ok), dict(failed))
            yield recorded

    def span(self, shard: int, first_seq: int, last_seq: int) -> SpanTally:
        """Probe results of ``shard`` between two windows that reported infra failures."""
        for seq in (first_seq, last_seq):
            if seq not in self._at:
                raise ProjectionError(
                    f"no probe count remembered at seq {seq}: only adapter windows that "
                    "reported an infra failure are, and only for the events watched"
                )
        ok0, failed0 = self._at[first_seq]
        ok1, failed1 = self._at[last_seq]
        # Both ends are windows, not probes: the counts between them are the span's.
        return SpanTally(
            shard,
            first_seq,
            last_seq,
            ok1.get(shard, 0) - ok0.get(shard, 0),
            failed1.get(shard, 0) - failed0.get(shard, 0),
        )


def transitions_of(entries: Sequence[Entry], shard: int) -> list[TransitionEntry]:
    """Every transition of ``shard``, in order: the chain an explanation walks."""
    return [e for e in entries if isinstance(e, TransitionEntry) and e.shard == shard]


def last_abort_before(entries: Sequence[Entry], seq: int) -> RefitEntry | None:
    """The last refit that aborted at or before ``seq``."""
    aborts = [
        e for e in entries if isinstance(e, RefitEntry) and e.outcome == "aborted" and e.seq <= seq
    ]
    return aborts[-1] if aborts else None


def check_shard(view: FleetView, shard: int) -> None:
    """Refuse a shard this run's fleet does not have, naming the valid range."""
    problem = shard_outside(shard, len(view.shards))
    if problem is not None:
        raise ProjectionError(f"run {view.run!r}: {problem}")


def check_entries(view: FleetView, entries: Sequence[Entry]) -> None:
    """Entries and view must come from the same events, or the words would contradict."""
    if entries and entries[-1].seq > view.seq:
        raise ProjectionError(
            f"run {view.run!r}: history entries reach seq {entries[-1].seq} but the view is at "
            f"seq {view.seq}; replay the same events the view folded"
        )


def lost_transitions(entries: Sequence[Entry]) -> list[TransitionEntry]:
    """The transitions that lost a shard (to DEAD or RETIRED): the run's trouble."""
    lost = (ShardState.DEAD, ShardState.RETIRED)
    return [e for e in entries if isinstance(e, TransitionEntry) and e.after in lost]


def evidence_needed(
    view: FleetView, entries: Sequence[Entry], shard: int | None = None
) -> EvidenceRequest:
    """Which events ``explain_shard``/``explain_run`` will cite for this view and shard."""
    check_entries(view, entries)
    seqs: set[int] = {1}
    if view.open_refit is not None:
        seqs.add(view.open_refit.seq)
    if shard is None:
        if view.progress is not None:
            seqs.add(view.progress.seq)
        if view.ended is not None:  # its progress, when recorded, is the last
            seqs.add(view.ended.seq)
        lost = tuple(t.seq for t in lost_transitions(entries) if t.cause)
        return EvidenceRequest(tuple(sorted(seqs)), None, lost)
    check_shard(view, shard)
    chain = transitions_of(entries, shard)
    span: tuple[int, int] | None = None
    if chain:
        link = chain[-1]
        seqs |= {*link.evidence, link.seq}
        if link.input in _AFTER_AN_ABORT:
            abort = last_abort_before(entries, link.seq)
            if abort is not None:
                seqs.add(abort.seq)
        if link.input is Input.REPORTED_FAILURE and link.evidence:
            span = (min(link.evidence), link.seq)
    shown = tuple(t.seq for t in chain[-TEXT_LIMIT:] if t.cause)  # what the text prints
    return EvidenceRequest(tuple(sorted(seqs)), span, shown)
