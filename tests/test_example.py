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
def test_the_example_survives_a_kill_a_freeze_and_restarts_and_its_reward_rises(tmp_path):
    """Shard 1 SIGKILLed in step 2, shard 2 SIGSTOPped in step 4: both condemned,
    restarted and re-admitted by a refit; the reward rises because every refit pushes the
    trainer's own model (an engine's output is its received weights' answer)."""
    db = f"sqlite:///{tmp_path}/run.db"
    run = f"tiny-{time.time_ns()}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "FLEETLEDGER_LOG": "warning"}
    done = subprocess.run(
        [
            *(sys.executable, str(EXAMPLE), "--db", db, "--run", run, "--steps", "8"),
            *("--kill", "1@2", "--freeze", "2@4", "--await-restarts", "60", "--log", "warning"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("rewards: ")]
    rewards = [float(r) for r in line.split()[1:]]
    assert len(rewards) == 8 and rewards[-1] > rewards[0] + 1.0, rewards  # learnt, delivered

    with EventLog.open(db) as log:
        events = list(log.read(run, 0))
        view = load_view(log, run)
        _, transitions = fold_with_transitions(log.read(run, 0))
    assert view.ended is not None and view.ended.outcome == "completed", view.ended
    assert view.ended.cause == "8 of 8 steps done"
    by_seq = {r.seq: r.event for r in events}
    for shard in (1, 2):
        # DEAD (at the kill; by failed probes for the frozen one), RESTARTING, STALE with
        # the replacement's URL, HEALTHY by a refit that included it.
        moves = [(t.seq, t.after.value) for t in transitions if t.shard == shard]
        core = [state for _, state in moves if state != "SUSPECT"]
        assert core[:4] == ["DEAD", "RESTARTING", "STALE", "HEALTHY"], (shard, moves)
        healthy_at = next(seq for seq, state in moves if state == "HEALTHY")
        refit = by_seq[healthy_at]
        assert refit.type == "refit_completed" and shard in refit.shards
        (loaded,) = [
            e for e in by_seq.values() if e.type == "replacement_loaded" and e.shard == shard
        ]
        assert loaded.base_url and "?pid=" in loaded.base_url
        assert loaded.base_url != view.config.base_urls[shard]  # a new process, asked
        assert view.state_of(shard).value == "HEALTHY" and view.shards[shard].weight_version == 8
    dead = [t for t in transitions if t.after.value in ("DEAD", "RETIRED")]
    assert sorted((t.shard, t.after.value) for t in dead) == [(1, "DEAD"), (2, "DEAD")]

    # The deaths recorded are the killed processes', before their restarts, read as causes
    # (the raw text, Ray's whole, kept in the cause).
    restarts = {e.shard: seq for seq, e in by_seq.items() if e.type == "restart_requested"}
    deaths = recorded_deaths(events)
    assert deaths and {d.shard for d in deaths} <= {1, 2}
    assert all(d.seq < restarts[d.shard] for d in deaths), "a death recorded against a replacement"
    first = min(deaths, key=lambda d: d.seq)
    assert "pid: " in first.raw and "killed (SIGKILL or a crash)" in first.error, first

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
    assert len(lost) == 2, text
    assert "every shard is HEALTHY" in text
