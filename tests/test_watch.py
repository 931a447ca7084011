"""``fleetledger watch``: a real subprocess following a run this test appends to.

The watcher is the installed console script; the writer is a ``Ledger`` in the test
process, on the same SQLite file (or PostgreSQL database). The assertions are on what
the watcher printed — the same entries a replay of the finished run gives after the
seq the watcher started from — never on how quickly it printed them. The subprocess
timeouts are only a safety net against a watcher that never exits.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FleetConfig
from fleetledger.projections.history import replay
from fleetledger.queries import Follower
from fleetledger.store.log import EventLog

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
RUN = "live-run"
SAFETY_TIMEOUT_S = 60
STEP_PAUSE_S = 0.15  # lets the watcher poll between steps; nothing depends on it


def config() -> FleetConfig:
    return FleetConfig(
        shard_count=3,
        workers_per_shard=2,
        train_world_size=2,
        base_urls=tuple(f"http://gen-{i}.test:8000/v1" for i in range(3)),
    )


def _pump(stream: IO[str], into: queue.Queue[str | None]) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))
    into.put(None)


@dataclass
class Watcher:
    """A ``fleetledger watch`` subprocess and the lines it has printed so far."""

    proc: subprocess.Popen[str]
    stdout: queue.Queue[str | None]
    stderr: queue.Queue[str | None]

    def next_stderr_line(self) -> str:
        try:
            line = self.stderr.get(timeout=SAFETY_TIMEOUT_S)
        except queue.Empty:
            pytest.fail("the watcher printed nothing on stderr")
        assert line is not None, f"the watcher exited early: {self.proc.wait()}"
        return line

    def finish(self) -> tuple[int, list[str], list[str]]:
        """Wait for the exit; returns (status, stdout lines, remaining stderr lines)."""
        try:
            status = self.proc.wait(timeout=SAFETY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the watcher did not exit within {SAFETY_TIMEOUT_S} s")
        return status, _drain(self.stdout), _drain(self.stderr)


def _drain(lines: queue.Queue[str | None]) -> list[str]:
    out: list[str] = []
    while (line := lines.get(timeout=SAFETY_TIMEOUT_S)) is not None:
        out.append(line)
    return out


@pytest.fixture
def start_watch() -> Iterator[Any]:
    started: list[subprocess.Popen[str]] = []

    def start(url: str, *extra: str, run: str = RUN) -> Watcher:
        env = {k: v for k, v in os.environ.items() if k != "FLEETLEDGER_DB"}
        proc = subprocess.Popen(
            [str(CONSOLE_SCRIPT), "watch", run, "--db", url, "--interval", "0.05", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        started.append(proc)
        watcher = Watcher(proc, queue.Queue(), queue.Queue())
        for stream, into in ((proc.stdout, watcher.stdout), (proc.stderr, watcher.stderr)):
            assert stream is not None
            threading.Thread(target=_pump, args=(stream, into), daemon=True).start()
        return watcher

    yield start
    for proc in started:  # only the processes this test started, by their handle
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def started_from(header: str) -> int:
    match = re.match(rf"watching run {RUN} from seq (\d+) \(epoch \d+, serving ", header)
    assert match, header
    return int(match.group(1))


def live_story(ledger: Ledger) -> None:
    """Shard 1 stops answering, is restarted and refitted back; then the run fails."""
    ok = {i: ProbeResult.ok() for i in range(3)}
    steps = [
        lambda: ledger.record_probes({**ok, 1: ProbeResult("timeout", "no answer in 2 s")}),
        lambda: ledger.record_probes({**ok, 1: ProbeResult("timeout", "no answer in 2 s")}),
        lambda: ledger.record_probes({**ok, 1: ProbeResult("timeout", "no answer in 2 s")}),
        lambda: ledger.restart_requested(1),
        lambda: ledger.replacement_loaded(1, "http://gen-1-b.test:8000/v1"),
        lambda: ledger.refit_started(1),
        lambda: ledger.refit_completed(1),
        lambda: ledger.stall_detected(
            committed_groups=12, train_steps=1, idle_s=300.0, in_flight=0, action="abort"
        ),
        lambda: ledger.end_run("failed", "stalled: no progress for 300 s"),
    ]
    for step in steps:
        step()
        time.sleep(STEP_PAUSE_S)


EXPECTED_TRANSITIONS = [
    (1, "HEALTHY", "SUSPECT"),
    (1, "SUSPECT", "DEAD"),
    (1, "DEAD", "RESTARTING"),
    (1, "RESTARTING", "STALE"),
    (1, "STALE", "HEALTHY"),
]


def test_watch_json_prints_each_entry_as_appended_and_exits_at_the_end(
    ledger_url: str, start_watch: Any
) -> None:
    with EventLog.open(ledger_url) as log:
        ledger = Ledger.start(log, RUN, config())
        ledger.record_probes({i: ProbeResult.ok() for i in range(3)})
        watcher = start_watch(ledger_url, "--json")
        start = started_from(watcher.next_stderr_line())
        assert start == 2  # run_started and one probe round (one event) were there before it
        live_story(ledger)
        status, out, err = watcher.finish()
        assert status == 0, err
        docs = [json.loads(line) for line in out]
        expected = [e.as_json() for e in replay(log.read(RUN)) if e.seq > start]
    assert docs == json.loads(json.dumps(expected))
    transitions = [(d["shard"], d["before"], d["after"]) for d in docs if d["kind"] == "transition"]
    assert transitions == EXPECTED_TRANSITIONS
    dead = next(d for d in docs if d["kind"] == "transition" and d["after"] == "DEAD")
    assert dead["rule"].startswith("3 consecutive failed probes ≥ unhealthy_threshold 3")
    assert [d["kind"] for d in docs][-3:] == ["epoch", "stall", "end"]
    assert (docs[-1]["outcome"], docs[-1]["cause"]) == ("failed", "stalled: no progress for 300 s")
    assert err == []


def test_watch_table_prints_the_story_in_order(sqlite_url: str, start_watch: Any) -> None:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, RUN, config())
        watcher = start_watch(sqlite_url)
        assert started_from(watcher.next_stderr_line()) == 1
        live_story(ledger)
        status, out, err = watcher.finish()
    assert status == 0, err
    assert re.match(r"time \(UTC\)\s+seq\s+shard\s+what\s+why / detail$", out[0])
    rows = out[1:]  # off a terminal, no rule under the header
    shown = [
        (int(m.group(1)), m.group(2), m.group(3))
        for row in rows
        if (m := re.search(r"\s(\d)\s+([A-Z]+) → ([A-Z]+)\s", row))
    ]
    assert shown == EXPECTED_TRANSITIONS
    assert any("3 consecutive failed probes ≥ unhealthy_threshold 3" in row for row in rows)
    assert any(re.search(r"epoch 1\s+serving \[0,2\] · absent \[1\]", row) for row in rows)
    assert any(re.search(r"refit v1 completed\s+seq \d+→\d+, ", row) for row in rows)
    assert any(re.search(r"stall \(abort\)\s+idle 300 s", row) for row in rows)
    assert re.search(r"run ended \(failed\)\s+stalled: no progress for 300 s$", rows[-1])


def test_watch_stops_cleanly_on_ctrl_c(sqlite_url: str, start_watch: Any) -> None:
    with EventLog.open(sqlite_url) as log:
        Ledger.start(log, RUN, config())
        watcher = start_watch(sqlite_url, "--json")
        started_from(watcher.next_stderr_line())  # it is inside its polling loop now
        watcher.proc.send_signal(signal.SIGINT)
        status, out, err = watcher.finish()
    assert status == 130
    assert out == []
    assert not any("Traceback" in line or "Error" in line for line in err), err


def test_watch_of_a_run_that_already_ended_prints_its_end(
    sqlite_url: str, start_watch: Any
) -> None:
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, RUN, config())
        ledger.end_run("completed", "trainer finished")
    watcher = start_watch(sqlite_url, "--json")
    status, out, err = watcher.finish()
    assert status == 0, err
    assert [json.loads(line) for line in out] == [
        {
            "kind": "end",
            "seq": 2,
            "at_us": json.loads(out[0])["at_us"],
            "outcome": "completed",
            "cause": "trainer finished",
            "at": json.loads(out[0])["at"],
        }
    ]


def test_watch_errors_are_one_line_and_status_2(sqlite_url: str, start_watch: Any) -> None:
    with EventLog.open(sqlite_url) as log:
        Ledger.start(log, RUN, config())
    for extra, run, message in (
        ((), "no-such-run", "no run 'no-such-run'"),
        (("--interval", "0"), RUN, "--interval 0.0: give a positive number of seconds"),
    ):
        watcher = start_watch(sqlite_url, *extra, run=run)
        status, out, err = watcher.finish()
        assert status == 2
        assert out == []
        assert len(err) == 1 and err[0].startswith("fleetledger: error: ") and message in err[0]


def test_follower_resumes_an_open_refit_with_its_real_start(sqlite_url: str) -> None:
    """A watch that starts mid-refit dates the refit from its start, as a replay does."""
    with EventLog.open(sqlite_url) as log:
        ledger = Ledger.start(log, RUN, config())
        ledger.refit_started(1)
        time.sleep(0.01)  # so the refit's start and the follower's view differ in time
        ledger.record_probes({i: ProbeResult.ok() for i in range(3)})
        follower = Follower(log, RUN)
        ledger.refit_completed(1)
        ledger.end_run("completed", "done")
        entries = list(follower.follow(0.01))
        full = [e for e in replay(log.read(RUN)) if e.seq > follower.started_at_seq]
    assert entries == full
    refit = next(e for e in entries if e.kind == "refit")
    assert refit.started_seq == 2 and refit.duration_us > 0
