"""The run's serving set as an external router wants it, followed from the ledger's tail,
with the recorded time at which each URL left it.

An external router knows workers by URL, so the fleet's view is reduced to URLs: each
serving shard's recorded base URL as its origin (``routing_table.origin_of``: no
``/v1``), a replacement's new URL included. A shard whose URL is not HTTP(S) (a
simulated shard's ``ray://``) is never a worker, said once. The view is loaded before
the first reconciliation, so a restarted sync knows the true membership at once.

Every record folded is compared with the serving URLs before it: a URL that left
(the shard went DEAD, STALE on partial weights, RESTARTING, RETIRED, or took a new
URL) is returned with that record's time, the start of the lag the sync measures; and
every entry to or exit from the serving set is counted per URL (``turns``), so that a
window of outcomes that spans two incarnations at one URL can be told apart.

Two shards can record one URL (a replacement started on the port a dead shard freed).
Outcomes are then mapped to the one that serves: counts sent to that URL now are its
requests, never the dead one's. Said once per such URL.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import structlog

from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.shard_states import ShardRecord
from fleetledger.queries.tail import Tail
from fleetledger.queries.views import load_view
from fleetledger.router.routing_table import origin_of
from fleetledger.store.log import EventLog

__all__ = ["Membership", "MembershipFollower"]

_log = structlog.get_logger("fleetledger.router_sync")


@dataclass(frozen=True, slots=True)
class Membership:
    """The fleet at one seq, by worker URL."""

    seq: int
    serving: dict[str, int]  # URL -> shard, for the shards that serve
    shard_of: dict[str, int]  # URL -> shard, for every shard (outcomes are mapped by it)
    not_serving: dict[str, str]  # URL -> why it is not serving, for reasons
    ended: str | None  # "at seq N (outcome: cause)" once the run has ended
    turns: dict[str, int] = field(default_factory=dict)  # URL -> entries + exits, so far


class MembershipFollower:
    """Folds one run's tail into :class:`Membership`. Blocking I/O; one caller at a time."""

    def __init__(self, log: EventLog, run: str) -> None:
        self.run = run
        self._view: FleetView = load_view(log, run)
        self._tail = Tail(log, run, self._view)
        self._skipped: set[tuple[int, str]] = set()
        self._shared: set[tuple[str, frozenset[int]]] = set()
        self._turns: dict[str, int] = {}
        self.membership = self._reduce()

    def poll(self) -> list[tuple[str, int]]:
        """Fold what was appended since the last poll; returns the URLs that left the
        serving set, each with the recorded time (µs) of the event that took it out."""
        left: list[tuple[str, int]] = []
        for recorded in self._tail.new():
            if self._view.apply(recorded) or self._view.ended is not None:
                before = self.membership.serving
                self.membership = self._reduce()
                after = self.membership.serving
                left += [(url, recorded.at_us) for url in before.keys() - after]
                self._turn(before, after)
        if self._view.seq != self.membership.seq:
            self.membership = self._reduce()
        return left

    def _turn(self, before: dict[str, int], after: dict[str, int]) -> None:
        """Count each URL's entries to and exits from the serving set (a URL that passes
        from one shard to another in one record does both)."""
        turned = False
        for url in before.keys() | after.keys():
            was, now = before.get(url), after.get(url)
            if was != now:
                steps = 1 if was is None or now is None else 2
                self._turns[url] = self._turns.get(url, 0) + steps
                turned = True
        if turned:
            self.membership = replace(self.membership, turns=dict(self._turns))

    def _reduce(self) -> Membership:
        view = self._view
        serving: dict[str, int] = {}
        holders: dict[str, list[ShardRecord]] = {}
        for record in view.shards:
            url = origin_of(record.base_url)
            if url is None:
                self._skip(record.index, record.base_url)
                continue
            holders.setdefault(url, []).append(record)
        shard_of: dict[str, int] = {}
        not_serving: dict[str, str] = {}
        for url, records in holders.items():
            if len(records) > 1:
                self._share(url, records)
            # The serving one first, then the latest to change: counts sent to the URL
            # now are that shard's requests.
            record = max(records, key=lambda r: (r.serving, r.since_seq, r.index))
            shard_of[url] = record.index
            if record.serving and view.ended is None:
                serving[url] = record.index
            else:
                why = "the run ended" if view.ended is not None else f"is {record.state.value}"
                not_serving[url] = f"shard {record.index} {why} (since seq {record.since_seq})"
        ended = None
        if view.ended is not None:
            ended = f"at seq {view.ended.seq} ({view.ended.outcome}: {view.ended.cause})"
        return Membership(view.seq, serving, shard_of, not_serving, ended, dict(self._turns))

    def _share(self, url: str, records: list[ShardRecord]) -> None:
        key = (url, frozenset(r.index for r in records))
        if key not in self._shared:
            self._shared.add(key)
            _log.warning(
                "several shards record one URL; its outcomes go to the one serving",
                run=self.run,
                worker=url,
                shards={r.index: r.state.value for r in records},
            )

    def _skip(self, shard: int, base_url: str) -> None:
        if (shard, base_url) not in self._skipped:
            self._skipped.add((shard, base_url))
            _log.warning(
                "shard skipped: its base URL is not HTTP(S), no router can reach it",
                run=self.run,
                shard=shard,
                base_url=base_url,
            )
