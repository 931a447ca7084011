"""The ledger's invariants, driven by hypothesis over every input kind on a real database.

Each example is a new run in one shared SQLite ledger (creating a database per example
would spend the budget on migrations). A second ``EventLog`` on the same file plays
"another process" appending to the run, so the live view must fold events it did not
write itself. After every step the live view is compared with a fresh fold of the log
and with the newest snapshot plus the tail.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import (
    FailureCount,
    FleetConfig,
    ShardOutcomes,
)
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.shard_states import ABSENT, SERVING, Input, ShardState, Transition
from fleetledger.queries import load_view
from fleetledger.store.errors import AppendRejected
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok
from tests.legacy_rows import insert_old_rows, probe_failed_v1, probe_ok_v1

MAX_SHARDS = 5
RECOVERY_ONLY_BY_REFIT = {ShardState.DEAD, ShardState.RESTARTING, ShardState.STALE}
_runs = itertools.count()

shard_index = st.integers(0, MAX_SHARDS - 1)
probe_result = st.sampled_from(
    [
        ProbeResult.ok(),
        ProbeResult.ok(),
        ProbeResult("timeout", "no answer in 2 s"),
        ProbeResult("error", "HTTP 503"),
        ProbeResult("died", "ActorDiedError"),
    ]
)
outcome = st.tuples(
    shard_index, st.integers(0, 5), st.integers(0, 3), st.integers(0, 2)
)  # shard, successes, infra failures, data failures


def _ledger_file() -> Path:
    # Durability is pinned by the log tests; here fsync would only slow 2,000 examples.
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")
    return base / f"fleetledger-stateful-{next(_runs)}-{id(object())}.db"


class LedgerMachine(RuleBasedStateMachine):
    url: str  # set per backend by the subclass

    def __init__(self) -> None:
        super().__init__()
        self.log = EventLog.open(self.url)
        self.other = EventLog.open(self.url)  # another writer on the same run
        self.weight_version = 0
        self.step_transitions: list[Transition] = []
        self.checker: FleetView | None = None

    @initialize(
        shards=st.integers(1, MAX_SHARDS),
        unhealthy=st.integers(1, 4),
        healthy=st.integers(1, 3),
        restarts=st.integers(0, 3),
        width=st.integers(1, 3),
        trainers=st.integers(1, 4),
        data=st.data(),
    )
    def start(self, shards, unhealthy, healthy, restarts, width, trainers, data) -> None:
        self.shards = shards
        config = FleetConfig(
            shard_count=shards,
            workers_per_shard=width,
            train_world_size=trainers,
            unhealthy_threshold=unhealthy,
            healthy_threshold=healthy,
            max_restart_attempts_per_shard=restarts,
            min_healthy_shards=data.draw(st.integers(1, shards), label="min_healthy"),
            base_urls=tuple(f"http://shard-{i}:8000/v1" for i in range(shards)),
        )
        self.run = f"stateful-{next(_runs)}"
        self.ledger = Ledger.start(self.log, self.run, config, snapshot_every=7)
        self.prev_states = [r.state for r in self.ledger.view.shards]

    def teardown(self) -> None:
        self.log.close()
        self.other.close()

    def _shard(self, index: int) -> int:
        return index % self.shards

    def _do(self, transitions: list[Transition]) -> None:
        self.step_transitions = transitions

    def _open(self) -> bool:
        return getattr(self, "ledger", None) is not None and self.ledger.view.ended is None

    # ── every input kind ────────────────────────────────────────────────────

    @precondition(_open)
    @rule(results=st.dictionaries(shard_index, probe_result, min_size=1))
    def probe_round(self, results) -> None:
        self._do(self.ledger.record_probes({self._shard(s): r for s, r in results.items()}))

    @precondition(_open)
    @rule(window=st.lists(outcome, min_size=1, max_size=MAX_SHARDS))
    def outcome_window(self, window) -> None:
        by_shard = {}
        for shard, ok, infra, data in window:
            failures = []
            if infra:
                failures.append(FailureCount(category="infra", reason="ReadTimeout", count=infra))
            if data:
                failures.append(FailureCount(category="data", reason="HTTP 400", count=data))
            by_shard[self._shard(shard)] = ShardOutcomes(
                shard=self._shard(shard), successes=ok, failures=tuple(failures)
            )
        self._do(self.ledger.report_outcomes("router", by_shard.values()))

    @precondition(_open)
    @rule(ending=st.sampled_from(["completed", "aborted", "aborted+partial"]))
    def refit(self, ending) -> None:
        self.weight_version += 1
        v = self.weight_version
        out = self.ledger.refit_started(v)
        if ending == "completed":
            out += self.ledger.refit_completed(v)
        else:
            out += self.ledger.refit_aborted(v, "broadcast timed out")
            if ending == "aborted+partial":
                out += self.ledger.mark_weights_partial(v)
        self._do(out)

    @precondition(_open)
    @rule(shards=st.lists(shard_index, unique=True, max_size=MAX_SHARDS))
    def refit_completed_for(self, shards) -> None:
        """A completion naming arbitrary shards, absent ones included."""
        self.weight_version += 1
        named = sorted({self._shard(s) for s in shards})
        self._do(self.ledger.refit_completed(self.weight_version, named))

    @precondition(_open)
    @rule()
    def weights_partial(self) -> None:
        self._do(self.ledger.mark_weights_partial(self.weight_version))

    @precondition(_open)
    @rule(shard=shard_index, step=st.sampled_from(["request", "fail", "load", "load-new-url"]))
    def restart(self, shard, step) -> None:
        s = self._shard(shard)
        if step == "request":
            self._do(self.ledger.restart_requested(s))
        elif step == "fail":
            self._do(self.ledger.restart_failed(s, "placement group timed out"))
        else:
            url = f"http://shard-{s}-new:8000/v1" if step == "load-new-url" else None
            self._do(self.ledger.replacement_loaded(s, url))

    @precondition(_open)
    @rule(shard=shard_index)
    def condemn(self, shard) -> None:
        self._do(self.ledger.condemn_silent_participant(self._shard(shard), "lone suspect"))

    @precondition(_open)
    @rule(shard=shard_index)
    def retire(self, shard) -> None:
        self._do(self.ledger.retire(self._shard(shard), "node drained"))

    @precondition(_open)
    @rule(action=st.sampled_from(["warn", "abort"]))
    def stall(self, action) -> None:
        self._do(
            self.ledger.stall_detected(
                committed_groups=3, train_steps=1, idle_s=601.0, in_flight=0, action=action
            )
        )

    @precondition(_open)
    @rule(suspects=st.lists(shard_index, unique=True, max_size=3), groups=st.integers(0, 50))
    def watchdog_and_refusal(self, suspects, groups) -> None:
        out = self.ledger.report_progress(committed_groups=groups, train_steps=1, in_flight=2)
        named = sorted({self._shard(s) for s in suspects})
        out += self.ledger.refuse_condemnation(named, f"{len(named)} suspects")
        self._do(out)

    @precondition(lambda self: self._open() and self.ledger.view.exhaustion() is not None)
    @rule()
    def exhausted(self) -> None:
        self._do(self.ledger.declare_exhausted())

    @precondition(_open)
    @rule(shard=shard_index, ok=st.booleans())
    def another_process_appends(self, shard, ok) -> None:
        s = self._shard(shard)
        self.other.append(self.run, [probe_ok(s) if ok else probe_failed(s, "error", "x")])
        self._do(self.ledger.catch_up())

    @precondition(_open)
    @rule(shard=shard_index, ok=st.booleans())
    def an_older_fleetledger_appends(self, shard, ok) -> None:
        """A process still on the per-shard probe record (mid-upgrade) stores a v1 row;
        the ledger folds it in as the one-shard round it is read as."""
        s = self._shard(shard)
        row = probe_ok_v1(s) if ok else probe_failed_v1(s, "error", "x")
        insert_old_rows(self.other.database.engine, self.run, [row])
        self._do(self.ledger.catch_up())

    @precondition(_open)
    @rule()
    def snapshot(self) -> None:
        self.ledger.save_snapshot()
        self._do([])

    @precondition(_open)
    @rule()
    def retried_append_is_not_duplicated(self) -> None:
        event = probe_ok(0)
        first = self.log.append(self.run, [event])
        again = self.log.append(self.run, [event])
        assert first == again
        self._do(self.ledger.catch_up())

    @precondition(_open)
    @rule()
    def end(self) -> None:
        self._do(self.ledger.end_run("completed", "max steps reached"))

    @precondition(lambda self: not self._open())
    @rule(shard=shard_index)
    def an_ended_run_refuses_appends(self, shard) -> None:
        head = self.log.head(self.run)
        with pytest.raises(AppendRejected, match="ended at seq"):
            self.ledger.record_probes({self._shard(shard): ProbeResult.ok()})
        assert self.log.head(self.run) == head
        self._do([])

    # ── invariants ──────────────────────────────────────────────────────────

    @invariant()
    def serving_and_absent_are_disjoint(self) -> None:
        if getattr(self, "ledger", None) is None:
            return
        view = self.ledger.view
        assert not set(view.serving) & set(view.absent)
        assert set(view.absent) == {r.index for r in view.shards if r.state in ABSENT}

    @invariant()
    def transitions_obey_the_lifecycle(self) -> None:
        if getattr(self, "ledger", None) is None:
            return
        for t in self.step_transitions:
            assert t.before is not t.after
            assert t.before is not ShardState.RETIRED, f"RETIRED shard {t.shard} moved: {t}"
            if t.after is ShardState.HEALTHY and t.before in RECOVERY_ONLY_BY_REFIT:
                assert t.input is Input.REFIT_COMPLETED, f"{t.before} → HEALTHY without a refit"
        states = [r.state for r in self.ledger.view.shards]
        for index, (before, after) in enumerate(zip(self.prev_states, states, strict=True)):
            if before is ShardState.RETIRED:
                assert after is ShardState.RETIRED, f"shard {index} left RETIRED"
        self.prev_states = states
        self.step_transitions = []

    @invariant()
    def epoch_moves_exactly_when_serving_changes(self) -> None:
        """Checked event by event, on a second fold kept in step with the log."""
        if getattr(self, "ledger", None) is None:
            return
        if self.checker is None:
            self.checker = fold(self.log.read(self.run, 0, 1))
        for recorded in self.log.read(self.run, self.checker.seq):
            serving_before = frozenset(self.checker.serving)
            epoch_before = self.checker.epoch
            moved = self.checker.apply(recorded)
            changed = frozenset(self.checker.serving) != serving_before
            expected = 1 if changed else 0
            if recorded.event.type == "probe_round":
                # Once per result that changed the serving set, as when each result was
                # its own event.
                expected = sum(1 for t in moved if (t.before in SERVING) != (t.after in SERVING))
            assert self.checker.epoch == epoch_before + expected, (
                f"seq {recorded.seq} ({recorded.event.type}): serving changed={changed}, "
                f"epoch {epoch_before} → {self.checker.epoch}"
            )
        assert self.checker == self.ledger.view

    @invariant()
    def layout_is_contiguous_with_trainers_first(self) -> None:
        if getattr(self, "ledger", None) is None:
            return
        view = self.ledger.view
        survivors = [r.index for r in view.shards if not r.absent]
        if not survivors:
            return
        layout = view.layout()
        c = view.config
        assert layout.survivors == tuple(survivors)
        assert layout.world_size == c.train_world_size + len(survivors) * c.workers_per_shard
        ranks = list(range(c.train_world_size))
        for shard in survivors:
            ranks += list(layout.shard_ranks(shard))
        assert ranks == list(range(layout.world_size))

    @invariant()
    def live_view_equals_fold_and_snapshot_plus_tail(self) -> None:
        if getattr(self, "ledger", None) is None:
            return
        live = self.ledger.view
        assert live == fold(self.log.read(self.run))
        assert live == load_view(self.log, self.run)  # newest snapshot + the tail


def _machine_for(url: str, examples: int) -> type[LedgerMachine]:
    machine = type("Machine", (LedgerMachine,), {"url": url})
    machine.TestCase.settings = settings(
        max_examples=examples,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    return machine


@pytest.mark.slow
def test_ledger_invariants_hold_on_sqlite() -> None:
    path = _ledger_file()
    try:
        _machine_for(f"sqlite:///{path}", 2000).TestCase().runTest()
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


@pytest.mark.postgres
def test_ledger_invariants_hold_on_postgresql(migrated_postgres_url) -> None:
    _machine_for(migrated_postgres_url, 60).TestCase().runTest()
