"""The adapters' way in: windows classified by the taxonomy, appended from any process."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.adapters.failure_taxonomy import FailureKind
from fleetledger.adapters.outcome_reporter import OutcomeReporter, OutcomeWindow
from fleetledger.controller.ledger import Ledger
from fleetledger.events.models import (
    FailureCount,
    OutcomeWindowReported,
    ShardOutcomes,
    VersionCount,
)
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.errors import AppendRejected
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


def test_window_classifies_exceptions_and_statuses():
    window = OutcomeWindow()
    window.success(0, 5)
    assert window.failure(0, TimeoutError("engine timed out")).kind is FailureKind.INFRA
    assert window.failure(0, status=503).kind is FailureKind.INFRA
    assert window.failure(1, status=400, detail="maximum context length").kind is FailureKind.DATA
    assert window.failure(1, KeyError("x")).kind is FailureKind.DATA
    outcomes = window.take()
    assert [o.shard for o in outcomes] == [0, 1]
    assert outcomes[0].successes == 5
    assert {(f.category, f.reason, f.count) for f in outcomes[0].failures} == {
        ("infra", "timeout", 1),
        ("infra", "http_503", 1),
    }
    assert {(f.category, f.reason) for f in outcomes[1].failures} == {
        ("data", "context_length"),
        ("data", "key_error"),
    }
    assert not window and window.take() == ()


def test_cancellation_is_not_the_shards_fault():
    window = OutcomeWindow()
    verdict = window.failure(0, asyncio.CancelledError())
    assert verdict.kind is FailureKind.CANCELLED
    assert window.take() == ()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.success(-1), "non-negative int"),
        (lambda w: w.success(True), "non-negative int"),
        (lambda w: w.success(0, 0), "success count must be >= 1"),
        (lambda w: w.failure(0), "exactly one of error= or status="),
        (lambda w: w.failure(0, ValueError("x"), status=500), "exactly one of error= or status="),
        (lambda w: w.failure(0, status=99), "not an HTTP status"),
        (lambda w: w.success(0, version=-1), "shard 0: a weight version must be >= 0"),
    ],
)
def test_bad_outcomes_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call(OutcomeWindow())


def _started(url: str, run: str, shards: int = 3) -> Ledger:
    log = EventLog.open(url)
    return Ledger.start(log, run, fleet_config(shards))


def test_reporter_appends_one_window_and_the_ledger_folds_it(ledger_url):
    ledger = _started(ledger_url, "r1")
    with OutcomeReporter(ledger_url, "r1", "router-0", window_s=3600) as reporter:
        reporter.success(0, 3)
        for _ in range(3):
            reporter.failure(1, ConnectionResetError("reset"))
        seq = reporter.flush()
        assert reporter.flush() is None  # nothing new: no empty event
    assert seq == 2
    ledger.catch_up()
    assert ledger.view.state_of(1) is ShardState.DEAD
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    stored = list(ledger.log.read("r1", 1, 2))
    assert isinstance(stored[-1].event, OutcomeWindowReported)
    assert stored[-1].event.adapter == "router-0"
    ledger.log.close()


def test_reporter_hands_over_a_window_once_it_is_old_enough(sqlite_url):
    ledger = _started(sqlite_url, "r1")
    now = [0.0]
    reporter = OutcomeReporter(sqlite_url, "r1", "a", window_s=1.0, clock=lambda: now[0])
    reporter.success(0)
    reporter.success(0)
    assert ledger.log.head("r1") == 1
    now[0] = 1.5
    reporter.success(2)  # the window is due: all three successes go in one event
    assert ledger.log.head("r1") == 2
    (recorded,) = ledger.log.read("r1", 1, 2)
    assert [(o.shard, o.successes) for o in recorded.event.outcomes] == [(0, 2), (2, 1)]
    reporter.close()
    ledger.log.close()


def test_a_refused_window_is_dropped_with_the_error_and_later_windows_go_through(sqlite_url):
    ledger = _started(sqlite_url, "r1", shards=2)
    reporter = OutcomeReporter(sqlite_url, "r1", "a", window_s=3600)
    reporter.success(0, 2)
    reporter.failure(5, TimeoutError("t"))  # shard 5 does not exist in this run
    with pytest.raises(AppendRejected, match="shard 5 is out of range"):
        reporter.flush()
    assert ledger.log.head("r1") == 1  # nothing of the refused window was written
    reporter.success(1)
    assert reporter.flush() == 2  # not blocked by the refused one
    (recorded,) = ledger.log.read("r1", 1)
    assert [(o.shard, o.successes) for o in recorded.event.outcomes] == [(1, 1)]
    reporter.close()
    ledger.log.close()


def test_reporting_after_the_run_ended_is_refused_by_name(sqlite_url):
    ledger = _started(sqlite_url, "r1")
    ledger.end_run("completed", "done")
    with OutcomeReporter(sqlite_url, "r1", "a", window_s=3600) as reporter:
        reporter.success(0)
        with pytest.raises(AppendRejected, match="the run ended at seq 2"):
            reporter.flush()
        assert reporter.flush() is None  # dropped, said once
    ledger.log.close()


def _report_from_child(reporter: OutcomeReporter, shard: int) -> None:
    for _ in range(3):
        reporter.failure(shard, TimeoutError("generation timed out"))
    reporter.success(0)
    reporter.close()


def test_reporter_works_from_another_process(ledger_url):
    """Picklable: only the URL, run and name travel; the child opens its own connection."""
    ledger = _started(ledger_url, "r1")
    reporter = OutcomeReporter(ledger_url, "r1", "adapter-in-child", window_s=3600)
    assert set(pickle.loads(pickle.dumps(reporter)).__dict__) >= {"db_url", "run", "adapter"}
    child = multiprocessing.get_context("spawn").Process(
        target=_report_from_child, args=(reporter, 2)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    ledger.catch_up()
    assert ledger.view.state_of(2) is ShardState.DEAD
    assert "3 consecutive reported failures" in ledger.view.shards[2].since_rule
    ledger.log.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 5)),  # (failures, successes) per window
        min_size=1,
        max_size=30,
    )
)
def test_blips_inside_successful_windows_never_condemn(windows):
    """Successes of a window are applied first, so a window with successes can leave at
    most its own failures on the streak: below the threshold, never DEAD."""
    from fleetledger.events.models import RecordedEvent
    from fleetledger.projections.fleet_view import fold
    from tests.builders import run_started

    events = [RecordedEvent("r", 1, 0, run_started(1))]
    for seq, (failures, successes) in enumerate(windows, start=2):
        window = OutcomeWindow()
        window.success(0, successes)
        for _ in range(min(failures, 2)):  # unhealthy_threshold 3: at most 2 per window
            window.failure(0, TimeoutError("blip"))
        events.append(
            RecordedEvent("r", seq, 0, OutcomeWindowReported(adapter="a", outcomes=window.take()))
        )
    view = fold(events)
    assert view.state_of(0) in (ShardState.HEALTHY, ShardState.SUSPECT)


def test_a_window_keeps_what_the_first_failure_of_each_reason_said(sqlite_url):
    """A category alone (``timeout``) is not what a post-mortem needs: the window keeps
    the first failure's own words per reason — the exception's type and message, or the
    status and its body's first line — and the rule of a reported streak quotes it."""
    window = OutcomeWindow()
    window.failure(0, TimeoutError("no reply"))
    window.failure(0, TimeoutError("no reply again"))  # counted; the first one speaks
    window.failure(0, status=503, detail="engine overloaded\n<html>…")
    window.failure(1, ConnectionResetError())  # no message: the type says it
    window.failure(1, status=502)  # no body: the status says it
    outcomes = window.take()
    said = {(o.shard, f.reason): (f.count, f.example) for o in outcomes for f in o.failures}
    assert said[(0, "timeout")] == (2, "TimeoutError: no reply")
    assert said[(0, "http_503")] == (1, "HTTP 503: engine overloaded")
    assert said[(1, "connection")] == (1, "ConnectionResetError")
    assert said[(1, "http_502")] == (1, "HTTP 502")
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "r", fleet_config(2, unhealthy_threshold=1))
        ledger.report_outcomes("router", outcomes)
        assert ledger.view.state_of(0) is ShardState.DEAD
        rule = ledger.view.shards[0].since_rule
        assert "timeout ×2 (TimeoutError: no reply)" in rule, rule
        assert "http_503 ×1 (HTTP 503: engine overloaded)" in rule, rule


