"""The embedding example (examples/tiny_rl.py) runs as written, and its sample config
covers every configuration key.

The example is run as a subprocess, as its reader would run it: its own engine actor
class, its own trainer and loop, a real SIGKILL of shard 1 during step 2 and the
controller's restart of it. The run's ledger must then hold exactly that story — DEAD,
RESTARTING, STALE, then HEALTHY by a refit that included the replacement, one death
and no other — and ``fleetledger explain`` must tell it without a false death.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel

from fleetledger.config import ControllerConfig
from fleetledger.projections.fleet_view import fold_with_transitions
from fleetledger.queries import load_view
from fleetledger.store.log import EventLog
from tests.probe_facts import deaths as recorded_deaths

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny_rl.py"
SAMPLE = ROOT / "examples" / "fleet.toml"


def _keys(model: type[BaseModel], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            keys |= _keys(kind, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def _flat(table: dict[str, object], prefix: str = "") -> set[str]:
    keys: set[str] = set()
    for name, value in table.items():
        if isinstance(value, dict):
            keys |= _flat(value, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_the_sample_config_has_every_key_and_validates():
    every = _keys(ControllerConfig)
    assert {"fleet_health.restart_dead_shards", "router.no_healthy_status"} <= every
    written = _flat(tomllib.loads(SAMPLE.read_text(encoding="utf-8")))
    assert sorted(every - written) == [], "keys missing from examples/fleet.toml"
    assert sorted(written - every) == [], "keys in examples/fleet.toml the config lacks"
    config = ControllerConfig.from_file(SAMPLE)
    assert config.fleet_health.enabled and config.fleet_health.restart_dead_shards


@pytest.mark.slow
def test_the_example_survives_a_kill_and_restart_and_explains_it(tmp_path):
    db = f"sqlite:///{tmp_path}/run.db"
    run = f"tiny-{time.time_ns()}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "FLEETLEDGER_LOG": "warning"}
    done = subprocess.run(
        [
            *(sys.executable, str(EXAMPLE), "--db", db, "--run", run),
            *("--kill", "1@2", "--steps", "6", "--await-restarts", "60", "--log", "warning"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    with EventLog.open(db) as log:
        events = list(log.read(run, 0))
        view = load_view(log, run)
        _, transitions = fold_with_transitions(log.read(run, 0))
    assert view.ended is not None and view.ended.outcome == "completed", view.ended
    assert view.ended.cause == "6 of 6 steps done"

    # Shard 1: DEAD at the kill, RESTARTING, STALE with the replacement's URL, HEALTHY by
    # a refit that included it (a slow probe may add a SUSPECT on either side).
    moves = [(t.seq, t.after.value) for t in transitions if t.shard == 1]
    core = [state for _, state in moves if state != "SUSPECT"]
    assert core[:4] == ["DEAD", "RESTARTING", "STALE", "HEALTHY"], moves
    by_seq = {r.seq: r.event for r in events}
    healthy_at = next(seq for seq, state in moves if state == "HEALTHY")
    assert by_seq[healthy_at].type == "refit_completed" and 1 in by_seq[healthy_at].shards
    (loaded,) = [e for e in by_seq.values() if e.type == "replacement_loaded"]
    assert loaded.shard == 1 and loaded.base_url and "?pid=" in loaded.base_url
    assert loaded.base_url != view.config.base_urls[1]  # a new process, asked for its URL
    assert view.shards[1].base_url == loaded.base_url
    assert view.state_of(1).value == "HEALTHY" and view.shards[1].weight_version == 6

    # Exactly the deaths that happened: shard 1's first process, with Ray's whole cause.
    # (A rollout and a probe may both have seen it; nothing after its restart did.)
    deaths = {f.seq: f for f in recorded_deaths(events)}  # by a probe round or a rollout
    (restart_seq,) = [seq for seq, e in by_seq.items() if e.type == "restart_requested"]
    assert deaths and {d.shard for d in deaths.values()} == {1}
    assert max(deaths) < restart_seq, "a death recorded against the replacement"
    first = deaths[min(deaths)].error
    assert "pid: " in first and "exit type" in first.lower(), first
    dead = [t for t in transitions if t.after.value in ("DEAD", "RETIRED")]
    assert [(t.shard, t.after.value) for t in dead] == [(1, "DEAD")]

    explained = subprocess.run(
        [str(Path(sys.executable).with_name("fleetledger")), "explain", run, "--db", db],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert explained.returncode == 0, explained.stderr
    text = explained.stdout
    assert f"run {run} ended completed" in text
    lost = [line for line in text.splitlines() if "→ DEAD" in line or "→ RETIRED" in line]
    assert len(lost) == 1 and "shard 1 " in lost[0] and "actor death" in lost[0], text
    assert "every shard is HEALTHY" in text
