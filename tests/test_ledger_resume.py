"""A controller that dies and starts again on the same database resumes its run exactly."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FailureCount, ShardOutcomes
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.membership import membership_document
from fleetledger.projections.shard_states import ShardState
from fleetledger.projections.snapshot import PROJECTION_VERSION, to_snapshot
from fleetledger.queries import load_view
from fleetledger.store.log import EventLog
from tests.builders import fleet_config

RESUME_AND_FAIL_SHARD_1 = textwrap.dedent(
    """
    import json, sys
    from fleetledger.controller.ledger import Ledger, ProbeResult
    from fleetledger.store.log import EventLog
    from fleetledger.projections.membership import membership_document

    log = EventLog.open(sys.argv[1])
    ledger = Ledger.resume(log, sys.argv[2])
    before = membership_document(ledger.view)
    transitions = ledger.record_probes({1: ProbeResult("timeout", "no answer")})
    print(json.dumps({
        "before": before,
        "after": membership_document(ledger.view),
        "transitions": [[t.shard, t.before.value, t.after.value, t.rule] for t in transitions],
    }))
    """
)


def _write_history(ledger: Ledger) -> None:
    """Epoch moves twice, shard 1 is two probe failures into its streak, shard 2 restarts."""
    ledger.refit_started(1)
    ledger.refit_completed(1)
    ledger.record_probes({0: ProbeResult.ok(), 1: ProbeResult("timeout", "t"), 2: ProbeResult.ok()})
    ledger.report_outcomes(
        "router",
        [
            ShardOutcomes(
                shard=2,
                failures=(FailureCount(category="infra", reason="ReadTimeout", count=3),),
            )
        ],
    )
    ledger.save_snapshot()
    ledger.restart_requested(2)
    ledger.replacement_loaded(2, "http://127.0.0.1:9002/v1")
    ledger.record_probes({1: ProbeResult("error", "HTTP 502")})


def test_a_restarted_controller_resumes_states_epoch_and_streaks(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "resume-me", fleet_config(3))
        _write_history(ledger)
        expected = membership_document(ledger.view)
        assert expected["shards"]["1"]["state"] == "SUSPECT"
        assert expected["shards"]["2"]["state"] == "STALE"
        assert expected["epoch"] == 1

    result = subprocess.run(
        [sys.executable, "-c", RESUME_AND_FAIL_SHARD_1, ledger_url, "resume-me"],
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["before"] == expected
    # The third failed probe condemns shard 1 only if the new process kept the streak of 2.
    assert answer["transitions"] == [
        [
            1,
            "SUSPECT",
            "DEAD",
            "3 consecutive failed probes ≥ unhealthy_threshold 3 (last: timeout: no answer)",
        ]
    ]
    assert answer["after"]["epoch"] == expected["epoch"] + 1

    with EventLog.open(ledger_url) as log:
        assert membership_document(fold(log.read("resume-me"))) == answer["after"]


def test_resume_uses_the_snapshot_and_equals_the_full_fold(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "snap", fleet_config(3), snapshot_every=4)
        _write_history(ledger)
        assert log.load_snapshot("snap", PROJECTION_VERSION) is not None
        resumed = Ledger.resume(log, "snap")
        assert resumed.view == fold(log.read("snap")) == ledger.view


def test_a_snapshot_of_another_projection_version_is_ignored(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "foreign-snap", fleet_config(3))
        _write_history(ledger)
        # A snapshot written by other fold rules claims every shard is RETIRED.
        lying = fold(log.read("foreign-snap"))
        for record in lying.shards:
            record.state = ShardState.RETIRED
        log.save_snapshot("foreign-snap", PROJECTION_VERSION + 1, lying.seq, to_snapshot(lying))
        assert load_view(log, "foreign-snap") == ledger.view


def test_a_damaged_snapshot_is_ignored_not_trusted(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "damaged-snap", fleet_config(3))
        _write_history(ledger)
        log.save_snapshot("damaged-snap", PROJECTION_VERSION, ledger.view.seq, '{"projection_')
        assert load_view(log, "damaged-snap") == ledger.view


def test_membership_at_a_past_seq_uses_an_earlier_snapshot_only(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "past", fleet_config(3), snapshot_every=3)
        _write_history(ledger)
        for seq in range(1, ledger.view.seq + 1):
            assert load_view(log, "past", seq) == fold(log.read("past", 0, seq)), seq


def test_a_snapshot_whose_payload_disagrees_with_its_row_is_ignored(ledger_url) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, "misfiled", fleet_config(3))
        _write_history(ledger)
        head = ledger.view.seq
        # The payload of the head's view filed under seq 3: trusting it would answer
        # `--at 3` with the fleet as it was at the head.
        log.save_snapshot("misfiled", PROJECTION_VERSION, 3, to_snapshot(ledger.view))
        assert head > 3
        assert load_view(log, "misfiled", 3) == fold(log.read("misfiled", 0, 3))
