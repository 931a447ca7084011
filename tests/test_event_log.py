"""The event log's contract, run alike on SQLite and PostgreSQL (the ``ledger_url`` fixture).

Every refused append is checked against a dump of all ledger tables taken before it:
"nothing is written" means no row of any table changed, not only that the call raised.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from fleetledger.events.codec import FIRST_STAMP, LAST_STAMP
from fleetledger.events.models import (
    ProbeRound,
    RefitStarted,
    RunEnded,
    RunStarted,
    datetime_from_us,
    iso_at,
)
from fleetledger.store.database import open_database
from fleetledger.store.errors import AppendRejected, UnknownRun
from fleetledger.store.log import EventLog
from tests.builders import (
    dump_tables,
    fleet_config,
    mixed_events,
    probe_failed,
    probe_ok,
    run_ended,
    run_started,
)

REPO = Path(__file__).resolve().parents[1]
RUN = "run-a"


def _start(log: EventLog, run: str = RUN, events: int = 4) -> list[int]:
    return log.append(run, [run_started(), *mixed_events(events)])


# ── append and read ──────────────────────────────────────────────────────────


def test_an_appended_batch_gets_seqs_1_to_n_and_reads_back_equal(log):
    batch = [run_started(), *mixed_events(18)]

    seqs = log.append(RUN, batch)

    assert seqs == list(range(1, 20))
    recorded = list(log.read(RUN))
    assert [r.seq for r in recorded] == seqs
    assert [r.run for r in recorded] == [RUN] * 19
    assert [r.event.type for r in recorded] == [e.type for e in batch]
    assert [r.event.id for r in recorded] == [e.id for e in batch]
    assert [type(r.event) for r in recorded] == [type(e) for e in batch]
    assert [r.event.model_dump() for r in recorded] == [e.model_dump() for e in batch]
    assert log.head(RUN) == 19
    assert log.config(RUN) == batch[0].config
    assert log.event_ids(RUN) == {seq: e.id for seq, e in zip(seqs, batch, strict=True)}


def test_later_appends_continue_the_sequence_and_reads_take_a_range(log):
    _start(log, events=2)
    more = mixed_events(5)

    assert log.append(RUN, more[:1]) == [4]
    assert log.append(RUN, more[1:]) == [5, 6, 7, 8]

    assert [r.event.id for r in log.read(RUN, after_seq=3)] == [e.id for e in more]
    assert [r.seq for r in log.read(RUN, after_seq=2, to_seq=5)] == [3, 4, 5]
    assert [r.seq for page in log.read_pages(RUN, after_seq=6) for r in page] == [7, 8]
    assert list(log.read(RUN, after_seq=8)) == []
    assert log.head(RUN) == 8


def test_runs_lists_every_run_with_its_head_and_whether_it_ended(log):
    log.append("first", [run_started(), *mixed_events(3)])
    log.append("second", [run_started(shards=2), probe_ok(1)])
    log.append("first", [run_ended()])

    summaries = {s.run_id: s for s in log.runs()}

    assert sorted(summaries) == ["first", "second"]
    assert (summaries["first"].head_seq, summaries["first"].ended) == (5, True)
    assert (summaries["second"].head_seq, summaries["second"].ended) == (2, False)
    for summary in summaries.values():
        assert 0 < summary.started_at_us <= summary.last_at_us
    assert [s.run_id for s in log.runs()] == sorted(
        summaries, key=lambda r: (summaries[r].started_at_us, r)
    )
    assert log.config("second").shard_count == 2
    assert log.count_events() == 7


def test_runs_are_numbered_independently(log):
    assert log.append("a", [run_started(), probe_ok(0)]) == [1, 2]
    assert log.append("b", [run_started()]) == [1]
    assert log.append("a", [probe_ok(1)]) == [3]
    assert log.append("b", [probe_ok(2)]) == [2]


# ── idempotent appends ───────────────────────────────────────────────────────


def test_a_retried_append_returns_the_stored_seqs_and_writes_nothing(log):
    _start(log)
    batch = mixed_events(6)
    first = log.append(RUN, batch)
    before = dump_tables(log.database.engine)

    again = log.append(RUN, batch)
    single = log.append(RUN, [batch[2]])

    assert again == first == [6, 7, 8, 9, 10, 11]
    assert single == [8]
    assert dump_tables(log.database.engine) == before
    assert log.count_events() == 11
    assert log.head(RUN) == 11


def test_a_retried_run_started_batch_returns_its_stored_seqs_and_writes_nothing(log):
    batch = [run_started(), *mixed_events(3)]
    assert log.append(RUN, batch) == [1, 2, 3, 4]
    before = dump_tables(log.database.engine)

    assert log.append(RUN, batch) == [1, 2, 3, 4]
    assert log.append(RUN, batch[:1]) == [1]
    # A fresh EventLog (another process, no cached config) recognises the retry as well.
    with EventLog.open(log.database.display_url) as other:
        assert other.append(RUN, batch) == [1, 2, 3, 4]

    assert dump_tables(log.database.engine) == before


def test_a_retried_final_batch_of_an_ended_run_returns_its_stored_seqs(log):
    _start(log, events=1)
    last = [probe_ok(0), run_ended()]
    assert log.append(RUN, last) == [3, 4]
    before = dump_tables(log.database.engine)

    assert log.append(RUN, last) == [3, 4]

    assert dump_tables(log.database.engine) == before


def test_a_batch_mixing_stored_and_new_events_keeps_the_old_seqs_and_numbers_the_new(log):
    stored = mixed_events(4)
    _start(log, events=0)
    assert log.append(RUN, stored) == [2, 3, 4, 5]
    new = [probe_ok(2), probe_failed(1, "error", "boom")]

    seqs = log.append(RUN, [new[0], stored[1], new[1], stored[3]])

    assert seqs == [6, 3, 7, 5]
    assert log.head(RUN) == 7
    assert [r.event for r in log.read(RUN, after_seq=5)] == new
    assert log.count_events() == 7


def test_an_event_id_twice_in_one_batch_is_rejected_and_writes_nothing(log):
    _start(log)
    before = dump_tables(log.database.engine)
    event = probe_ok(0)

    with pytest.raises(AppendRejected, match="appears twice") as caught:
        log.append(RUN, [event, probe_ok(1), event])

    assert caught.value.index == 2
    assert dump_tables(log.database.engine) == before


# ── refused appends leave the log unchanged ──────────────────────────────────


def test_appending_to_an_unknown_run_raises_unknown_run_and_writes_nothing(log):
    _start(log, run="other")
    before = dump_tables(log.database.engine)

    with pytest.raises(UnknownRun, match="run_started") as caught:
        log.append(RUN, [probe_ok(0), probe_ok(1)])

    assert caught.value.run == RUN
    assert dump_tables(log.database.engine) == before
    with pytest.raises(UnknownRun):
        log.head(RUN)
    assert [s.run_id for s in log.runs()] == ["other"]


def test_a_second_run_started_is_rejected_and_writes_nothing(log):
    _start(log)
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected, match="already started") as alone:
        log.append(RUN, [run_started()])
    with pytest.raises(AppendRejected, match="already started") as inside:
        log.append(RUN, [probe_ok(0), run_started(shards=5)])

    assert not isinstance(alone.value, UnknownRun)
    assert inside.value.index == 1
    assert dump_tables(log.database.engine) == before


def test_a_run_started_twice_in_its_first_batch_is_rejected_and_creates_no_run(log):
    _start(log, run="other")
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected, match="already started"):
        log.append(RUN, [run_started(), probe_ok(0), run_started()])

    assert dump_tables(log.database.engine) == before


def test_an_out_of_range_shard_is_rejected_naming_the_shard_and_writes_nothing(log):
    _start(log)  # shard_count=3
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected) as single:
        log.append(RUN, [probe_ok(0), probe_ok(3)])
    with pytest.raises(AppendRejected) as listed:
        log.append(RUN, [RefitStarted(weight_version=1, shards=(0, 7, 1))])
    with pytest.raises(AppendRejected) as at_start:
        log.append("new-run", [run_started(shards=2), probe_ok(2)])

    assert "shard 3 is out of range" in str(single.value)
    assert "shard_count=3" in str(single.value)
    assert single.value.index == 1
    assert "shard 7 is out of range" in str(listed.value)
    assert "shard 2 is out of range" in str(at_start.value)
    assert "shard_count=2" in str(at_start.value)
    assert dump_tables(log.database.engine) == before


def test_nothing_may_be_appended_after_run_ended_and_the_error_names_the_seq(log):
    _start(log)  # seqs 1..5
    assert log.append(RUN, [probe_ok(1), run_ended()]) == [6, 7]
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected, match=r"ended at seq 7") as after:
        log.append(RUN, [probe_ok(0)])
    with pytest.raises(AppendRejected, match=r"ended at seq 7"):
        log.append(RUN, [run_ended("failed")])
    with EventLog.open(log.database.display_url) as other:  # not a cached verdict
        with pytest.raises(AppendRejected, match=r"ended at seq 7"):
            other.append(RUN, [probe_ok(2)])

    assert not isinstance(after.value, UnknownRun)
    assert dump_tables(log.database.engine) == before
    assert [s.ended for s in log.runs()] == [True]


def test_run_ended_must_be_the_last_event_of_its_batch(log):
    _start(log)
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected, match="run_ended must be the last") as caught:
        log.append(RUN, [probe_ok(0), run_ended(), probe_ok(1)])

    assert caught.value.index == 1
    assert dump_tables(log.database.engine) == before
    # The run did not end: it still takes events.
    assert log.append(RUN, [probe_ok(2)]) == [6]


# ── timestamps ───────────────────────────────────────────────────────────────


def test_timestamps_never_go_back_within_a_run_even_when_the_clock_does(ledger_url):
    ticks = iter([5_000_000, 4_000_000, 6_000_000, 1_000_000])
    with EventLog(open_database(ledger_url), clock_us=lambda: next(ticks)) as log:
        log.append(RUN, [run_started(), probe_ok(0)])  # clock 5 s
        log.append(RUN, [probe_ok(1)])  # clock 4 s: behind the head
        log.append(RUN, [probe_ok(2), probe_ok(0)])  # 6 s
        log.append(RUN, [probe_ok(1)])  # 1 s: behind again
    with EventLog(open_database(ledger_url), clock_us=lambda: 2_000_000) as log:
        # Another run has its own head: there the clock is taken as it is.
        log.append("other", [run_started()])
        # The rule lives in the stored head, not in one process: this log's clock is
        # far behind what the first log wrote.
        log.append(RUN, [probe_ok(2)])

        at = [r.at_us for r in log.read(RUN)]
        summaries = {s.run_id: s for s in log.runs()}

    assert at == [5_000_000, 5_000_000, 5_000_000, 6_000_000, 6_000_000, 6_000_000, 6_000_000]
    assert (summaries[RUN].started_at_us, summaries[RUN].last_at_us) == (5_000_000, 6_000_000)
    assert (summaries["other"].started_at_us, summaries["other"].last_at_us) == (
        2_000_000,
        2_000_000,
    )


def test_recorded_times_come_from_the_wall_clock_by_default(log):
    before = time.time_ns() // 1_000
    _start(log, events=1)
    after = time.time_ns() // 1_000

    recorded = list(log.read(RUN))

    assert all(before <= r.at_us <= after for r in recorded)
    assert abs(recorded[0].at.timestamp() * 1_000_000 - recorded[0].at_us) < 2


# ── snapshots ────────────────────────────────────────────────────────────────


def test_load_snapshot_picks_the_newest_at_or_before_the_seq_of_the_asked_version(log):
    _start(log, events=9)  # seqs 1..10
    for seq in (2, 4, 6):
        log.save_snapshot(RUN, 1, seq, json.dumps({"v": 1, "seq": seq}))
    log.save_snapshot(RUN, 2, 5, '{"v": 2}')
    log.save_snapshot(RUN, 1, 4, json.dumps({"v": 1, "seq": 4}))  # saved twice: no error

    assert log.load_snapshot(RUN, 1) == (6, '{"v": 1, "seq": 6}')
    assert log.load_snapshot(RUN, 1, at_most_seq=5) == (4, '{"v": 1, "seq": 4}')
    assert log.load_snapshot(RUN, 1, at_most_seq=4) == (4, '{"v": 1, "seq": 4}')
    assert log.load_snapshot(RUN, 1, at_most_seq=1) is None
    assert log.load_snapshot(RUN, 2) == (5, '{"v": 2}')
    assert log.load_snapshot(RUN, 2, at_most_seq=4) is None
    assert log.load_snapshot(RUN, 3) is None
    assert log.load_snapshot("other-run", 1) is None


def test_a_snapshot_beyond_the_head_or_of_an_unknown_run_is_rejected(log):
    _start(log)  # head 5
    log.save_snapshot(RUN, 1, 5, "{}")
    before = dump_tables(log.database.engine)

    with pytest.raises(AppendRejected, match="seq 6"):
        log.save_snapshot(RUN, 1, 6, "{}")
    with pytest.raises(AppendRejected, match="seq 0"):
        log.save_snapshot(RUN, 1, 0, "{}")
    with pytest.raises(AppendRejected):
        log.save_snapshot("unknown-run", 1, 1, "{}")

    assert dump_tables(log.database.engine) == before
    assert log.load_snapshot(RUN, 1) == (5, "{}")


# ── SQLite file and connection settings ──────────────────────────────────────


def test_a_new_sqlite_ledger_file_is_readable_by_its_owner_only(sqlite_url, tmp_path):
    path = tmp_path / "ledger.db"
    assert not path.exists()

    with EventLog.open(sqlite_url) as log:
        _start(log)
        modes = {
            p.name: stat.S_IMODE(p.stat().st_mode)
            for p in tmp_path.iterdir()
            if p.name.startswith("ledger.db")
        }

    assert modes["ledger.db"] == 0o600
    assert set(modes.values()) == {0o600}, modes  # the -wal and -shm files too


def test_sqlite_connections_run_in_wal_mode_with_full_synchronous(sqlite_url):
    with EventLog.open(sqlite_url) as log:
        _start(log)
        engine = log.database.engine
        with engine.connect() as one, engine.connect() as two, log.database.write_connection() as w:
            for conn in (one, two, w):
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
                conn.rollback()


# ── several processes ────────────────────────────────────────────────────────


def _worker(*args: object, stderr=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.log_workers", *map(str, args)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def _stored(log: EventLog, run: str) -> tuple[int, int]:
    with log.database.engine.connect() as conn:
        count, top = conn.execute(
            text("SELECT count(*), max(seq) FROM fleetledger_events WHERE run_id = :run"),
            {"run": run},
        ).one()
        conn.rollback()
    return count, top


@pytest.mark.slow
def test_concurrent_appenders_in_separate_processes_share_one_gap_free_sequence(ledger_url):
    workers, per_worker = 4, 150
    with EventLog.open(ledger_url) as log:
        log.append(RUN, [RunStarted(config=fleet_config())])

    procs = [
        _worker("concurrent", ledger_url, RUN, w, per_worker, 1000 + w) for w in range(workers)
    ]
    try:
        for proc in procs:
            assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        for proc in procs:  # the barrier: every worker has its log open, now go
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err

    returned: dict[str, int] = {}
    for out, _ in outputs:
        batches = json.loads(out.strip().splitlines()[-1])["batches"]
        assert sum(len(b) for b in batches) == per_worker
        previous = 1
        for batch in batches:
            seqs = [seq for _, seq in batch]
            # One batch is one transaction: its seqs are consecutive ...
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            # ... and a worker's later append always lands after its earlier one.
            assert seqs[0] > previous
            previous = seqs[-1]
            returned.update(dict(batch))

    total = 1 + workers * per_worker
    assert len(returned) == workers * per_worker
    assert sorted(returned.values()) == list(range(2, total + 1))  # no seq given out twice
    with EventLog.open(ledger_url) as log:
        assert log.head(RUN) == total
        assert [r.seq for r in log.read(RUN)] == list(range(1, total + 1))
        stored = {event_id: seq for seq, event_id in log.event_ids(RUN).items()}
        assert _stored(log, RUN) == (total, total)
    assert {i: stored.get(i) for i in returned} == returned


def _parse_printed(out: str) -> dict[str, int]:
    """``event_id seq`` pairs of every complete line; a line cut by the kill is ignored."""
    printed: dict[str, int] = {}
    for line in out.split("\n")[:-1]:
        tokens = line.split()
        assert len(tokens) % 2 == 0 and tokens, f"malformed worker line {line!r}"
        for event_id, seq in zip(tokens[::2], tokens[1::2], strict=True):
            printed[event_id] = int(seq)
    return printed


def _kill_during_appends(proc: subprocess.Popen, delay_s: float) -> str:
    """Let the worker append for ``delay_s``, SIGKILL it, and return all it printed."""
    ready = proc.stdout.readline()
    assert ready == "ready\n", f"worker did not start: {ready!r}"
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()))
    reader.start()  # keep the pipe drained so the worker never blocks on print
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(delay_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    reader.join(timeout=30)
    proc.stdin.close()
    proc.stdout.close()
    return chunks[0]


def _crash_worker(url: str, trial: int, seed: int, tmp_path: Path) -> subprocess.Popen:
    with open(tmp_path / f"worker-{trial}.err", "w") as err:
        return _worker("crash", url, f"crash-{trial}", trial, seed, stderr=err)


def _check_after_kill(url: str, trial: int, printed: dict[str, int], where: str) -> int:
    """Everything the killed worker was told is stored, as told; returns the run's head."""
    run = f"crash-{trial}"
    database = open_database(url)  # opens cleanly after the kill
    assert (database.created, database.upgraded_from) == (False, None), where
    with EventLog(database) as log:
        if database.backend == "sqlite":
            with database.engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok", where
                conn.rollback()
        head = log.head(run)
        recorded = list(log.read(run))  # every stored row decodes
        assert [r.seq for r in recorded] == list(range(1, head + 1)), where
        assert _stored(log, run) == (head, head), where  # and no row lies beyond the head
        stored = {r.event.id: r.seq for r in recorded}
        lost = {i: s for i, s in printed.items() if stored.get(i) != s}
        assert not lost, f"{where}: returned but not stored as returned: {lost}"

        # A batch is one transaction: stored whole, in consecutive seqs, or not at all.
        batches: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
        for r in recorded[1:]:
            assert isinstance(r.event, ProbeRound) and len(r.event.failed) == 1, where
            t, b, index, size = r.event.failed[0].error.split(":")
            assert t == f"t{trial}", where
            batches[b].append((r.seq, int(index), int(size)))
        for b, members in batches.items():
            first, size = members[0][0], members[0][2]
            assert [m[1] for m in members] == list(range(size)), f"{where}: batch {b}"
            assert [m[0] for m in members] == list(range(first, first + size)), f"{where}: {b}"

        # The killed run goes on where it stopped.
        assert log.append(run, [probe_ok(0)]) == [head + 1], where
    return head + 1


