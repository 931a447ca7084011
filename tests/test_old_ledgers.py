"""An old export — its probes one v1 ``probe_succeeded`` / ``probe_failed`` line per
shard — imports, replays and explains as it did before the probe round existed.

``OLD_HISTORY`` is a run as an older fleetledger exported it: a shard condemned by its
probe streak, a wedged shard condemned by the reported streak while its probes kept
answering, a restart, a blip that heals, a confirmed death, a refit and the end. The
expected answers below were printed by the fleetledger of commit 88a788b (the last one
with per-shard probe events in its vocabulary) for this very file: every transition,
every cited seq and what it says, every count. Today the v1 lines reach the fold only
through the codec's upcasters, as one-shard rounds at their own seqs, and the answers
must be the same — through a plain import and through a bundle exported from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetledger.events.models import (
    ActorDeathConfirmed,
    FailureCount,
    OutcomeWindowReported,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
    RunEnded,
    RunStarted,
    ShardOutcomes,
)
from fleetledger.store.log import EventLog
from tests.cli_support import invoke
from tests.legacy_rows import Item, export_lines, probe_failed_v1, probe_ok_v1
from tests.projection_builders import fleet_config

RUN = "old-run"


@pytest.fixture(autouse=True)
def _sandbox(cli_sandbox: None) -> None:
    """The commands below point structlog at the runner's stream: put it back after."""


def _reported(shard: int) -> OutcomeWindowReported:
    failure = FailureCount(category="infra", reason="read timeout", count=1)
    return OutcomeWindowReported(
        adapter="rollouts", outcomes=(ShardOutcomes(shard=shard, failures=(failure,)),)
    )


def _history() -> list[Item]:
    items: list[Item] = [
        RunStarted(config=fleet_config(3, unhealthy_threshold=3, healthy_threshold=2)),
        # Seqs 2-4, 5-7, 9-11, 13-15: rounds of three per-shard probe events each.
        probe_ok_v1(0),
        probe_ok_v1(1),
        probe_ok_v1(2),
        probe_ok_v1(0),
        probe_failed_v1(1, "timeout", "no answer within probe_timeout_s=2"),
        probe_ok_v1(2),
        _reported(0),  # 8: shard 0 still answers probes, but its rollouts time out
        probe_ok_v1(0),
        probe_failed_v1(1, "error", "HTTP 503"),
        probe_ok_v1(2),
        _reported(0),  # 12
        probe_ok_v1(0),
        probe_failed_v1(1, "timeout", "no answer within probe_timeout_s=2"),  # 14: DEAD
        probe_ok_v1(2),
        _reported(0),  # 16: shard 0 DEAD by the reported streak
        RestartRequested(shard=1),  # 17
        ReplacementLoaded(shard=1, base_url="http://127.0.0.1:8101/v1"),  # 18: STALE
        probe_failed_v1(2, "error", "connection reset"),  # 19: SUSPECT
        probe_ok_v1(1),  # 20: a STALE shard ignores successful probes
        probe_ok_v1(2),  # 21
        probe_ok_v1(2),  # 22: HEALTHY again
        RefitStarted(weight_version=1, shards=(1, 2)),  # 23
        RefitCompleted(weight_version=1, shards=(1, 2)),  # 24: shard 1 HEALTHY
        ActorDeathConfirmed(shard=2, error="ActorDiedError: the actor died unexpectedly"),
        RunEnded(outcome="failed", cause="two of three shards lost"),  # 26
    ]
    # Fixed ids, so the expected output can name them; the lines carry fixed times.
    return [item.model_copy(update={"id": f"old-{seq:04d}"}) for seq, item in enumerate(items, 1)]


def old_export() -> str:
    lines = export_lines(RUN, _history(), first_us=1_764_410_400_000_000, step_us=1_000_000)
    return "".join(line + "\n" for line in lines)


