"""The ``fleetledger`` command line, on real SQLite files and the real PostgreSQL server.

Most tests drive ``fleetledger.cli.app`` through typer's ``CliRunner`` (stdout and
stderr captured apart); one runs the installed console script in a subprocess, with no
``--db`` and no ``$FLEETLEDGER_DB``, the way a first-time user would.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetledger.controller.ledger import Ledger
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.membership import membership_document
from fleetledger.store.log import EventLog
from fleetledger.store.revisions import head_revision
from tests.builders import fleet_config
from tests.cli_support import invoke, run_cli

pytestmark = pytest.mark.usefixtures("cli_sandbox")

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
DEMO_EVENTS = 19
DEMO_STEPS = 16


def only_run(url: str) -> str:
    with EventLog.open(url) as log:
        runs = [s.run_id for s in log.runs()]
    assert len(runs) == 1, runs
    return runs[0]


def folded_document(url: str, run: str, to_seq: int | None = None) -> dict[str, Any]:
    """membership_document of a fresh fold of the stored events 1..to_seq, JSON-normalised."""
    with EventLog.open(url) as log:
        view = fold(log.read(run, to_seq=to_seq))
    return json.loads(json.dumps(membership_document(view)))


def membership_json(url: str, run: str, *extra: str) -> dict[str, Any]:
    return json.loads(invoke("membership", run, "--json", "--db", url, *extra).stdout)


# ── demo ───────────────────────────────────────────────────────────────────────


def test_demo_prints_every_step_and_the_final_membership(sqlite_url: str) -> None:
    result = invoke("demo", "--db", sqlite_url)
    out = result.stdout
    run = only_run(sqlite_url)
    final = folded_document(sqlite_url, run)

    steps = re.findall(r"^\s*(\d+)\. (.+)$", out, flags=re.MULTILINE)
    assert [int(n) for n, _ in steps] == list(range(1, DEMO_STEPS + 1))
    titles = [t for _, t in steps]
    assert titles[0].startswith("run started: 4 shards")
    assert titles[-1] == "run ends"
    assert "exactly one suspect (shard 1): condemned as the silent participant" in titles
    # Each step prints the state after it: one 'seq … · epoch …' line per step.
    assert len(re.findall(r"^\s+seq \d+ · epoch \d+ · serving ", out, flags=re.MULTILINE)) == (
        DEMO_STEPS
    )
    # The transitions that tell the demo's two stories.
    assert "shard 2: SUSPECT → DEAD (3 consecutive failed probes" in out
    assert "shard 2: RESTARTING → STALE (replacement loaded" in out
    assert "shard 2: STALE → HEALTHY (refit completed at weight version 2)" in out
    assert "shard 1: STALE → DEAD (condemned as the silent participant" in out

    # The final membership, as folding the stored run computes it.
    assert final["shards"]["1"]["state"] == "DEAD"
    assert final["shards"]["1"]["since_rule"].startswith("condemned as the silent participant")
    assert final["shards"]["2"]["state"] == "HEALTHY"
    assert final["shards"]["2"]["restart_attempts"] == 1
    assert final["serving"] == [0, 2, 3] and final["absent"] == [1]
    assert final["seq"] == DEMO_EVENTS
    summary = (
        f"run {run} at seq {DEMO_EVENTS} "
        f"({final['at']}): epoch {final['epoch']}, serving [0, 2, 3], absent [1], suspected []"
    )
    assert summary in out
    assert final["epoch"] == 4  # the serving set changed at seqs 6, 11, 15 and 18
    assert re.search(r"│\s*1\s*│\s*DEAD\s*│\s*2\s*│\s*0\s*│\s*16\s*│", out)
    assert re.search(r"│\s*2\s*│\s*HEALTHY\s*│\s*3\s*│\s*1\s*│\s*18\s*│", out)
    assert "rank layout: world 8: trainers → ranks 0–1, shard 0 → ranks 2–3, " in out
    assert f"run id: {run}" in out


def test_demo_json_prints_one_parseable_object_per_step(sqlite_url: str) -> None:
    result = invoke("demo", "--json", "--db", sqlite_url)
    lines = result.stdout.splitlines()
    docs = [json.loads(line) for line in lines]
    assert [d["step"] for d in docs] == list(range(1, DEMO_STEPS + 1))
    assert all(set(d) == {"step", "title", "transitions", "membership"} for d in docs)
    run = only_run(sqlite_url)
    assert {d["membership"]["run"] for d in docs} == {run}
    # Every step's membership equals a fresh fold of the log up to that step's seq.
    for doc in docs:
        assert doc["membership"] == folded_document(sqlite_url, run, doc["membership"]["seq"])
    condemned = docs[13]["transitions"]
    assert condemned == [
        {
            "seq": 16,
            "shard": 1,
            "from": "STALE",
            "to": "DEAD",
            "rule": "condemned as the silent participant: the only SUSPECT shard when "
            "refit 3 aborted",
        }
    ]
    last = docs[-1]["membership"]
    assert last["shards"]["1"]["state"] == "DEAD"
    assert (last["shards"]["2"]["state"], last["shards"]["2"]["restart_attempts"]) == ("HEALTHY", 1)
    assert last["ended"] == {
        "seq": DEMO_EVENTS,
        "outcome": "completed",
        "cause": "demo script finished",
    }


# ── membership ─────────────────────────────────────────────────────────────────


def test_membership_json_has_the_documented_keys(sqlite_url: str) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    doc = membership_json(sqlite_url, run)
    assert {
        "run",
        "seq",
        "epoch",
        "serving",
        "absent",
        "suspected",
        "shards",
        "layout",
    } <= set(doc)
    assert doc["run"] == run
    assert doc["seq"] == DEMO_EVENTS
    assert isinstance(doc["epoch"], int)
    assert (doc["serving"], doc["absent"], doc["suspected"]) == ([0, 2, 3], [1], [])
    assert sorted(doc["shards"]) == ["0", "1", "2", "3"]
    for shard in doc["shards"].values():
        assert {"state", "weight_version", "restart_attempts"} <= set(shard)
    assert doc["shards"]["1"]["state"] == "DEAD"
    assert doc["shards"]["2"]["restart_attempts"] == 1
    assert doc["layout"] == {
        "world_size": 8,
        "train_world_size": 2,
        "workers_per_shard": 2,
        "shard_prefixes": {"0": 0, "2": 2, "3": 4},
    }
    assert doc == folded_document(sqlite_url, run)


@pytest.mark.parametrize("seq", [1, 4, 6, 9, 11, 15, 16, DEMO_EVENTS])
def test_membership_at_seq_equals_a_fresh_fold_up_to_it(sqlite_url: str, seq: int) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    doc = membership_json(sqlite_url, run, "--at", str(seq))
    assert doc["seq"] == seq
    assert doc == folded_document(sqlite_url, run, seq)


def test_membership_at_differs_from_the_head_where_the_fleet_differed(sqlite_url: str) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    at_6 = membership_json(sqlite_url, run, "--at", "6")
    head = membership_json(sqlite_url, run)
    assert (at_6["epoch"], at_6["absent"], at_6["shards"]["2"]["state"]) == (1, [2], "DEAD")
    assert (head["epoch"], head["absent"], head["shards"]["2"]["state"]) == (4, [1], "HEALTHY")


def test_membership_table_output(sqlite_url: str) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    out = invoke("membership", run, "--at", "6", "--db", sqlite_url).stdout
    assert f"run {run} at seq 6 (" in out
    assert "epoch 1, serving [0, 1, 3], absent [2], suspected []" in out
    assert re.search(r"│\s*2\s*│\s*DEAD\s*│", out)


# ── where the ledger is ────────────────────────────────────────────────────────


def test_fleetledger_db_is_honoured_and_db_overrides_it(tmp_path: Path) -> None:
    env_url = f"sqlite:///{tmp_path}/from-env.db"
    option_url = f"sqlite:///{tmp_path}/from-option.db"
    env = {"FLEETLEDGER_DB": env_url}

    invoke("demo", env=env)
    run = only_run(env_url)
    assert not (tmp_path / "fleetledger.db").exists()

    listed = json.loads(invoke("runs", "--json", env=env).stdout)
    assert [r["run"] for r in listed] == [run]

    # --db wins over the environment: the other ledger does not exist (a read command
    # never creates one), then gets its own run.
    missing = run_cli("runs", "--json", "--db", option_url, env=env)
    assert missing.exit_code == 2
    assert f"no ledger at {tmp_path}/from-option.db" in missing.stderr
    invoke("demo", "--db", option_url, env=env)
    other = only_run(option_url)
    assert other != run
    assert only_run(env_url) == run
    assert not (tmp_path / "fleetledger.db").exists()


# ── export / import ────────────────────────────────────────────────────────────


def test_export_import_round_trip_keeps_every_event(sqlite_url: str, tmp_path: Path) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    exported = invoke("export", run, "--db", sqlite_url).stdout
    original = exported.splitlines()
    assert len(original) == DEMO_EVENTS

    path = tmp_path / "run.jsonl"
    path.write_text(exported, encoding="utf-8")
    summary = json.loads(
        invoke("import", str(path), "--run", "copy", "--json", "--db", sqlite_url).stdout
    )
    head = membership_json(sqlite_url, run)
    assert summary == {"run": "copy", "events": DEMO_EVENTS, "epoch": head["epoch"]}

    copied = invoke("export", "copy", "--db", sqlite_url).stdout.splitlines()
    assert len(copied) == len(original)
    for before, after in zip(original, copied, strict=True):
        a, b = json.loads(before), json.loads(after)
        assert (a.pop("run"), b.pop("run")) == (run, "copy")
        assert a == b
        # Byte-for-byte apart from the run field.
        assert after == before.replace(f'"run":"{run}"', '"run":"copy"', 1)

    copy_doc = membership_json(sqlite_url, "copy")
    assert copy_doc.pop("run") == "copy"
    assert head.pop("run") == run
    assert copy_doc == head


def test_export_to_a_file_matches_stdout(sqlite_url: str, tmp_path: Path) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    target = tmp_path / "out.jsonl"
    assert invoke("export", run, "-o", str(target), "--db", sqlite_url).stdout == ""
    assert target.read_text(encoding="utf-8") == invoke("export", run, "--db", sqlite_url).stdout
    assert not (tmp_path / "out.jsonl.partial").exists()


def test_import_text_output_and_stdin(sqlite_url: str) -> None:
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    exported = invoke("export", run, "--db", sqlite_url).stdout
    result = invoke("import", "-", "--run", "from-stdin", "--db", sqlite_url, input=exported)
    assert result.stdout.strip() == f"imported {DEMO_EVENTS} events as run from-stdin"
    assert invoke("export", "from-stdin", "--db", sqlite_url).stdout == exported.replace(
        f'"run":"{run}"', '"run":"from-stdin"'
    )


# ── runs ───────────────────────────────────────────────────────────────────────


def test_runs_json_lists_each_run(sqlite_url: str, tmp_path: Path) -> None:
    invoke("migrate", "--db", sqlite_url)  # an empty ledger: read commands create none
    assert json.loads(invoke("runs", "--json", "--db", sqlite_url).stdout) == []
    assert invoke("runs", "--db", sqlite_url).stdout.strip() == "no runs in this ledger"

    invoke("demo", "--db", sqlite_url)
    first = only_run(sqlite_url)
    exported = tmp_path / "first.jsonl"
    exported.write_text(invoke("export", first, "--db", sqlite_url).stdout, encoding="utf-8")
    invoke("import", str(exported), "--run", "copy", "--db", sqlite_url)

    listed = json.loads(invoke("runs", "--json", "--db", sqlite_url).stdout)
    # Ordered by start time, then run id: the copy kept the original's times.
    assert [r["run"] for r in listed] == sorted(["copy", first])
    for entry in listed:
        assert set(entry) == {"run", "events", "started", "last_event", "ended", "outcome", "cause"}
        assert (entry["outcome"], entry["cause"]) == ("completed", "demo script finished")
        assert entry["events"] == DEMO_EVENTS
        assert entry["ended"] is True
        assert entry["started"].endswith("Z") and entry["last_event"].endswith("Z")
        assert entry["started"] <= entry["last_event"]
    # The copy keeps the original's times.
    by_run = {r["run"]: r for r in listed}
    assert by_run["copy"]["started"] == by_run[first]["started"]
    assert by_run["copy"]["last_event"] == by_run[first]["last_event"]


def test_runs_table_shows_whole_run_ids_and_outcomes_at_80_columns(sqlite_url: str) -> None:
    """The run id is what `membership RUN` needs: the table must not cut it short; each
    run says how it ended (a failure's cause as far as the terminal allows) or that it
    is running, and no line is wider than the terminal."""
    invoke("demo", "--db", sqlite_url)
    run = only_run(sqlite_url)
    with EventLog.open(sqlite_url) as log:
        failed = Ledger.start(log, "a-failed-run", fleet_config(2))
        failed.end_run_if_open("failed", "refit v3 aborted and no silent participant " * 3)
        Ledger.start(log, "a-running-run", fleet_config(2))
    for columns in (80, 120):
        table = invoke("runs", "--db", sqlite_url, env={"COLUMNS": str(columns)}).stdout
        lines = table.splitlines()
        assert max(len(line) for line in lines) <= columns, table
        assert lines[0].split() == ["run", "events", "started", "(UTC)", "lasted", "outcome"]
        by_run = {line.split()[0]: line for line in lines[1:]}
        assert re.search(
            rf"^{re.escape(run)}\s+19\s+\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d\s", by_run[run]
        )
        assert by_run[run].rstrip().endswith("completed")
        assert by_run["a-running-run"].rstrip().endswith("running")
        assert re.search(r"failed: \S.*…$", by_run["a-failed-run"].rstrip())
        if columns == 120:
            assert "failed: refit v3 aborted and no silent" in by_run["a-failed-run"]
    listed = {r["run"]: r for r in json.loads(invoke("runs", "--json", "--db", sqlite_url).stdout)}
    assert (listed[run]["outcome"], listed["a-running-run"]["outcome"]) == ("completed", None)
    assert listed["a-failed-run"]["outcome"] == "failed"
    assert listed["a-failed-run"]["cause"].startswith("refit v3 aborted")


# ── migrate ────────────────────────────────────────────────────────────────────


def test_migrate_json_reports_from_and_to_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    head = head_revision()
    assert json.loads(invoke("migrate", "--json", "--db", url).stdout) == {
        "from": None,
        "to": head,
    }
    assert json.loads(invoke("migrate", "--json", "--db", url).stdout) == {
        "from": head,
        "to": head,
    }
    assert invoke("migrate", "--db", url).stdout.strip() == (
        f"ledger schema already at revision {head}"
    )


@pytest.mark.postgres
def test_migrate_a_fresh_postgres_database_then_run_the_demo_there(postgres_url: str) -> None:
    head = head_revision()
    # Not migrated yet: a shared database is never created on open.
    refused = run_cli("demo", "--db", postgres_url)
    assert refused.exit_code == 2
    assert "fleetledger migrate" in refused.stderr

    migrated = invoke("migrate", "--db", postgres_url).stdout
    assert migrated.strip() == f"ledger schema upgraded from empty to revision {head}"
    assert json.loads(invoke("migrate", "--json", "--db", postgres_url).stdout) == {
        "from": head,
        "to": head,
    }

    invoke("demo", "--db", postgres_url)
    run = only_run(postgres_url)
    listed = json.loads(invoke("runs", "--json", "--db", postgres_url).stdout)
    assert [(r["run"], r["events"], r["ended"]) for r in listed] == [(run, DEMO_EVENTS, True)]
    doc = membership_json(postgres_url, run)
    assert doc == folded_document(postgres_url, run)
    assert doc["shards"]["1"]["state"] == "DEAD"
    assert doc["shards"]["2"]["state"] == "HEALTHY"


@pytest.mark.postgres
def test_migrate_json_on_a_fresh_postgres_database(postgres_url: str) -> None:
    assert json.loads(invoke("migrate", "--json", "--db", postgres_url).stdout) == {
        "from": None,
        "to": head_revision(),
    }


# ── the installed command ──────────────────────────────────────────────────────


def test_installed_command_demo_in_an_empty_directory(tmp_path: Path) -> None:
    """No --db, no $FLEETLEDGER_DB: ./fleetledger.db is created 0600 and holds the demo."""
    assert CONSOLE_SCRIPT.exists(), f"{CONSOLE_SCRIPT} is not installed"
    env = {k: v for k, v in os.environ.items() if k not in ("FLEETLEDGER_DB", "FLEETLEDGER_LOG")}
    cwd = tmp_path / "fresh"
    cwd.mkdir()

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(CONSOLE_SCRIPT), *args],
            cwd=cwd,
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stdout + done.stderr
        return done

    demo = run("demo")
    ledger = cwd / "fleetledger.db"
    assert ledger.is_file()
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600
    assert "condemned as the silent participant" in demo.stdout

    listed = json.loads(run("runs", "--json").stdout)
    assert len(listed) == 1
    assert listed[0]["run"].startswith("demo-")
    assert (listed[0]["events"], listed[0]["ended"]) == (DEMO_EVENTS, True)
    assert listed[0]["run"] in demo.stdout

    # With transitions logged at info, the logs go to stderr and --json stays clean.
    second = run("demo", "--json", FLEETLEDGER_LOG="info")
    assert [json.loads(line)["step"] for line in second.stdout.splitlines()] == list(
        range(1, DEMO_STEPS + 1)
    )
    assert "shard transition" in second.stderr
    assert len(json.loads(run("runs", "--json").stdout)) == 2
    assert stat.S_IMODE(ledger.stat().st_mode) == 0o600


def test_the_replay_commands_option_defaults_are_the_queries_own() -> None:
    """The command module keeps them itself so `--help` does not import the read side."""
    from fleetledger import queries
    from fleetledger.cli import replay_commands

    assert replay_commands.DEFAULT_POLL_INTERVAL_S == queries.DEFAULT_POLL_INTERVAL_S
    assert replay_commands.TIME_EXAMPLE == queries.TIME_EXAMPLE


def test_the_version_imports_no_database_layer() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from fleetledger.cli import app\n"
        "try:\n    app(['--version'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('sqlalchemy', 'alembic', 'fleetledger.store.log') "
        "if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip().splitlines()[-1] == "[]"