@pytest.mark.slow
def test_a_killed_appender_loses_no_returned_event_and_leaves_no_partial_batch(
    ledger_url, tmp_path
):
    trials = 20
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    seeds = [rng.randrange(1 << 30) for _ in range(trials)]
    printed_total = 0
    heads: dict[str, int] = {}
    procs = {0: _crash_worker(ledger_url, 0, seeds[0], tmp_path)}
    try:
        for trial in range(trials):
            where = f"trial {trial} (seed {seed})"
            with EventLog.open(ledger_url) as log:
                log.append(f"crash-{trial}", [RunStarted(config=fleet_config())])
            if trial + 1 < trials:  # the next worker imports while this one appends
                procs[trial + 1] = _crash_worker(ledger_url, trial + 1, seeds[trial + 1], tmp_path)
            proc = procs[trial]
            out = _kill_during_appends(proc, rng.uniform(0.02, 0.4))
            assert proc.returncode == -signal.SIGKILL, (
                f"{where}: the worker exited with {proc.returncode} before it was killed: "
                + (tmp_path / f"worker-{trial}.err").read_text()
            )
            printed = _parse_printed(out)
            printed_total += len(printed)

            heads[f"crash-{trial}"] = _check_after_kill(ledger_url, trial, printed, where)
            with EventLog.open(ledger_url) as log:  # earlier runs are untouched
                assert {run: log.head(run) for run in heads} == heads, where
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # Not a vacuous pass: the workers did get appends back before they were killed.
    assert printed_total >= trials, f"only {printed_total} events were printed (seed {seed})"