def test_a_window_without_examples_is_stored_as_before():
    """Left out when empty: a window of the old meaning is the bytes an older
    fleetledger wrote (and reads)."""
    old = OutcomeWindowReported(
        adapter="a",
        outcomes=(
            ShardOutcomes(shard=0, failures=(FailureCount(category="infra", reason="timeout"),)),
        ),
    )
    assert "example" not in old.model_dump_json()
    long = FailureCount(category="infra", reason="timeout", example="x" * 200)
    assert long.example == "x" * 200
    with pytest.raises(ValueError):
        FailureCount(category="infra", reason="timeout", example="x" * 201)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 2), st.integers(1, 3), st.none() | st.integers(0, 4), st.booleans()
        ),
        max_size=30,
    )
)
def test_a_window_counts_successes_by_the_version_the_engine_attested(successes):
    window = OutcomeWindow()
    for shard, count, version, partial in successes:
        window.success(shard, count, version=version, partial=partial)
    for outcome in window.take():
        mine = [s for s in successes if s[0] == outcome.shard]
        assert outcome.successes == sum(c for _, c, _, _ in mine)
        by_version = {v.version: v.count for v in outcome.versions}
        for version in {v for _, _, v, _ in mine if v is not None}:
            assert by_version[version] == sum(c for _, c, v, _ in mine if v == version)
        assert outcome.unattested == sum(c for _, c, v, _ in mine if v is None)
        assert outcome.partial == sum(c for _, c, _, p in mine if p)


def test_a_window_without_versions_is_stored_as_before_and_bad_counts_are_refused():
    assert "versions" not in ShardOutcomes(shard=0, successes=2).model_dump_json()
    assert "partial" not in ShardOutcomes(shard=0, successes=2).model_dump_json()
    with pytest.raises(ValueError, match="shard 1: 3 successes by version and 0 on partial"):
        ShardOutcomes(shard=1, successes=2, versions=(VersionCount(version=4, count=3),))
    with pytest.raises(ValueError, match="shard 1: versions name a version more than once"):
        ShardOutcomes(
            shard=1,
            successes=2,
            versions=(VersionCount(version=4, count=1), VersionCount(version=4, count=1)),
        )
