"""Every shard transition is one structlog event; JSON lines carry its rule and evidence."""

from __future__ import annotations

import io
import json

import pytest

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.logs import configure_logging
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


@pytest.fixture
def json_logs():
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    yield stream
    configure_logging("warning")


def test_a_transition_is_one_json_line_with_its_rule_and_evidence(sqlite_url, json_logs):
    log = EventLog.open(sqlite_url)
    ledger = Ledger.start(log, "r", fleet_config(2))
    ledger.record_probes({0: ProbeResult("timeout", "no answer"), 1: ProbeResult.ok()})
    ledger.actor_died(1, "ActorDiedError: gone")
    log.close()
    lines = [json.loads(line) for line in json_logs.getvalue().splitlines()]
    transitions = [line for line in lines if line["event"] == "shard transition"]
    assert [(t["shard"], t["before"], t["after"], t["seq"]) for t in transitions] == [
        (0, "HEALTHY", "SUSPECT", 2),  # the probe round is seq 2
        (1, "HEALTHY", "DEAD", 3),
    ]
    first, second = transitions
    assert first["rule"].startswith("failed probe") and first["evidence"] == [2]
    assert second["epoch"] == 1 and second["run"] == "r"
    assert all(t["level"] == "info" and t["timestamp"].endswith("Z") for t in transitions)


@pytest.mark.parametrize(
    ("level", "fmt", "message"),
    [("loud", "json", "unknown log level 'loud'"), ("info", "xml", "unknown log format 'xml'")],
)
def test_bad_logging_settings_are_named(level, fmt, message):
    with pytest.raises(ValueError, match=message):
        configure_logging(level, fmt)
