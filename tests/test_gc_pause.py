"""Pausing the cyclic garbage collector pauses it for every thread of the process: only a
read command does it, around its own read (``cli.paused_gc``). The library's read path
and the folds — which the live controller and the router run beside other threads —
read and fold with the collector running.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fleetledger.events.models import RecordedEvent
from fleetledger.projections.fleet_view import fold_pages
from fleetledger.store.log import EventLog
from tests.builders import mixed_events, run_started
from tests.cli_support import invoke

PACKAGE = Path(__file__).resolve().parent.parent / "fleetledger"
PAUSE = PACKAGE / "cli" / "paused_gc.py"


def test_only_the_command_line_pauses_the_collector() -> None:
    pausing = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if path != PAUSE
        and any(
            call in path.read_text(encoding="utf-8")
            for call in ("gc.disable", "gc.freeze", "gc.set_threshold")
        )
    )
    assert pausing == []


def test_the_library_reads_and_folds_with_the_collector_running(log: EventLog) -> None:
    log.append("r1", [run_started(), *mixed_events(50)])
    seen: list[bool] = []

    def watched(pages: Iterator[list[RecordedEvent]]) -> Iterator[Sequence[RecordedEvent]]:
        for page in pages:
            seen.append(gc.isenabled())  # read and decoded: the fold comes next
            yield page

    fold_pages(watched(log.read_pages("r1", ids=False)))
    assert seen and all(seen)
    assert gc.isenabled()


@pytest.mark.usefixtures("cli_sandbox")
def test_a_read_command_leaves_the_collector_as_it_found_it(sqlite_url: str) -> None:
    with EventLog.open(sqlite_url) as log:
        log.append("r1", [run_started(), *mixed_events(50)])
    entries = invoke("replay", "r1", "--json", "--db", sqlite_url).stdout.splitlines()
    assert json.loads(entries[0])["seq"] == 1
    assert gc.isenabled()
    gc.disable()
    try:
        invoke("membership", "r1", "--json", "--db", sqlite_url)
        assert not gc.isenabled()  # a caller's choice is not undone either
    finally:
        gc.enable()
