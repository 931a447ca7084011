"""Every code block of docs/controller.md runs, in order, as written.

The embedding guide is read by someone who copies it: a block that does not run is a
trip into the source (the guide once needed ten). Its Python blocks run one after the
other in one namespace — on this module's Ray cluster, in a directory holding a copy of
``examples/`` (the blocks name ``examples/fleet.toml``) — and its shell block runs as a
shell would, there too. Then the ledger the blocks wrote must hold what they did.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetledger.queries import load_view
from fleetledger.store.log import EventLog

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "controller.md"
BLOCK = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<code>.*?)^```$", re.S | re.M)


def _blocks() -> list[tuple[str, str, int]]:
    text = GUIDE.read_text(encoding="utf-8")
    return [
        (m.group("lang"), m.group("code"), text.count("\n", 0, m.start()) + 2)
        for m in BLOCK.finditer(text)
    ]


def test_every_block_says_its_language() -> None:
    blocks = _blocks()
    assert len(blocks) >= 6
    assert {lang for lang, _, _ in blocks} <= {"python", "sh"}, "a block this test cannot run"


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_the_python_blocks_run_in_order_and_record_what_they_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "docs_controller"}
    try:
        for lang, code, line in _blocks():
            if lang == "python":
                exec(compile(code, f"{GUIDE}:{line}", "exec"), namespace)
    finally:
        fleet = namespace.get("fleet")
        if fleet is not None:
            fleet.shutdown()  # type: ignore[attr-defined]
    with EventLog.open("sqlite:///run.db") as log:
        main = load_view(log, "run-42")
        adapters = load_view(log, "run-43")
    assert main.ended is not None and (main.ended.outcome, main.ended.cause) == (
        "completed",
        "2 of 2 steps done",
    )
    assert main.weight_version == 2 and set(main.serving) == {0, 1}
    assert adapters.ended is not None and adapters.ended.outcome == "completed"
    assert adapters.shards[1].reported_failures == 1  # the reporter's window landed


@pytest.mark.slow
def test_the_shell_block_runs(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (shell,) = [code for lang, code, _ in _blocks() if lang == "sh"]
    bin_dir = str(Path(sys.executable).parent)  # `python` and `fleetledger` of this venv
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "RAY_AUTH_MODE": "disabled"}
    for command in shell.strip().splitlines():
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    assert "run demo ended completed" in done.stdout
