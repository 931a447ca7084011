"""``replay``, ``membership --at SEQ|TIME`` and ``EventLog.seq_at``, on real ledgers.

The expected answers come from the pure projections folded over what the log holds
(``projections.history.replay``, ``fold``) — or, for ``seq_at``, from a brute-force
scan of the stored times — never from the code under test. The demo run is written
through the real ingest facade; the property tests write a random run through a
``Ledger`` that snapshots often, with a clock that repeats and jumps, so the nearest
snapshot and equal timestamps are both exercised.
"""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields
from datetime import timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.controller.demo import run_demo
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.errors import LedgerError
from fleetledger.events.ids import new_event_id
from fleetledger.events.models import (
    FleetConfig,
    RunStarted,
    ShardOutcomes,
    datetime_from_us,
    iso_at,
)
from fleetledger.projections.fleet_view import FleetView, fold
from fleetledger.projections.history import (
    ENTRY_TYPES,
    EndEntry,
    Entry,
    EpochEntry,
    RefitEntry,
    StallEntry,
    TransitionEntry,
    replay,
)
from fleetledger.projections.membership import membership_document
from fleetledger.projections.shard_states import Input, ShardState
from fleetledger.projections.snapshot import PROJECTION_VERSION
from fleetledger.store.errors import UnknownRun
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok
from tests.cli_support import invoke, run_cli, stderr_on_a_terminal, with_progress_after

pytestmark = pytest.mark.usefixtures("cli_sandbox")

DEMO_RUN = "demo-under-test"
DEMO_EVENTS = 19
CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"


def fails(*args: str) -> str:
    """Run a command that must fail the CLI way: status 2, one line on stderr."""
    result = run_cli(*args)
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert "Traceback" not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetledger: error: "), result.stderr
    return lines[0]