def _answers(url: str, run: str) -> dict[str, Any]:
    """What the read commands say of ``run``, as JSON documents."""
    commands = {
        "replay": ["replay", run],
        "explain": ["explain", run],
        "explain 0": ["explain", run, "0"],
        "explain 1": ["explain", run, "1"],
        "explain 2": ["explain", run, "2"],
        "explain 1 at 15": ["explain", run, "1", "--at", "15"],
        "explain 2 at 19": ["explain", run, "2", "--at", "19"],
        "membership at 16": ["membership", run, "--at", "16"],
    }
    answers: dict[str, Any] = {}
    for name, args in commands.items():
        printed = invoke(*args, "--json", "--db", url).stdout
        try:
            answers[name] = json.loads(printed)
        except json.JSONDecodeError:  # JSON lines (replay): one document per entry
            answers[name] = [json.loads(line) for line in printed.splitlines()]
    for name, args in commands.items():
        if name.startswith("explain"):  # and the words, as people read them
            answers[f"text: {name}"] = invoke(*args, "--db", url).stdout
    return answers


# What the fleetledger of commit 88a788b answered for ``old_export()`` imported as is,
# with the answers changed on purpose since: the one layout notation, a membership entry
# (``epoch_moved`` false) where the absent set changed alone (seq 18), and causes read
# into facts (each transition's ``cause``, the raw causes an explanation cites, a cause
# printed once), the membership document's ``since_at`` and ``layout_words`` (keys added
# for the live page), and what each fault cost and the rollouts by attested weights
# (``faults``, ``served``, ``trainer_version``: where the old windows said no fates, the
# in-flight count is unknown). The seqs of every other entry are the old ones.
EXPECTED_PATH = Path(__file__).with_name("data") / "old_ledger_answers.json"


def _expected() -> dict[str, Any]:
    return json.loads(EXPECTED_PATH.read_text(encoding="utf-8"))


def test_an_old_export_imports_its_v1_probe_lines_as_they_are(tmp_path: Path) -> None:
    exported = tmp_path / "old.jsonl"
    exported.write_text(old_export(), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    invoke("import", str(exported), "--db", url)
    with EventLog.open(url) as log:
        stored = [row[3:5] for page in log.read_stored(RUN) for row in page]
        events = [r.event for r in log.read(RUN)]
    assert stored.count(("probe_succeeded", 1)) == 12
    assert stored.count(("probe_failed", 1)) == 4
    assert "probe_round" not in {type_ for type_, _ in stored}
    # Read, every v1 line is the one-shard round it means, at its own seq.
    assert events[5].type == "probe_round" and events[5].failed[0].shard == 1
    # And the export of the import is the file itself, byte for byte.
    assert invoke("export", RUN, "--db", url).stdout == old_export()


def test_an_old_export_replays_and_explains_with_the_same_seqs_as_before(tmp_path: Path) -> None:
    exported = tmp_path / "old.jsonl"
    exported.write_text(old_export(), encoding="utf-8")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    invoke("import", str(exported), "--db", url)
    answers = _answers(url, RUN)
    expected = _expected()
    for name in expected:
        assert answers[name] == expected[name], name


def test_an_old_run_in_a_bundle_answers_the_same(tmp_path: Path) -> None:
    exported = tmp_path / "old.jsonl"
    exported.write_text(old_export(), encoding="utf-8")
    first = f"sqlite:///{tmp_path / 'first.db'}"
    invoke("import", str(exported), "--db", first)
    bundle = tmp_path / "old.zip"
    invoke("export", RUN, "--bundle", str(bundle), "--db", first)
    second = f"sqlite:///{tmp_path / 'second.db'}"
    invoke("import", str(bundle), "--run", "copy", "--db", second)
    with EventLog.open(second) as log:
        stored = {row[3:5] for page in log.read_stored("copy") for row in page}
    assert {("probe_succeeded", 1), ("probe_failed", 1)} <= stored  # still v1 rows
    answers = _answers(second, "copy")
    for name, expected in _expected().items():
        assert answers[name] == json.loads(json.dumps(expected).replace(RUN, "copy")), name
