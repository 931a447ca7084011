"""Every text of a timeline: title, subtitle, the end, tooltips, and the tables under it.

Plain text only, never markup: the HTML painter escapes every string it is handed, so a
base URL or a reason read from the ledger can only ever show as itself. Times are written
by :func:`fleetledger.events.models.iso_at`, as every other output writes them, with the
offset from the run's start next to them because the axis counts from zero.
"""

from __future__ import annotations

from dataclasses import dataclass

from fleetledger.events.models import iso_at
from fleetledger.projections.history import DecisionEntry, EpochEntry, RefitEntry, StallEntry
from fleetledger.projections.lanes import Interval, Lanes
from fleetledger.projections.shard_states import ShardState


@dataclass(frozen=True, slots=True)
class Table:
    """Facts of the picture as text, for reading and searching."""

    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    code_columns: frozenset[int] = frozenset()  # identifiers (base URLs), set as code


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def at_text(lanes: Lanes, at_us: int) -> str:
    offset = duration((at_us - lanes.first_us) / 1e6)
    return f"{iso_at(at_us, timespec='milliseconds')} (+{offset})"


def title(lanes: Lanes) -> str:
    return f"fleetledger timeline · run {lanes.run}"


def subtitle(lanes: Lanes) -> str:
    c = lanes.config
    span = (lanes.last_us - lanes.first_us) / 1e6
    first = iso_at(lanes.first_us, timespec="seconds")
    last = iso_at(lanes.last_us, timespec="seconds")
    return (
        f"{plural(lanes.last_seq, 'event')} · {first} → {last} ({duration(span)}) · "
        f"{plural(c.shard_count, 'shard')} × {plural(c.workers_per_shard, 'rank')} + "
        f"{plural(c.train_world_size, 'trainer rank')} · {plural(len(lanes.refits), 'refit')} · "
        f"{plural(len(lanes.epochs) - 1, 'epoch change')}"
    )


def end_text(lanes: Lanes) -> str:
    return ("END · " if lanes.end else "NOT ENDED · ") + lanes.end_label()


# ── tooltips ───────────────────────────────────────────────────────────────────


def interval_tip(lanes: Lanes, interval: Interval) -> str:
    if interval.end_seq > lanes.last_seq:
        until = "the last event"
    else:
        until = f"seq {interval.end_seq} at {at_text(lanes, interval.end_us)}"
    return (
        f"shard {interval.shard}: {interval.state} from seq {interval.start_seq} at "
        f"{at_text(lanes, interval.start_us)} until {until} — {interval.rule}"
    )


def refit_tip(r: RefitEntry) -> str:
    shards = ",".join(map(str, r.participants)) or "none"
    took = duration(r.duration_us / 1e6)
    text = (
        f"refit to v{r.weight_version} {r.outcome} "
        f"(seq {r.started_seq}–{r.seq}, {took}, shards {shards})"
    )
    if r.reason:
        text += f": {r.reason}"
    if r.context_lost:
        text += " [context lost]"
    return text


def epoch_tip(lanes: Lanes, e: EpochEntry) -> str:
    world = e.world_size if e.world_size is not None else f"none ({e.layout_error})"
    return (
        f"epoch {e.epoch} at seq {e.seq}, {at_text(lanes, e.at_us)}: serving "
        f"{list(e.serving)}, absent {list(e.absent)}, refit world size {world}"
    )


def decision_tip(lanes: Lanes, d: DecisionEntry, what: str) -> str:
    return f"seq {d.seq}, {at_text(lanes, d.at_us)}: {what}: {d.detail}"


def stall_tip(lanes: Lanes, s: StallEntry) -> str:
    return (
        f"seq {s.seq}, {at_text(lanes, s.at_us)}: stall ({s.action}) — idle {s.idle_s:g} s, "
        f"{s.committed_groups} groups committed, {s.train_steps} train steps, "
        f"{s.in_flight} in flight"
    )


# ── the tables ─────────────────────────────────────────────────────────────────


def _shards(lanes: Lanes) -> Table:
    rows = tuple(
        (
            str(index),
            lanes.config.base_urls[index],
            str(lane[-1].state),
            str(lane[-1].start_seq),
            lane[-1].rule,
            str(sum(1 for i in lane if i.state == ShardState.DEAD)),
        )
        for index, lane in enumerate(lanes.lanes)
    )
    header = ("shard", "base URL at start", "final state", "since seq", "because", "times DEAD")
    return Table("Shards", header, rows, frozenset({1}))


def _refits(lanes: Lanes) -> Table:
    rows = tuple(
        (
            str(r.weight_version),
            r.outcome + (" (context lost)" if r.context_lost else ""),
            f"{r.started_seq}–{r.seq}",
            at_text(lanes, r.started_at_us),
            duration(r.duration_us / 1e6),
            ", ".join(map(str, r.participants)) or "none",
            r.reason,
        )
        for r in lanes.refits
    )
    header = ("weight version", "outcome", "seqs", "started", "duration", "shards", "reason")
    return Table("Refits", header, rows)


def _epochs(lanes: Lanes) -> Table:
    rows = tuple(
        (
            str(e.epoch),
            str(e.seq),
            at_text(lanes, e.at_us),
            str(list(e.serving)),
            str(list(e.absent)),
            str(e.world_size) if e.world_size is not None else f"none: {e.layout_error}",
        )
        for e in lanes.epochs
    )
    header = ("epoch", "seq", "at", "serving", "absent", "refit world size")
    return Table("Membership epochs", header, rows)


def _decisions_and_stalls(lanes: Lanes) -> Table:
    events = [
        (d.seq, d.at_us, d.decision.replace("_", " "), str(list(d.subjects) or ""), d.detail)
        for d in lanes.decisions
    ] + [
        (
            s.seq,
            s.at_us,
            f"stall ({s.action})",
            "",
            f"idle {s.idle_s:g} s; {s.committed_groups} groups committed, "
            f"{s.train_steps} train steps, {s.in_flight} in flight",
        )
        for s in lanes.stalls
    ]
    rows = tuple(
        (str(seq), at_text(lanes, at), what, shards, detail)
        for seq, at, what, shards, detail in sorted(events)
    )
    return Table("Decisions and stalls", ("seq", "at", "what", "shards", "detail"), rows)


TABLES = (_shards, _refits, _epochs, _decisions_and_stalls)


def tables(lanes: Lanes) -> tuple[Table, ...]:
    return tuple(make(lanes) for make in TABLES)
