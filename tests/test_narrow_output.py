"""Every command's text fits the width it is read at (``COLUMNS``), without losing the answer.

Story: at 80 columns ``membership`` turned one Ray death text into a 45-line cell,
``replay`` left its detail column 20 characters wide, and ``explain``'s lines ran off the
edge of a pasted post-mortem. Here a run like the issue's (a shard killed with SIGKILL,
Ray's real death text) and the scripted demo go through every command that prints text,
at 80 and at 120 columns: no line is wider than asked, and what each command is for is
still there. Off a terminal without ``COLUMNS`` nothing is folded (one entry, one line),
which ``tests/test_hostile_strings.py`` holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FleetConfig, RunProgress
from fleetledger.store.log import EventLog
from tests.cli_support import invoke

pytestmark = pytest.mark.usefixtures("cli_sandbox")

ray_exceptions = pytest.importorskip("ray.exceptions", reason="Ray is not installed")

RUN = "sim-20261202T152000Z-kill"
PID = 10825


def _ray_death_text() -> str:
    """What a rollout that met a SIGKILLed actor hands the ledger: Ray's own
    ``ActorDiedError``, built with the context its control service sends for it."""
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    from fleetledger.controller.runtime_deaths import death_text

    ctx = ActorDiedErrorContext(
        error_message=(
            "The actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
            "error code 2. End of file. Some common causes include: (1) the process was "
            "killed by the OOM killer due to high memory usage, (2) ray stop --force was "
            "called, or (3) the worker crashed unexpectedly due to SIGSEGV or another "
            "unexpected error. If the process was killed by the kernel OOM killer "
            "(verifiable by checking for OOM in dmesg of the OOMing node), consider enabling "
            "resource isolation via --enable-resource-isolation to prevent node deaths by "
            "resource contention and significant loss of progress by uninformed kernel OOM "
            "killing."
        ),
        pid=PID,
        node_ip_address="192.0.2.2",
        class_name="SimulatedRefitShard",
        actor_id=bytes.fromhex("57" * 16),
        name="fleetledger-sim-shard-1",
        ray_namespace="0c515eb4-2883-4d0e-8908-c354451e60b3",
    )
    return death_text(ray_exceptions.ActorDiedError(ctx))


@pytest.fixture
def ledger_url(sqlite_url: str) -> str:
    """The issue's run: 4 shards, shard 1 SIGKILLed in step 3, 5 of 5 steps done."""
    config = FleetConfig(
        shard_count=4,
        train_world_size=1,
        base_urls=tuple(f"ray://fleetledger-sim-shard-{i}" for i in range(4)),
    )
    ok = ProbeResult.ok()
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, RUN, config)
        for version in (1, 2):
            ledger.refit_started(version)
            ledger.refit_completed(version)
        ledger.record_probes({0: ok, 1: ProbeResult("timeout", "no answer within 0.25s"), 2: ok})
        ledger.actor_died(1, _ray_death_text())
        for version in (3, 4, 5):
            ledger.refit_started(version)
            ledger.refit_completed(version)
        ledger.end_run(
            "completed",
            "5 of 5 steps done",
            progress=RunProgress(committed_groups=20, train_steps=5),
        )
    invoke("demo", "--db", sqlite_url)
    return sqlite_url


def _demo_run(url: str) -> str:
    runs = invoke("runs", "--json", "--db", url).stdout
    (run,) = re.findall(r'"run": "(demo-[^"]+)"', runs)
    return run


def _joined(lines: list[str]) -> str:
    """What the lines say, folding undone: a table's borders dropped, blanks one space."""
    return " ".join(re.sub(r"[│┃┏┓┗┛┡┩└┘━─╇┳┻╋┯┷]", " ", " ".join(lines)).split())


def _at(columns: int, *args: str) -> list[str]:
    result = invoke(*args, env={"COLUMNS": str(columns)})
    lines = (result.stdout + result.stderr).splitlines()
    wide = [line for line in lines if cell_len(line) > columns]
    assert not wide, f"{args[0]} at {columns} columns: {wide}"
    return lines


@pytest.mark.parametrize("columns", [80, 120])
def test_every_text_command_fits_the_width_and_keeps_its_answer(
    ledger_url: str, columns: int, tmp_path: Path
) -> None:
    db = ("--db", ledger_url)
    demo = _demo_run(ledger_url)
    # One fact per command that must survive the folding (words split across lines are
    # joined back before looking).
    expected = {
        ("runs",): [RUN, "completed", demo],
        ("membership", RUN): [
            "DEAD",
            f"actor process {PID} on 192.0.2.2 killed (SIGKILL or a crash)",
        ],
        ("explain", RUN): ["5 train steps", f"actor process {PID}"],
        ("explain", RUN, "1"): ["shard 1 is DEAD since seq", "same cause as seq", "base URL:"],
        ("replay", RUN): ["SUSPECT → DEAD", "run ended (completed)", "world 4: trainers"],
        ("watch", RUN): ["run ended (completed)"],
        ("membership", demo): ["HEALTHY", "rank layout"],
        ("explain", demo, "2"): ["shard 2 is"],
        ("replay", demo): ["SUSPECT → DEAD"],
        ("timeline", RUN, "-o", str(tmp_path / "t.html")): ["wrote", "5 of 5 steps done"],
        ("migrate",): ["ledger schema already at revision"],
        ("demo",): ["HEALTHY → SUSPECT", "run id: demo-"],
        ("export", RUN, "-o", str(tmp_path / "run.jsonl")): [],
        ("import", str(tmp_path / "run.jsonl"), "--run", "copy"): [
            "imported 14 events as run copy"
        ],
    }
    for args, facts in expected.items():
        lines = _at(columns, *args, *db)
        joined = _joined(lines)
        for fact in facts:
            assert fact in joined, (args, fact, lines)


def test_explain_of_the_killed_shard_is_short_clean_and_names_the_sigkill(ledger_url: str) -> None:
    """The issue's own measure: ≤ 15 lines of ≤ 120 characters, no ANSI, no OOM-killer
    advice, the SIGKILL named, the pid and the node shown; the raw text on request."""
    lines = _at(120, "explain", RUN, "1", "--db", ledger_url)
    text = _joined(lines)
    assert len(lines) <= 15, "\n".join(lines)
    assert "\x1b" not in text and "\\x1b" not in text and "OOM killer" not in text
    assert f"actor process {PID} on 192.0.2.2 killed (SIGKILL or a crash)" in text
    assert text.count("SIGKILL") == 1  # printed once, then by reference
    raw = invoke("explain", RUN, "1", "--raw", "--db", ledger_url).stdout
    assert "OOM killer" in raw and "raw causes:" in raw  # kept, shown when asked
    run = _joined(_at(120, "explain", RUN, "--db", ledger_url))
    assert "5 train steps" in run
