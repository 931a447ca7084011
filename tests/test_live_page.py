"""The live page in a real headless browser (Debian's chromium), beside a live run.

``fleetledger simulate --serve 0`` runs a simulated fleet and serves its ledger; the
browser opens the printed page while every shard is HEALTHY; a shard is SIGKILLed a few
steps later, and the page — never reloaded — shows it DEAD, with the death among the
latest entries; a real click on its row shows its explanation; what the death cost and the
rollouts by the weights their engines attested are on the page too. A screenshot is kept
under ``test-artifacts/`` (or ``$FLEETLEDGER_TEST_ARTIFACTS``). The page's script must
throw nothing and the browser log no error (a Content-Security-Policy violation would
be one: the page fetches nothing from elsewhere).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.devtools import CHROMIUM, DevTools

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium: apt-get install chromium (.ci/run installs it)"
)

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
ARTIFACTS = Path(
    os.environ.get("FLEETLEDGER_TEST_ARTIFACTS")
    or Path(__file__).resolve().parent.parent / "test-artifacts"
)
KILLED = 1
# Long enough that the page is open before the kill and the run outlives the test: the
# test stops it (SIGINT) once it has seen what it came for.
SIMULATION = ("--shards", "3", "--steps", "200", "--kill", f"{KILLED}@8", "--no-restart")


def _live_page_url(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.match(r"live page: (http://\S+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"simulate printed no live page URL (exit {proc.poll()})")


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # the run ends as aborted; Ray is shut down
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


ROW = f'tr[data-shard="{KILLED}"]'


async def _watch(url: str, profile: Path, shot: Path) -> list[str]:
    browser = await DevTools.launch(profile)
    try:
        await browser.send("Page.navigate", url=url)
        first = await browser.wait_for(
            f"document.querySelector('{ROW}')?.dataset.state", timeout=60, what="the shards"
        )
        assert first == "HEALTHY", f"the page opened after the kill ({first}): nothing to see live"
        # Before the run's first event the page asked and was told 404 (the browser logs
        # each); it asked again until the run was there. Those are the only errors allowed.
        waiting = re.compile(
            r"log: .* 404 \(Not Found\) \S+/api/v1/runs/[^/]+/(membership|history)\??.*"
        )
        assert [e for e in browser.errors if not waiting.fullmatch(e)] == []
        browser.errors.clear()
        await browser.evaluate("window.__openedOnce = performance.timeOrigin")
        await browser.wait_for(
            f"document.querySelector('{ROW}')?.dataset.state === 'DEAD'",
            timeout=180,
            what=f"shard {KILLED} DEAD",
        )
        # Not reloaded: the marker set in this document is still there.
        assert await browser.evaluate("window.__openedOnce === performance.timeOrigin")
        death = await browser.wait_for(
            "[...document.querySelectorAll('tr[data-kind=\"transition\"]')]"
            ".map(r => r.textContent).find(t => t.includes('HEALTHY → DEAD'))",
            timeout=30,
            what="the death among the latest entries",
        )
        assert "actor death confirmed" in death
        await browser.click(ROW)
        explanation = await browser.wait_for(
            f"document.querySelector('pre.explanation[data-shard=\"{KILLED}\"]')?.textContent",
            timeout=30,
            what="the shard's explanation",
        )
        assert f"shard {KILLED} is DEAD" in explanation
        assert "killed (SIGKILL or a crash)" in explanation
        # The timeline is redrawn from the stream too: the lane turns red, no reload.
        await browser.wait_for(
            f'document.querySelector(\'#timeline g.lane[data-shard="{KILLED}"] '
            'rect[data-state="DEAD"]\') !== null',
            timeout=30,
            what="the death on the timeline",
        )
        assert await browser.evaluate("document.querySelectorAll('#timeline g.lane').length") == 3
        # What the death cost, from the ledger alone: the loop told each broken attempt's
        # fate, so nothing is unknown; and the rollouts by the weights engines attested.
        cost = await browser.wait_for(
            "[...document.querySelectorAll('#faults tr[data-kind=\"death\"] td')]"
            ".map(td => td.textContent)",
            timeout=30,
            what="the death's cost",
        )
        assert cost[1:3] == ["death", str(KILLED)], cost
        assert "unknown" not in " ".join(cost)
        assert int(cost[6]) == int(cost[7]) + int(cost[8]) + int(cost[9])  # in flight = fates
        versions = await browser.evaluate(
            "[...document.querySelectorAll('#served table.versions tbody tr')]"
            ".map(r => r.dataset.version)"
        )
        assert versions and versions[0] is not None and int(versions[0]) >= 7, versions
        assert await browser.evaluate(
            "document.querySelector('#served table.staleness tbody tr') !== null"
        )
        await browser.screenshot(shot)
        return browser.errors
    finally:
        await browser.close()


def test_the_page_of_a_live_run_shows_a_shard_turning_dead_and_explains_it(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "FLEETLEDGER_DB": f"sqlite:///{tmp_path}/l.db",
    }
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "simulate", "--serve", "0", *SIMULATION],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        url = _live_page_url(proc)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "live-page-shard-dead.png"
        errors = asyncio.run(_watch(url, tmp_path / "profile", shot))
    finally:
        _stop(proc)
    assert errors == []
    assert shot.stat().st_size > 10_000