def _race_to_start(log, run, barrier, results, i):
    batch = [run_started(), *mixed_events(2)]
    barrier.wait()
    try:
        results[i] = (batch, log.append(run, batch))
    except AppendRejected as exc:
        results[i] = exc


def test_of_several_logs_racing_to_start_one_run_exactly_one_wins(ledger_url):
    logs = [EventLog.open(ledger_url) for _ in range(4)]
    try:
        for trial in range(5):
            run = f"race-{trial}"
            barrier = threading.Barrier(len(logs))
            results: list[object] = [None] * len(logs)

            threads = [
                threading.Thread(target=_race_to_start, args=(opened, run, barrier, results, i))
                for i, opened in enumerate(logs)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)

            won = [r for r in results if isinstance(r, tuple)]
            lost = [r for r in results if isinstance(r, AppendRejected)]
            assert len(won) == 1 and len(lost) == len(logs) - 1, results
            assert all("already started" in str(r) for r in lost)
            batch, seqs = won[0]
            assert seqs == [1, 2, 3]
            assert [r.event for r in logs[0].read(run)] == batch
    finally:
        for opened in logs:
            opened.close()


def test_a_run_id_must_be_printable_and_bounded(log):
    with pytest.raises(AppendRejected, match="printable"):
        log.append("", [run_started()])
    with pytest.raises(AppendRejected, match="printable"):
        log.append("x" * 129, [run_started()])
    with pytest.raises(AppendRejected, match="printable"):
        log.append("tab\there", [run_started()])
    assert log.runs() == []
    assert log.append("x" * 128, [run_started()]) == [1]


