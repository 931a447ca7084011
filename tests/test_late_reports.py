"""Reports that arrive after their run ended are counted and said once, at info; a failed
attempt and its fate land in one window.

After the controller ended a run, each rollout still in flight logged "rollout failure
not recorded … nothing may be appended" at error level. A report that meets the run's
end is late, not failed: the late ones are counted per kind and the first of each kind is
logged at info; any other refusal is still an error. On a real SQLite ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
from collections.abc import Iterator

import pytest

from fleetledger.adapters.retry_policy import Attempt, RetryPolicy, RolloutCounters, run_rollout
from fleetledger.config import FleetHealthConfig
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.probe_pump import ProbePump
from fleetledger.controller.ray_fleet import GenerationReports
from fleetledger.logs import configure_logging
from fleetledger.store.errors import AppendRejected, RunAlreadyEnded
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    yield stream
    configure_logging("warning")


def _logged(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


@pytest.fixture
def ended(sqlite_url: str) -> Iterator[Ledger]:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, "r", fleet_config(2))
        ledger.end_run_if_open("completed", "3 of 3 steps done")
        yield ledger


def test_an_append_after_the_end_is_refused_as_run_already_ended(ended: Ledger) -> None:
    with pytest.raises(RunAlreadyEnded, match="the run ended at seq 2") as refused:
        ended.restart_requested(0)
    assert isinstance(refused.value, AppendRejected)  # what callers caught before
    assert refused.value.ended_seq == 2


def test_late_rollout_failures_are_counted_and_logged_once_at_info(ended, lines) -> None:
    reports = GenerationReports(ended, "rollouts")
    for _ in range(16):  # the rollouts in flight when the controller ended the run
        reports.failure(1, TimeoutError("generation timed out"))
    logged = _logged(lines)
    assert [e for e in logged if e["level"] in ("error", "warning")] == []
    (said,) = [e for e in logged if e.get("report") == "rollout failure"]
    assert said["level"] == "info" and said["ended_at_seq"] == 2
    assert ended.late_reports.counts() == {"rollout failure": 16}
    assert ended.view.seq == 2  # nothing was appended


def test_a_probe_round_that_meets_the_end_is_counted_and_the_pump_stops(sqlite_url, lines) -> None:
    """The run is ended by another writer while the pump's round is probing: the round's
    append is refused, counted as late, and the pump stops at the end it then folds."""
    with EventLog.open(sqlite_url) as log, EventLog.open(sqlite_url) as other_log:
        ledger = Ledger.start(log, "r", fleet_config(2))

        class EndsTheRunWhileProbing:
            def probe(self, shards, timeout_s, *, deep=False):
                Ledger.resume(other_log, "r").end_run_if_open("completed", "done")
                return {s: ProbeResult.ok() for s in shards}

        config = FleetHealthConfig(enabled=True, probe_interval_s=0.05, probe_timeout_s=0.01)
        ProbePump(ledger, EndsTheRunWhileProbing(), config).run(threading.Event())
        assert ledger.membership.ended
    assert ledger.late_reports.counts() == {"probe round": 1}
    assert [e for e in _logged(lines) if e["level"] in ("error", "warning")] == []


def test_another_refusal_is_still_an_error(lines, sqlite_url) -> None:
    with EventLog.open(sqlite_url) as log:
        open_run = Ledger.start(log, "open", fleet_config(2))
        reports = GenerationReports(open_run, "rollouts")
        reports.window.failure(7, TimeoutError("shard 7 of a 2-shard fleet"))
        reports.failure(1, TimeoutError("generation timed out"))
    errors = [e for e in _logged(lines) if e["level"] == "error"]
    assert [e["event"] for e in errors] == ["rollout failure not recorded"]
    assert open_run.late_reports.counts() == {}


# ── a failure and its fate: one window, handed over before the retry re-selects ──


def _windows(ledger: Ledger) -> list:
    return [
        r.event for r in ledger.log.read(ledger.run, 0) if r.event.type == "outcome_window_reported"
    ]


@pytest.fixture
def open_ledger(sqlite_url: str) -> Iterator[Ledger]:
    with EventLog.open(sqlite_url) as log:
        yield Ledger.start(log, "r", fleet_config(3))


def test_a_failed_attempt_and_its_fate_are_one_window_recorded_before_the_retry(
    open_ledger: Ledger,
) -> None:
    """Two windows (the failure, then its fate) left a fault's cost unable to say what
    became of the failure; the failure must still be in the ledger when the retry picks."""
    reports = GenerationReports(open_ledger, "rollouts")
    picks = iter((1, 2))
    seen_at_retry: list[list] = []

    def select() -> contextlib.AbstractContextManager[int]:
        shard = next(picks)
        if shard == 2:
            seen_at_retry.append(_windows(open_ledger))
        return contextlib.nullcontext(shard)

    async def generate(attempt: Attempt[int]) -> str:
        if attempt.shard == 1:
            reports.failure(1, TimeoutError("generation timed out"))
            raise TimeoutError("generation timed out")
        return "ok"

    async def no_wait(_s: float) -> None:
        await asyncio.sleep(0)

    result = asyncio.run(
        run_rollout(
            generate,
            select_shard=select,
            policy=RetryPolicy(),
            counters=RolloutCounters(),
            sleep=no_wait,
            on_fate=reports.fate,
        )
    )
    assert result == "ok"
    (window,) = seen_at_retry[0]
    (outcome,) = window.outcomes
    assert (outcome.shard, outcome.infra_failures) == (1, 1)
    assert outcome.fates is not None and outcome.fates.redispatched == 1


def test_a_failure_nobody_tells_the_fate_of_is_handed_over_on_the_loops_next_turn(
    open_ledger: Ledger,
) -> None:
    reports = GenerationReports(open_ledger, "rollouts")

    async def fail_then_yield() -> tuple[int, int]:
        reports.failure(0, TimeoutError("generation timed out"))
        before = len(_windows(open_ledger))
        await asyncio.sleep(0)
        return before, len(_windows(open_ledger))

    assert asyncio.run(fail_then_yield()) == (0, 1)
    (window,) = _windows(open_ledger)
    assert window.outcomes[0].fates is None  # nobody said: a fault's cost says unknown
    reports.failure(2, TimeoutError("generation timed out"))  # outside an event loop: at once
    assert len(_windows(open_ledger)) == 2
