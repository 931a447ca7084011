"""The router's routing table, read from the ledger: who serves, at which URL, and whom to avoid.

Rules of this file, and why:

- **Membership is the ledger's, never pushed.** The router folds its run's tail (the
  serving set, each shard's recorded base URL — ``run_started``'s, replaced by
  ``replacement_loaded``'s new URL) and loads the view before it serves, so a
  restarted router knows the true membership at once. Story: the reference's
  restarted router believed every backend served until the next push corrected it.
- **A snapshot per poll.** :class:`RoutingTable` is immutable and rebuilt after each
  poll; the event loop only ever reads a finished snapshot, so a request never sees a
  half-folded view.
- **Only HTTP(S) base URLs are routable.** A simulated shard records ``ray://...``;
  such a shard is skipped with one log line, never dialled.
- **Selection is least outstanding** (:mod:`fleetledger.adapters.least_outstanding`,
  the rule the adapters' selector uses too) over the routable shards that are not
  avoided (:meth:`RoutingTable.candidates`).
- **Avoidance, precisely** (:class:`Avoidance`): a backend whose call timed out or
  failed to connect is avoided from the moment of the failure. Call ``s`` the last seq
  the router had folded then. The avoidance is lifted when the router folds an event
  with seq > ``s`` that *names* the shard (``Event.shards_named()``: a probe round, an
  outcome window — the router's own report of this very failure included — a state
  change, a refit), or when the shard's base URL changes (a new engine is a new
  backend). Whether the shard then gets traffic is the ledger's call: serving after
  that event means routable again. So the ledger, not a local timer, decides when a
  failed backend is tried again; a dead one costs at most ``unhealthy_threshold``
  failed requests, one per window, before the ledger records it DEAD. An event that
  was appended before the failure but not yet read counts as after it: that costs at
  most one more request.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import structlog

from fleetledger.projections.fleet_view import FleetView
from fleetledger.queries.tail import Tail
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog

__all__ = ["Avoidance", "Backend", "RoutingTable", "RoutingTableFollower", "origin_of"]

_log = structlog.get_logger("fleetledger.router")


def origin_of(base_url: str) -> str | None:
    """Where the router sends a shard's requests: its base URL with the ``/v1`` suffix
    stripped (the router re-adds the client's ``/v1`` path once), or ``None`` when the
    URL is not HTTP(S) and cannot be routed to."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return None
    path = parts.path.rstrip("/").removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


@dataclass(frozen=True, slots=True)
class Backend:
    """One shard as the router sees it."""

    shard: int
    base_url: str  # as the ledger records it
    origin: str | None  # None: not an HTTP(S) URL, never routed to
    serving: bool
    weight_version: int = 0  # the trainer's version at the shard's last completed refit
    state: str = "HEALTHY"  # the shard's state's name, said when it leaves

    @property
    def routable(self) -> bool:
        return self.serving and self.origin is not None


@dataclass(frozen=True, slots=True)
class RoutingTable:
    """The fleet at one seq of the run, as the router routes it (the ledger's membership
    reduced to what routing needs: each shard's URL, whether it serves)."""

    run: str
    seq: int
    backends: tuple[Backend, ...]  # every shard, in shard order
    named_at: tuple[int, ...]  # per shard: the last seq folded whose event named it
    counts: Mapping[str, int]
    ended: str | None = None  # "at seq N (outcome: cause)" once the run has ended

    def url_of(self, shard: int) -> str:
        return self.backends[shard].base_url

    def left(self, shard: int, base_url: str) -> str | None:
        """Why a request in flight on ``shard`` at ``base_url`` must end now — the ledger
        says the shard left the fleet (it no longer serves, or another engine holds its
        place) — or None while it serves."""
        backend = self.backends[shard]
        if backend.base_url != base_url:
            why = "another engine took its place"
        elif not backend.serving:
            why = f"it is {backend.state}"
        else:
            return None
        return f"shard {shard} left the fleet at seq {self.named_at[shard]} ({why})"

    def weight_version_of(self, shard: int, base_url: str) -> int | None:
        """The shard's weight version now, or ``None`` when its base URL is no longer
        ``base_url`` (another engine: nothing to say about the first one's weights)."""
        backend = self.backends[shard]
        return backend.weight_version if backend.base_url == base_url else None

    def candidates(self, avoided: Container[int]) -> Iterator[int]:
        """The shards a request may go to: routable and not ``avoided``; none once the
        run has ended."""
        if self.ended is not None:
            return
        for backend in self.backends:
            if backend.routable and backend.shard not in avoided:
                yield backend.shard


class Avoidance:
    """Backends avoided locally after a timeout or connection error (rule in the module
    docstring). Used from the event loop only."""

    def __init__(self) -> None:
        self._marks: dict[int, tuple[str, int]] = {}  # shard -> (its URL, seq at failure)

    def avoid(self, shard: int, base_url: str, seq: int) -> None:
        """Avoid ``shard`` at ``base_url``; ``seq``: the last seq folded when it failed."""
        self._marks[shard] = (base_url, seq)

    def lift(self, table: RoutingTable) -> list[int]:
        """Lift every avoidance that ``table`` has answered; returns those shards."""
        lifted = []
        for shard, (url, seq) in list(self._marks.items()):
            if table.url_of(shard) != url or table.named_at[shard] > seq:
                del self._marks[shard]
                lifted.append(shard)
        return lifted

    @property
    def avoided(self) -> frozenset[int]:
        return frozenset(self._marks)


class RoutingTableFollower:
    """Folds one run's tail into :class:`RoutingTable` snapshots. Blocking I/O: the router
    calls :meth:`poll` off its event loop. Not thread-safe; one caller at a time."""

    def __init__(self, log: EventLog, run: str) -> None:
        self.log = log
        self.run = run
        self._view: FleetView = load_view(log, run)
        self._tail = Tail(log, run, self._view)
        self._named_at = [self._view.seq] * len(self._view.shards)
        self._unroutable_logged: set[tuple[int, str]] = set()
        self.table = self._snapshot()

    def poll(self) -> RoutingTable:
        """Fold whatever was appended since the last poll; returns the new snapshot."""
        view = self._view
        for recorded in self._tail.new():
            view.apply(recorded)
            for shard in recorded.event.shards_named():
                if 0 <= shard < len(self._named_at):
                    self._named_at[shard] = recorded.seq
        if view.seq != self.table.seq:
            self.table = self._snapshot()
        return self.table

    def _snapshot(self) -> RoutingTable:
        view = self._view
        backends = []
        for record in view.shards:
            origin = origin_of(record.base_url)
            if origin is None and (record.index, record.base_url) not in self._unroutable_logged:
                self._unroutable_logged.add((record.index, record.base_url))
                _log.warning(
                    "shard skipped: its base URL is not HTTP(S)",
                    run=self.run,
                    shard=record.index,
                    base_url=record.base_url,
                )
            backends.append(
                Backend(
                    record.index,
                    record.base_url,
                    origin,
                    record.serving,
                    record.weight_version,
                    record.state.name,
                )
            )
        ended = None
        if view.ended is not None:
            ended = f"at seq {view.ended.seq} ({view.ended.outcome}: {view.ended.cause})"
        return RoutingTable(
            run=self.run,
            seq=view.seq,
            backends=tuple(backends),
            named_at=tuple(self._named_at),
            counts=view.counts(),
            ended=ended,
        )