def test_a_run_ended_in_its_first_batch_is_recorded_as_ended(log):
    assert log.append(RUN, [run_started(), RunEnded(outcome="aborted", cause="x")]) == [1, 2]
    with pytest.raises(AppendRejected, match="ended at seq 2"):
        log.append(RUN, [probe_ok(0)])


def test_a_writer_whose_remembered_head_is_stale_still_appends_gap_free(ledger_url):
    """Each log remembers the head it left; another writer moving it must not matter."""
    with EventLog.open(ledger_url) as first, EventLog.open(ledger_url) as second:
        assert first.append("shared", [run_started(shards=2)]) == [1]
        assert first.append("shared", [probe_ok(0)]) == [2]
        assert second.append("shared", [probe_ok(1)] * 1 + [probe_ok(0)]) == [
            3,
            4,
        ]
        # ``first`` remembers head 2; seq 3 is taken, so it must re-read and take 5.
        assert first.append("shared", [probe_failed(1, "timeout")]) == [5]
        assert second.append("shared", [run_ended()]) == [6]
        before = [(r.seq, r.event.id) for r in first.read("shared")]
        with pytest.raises(AppendRejected, match="ended at seq 6"):
            first.append("shared", [probe_ok(0)])
        assert [(r.seq, r.event.id) for r in second.read("shared")] == before


