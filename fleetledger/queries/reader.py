"""One run, as a read command sees it: the head and configuration looked up once.

Every read command used to look the run's head up again at each layer it passed
through (the time bisection, the configuration, the range check, the snapshot, each
read). A reader takes one consistent head at the start; every later read names its
upper bound, so the log never has to look again — and a live run growing meanwhile
does not move the answer mid-command.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from fleetledger.events.models import FleetConfig, shard_outside
from fleetledger.projections.fleet_view import FleetView
from fleetledger.projections.history import Entry
from fleetledger.queries.history import PageCallback, read_history
from fleetledger.queries.points import PointError, parse_time, seq_of_point
from fleetledger.queries.views import load_view
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunHead

if TYPE_CHECKING:
    from fleetledger.projections.explain import RunExplanation, ShardExplanation


class RunReader:
    """Reads one run of one log as of the head it found when it was opened."""

    def __init__(self, log: EventLog, run: str) -> None:
        self.log = log
        self.run = run
        self.head: RunHead = log.run_head(run)  # an unknown run fails here, naming the runs

    @property
    def config(self) -> FleetConfig:
        return self.head.config

    def seq_of(self, point: str | None, option: str) -> int | None:
        """A ``SEQ|TIME`` option as a seq (None stays None: "at the head")."""
        return None if point is None else seq_of_point(self.log, self.head, point, option)

    def seq_until(self, time_text: str, option: str) -> int:
        """A ``TIME``-only option as the last seq at or before it."""
        return self.log.seq_at(self.run, parse_time(time_text, option), head=self.head)

    def view(self, at_seq: int | None = None) -> FleetView:
        return load_view(self.log, self.run, at_seq, head=self.head)

    def history(
        self,
        *,
        from_seq: int = 1,
        to_seq: int | None = None,
        on_page: PageCallback | None = None,
    ) -> Iterator[Entry]:
        return read_history(
            self.log, self.run, from_seq=from_seq, to_seq=to_seq, on_page=on_page, head=self.head
        )

    def explain(
        self, shard: int | None = None, at_seq: int | None = None
    ) -> ShardExplanation | RunExplanation:
        from fleetledger.queries.evidence import explain_from_log  # only explain needs it

        return explain_from_log(self.log, self.run, shard, at_seq, head=self.head)

    def check_shard(self, shard: int, option: str) -> None:
        """``shard`` is one of this run's shards, or a one-line error naming the range."""
        problem = shard_outside(shard, self.config.shard_count)
        if problem is not None:
            raise PointError(f"{option} {shard}: run {self.run!r}: {problem}")
