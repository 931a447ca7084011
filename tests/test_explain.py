"""``projections.explain``: the words for one shard or one run, from folded events.

Most tests build runs in memory (``projection_builders.Fleet``: no database, no clock)
and call the pure functions the way the CLI does: fold, replay, read what
``evidence_needed`` asks for, explain. The last few drive ``fleetledger explain`` on a
real SQLite ledger written with snapshots, and check that ``--at`` answers equal the
pure explanation of the events truncated at that seq.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import fields

import pytest

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import (
    CondemnationRefused,
    FailureCount,
    ProgressReported,
    RecordedEvent,
    ShardOutcomes,
    iso_at,
)
from fleetledger.projections.explain import (
    TEXT_LIMIT,
    ProbeTallies,
    RunExplanation,
    ShardExplanation,
    check_shard,
    evidence_needed,
    explain_run,
    explain_shard,
    tally_span,
)
from fleetledger.projections.fault_cost import fault_costs
from fleetledger.projections.fleet_view import ProjectionError, fold
from fleetledger.projections.history import replay
from fleetledger.projections.shard_states import Input, ShardState
from fleetledger.projections.snapshot import PROJECTION_VERSION
from fleetledger.store.log import EventLog
from tests.builders import fleet_config as ledger_fleet_config
from tests.cli_support import run_cli
from tests.projection_builders import T0_US, Fleet, at_us_of, outcome, put_in

pytestmark = pytest.mark.usefixtures("cli_sandbox")


def explain_records(
    records: Sequence[RecordedEvent], shard: int | None = None
) -> ShardExplanation | RunExplanation:
    """What the CLI does, without a database: fold, replay, hand over the evidence."""
    view = fold(records)
    entries = list(replay(records))
    wanted = evidence_needed(view, entries, shard)
    evidence = {r.seq: r for r in records if r.seq in wanted.to_read}
    if shard is None:
        return explain_run(view, entries, evidence, fault_costs(records))
    tally = None if wanted.span is None else tally_span(records, shard, *wanted.span)
    return explain_shard(view, entries, shard, evidence, tally)


def shard_of(fleet: Fleet, shard: int, at: int | None = None) -> ShardExplanation:
    records = fleet.records if at is None else fleet.records[:at]
    explanation = explain_records(records, shard)
    assert isinstance(explanation, ShardExplanation)
    return explanation


def run_of(fleet: Fleet, at: int | None = None) -> RunExplanation:
    records = fleet.records if at is None else fleet.records[:at]
    explanation = explain_records(records)
    assert isinstance(explanation, RunExplanation)
    return explanation


# ── a shard ────────────────────────────────────────────────────────────────────


def test_a_shard_that_never_changed_state_says_so() -> None:
    fleet = Fleet()
    for _ in range(3):
        fleet.probe_ok(0)
    e = shard_of(fleet, 0)
    assert (e.state, e.since_seq, e.since_at_us, e.input) == (ShardState.HEALTHY, 1, T0_US, None)
    assert e.chain == () and e.evidence == ()
    assert e.because == (
        "it has been HEALTHY since the run started; no rule has moved it",
        "it has never been condemned (no transition to DEAD or RETIRED)",
    )
    assert e.summary.startswith("shard 0 is HEALTHY since seq 1: it has been HEALTHY since")
    assert "how it got here: no transition recorded" in e.text
    assert "rule: run started — at seq 1" in e.text
    assert e.serving and not e.absent and not e.suspected


def test_a_retired_shard_is_terminal_and_a_later_restart_request_changes_nothing() -> None:
    fleet = Fleet()
    fleet.actor_died(1)
    fleet.retired(1, "operator: host has a bad NIC")
    retired = fleet.last_seq
    fleet.restart_requested(1)  # ignored: RETIRED is terminal
    e = shard_of(fleet, 1)
    assert (e.state, e.since_seq, e.input) == (ShardState.RETIRED, retired, Input.RETIRE)
    assert e.because == (
        f"retired at seq {retired}: operator: host has a bad NIC",
        "RETIRED is terminal: nothing moves it again",
    )
    assert [(t.before, t.after) for t in e.chain] == [
        (ShardState.HEALTHY, ShardState.DEAD),
        (ShardState.DEAD, ShardState.RETIRED),
    ]
    assert e.restart_attempts == 0
    assert (
        f"restarts: 0 of max_restart_attempts_per_shard 5 used (requested at seq {retired + 1})"
        in e.text
    )
    assert [d.decision for d in e.decisions] == ["retired"]
    assert "absent (no traffic, no rank in the next refit)" in e.text


def test_a_stale_shard_waits_for_a_refit_that_includes_it() -> None:
    fleet = Fleet()
    put_in(fleet, 2, ShardState.STALE)
    loaded = fleet.last_seq
    waiting = shard_of(fleet, 2)
    assert (waiting.state, waiting.since_seq) == ("STALE", loaded)
    assert waiting.because[0] == (
        f"a replacement engine loaded at seq {loaded}; it holds start-up weights, so it gets no "
        "traffic until a refit that includes it completes"
    )
    assert "no open refit includes it: it waits for the next one" in waiting.because
    assert "not serving, not absent (no traffic, joins the next refit)" in waiting.text
    assert waiting.open_refit is None

    fleet.refit_started(7, shards=(0, 1))
    excluded = shard_of(fleet, 2)
    assert "no open refit includes it: it waits for the next one" in excluded.because
    assert "it does not include it" in excluded.text

    fleet.refit_aborted(7)
    fleet.refit_started(7)
    started = fleet.last_seq
    included = shard_of(fleet, 2)
    assert f"the refit to weight version 7 open since seq {started} includes it" in included.because
    assert included.open_refit is not None and included.open_refit.started_seq == started
    assert (
        f"open refit: weight version 7 since seq {started} over shards 0, 1 and 2; it includes it"
        in included.text
    )

    fleet.refit_completed(7)
    done = shard_of(fleet, 2)
    assert (done.state, done.weight_version, done.open_refit) == ("HEALTHY", 7, None)
    assert done.because[0].startswith(f"a refit that included it completed at seq {started + 1}")


def test_a_replacement_at_a_new_url_is_named() -> None:
    fleet = Fleet()
    fleet.actor_died(0)
    fleet.restart_requested(0)
    fleet.replacement_loaded(0, "http://gen-0b.test:8000")
    e = shard_of(fleet, 0)
    assert e.because[0].startswith(
        f"a replacement engine loaded at http://gen-0b.test:8000 at seq {fleet.last_seq}"
    )
    assert e.base_url == "http://gen-0b.test:8000"
    assert (
        f"restarts: 1 of max_restart_attempts_per_shard 5 used (requested at seq "
        f"{fleet.last_seq - 1}; loaded at seq {fleet.last_seq})"
    ) in e.text


def test_explaining_an_earlier_seq_gives_the_earlier_state() -> None:
    fleet = Fleet()
    fleet.probe_failed(1, kind="error", error="HTTP 503")
    suspect = fleet.last_seq
    fleet.probe_failed(1, 2, kind="error", error="HTTP 503")
    dead = fleet.last_seq
    fleet.restart_requested(1)

    assert shard_of(fleet, 1).state == "RESTARTING"
    at_dead = shard_of(fleet, 1, at=dead)
    assert (at_dead.state, at_dead.seq, at_dead.since_seq) == ("DEAD", dead, dead)
    assert at_dead.summary == (
        f"shard 1 is DEAD since seq {dead}: 3 consecutive failed probes (seqs {suspect}, "
        f"{suspect + 1}, {dead}: error: HTTP 503) ≥ unhealthy_threshold 3; no actor death was "
        "confirmed: the probe streak condemned it."
    )
    at_suspect = shard_of(fleet, 1, at=suspect)
    assert (at_suspect.state, at_suspect.seq) == ("SUSPECT", suspect)
    assert at_suspect.because[0] == (
        f"a probe failed (seq {suspect}: error: HTTP 503): probe streak 1 of unhealthy_threshold "
        "3; a SUSPECT shard still serves, so one failed probe costs no traffic"
    )
    assert shard_of(fleet, 1, at=suspect - 1).state == "HEALTHY"
    assert run_of(fleet, at=suspect).not_healthy[0].state == "SUSPECT"


def test_a_single_window_can_condemn_and_with_no_probes_it_says_so() -> None:
    fleet = Fleet()
    fleet.reported_failure(2, count=3, reason="ConnectError")
    seq = fleet.last_seq
    e = shard_of(fleet, 2)
    assert e.because == (
        f"3 consecutive reported failures (seq {seq}: infra ConnectError) ≥ unhealthy_threshold 3",
        "no probe of it was recorded in that span: the reported streak alone condemned it",
    )
    assert e.probe_tally is not None
    assert (e.probe_tally.probes_ok, e.probe_tally.probes_failed) == (0, 0)


def test_a_reported_streak_with_failing_probes_says_the_streak_got_there_first() -> None:
    fleet = Fleet()
    fleet.reported_failure(0, reason="ReadTimeout")
    first = fleet.last_seq
    fleet.probe_failed(0)
    fleet.reported_failure(0, count=2, reason="ReadTimeout")
    e = shard_of(fleet, 0)
    assert e.because == (
        f"3 consecutive reported failures (seqs {first}, {fleet.last_seq}: infra ReadTimeout) ≥ "
        "unhealthy_threshold 3",
        "probes failed too (1 failed probes in that span), but the reported streak reached the "
        "threshold first",
    )


def test_a_reported_failure_below_the_threshold_counts_the_streak() -> None:
    fleet = Fleet()
    fleet.outcomes(outcome(1, successes=10, infra=2, infra_reason="ReadTimeout"))
    e = shard_of(fleet, 1)
    assert e.state == "SUSPECT"
    assert e.because[0] == (
        f"adapters reported a failure (seq {fleet.last_seq}: infra ReadTimeout): reported streak "
        "2 of unhealthy_threshold 3; a SUSPECT shard still serves, so one blip costs no traffic"
    )
    assert e.evidence[0].what == (
        "adapter adapter-0 reported shard 1: 10 successes, failures: infra ReadTimeout ×2"
    )


def test_a_suspect_that_lives_through_an_abort_returns_to_suspect() -> None:
    fleet = Fleet()
    fleet.probe_failed(0)
    fleet.refit_started(2)
    fleet.refit_aborted(2, "broadcast timed out")
    fleet.weights_partial(2)
    fleet.refit_started(2)
    fleet.refit_completed(2)
    e = shard_of(fleet, 0)
    assert e.state == "SUSPECT"
    assert e.because[0] == (
        "refit completed at weight version 2; it was SUSPECT before the abort, so it stays "
        f"suspected (seq {fleet.last_seq}); its reported streak was kept"
    )
    assert e.suspected and e.weight_version == 2


def test_missing_evidence_is_named_not_invented() -> None:
    fleet = Fleet()
    fleet.reported_failure(0, count=3, reason="ReadTimeout")
    view = fold(fleet.records)
    entries = list(replay(fleet.records))
    e = explain_shard(view, entries, 0, evidence={})
    assert e.evidence[0].what == "event not read (not supplied to the explanation)"
    assert e.evidence[0].at_us is None
    assert e.because == (
        "3 consecutive reported failures ≥ unhealthy_threshold 3 (last: ReadTimeout ×3) "
        f"(seq {fleet.last_seq})",
    )


def test_a_shard_outside_the_fleet_is_refused_with_the_valid_range() -> None:
    fleet = Fleet()
    view = fold(fleet.records)
    refused = r"shard 3 is out of range: .* \(valid shards 0\.\.2\)"
    with pytest.raises(ProjectionError, match=refused):
        check_shard(view, 3)
    with pytest.raises(ProjectionError, match="shard -1 is out of range"):
        explain_shard(view, list(replay(fleet.records)), -1, {})


def test_history_from_other_events_than_the_view_is_refused() -> None:
    fleet = Fleet()
    fleet.actor_died(0)
    fleet.restart_requested(0)
    early = fold(fleet.records[:2])
    with pytest.raises(
        ProjectionError, match="history entries reach seq 3 but the view is at seq 2"
    ):
        explain_shard(early, list(replay(fleet.records)), 0, {})
    # Same length, different events: the shard's last transition disagrees with the view.
    other = Fleet()
    other.probe_ok(0)
    other.probe_ok(0)
    with pytest.raises(
        ProjectionError, match="shard 0's last transition in the history is at seq 3"
    ):
        explain_shard(fold(other.records), list(replay(fleet.records)), 0, {})
    # And the other way round: a view that moved with a history that did not.
    with pytest.raises(ProjectionError, match="last transition in the history is at seq 1, but"):
        explain_shard(fold(fleet.records), list(replay(other.records)), 0, {})


def test_tally_span_counts_only_that_shards_probes_inside_the_span() -> None:
    fleet = Fleet()
    fleet.probe_ok(0)  # seq 2: before the span
    fleet.probe_ok(0)  # 3
    fleet.probe_ok(1)  # 4: another shard
    fleet.probe_failed(0)  # 5
    fleet.probe_ok(0)  # 6: after the span
    tally = tally_span(fleet.records, 0, 3, 5)
    assert (tally.probes_ok, tally.probes_failed) == (1, 1)
    assert tally.as_json() == {
        "shard": 0,
        "first_seq": 3,
        "last_seq": 5,
        "probes_ok": 1,
        "probes_failed": 1,
    }


def test_probe_tallies_counted_in_one_pass_equal_a_tally_of_the_span() -> None:
    fleet = Fleet()
    fleet.reported_failure(1)
    first = fleet.last_seq
    fleet.probe_ok(1, 3)
    fleet.probe_ok(0, 2)
    fleet.probe_failed(1)
    fleet.reported_failure(0)  # a window that names another shard
    fleet.probe_ok(1)
    fleet.reported_failure(1, 2)
    last = fleet.last_seq
    fleet.probe_ok(1)  # after the span
    tallies = ProbeTallies()
    assert list(tallies.watch(fleet.records)) == fleet.records
    counted = tallies.span(1, first, last)
    assert counted == tally_span(fleet.records, 1, first, last)
    assert (counted.probes_ok, counted.probes_failed) == (4, 1)
    assert tallies.span(0, first, last) == tally_span(fleet.records, 0, first, last)
    with pytest.raises(ProjectionError, match=f"no probe count remembered at seq {first + 1}"):
        tallies.span(1, first + 1, last)


def test_evidence_needed_asks_for_the_streak_its_span_and_the_open_refit() -> None:
    fleet = Fleet()
    fleet.refit_started(1)
    started = fleet.last_seq
    fleet.reported_failure(0)
    first = fleet.last_seq
    fleet.probe_ok(0)
    fleet.reported_failure(0, count=2)
    view = fold(fleet.records)
    entries = list(replay(fleet.records))
    wanted = evidence_needed(view, entries, 0)
    assert wanted.seqs == (1, started, first, fleet.last_seq)
    assert wanted.span == (first, fleet.last_seq)
    lost = fleet.last_seq  # shard 0's third reported failure took it DEAD
    assert fold(fleet.records).state_of(0) is ShardState.DEAD
    fleet.apply(ProgressReported(committed_groups=3, train_steps=1, in_flight=2))
    run_wanted = evidence_needed(fold(fleet.records), list(replay(fleet.records)))
    assert run_wanted.seqs == (1, started, fleet.last_seq) and run_wanted.span is None
    # Read, not cited: the lost shard's transition, for its cause's raw text (--raw, --json).
    assert run_wanted.causes == (lost,)


def test_long_histories_are_summarised_in_text_and_complete_in_json() -> None:
    fleet = Fleet(max_restart_attempts_per_shard=TEXT_LIMIT)
    flaps = TEXT_LIMIT + 3
    for _ in range(flaps):
        fleet.probe_failed(0)
        fleet.probe_ok(0, 2)
    fleet.actor_died(1)
    for _ in range(TEXT_LIMIT):
        fleet.restart_requested(1)
        fleet.restart_failed(1)
    e = shard_of(fleet, 0)
    assert len(e.chain) == 2 * flaps
    assert f"how it got here ({2 * flaps} transitions):" in e.text
    assert f"… {2 * flaps - TEXT_LIMIT} earlier (see --json)" in e.text
    assert len(e.as_json()["chain"]) == 2 * flaps
    run = run_of(fleet)
    lost = [f for f in run.findings if f.kind == "shard_lost"]
    assert len(lost) == 1 + TEXT_LIMIT  # the death, then every failed restart
    assert f"… {len(run.findings) - TEXT_LIMIT} earlier (see --json)" in run.text


def test_with_every_shard_absent_the_layout_says_why_none_can_be_built() -> None:
    fleet = Fleet(shard_count=2)
    fleet.actor_died(0)
    fleet.actor_died(1)
    e = shard_of(fleet, 1)
    assert e.layout.world_size is None
    assert "layout: no refit communicator can be built (no surviving shards" in e.text
    assert "layout: no refit communicator can be built" in run_of(fleet).text


# ── the run ────────────────────────────────────────────────────────────────────


def test_a_run_with_nothing_wrong_says_so() -> None:
    fleet = Fleet()
    fleet.probe_ok(0)
    e = run_of(fleet)
    assert e.ended is None and e.why is None and e.findings == ()
    assert e.summary.startswith(f"run {fleet.run} has not ended: as of seq 2 (")
    assert "progress: none was ever reported" in e.text
    assert "trouble recorded: none" in e.text
    assert "refits: none open, none completed" in e.text
    assert "every shard is HEALTHY" in e.text


def test_where_progress_stopped_counts_events_and_seconds_since() -> None:
    fleet = Fleet()
    fleet.apply(ProgressReported(committed_groups=1, train_steps=1, in_flight=0))
    progress = fleet.last_seq
    fleet.probe_ok(0, 5)
    e = run_of(fleet)
    assert e.progress is not None and e.progress.at_us == at_us_of(progress)
    assert (
        f"last progress at seq {progress} ({iso_at(at_us_of(progress))}): 1 committed "
        "group, 1 train step, 0 in flight; nothing newer in the 5 events and 5.0 s up to seq "
        f"{fleet.last_seq}"
    ) in e.text


def test_a_refusal_with_no_suspect_says_there_was_nothing_to_go_on() -> None:
    fleet = Fleet()
    fleet.refit_started(2)
    fleet.refit_aborted(2, "broadcast timed out")
    fleet.weights_partial(2)
    fleet.apply(CondemnationRefused(suspected=(), reason="no suspect"))
    fleet.run_ended("failed", "refit 2 aborted")
    e = run_of(fleet)
    assert e.why is not None and e.why.text == (
        "condemnation refused: no shard was suspected, so there was nothing to go on; "
        "recorded reason: no suspect"
    )


def test_json_keys_are_the_fields_and_the_declared_derived_keys() -> None:
    fleet = Fleet()
    fleet.probe_failed(1)
    fleet.run_ended()
    explained = shard_of(fleet, 1)
    shard = explained.as_json()
    assert set(shard) == {
        "kind", "run", "seq", "at_us", "at", "shard", "state", "since_seq", "since_at_us",
        "since_at", "rule", "input", "because", "summary", "evidence", "chain", "restarts",
        "decisions", "restart_attempts", "max_restart_attempts_per_shard", "probe_failures",
        "reported_failures", "unhealthy_threshold", "weight_version", "trainer_weight_version",
        "serving", "absent", "suspected", "epoch", "serving_set", "absent_set", "suspected_set",
        "layout", "open_refit", "base_url", "probe_tally", "causes",
    }  # fmt: skip
    assert set(shard) == {f.name for f in fields(ShardExplanation)} | {
        "kind", "at", "since_at", "summary",
    }  # fmt: skip
    assert (shard["kind"], shard["state"], shard["input"]) == ("shard", "SUSPECT", "probe failed")
    assert (shard["at_us"], shard["at"]) == (explained.at_us, iso_at(explained.at_us))
    assert shard["summary"] == explained.summary
    assert shard["chain"][0]["kind"] == "transition" and shard["chain"][0]["at"].endswith("Z")
    assert shard["chain"] == [t.as_json() for t in explained.chain]
    assert set(shard["evidence"][0]) == {"seq", "at_us", "at", "what"}
    assert set(shard["layout"]) == {
        "world_size", "train_world_size", "workers_per_shard", "shard_ranks", "error",
    }  # fmt: skip
    assert shard["layout"]["shard_ranks"] == {"0": [2], "1": [3], "2": [4]}
    run = run_of(fleet).as_json()
    assert set(run) == {
        "kind", "run", "seq", "at_us", "at", "started_at_us", "started_at", "summary", "ended",
        "why", "findings", "progress", "stalls", "open_refit", "last_completed_refit",
        "not_healthy", "epoch", "serving", "absent", "suspected", "trainer_weight_version",
        "layout", "causes", "served", "faults",
    }  # fmt: skip
    assert (run["started_at_us"], run["started_at"]) == (T0_US, iso_at(T0_US))
    assert run["ended"] == {
        "kind": "end",
        "seq": fleet.last_seq,
        "at_us": run["at_us"],
        "at": run["at"],
        "outcome": "completed",
        "cause": "max steps",
    }
    assert run["not_healthy"] == [
        {"shard": 1, "state": "SUSPECT", "since_seq": 2, "rule": "failed probe: timeout",
         "suspected": True, "cause": "timeout"}
    ]  # fmt: skip
    assert json.loads(json.dumps(shard)) == shard and json.loads(json.dumps(run)) == run


# ── the command, on a real ledger with snapshots ───────────────────────────────


RUN = "explained"


@pytest.fixture
def ledger_with_snapshots(sqlite_url: str) -> str:
    """A suspect condemned after an abort, then a wedged shard; snapshots every 3 events."""
    with EventLog.open(sqlite_url) as log:
        led = Ledger.start(log, RUN, ledger_fleet_config(3), snapshot_every=3)
        ok = ProbeResult.ok()
        led.refit_started(1)
        led.refit_completed(1)
        led.report_progress(committed_groups=2, train_steps=1, in_flight=1)
        led.refit_started(2)
        led.record_probes({0: ok, 1: ProbeResult("timeout", "no answer"), 2: ok})
        led.refit_aborted(2, "broadcast timed out")
        led.mark_weights_partial(2)
        led.condemn_silent_participant(1, "the only SUSPECT shard when refit 2 aborted")
        led.refit_started(2)
        led.refit_completed(2)
        # Then shard 0 wedges: its generations time out while its probes still answer.
        timeout = FailureCount(category="infra", reason="ReadTimeout")
        led.report_outcomes("router", [ShardOutcomes(shard=0, failures=(timeout,))])
        led.record_probes({0: ok, 2: ok})
        twice = timeout.model_copy(update={"count": 2})
        led.report_outcomes("router", [ShardOutcomes(shard=0, failures=(twice,))])
        led.end_run("failed", "shard 0 condemned; the fleet is below what the run needs")
    return sqlite_url


def test_explain_at_every_seq_equals_the_pure_explanation_of_the_truncated_run(
    ledger_with_snapshots: str,
) -> None:
    url = ledger_with_snapshots
    with EventLog.open(url) as log:
        records = list(log.read(RUN))
        # --at below the head folds from a snapshot when one exists at or before it.
        assert log.load_snapshot(RUN, PROJECTION_VERSION, at_most_seq=len(records)) is not None
    for seq in range(1, len(records) + 1):
        for shard in (None, 0, 1):
            args = ["explain", RUN, *([] if shard is None else [str(shard)])]
            result = run_cli(*args, "--at", str(seq), "--json", "--db", url)
            assert result.exit_code == 0, (seq, shard, result.stderr)
            expected = explain_records(records[:seq], shard).as_json()
            assert json.loads(result.stdout) == json.loads(json.dumps(expected)), (seq, shard)


def test_explain_text_at_an_earlier_seq_and_at_the_head(ledger_with_snapshots: str) -> None:
    url = ledger_with_snapshots
    head = run_cli("explain", RUN, "1", "--db", url)
    assert head.exit_code == 0
    assert "shard 1 is DEAD since seq 9: condemned as the silent participant" in head.stdout
    # Seq 6 is the probe round (one event for the three shards): the failure cites it.
    earlier = run_cli("explain", RUN, "1", "--at", "6", "--db", url)
    assert earlier.exit_code == 0
    assert earlier.stdout.startswith(f"run {RUN}, as of seq 6 (")
    assert "shard 1 is SUSPECT since seq 6: a probe failed (seq 6: timeout: no answer)" in (
        earlier.stdout
    )


def test_explain_refuses_a_shard_outside_the_fleet_in_one_line(ledger_with_snapshots: str) -> None:
    result = run_cli("explain", RUN, "7", "--db", ledger_with_snapshots)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        f"fleetledger: error: run '{RUN}': shard 7 is out of range: this run has shard_count=3 "
        "(valid shards 0..2)\n"
    )


def test_explain_refuses_a_seq_outside_the_run_and_an_unknown_run(
    ledger_with_snapshots: str,
) -> None:
    url = ledger_with_snapshots
    outside = run_cli("explain", RUN, "--at", "99", "--db", url)
    assert outside.exit_code == 2
    assert outside.stderr.strip() == (
        f"fleetledger: error: run '{RUN}' has seqs 1..15; --at 99 is outside it"
    )
    unknown = run_cli("explain", "nope", "--db", url)
    assert unknown.exit_code == 2
    assert "no run 'nope'" in unknown.stderr and "Traceback" not in unknown.stderr


def test_explain_at_a_time_answers_for_the_last_event_at_or_before_it(
    ledger_with_snapshots: str,
) -> None:
    url = ledger_with_snapshots
    with EventLog.open(url) as log:
        records = list(log.read(RUN))
    middle = records[len(records) // 2]
    # Events stamped in the same microsecond share a time: the answer is the last of them.
    last_at_that_time = max(r.seq for r in records if r.at_us <= middle.at_us)
    when = middle.at.isoformat().replace("+00:00", "Z")
    by_time = run_cli("explain", RUN, "0", "--at", when, "--json", "--db", url)
    by_seq = run_cli("explain", RUN, "0", "--at", str(last_at_that_time), "--json", "--db", url)
    assert by_time.exit_code == 0, by_time.stderr
    assert json.loads(by_time.stdout) == json.loads(by_seq.stdout)
    naive = run_cli("explain", RUN, "--at", when.rstrip("Z"), "--db", url)
    assert naive.exit_code == 2 and "zone" in naive.stderr


def test_probe_tallies_count_each_shards_results_inside_probe_rounds() -> None:
    from fleetledger.events.models import ProbeFailure, ProbeRound

    fleet = Fleet()
    fleet.reported_failure(1)
    first = fleet.last_seq
    for _ in range(3):
        fleet.apply(ProbeRound(ok=(0, 1, 2)))
    fleet.apply(ProbeRound(ok=(0, 2), failed=(ProbeFailure(shard=1, kind="timeout"),)))
    fleet.apply(ProbeRound(ok=(1,)))
    fleet.reported_failure(1, 2)
    last = fleet.last_seq
    fleet.apply(ProbeRound(ok=(0, 1, 2)))  # after the span
    tallies = ProbeTallies()
    assert list(tallies.watch(fleet.records)) == fleet.records
    for shard, expected in ((0, (4, 0)), (1, (4, 1)), (2, (4, 0))):
        counted = tallies.span(shard, first, last)
        assert counted == tally_span(fleet.records, shard, first, last)
        assert (counted.probes_ok, counted.probes_failed) == expected