def test_writer_connections_of_exited_threads_are_returned(sqlite_url):
    """Each thread keeps a write connection; threads that exit must not drain the pool.

    Before the fix the 15th short-lived thread waited 30 s for a pooled connection and
    failed with a raw SQLAlchemy TimeoutError.
    """
    with EventLog.open(sqlite_url) as log:
        log.append("threads", [run_started(shards=2)])
        errors: list[BaseException] = []

        def append_once(shard: int) -> None:
            try:
                log.append("threads", [probe_ok(shard % 2)])
            except BaseException as exc:  # reported below, with the thread's index
                errors.append(exc)

        for i in range(20):  # the pool holds 15: a leak makes the 16th wait, then fail
            thread = threading.Thread(target=append_once, args=(i,))
            thread.start()
            thread.join()
        assert errors == []
        assert log.head("threads") == 21


def test_the_codec_stores_what_model_dump_json_writes() -> None:
    """The codec calls pydantic's serializer directly: the stored text is what
    ``model_dump_json`` writes without the id and the type (their columns hold them)."""
    from fleetledger.events.codec import EventCodec
    from fleetledger.events.models import RunEnded, RunStarted
    from tests.projection_builders import every_event_naming, fleet_config

    codec = EventCodec()
    events = [
        RunStarted(config=fleet_config()),
        RunEnded(outcome="failed", cause="ünïcödé \u2028 \x1b[31m"),
        *every_event_naming(1, 3),
    ]
    for event in events:
        assert codec.encode(event)[2] == event.model_dump_json(exclude={"id", "type"}), event.type


@given(st.integers(min_value=FIRST_STAMP, max_value=LAST_STAMP))
def test_a_stamp_is_written_as_datetime_writes_it(at_us: int) -> None:
    """``iso_at`` keeps the second's text between calls: what it writes must be what the
    datetime of the stamp writes, for every stamp a log stores or names."""
    expected = datetime_from_us(at_us).isoformat(timespec="microseconds")
    assert iso_at(at_us) == expected.replace("+00:00", "Z")
    assert iso_at(at_us, "seconds") == datetime_from_us(at_us).isoformat(
        timespec="seconds"
    ).replace("+00:00", "Z")