def normalised(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What JSON makes of these documents (tuples become lists, int keys strings)."""
    return json.loads(json.dumps(docs))


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def replay_json(url: str, run: str, *extra: str) -> list[dict[str, Any]]:
    return json_lines(invoke("replay", run, "--json", "--db", url, *extra).stdout)


def expected_entries(url: str, run: str, to_seq: int | None = None) -> list[Entry]:
    with EventLog.open(url) as log:
        return list(replay(log.read(run, to_seq=to_seq)))


def as_docs(entries: list[Entry]) -> list[dict[str, Any]]:
    return normalised([e.as_json() for e in entries])


def stored_times(url: str, run: str) -> list[int]:
    """``times[seq - 1]`` is the stored time of ``seq``."""
    with EventLog.open(url) as log:
        return [r.at_us for r in log.read(run)]


def last_seq_at(times: list[int], at_us: int) -> int:
    """Brute force: the last seq stamped at or before ``at_us`` (0: none)."""
    return max((i + 1 for i, t in enumerate(times) if t <= at_us), default=0)


def iso(at_us: int, offset_minutes: int = 0) -> str:
    zone = timezone(timedelta(minutes=offset_minutes))
    return datetime_from_us(at_us).astimezone(zone).isoformat(timespec="microseconds")


@pytest.fixture
def demo_url(ledger_url: str) -> str:
    """The demo run, written through the real ingest facade, on each backend."""
    with EventLog.open(ledger_url) as log:
        for _ in run_demo(log, DEMO_RUN):
            pass
    return ledger_url


@pytest.fixture
def demo_sqlite(sqlite_url: str) -> str:
    with EventLog.open(sqlite_url) as log:
        for _ in run_demo(log, DEMO_RUN):
            pass
    return sqlite_url


# ── replay: what it prints ─────────────────────────────────────────────────────


def test_replay_table_tells_the_demo_story(demo_url: str) -> None:
    out = invoke("replay", DEMO_RUN, "--db", demo_url).stdout
    lines = out.splitlines()
    entries = expected_entries(demo_url, DEMO_RUN)
    # Off a terminal nothing wraps and no rule is drawn: a title, the header, one line
    # per entry, each opening with its whole date.
    assert lines[0].startswith(f"run {DEMO_RUN}: seqs 1..{DEMO_EVENTS}, ")
    assert lines[0].endswith(f"UTC, {len(entries)} entries")
    assert re.match(r"time \(UTC\)\s+seq\s+shard\s+what\s+why / detail$", lines[1])
    rows = lines[2:]
    assert all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\s", row) for row in rows)
    assert len(rows) == len(entries)
    assert [int(row.split()[2]) for row in rows] == [e.seq for e in entries]
    assert all(line == line.rstrip() for line in lines)

    def row(seq: int, shard: str, what: str, detail: str) -> None:
        # The detail is matched as a prefix: durations and long reasons vary.
        pattern = rf"^\S+ \S+\s+{seq}\s+{re.escape(shard)}\s+{re.escape(what)}\s*"
        pattern += re.escape(detail)
        assert [r for r in rows if re.match(pattern, r)], f"no row {pattern!r} in\n{out}"

    row(1, "", "epoch 0", "serving [0,1,2,3] · absent [] · world 10: trainers → ranks 0–1, "
        "shard 0 → ranks 2–3, shard 1 → ranks 4–5, shard 2 → ranks 6–7, "
        "shard 3 → ranks 8–9")  # fmt: skip
    row(3, "", "refit v1 completed", "seq 2→3, ")
    row(4, "2", "HEALTHY → SUSPECT", "failed probe: timeout: no answer within "
        "probe_timeout_s=2 [evidence: seq 4]")  # fmt: skip
    # Each probe round is one event: shard 2's three timeouts are the rounds at 4, 5, 6;
    # the last said what the first said, which the table printed whole at seq 4.
    dead = (
        "3 consecutive failed probes ≥ unhealthy_threshold 3 "
        "(last: same cause as seq 4) [evidence: seq 4, 5, 6]"
    )
    row(6, "2", "SUSPECT → DEAD", dead)
    row(6, "", "epoch 1", "serving [0,1,3] · absent [2] · world 8: trainers → ranks 0–1, "
        "shard 0 → ranks 2–3, shard 1 → ranks 4–5, shard 3 → ranks 6–7")  # fmt: skip
    row(8, "2", "restart requested", "")
    row(8, "2", "DEAD → RESTARTING", "restart requested (attempt 1 of 5) [evidence: seq 8]")
    row(9, "2", "restart loaded", "http://127.0.0.1:8012/v1")
    row(9, "2", "RESTARTING → STALE", "replacement loaded; it holds start-up weights")
    row(11, "2", "STALE → HEALTHY", "refit completed at weight version 2 [evidence: seq 11]")
    row(12, "1", "HEALTHY → SUSPECT", "failed probe: error: HTTP 503")
    row(14, "", "refit v3 aborted", "seq 13→14, ")
    assert re.search(
        r"refit v3 aborted\s+seq 13→14, \d+\.\d{3} s, shards \[0,1,2,3\]; broadcast did not "
        r"finish within refit_timeout_s=30$",
        out,
        flags=re.MULTILINE,
    )
    row(15, "", "weights partial", "refit at weight version 3 aborted; shards [0,1,2,3]")
    row(15, "1", "SUSPECT → STALE", "weights partial: refit at version 3 aborted")
    row(15, "", "epoch 3", "serving [] · absent [] · world 10")
    row(16, "1", "condemned", "the only SUSPECT shard when refit 3 aborted")
    row(16, "1", "STALE → DEAD", "condemned as the silent participant: the only SUSPECT shard")
    row(18, "", "refit v3 completed", "seq 17→18, ")
    row(18, "", "epoch 4", "serving [0,2,3] · absent [1] · world 8: trainers → ranks 0–1, "
        "shard 0 → ranks 2–3, shard 2 → ranks 4–5, shard 3 → ranks 6–7")  # fmt: skip
    assert re.match(r"^\S+ \S+\s+19\s+run ended \(completed\)\s+demo script finished$", rows[-1])


def test_replay_json_lines_equal_the_history_projection(demo_url: str) -> None:
    docs = replay_json(demo_url, DEMO_RUN)
    assert docs == as_docs(expected_entries(demo_url, DEMO_RUN))
    kinds = [d["kind"] for d in docs]
    assert kinds.count("refit") == 4 and kinds[-1] == "end"
    # A membership entry at each change of the serving set (the epoch: 5) and at each
    # change of the absent set alone (the layout: the replacement loaded at seq 9, the
    # condemnation at 16 — STALE → DEAD leaves the serving set as it was).
    membership = [(d["seq"], d["epoch_moved"]) for d in docs if d["kind"] == "epoch"]
    assert [seq for seq, moved in membership if moved] == [1, 6, 11, 15, 18]
    assert [seq for seq, moved in membership if not moved] == [9, 16]
    aborted = [d for d in docs if d["kind"] == "refit" and d["outcome"] == "aborted"]
    assert len(aborted) == 1
    assert aborted[0]["reason"] == "broadcast did not finish within refit_timeout_s=30"
    assert (aborted[0]["started_seq"], aborted[0]["seq"]) == (13, 14)
    assert aborted[0]["participants"] == [0, 1, 2, 3]
    dead = [d for d in docs if d["kind"] == "transition" and d["after"] == "DEAD"]
    assert [(d["seq"], d["shard"], d["evidence"]) for d in dead] == [
        (6, 2, [4, 5, 6]),
        (16, 1, [16]),
    ]


def test_replay_json_keys_are_each_entrys_fields_and_its_declared_derived_keys(
    demo_sqlite: str,
) -> None:
    docs = replay_json(demo_sqlite, DEMO_RUN)
    entries = expected_entries(demo_sqlite, DEMO_RUN)
    assert {type(e) for e in entries} == set(ENTRY_TYPES) - {StallEntry}  # the demo never stalls
    for entry, doc in zip(entries, docs, strict=True):
        assert list(doc) == [*entry.JSON_DERIVED, *(f.name for f in fields(entry))]
        assert (doc["kind"], doc["at_us"], doc["at"]) == (
            entry.kind,
            entry.at_us,
            iso_at(entry.at_us),
        )
        if isinstance(entry, RefitEntry):
            assert doc["started_at"] == iso_at(entry.started_at_us)
            assert doc["duration_s"] == (entry.at_us - entry.started_at_us) / 1e6


def test_transition_entries_hold_the_folds_states_and_inputs(demo_sqlite: str) -> None:
    moves = [e for e in expected_entries(demo_sqlite, DEMO_RUN) if isinstance(e, TransitionEntry)]
    assert moves
    for t in moves:
        assert type(t.before) is ShardState and type(t.after) is ShardState, t
        assert type(t.input) is Input, t
    died = next(t for t in moves if t.after is ShardState.DEAD)
    assert (died.before, died.input) == (ShardState.SUSPECT, Input.PROBE_FAILED)


def test_replay_from_is_the_full_replay_from_that_seq(demo_sqlite: str) -> None:
    """Folding up to SEQ-1 silently loses nothing: not even the start of an open refit."""
    full = replay_json(demo_sqlite, DEMO_RUN)
    for start in range(1, DEMO_EVENTS + 1):
        assert replay_json(demo_sqlite, DEMO_RUN, "--from", str(start)) == [
            d for d in full if d["seq"] >= start
        ], f"--from {start}"
    # Seq 14 aborts the refit opened at 13: its start and duration survive the cut.
    cut = replay_json(demo_sqlite, DEMO_RUN, "--from", "14")
    assert cut[0]["kind"] == "refit" and cut[0]["started_seq"] == 13
    assert (
        cut[0]["started_at"]
        == next(d for d in full if d["kind"] == "refit" and d["seq"] == 14)["started_at"]
    )


def test_replay_to_and_until_stop_where_a_truncated_log_stops(demo_sqlite: str) -> None:
    times = stored_times(demo_sqlite, DEMO_RUN)
    for to in (1, 2, 6, 13, 14, DEMO_EVENTS):
        expected = as_docs(expected_entries(demo_sqlite, DEMO_RUN, to))
        assert replay_json(demo_sqlite, DEMO_RUN, "--to", str(to)) == expected, f"--to {to}"
    # Seq 13 opened refit v3: a replay stopped there shows it as still open.
    open_refit = replay_json(demo_sqlite, DEMO_RUN, "--to", "13")[-1]
    assert (open_refit["kind"], open_refit["outcome"], open_refit["started_seq"]) == (
        "refit",
        "open",
        13,
    )
    for seq in (1, 6, 11, 18):
        for at in (times[seq - 1], times[seq - 1] + 1, times[seq] - 1):
            last = last_seq_at(times, at)
            expected = as_docs(expected_entries(demo_sqlite, DEMO_RUN, last))
            for offset in (0, 90, -420):
                until = iso(at, offset)
                assert replay_json(demo_sqlite, DEMO_RUN, "--until", until) == expected, until
    # With --from as well: the window between the two.
    window = replay_json(demo_sqlite, DEMO_RUN, "--from", "6", "--until", iso(times[10]))
    full = as_docs(expected_entries(demo_sqlite, DEMO_RUN, last_seq_at(times, times[10])))
    assert window == [d for d in full if d["seq"] >= 6]
    assert window[0]["seq"] == 6 and window[-1]["seq"] == 11


@pytest.mark.parametrize("shard", [0, 1, 2, 3])
def test_replay_shard_keeps_that_shards_entries_and_the_end(demo_sqlite: str, shard: int) -> None:
    entries = expected_entries(demo_sqlite, DEMO_RUN)
    expected = as_docs([e for e in entries if shard in e.shards or isinstance(e, EndEntry)])
    docs = replay_json(demo_sqlite, DEMO_RUN, "--shard", str(shard))
    assert docs == expected
    assert docs[-1]["kind"] == "end"
    assert all(d["shard"] == shard for d in docs if d["kind"] == "transition")
    table = invoke("replay", DEMO_RUN, "--shard", str(shard), "--db", demo_sqlite).stdout
    assert table.splitlines()[0].endswith(f"{len(expected)} entries about shard {shard}")


def test_replay_shard_two_tells_its_death_and_return(demo_sqlite: str) -> None:
    docs = replay_json(demo_sqlite, DEMO_RUN, "--shard", "2")
    path = [(d["before"], d["after"]) for d in docs if d["kind"] == "transition"]
    assert path == [
        ("HEALTHY", "SUSPECT"),
        ("SUSPECT", "DEAD"),
        ("DEAD", "RESTARTING"),
        ("RESTARTING", "STALE"),
        ("STALE", "HEALTHY"),
        ("HEALTHY", "STALE"),
        ("STALE", "HEALTHY"),
    ]
    assert [d["action"] for d in docs if d["kind"] == "restart"] == ["requested", "loaded"]


def test_replay_errors_are_one_line_and_status_2(demo_sqlite: str) -> None:
    db = ("--db", demo_sqlite)
    times = stored_times(demo_sqlite, DEMO_RUN)
    both = fails("replay", DEMO_RUN, "--to", "5", "--until", iso(times[4]), *db)
    assert "--to SEQ or --until TIME, not both" in both
    assert "no time zone" in fails("replay", DEMO_RUN, "--until", "2026-11-29T10:00:00", *db)
    assert "not an ISO 8601 time" in fails("replay", DEMO_RUN, "--until", "yesterday", *db)
    before = fails("replay", DEMO_RUN, "--until", iso(times[0] - 1), *db)
    assert f"run {DEMO_RUN!r} began at" in before and "before its first event" in before
    assert "valid shards 0..3" in fails("replay", DEMO_RUN, "--shard", "4", *db)
    assert "cannot start at seq 20" in fails("replay", DEMO_RUN, "--from", "20", *db)
    assert "cannot start at seq 0" in fails("replay", DEMO_RUN, "--from", "0", *db)
    assert "cannot stop at seq 40" in fails("replay", DEMO_RUN, "--to", "40", *db)
    assert "empty range" in fails("replay", DEMO_RUN, "--from", "12", "--to", "10", *db)
    assert "no run 'nope'" in fails("replay", "nope", *db)


@pytest.mark.parametrize("form", ["jsonl", "bundle"])
def test_export_import_replay_is_identical(demo_sqlite: str, tmp_path: Path, form: str) -> None:
    exported = tmp_path / f"demo.{form}"
    how = ("-o", str(exported)) if form == "jsonl" else ("--bundle", str(exported))
    invoke("export", DEMO_RUN, *how, "--db", demo_sqlite)
    invoke("import", str(exported), "--run", "copy", "--db", demo_sqlite)
    original = invoke("replay", DEMO_RUN, "--json", "--db", demo_sqlite).stdout
    copied = invoke("replay", "copy", "--json", "--db", demo_sqlite).stdout
    assert copied == original and len(original.splitlines()) > 20
    # The table too, but for the run id in its title line.
    table = invoke("replay", DEMO_RUN, "--db", demo_sqlite).stdout
    copy_table = invoke("replay", "copy", "--db", demo_sqlite).stdout
    assert copy_table.replace("run copy:", f"run {DEMO_RUN}:", 1) == table


def test_history_transitions_and_epochs_are_the_folds(sqlite_url: str) -> None:
    """The history's transitions are the fold's, and its membership entries are where
    the fold's epoch moved or its absent set changed (the layout).

    Checked against ``FleetView.apply`` event by event, so a shortcut in
    ``History.feed`` (it takes one for probe results and adapter windows) cannot drop or
    invent an entry unnoticed.
    """
    with EventLog.open(sqlite_url, clock_us=stepping_clock(5)) as log:
        write_random_run(log, "wander", seed=5, steps=150, snapshot_every=10_000)
        recorded = list(log.read("wander"))
    entries = list(replay(recorded))
    view = FleetView.start(recorded[0])
    transitions: list[TransitionEntry] = []
    memberships = [(1, 0, True)]
    shown_absent = view.absent
    for r in recorded[1:]:
        before = view.epoch
        transitions += [TransitionEntry.of(t) for t in view.apply(r)]
        if view.epoch != before or view.absent != shown_absent:
            memberships.append((r.seq, view.epoch, view.epoch != before))
            shown_absent = view.absent
    assert [e for e in entries if isinstance(e, TransitionEntry)] == transitions
    shown = [(e.seq, e.epoch, e.epoch_moved) for e in entries if isinstance(e, EpochEntry)]
    assert shown == memberships
    assert len(transitions) > 50 and sum(moved for *_, moved in memberships) > 5
    assert not all(moved for *_, moved in memberships)  # the layout alone moved too


# ── progress ───────────────────────────────────────────────────────────────────


def test_progress_is_drawn_on_a_terminal_stderr_and_never_on_stdout(demo_sqlite: str) -> None:
    stdout, drawn = stderr_on_a_terminal(
        with_progress_after(0.0, "replay", DEMO_RUN, "--db", demo_sqlite)
    )
    assert f"replaying {DEMO_RUN}: " in drawn
    assert re.search(rf"[0-9,]+ of {DEMO_EVENTS:,} events \([0-9]+%\) · [0-9,]+/s · ", drawn)
    assert "replaying" not in stdout and "\x1b" not in stdout
    assert f"run {DEMO_RUN}: seqs 1..{DEMO_EVENTS}" in stdout


@pytest.mark.parametrize(
    ("delay_s", "args"),
    [
        (3600.0, ()),  # a fold shorter than the delay
        (0.0, ("--json",)),  # --json is for a program: never progress
    ],
    ids=["shorter_than_the_delay", "json"],
)
def test_no_progress_for_a_short_fold_or_json(
    demo_sqlite: str, delay_s: float, args: tuple[str, ...]
) -> None:
    stdout, drawn = stderr_on_a_terminal(
        with_progress_after(delay_s, "replay", DEMO_RUN, "--db", demo_sqlite, *args)
    )
    assert "replaying" not in drawn
    if args:
        assert json_lines(stdout) == as_docs(expected_entries(demo_sqlite, DEMO_RUN))


def test_no_progress_when_stderr_is_not_a_terminal(demo_sqlite: str) -> None:
    proc = subprocess.run(
        with_progress_after(0.0, "replay", DEMO_RUN, "--db", demo_sqlite),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"run {DEMO_RUN}: seqs 1..{DEMO_EVENTS}" in proc.stdout


def test_replay_piped_into_a_reader_that_stops_early_is_quiet(sqlite_url: str) -> None:
    """``replay | head``: no error message and no traceback when the reader goes away."""
    with EventLog.open(sqlite_url) as log:
        # A shard that blips and recovers, over and over: far more output than a pipe holds.
        log.append("blips", [RunStarted(config=FleetConfig(
            shard_count=1, train_world_size=1, base_urls=("http://gen-0.test:8000/v1",)
        ))])  # fmt: skip
        blip = [probe_failed(0, "error", "HTTP 503")]
        recover = [probe_ok(0), probe_ok(0)]
        for _ in range(4):
            log.append("blips", [e.model_copy(update={"id": new_event_id()})
                                 for _ in range(500) for e in (*blip, *recover)])  # fmt: skip
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f"{CONSOLE_SCRIPT} replay blips --json --db {sqlite_url} | head -c 100 >/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""


# ── seq_at ─────────────────────────────────────────────────────────────────────


def stepping_clock(seed: int) -> Callable[[], int]:
    """A recorder's clock that often repeats (batches share a stamp) and sometimes jumps."""
    rng = random.Random(seed)
    now = [1_795_000_000_000_000]

    def clock() -> int:
        now[0] += rng.choice([0, 0, 1, 7, 1_000, 250_000, 3_600_000_000])
        return now[0]

    return clock


def test_seq_at_is_the_last_seq_stamped_at_or_before(ledger_url: str) -> None:
    """On both backends, against a brute-force scan of the stored times."""
    with EventLog.open(ledger_url, clock_us=stepping_clock(7)) as log:
        write_random_run(log, "timed", seed=7, steps=60, snapshot_every=1_000)
        times = [r.at_us for r in log.read("timed")]
        assert len(set(times)) < len(times)  # plateaus: several seqs share a stamp
        probes = sorted({t + d for t in times for d in (-1, 0, 1)})
        for at in probes:
            if at < times[0]:
                continue
            assert log.seq_at("timed", at) == last_seq_at(times, at), at
        assert log.seq_at("timed", times[-1] + 10**12) == len(times)
        with pytest.raises(LedgerError) as before:
            log.seq_at("timed", times[0] - 1)
        assert str(before.value) == (
            f"run 'timed' began at {iso(times[0]).replace('+00:00', 'Z')} (seq 1); "
            f"{iso(times[0] - 1).replace('+00:00', 'Z')} is before its first event"
        )
        with pytest.raises(UnknownRun):
            log.seq_at("no-such-run", times[0])


def test_seq_at_bisects_with_a_logarithmic_number_of_point_lookups(sqlite_url: str) -> None:
    """A scan would read the whole run; the bisection reads about log2(n) rows."""
    with EventLog.open(sqlite_url, clock_us=stepping_clock(11)) as log:
        write_random_run(log, "long", seed=11, steps=400, snapshot_every=10_000)
        times = [r.at_us for r in log.read("long")]
        statements: list[str] = []
        log.database.reads.configure(lambda conn: conn.set_trace_callback(statements.append))
        bound = math.ceil(math.log2(len(times))) + 1
        for at in (times[0], times[len(times) // 3], times[-2], times[-1] - 1):
            statements.clear()
            assert log.seq_at("long", at) == last_seq_at(times, at)
            lookups = [s for s in statements if "seq =" in s and "at_us" in s.split("FROM")[0]]
            assert 1 <= len(lookups) <= bound, (len(times), len(lookups))


# ── membership --at SEQ|TIME, against a fresh fold (hypothesis) ────────────────


def write_random_run(
    log: EventLog, run: str, *, seed: int, steps: int, snapshot_every: int
) -> Ledger:
    """A run that wanders through every state, written through the ingest facade.

    Decisions follow the fold, as a controller's would: the dead are restarted, the
    replaced are refitted back, refits sometimes abort (with partial weights and, with
    one suspect, a condemnation), and the run ends.
    """
    rng = random.Random(seed)
    shards = 4
    config = FleetConfig(
        shard_count=shards,
        workers_per_shard=2,
        train_world_size=2,
        max_restart_attempts_per_shard=3,
        base_urls=tuple(f"http://gen-{i}.test:8000/v1" for i in range(shards)),
    )
    ledger = Ledger.start(log, run, config, snapshot_every=snapshot_every)
    version = 0
    for step in range(steps):
        view = ledger.view
        states = [view.state_of(i) for i in range(shards)]
        roll = rng.random()
        dead = [i for i, s in enumerate(states) if s is ShardState.DEAD]
        restarting = [i for i, s in enumerate(states) if s is ShardState.RESTARTING]
        if dead and roll < 0.5:
            ledger.restart_requested(rng.choice(dead))
        elif restarting and roll < 0.5:
            shard = rng.choice(restarting)
            if rng.random() < 0.3:
                ledger.restart_failed(shard, "engine failed to start")
            else:
                ledger.replacement_loaded(shard, f"http://gen-{shard}-r{step}.test:8000/v1")
        elif roll < 0.15 and any(not r.absent for r in view.shards):
            version += 1
            ledger.refit_started(version)
            if rng.random() < 0.25:
                suspects = view.suspected
                ledger.refit_aborted(version, "broadcast timed out")
                ledger.mark_weights_partial(version)
                if len(suspects) == 1:
                    ledger.condemn_silent_participant(suspects[0], "the only suspect")
            else:
                ledger.refit_completed(version)
        elif roll < 0.25:
            ledger.report_outcomes(
                "adapter-0",
                [
                    ShardOutcomes(shard=i, successes=rng.randint(0, 3))
                    for i in range(shards)
                    if view.shards[i].serving
                ]
                or [ShardOutcomes(shard=0)],
            )
        else:
            results = {}
            for i in range(shards):
                kind = rng.random()
                results[i] = (
                    ProbeResult("timeout", "no answer")
                    if kind < 0.2
                    else ProbeResult("died", "exit 137")
                    if kind < 0.23
                    else ProbeResult.ok()
                )
            ledger.record_probes(results)
    ledger.end_run("completed", "random run finished")
    return ledger


def membership_at(url: str, run: str, at: str) -> dict[str, Any]:
    return json.loads(invoke("membership", run, "--at", at, "--json", "--db", url).stdout)


def fresh_fold_document(url: str, run: str, seq: int) -> dict[str, Any]:
    with EventLog.open(url) as log:
        view = fold(log.read(run, to_seq=seq))
    return json.loads(json.dumps(membership_document(view)))


def test_membership_at_seq_or_time_equals_a_fresh_fold(sqlite_url: str) -> None:
    with EventLog.open(sqlite_url, clock_us=stepping_clock(3)) as log:
        write_random_run(log, "wander", seed=3, steps=120, snapshot_every=9)
        head = log.head("wander")
    times = stored_times(sqlite_url, "wander")
    with EventLog.open(sqlite_url) as log:
        # Several snapshots sit inside the run, so most answers start from one.
        assert log.load_snapshot("wander", PROJECTION_VERSION, head) is not None
        assert log.load_snapshot("wander", PROJECTION_VERSION, 10) is not None

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        seq=st.integers(1, head),
        at=st.integers(times[0], times[-1]),
        offset=st.integers(-14 * 60, 14 * 60),
    )
    def check(seq: int, at: int, offset: int) -> None:
        by_seq = membership_at(sqlite_url, "wander", str(seq))
        assert by_seq["seq"] == seq
        assert by_seq == fresh_fold_document(sqlite_url, "wander", seq)
        expected_seq = last_seq_at(times, at)
        by_time = membership_at(sqlite_url, "wander", iso(at, offset))
        assert by_time["seq"] == expected_seq
        assert by_time == fresh_fold_document(sqlite_url, "wander", expected_seq)

    check()


def test_membership_at_time_errors(demo_sqlite: str) -> None:
    times = stored_times(demo_sqlite, DEMO_RUN)
    db = ("--db", demo_sqlite)
    naive = fails("membership", DEMO_RUN, "--at", "2026-11-29T10:25:43", *db)
    assert "--at '2026-11-29T10:25:43' has no time zone" in naive
    assert "2026-11-29T10:25:43Z" in naive  # the message shows how to write it
    bad = fails("membership", DEMO_RUN, "--at", "noon", *db)
    assert "is not a seq (an integer) or an ISO 8601 time" in bad
    before = fails("membership", DEMO_RUN, "--at", iso(times[0] - 1_000_000), *db)
    assert "before its first event" in before and DEMO_RUN in before
    assert "has seqs 1..19" in fails("membership", DEMO_RUN, "--at", "20", *db)
    # After the last event: the head.
    assert membership_at(demo_sqlite, DEMO_RUN, iso(times[-1] + 10**9))["seq"] == DEMO_EVENTS
