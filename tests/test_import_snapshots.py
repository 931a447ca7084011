"""An imported run gets the snapshots a live ledger would have left, at the same cadence.

Snapshots are an optimisation: every one stored must equal the fold of the run up to
its seq, and the cadence counts probe results as well as events, so a fleet of many
shards (one round, many results) is snapshotted by the work a fold does, not by rows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetledger.controller.ledger import ProbeResult, round_event
from fleetledger.events.models import RunStarted
from fleetledger.projections.fleet_view import fold
from fleetledger.projections.snapshot import (
    PROJECTION_VERSION,
    SNAPSHOT_EVERY_EVENTS,
    fold_with_snapshots,
    from_snapshot,
    to_snapshot,
)
from fleetledger.store.log import EventLog
from fleetledger.store.schema import snapshots
from tests.builders import probe_ok
from tests.cli_support import invoke
from tests.legacy_rows import export_lines, probe_ok_v1
from tests.projection_builders import fleet_config, record_run


def _stored_snapshot_seqs(log: EventLog, run: str) -> list[int]:
    with log.database.engine.connect() as conn:
        rows = conn.execute(
            snapshots.select().where(snapshots.c.run_id == run).order_by(snapshots.c.seq)
        ).all()
    return [row.seq for row in rows]


def test_snapshots_fall_where_events_or_probe_results_reach_the_cadence() -> None:
    timeout = ProbeResult("timeout", "slow")
    rounds = [round_event({0: ProbeResult.ok(), 1: timeout, 2: ProbeResult.ok()})] * 4
    singles = [probe_ok(0)] * 5
    records = record_run(fleet_config(3), [*singles, *rounds, *singles])
    taken: list[tuple[int, str]] = []
    pages = [records[:4], records[4:9], records[9:]]
    final = fold_with_snapshots(
        pages, lambda seq, payload: taken.append((seq, payload)), every_events=4, every_results=7
    )
    assert to_snapshot(final) == to_snapshot(fold(records))
    # Seqs 2-6 are singles, 7-10 rounds of 3 results, 11-15 singles. Seqs 2..5 are 4
    # events; 6, 7, 8 hold 1+3+3 = 7 results; 9, 10, 11 hold 3+3+1; 12..15 are 4 events.
    assert [seq for seq, _ in taken] == [5, 8, 11, 15]
    for seq, payload in taken:
        assert to_snapshot(from_snapshot(payload)) == to_snapshot(fold(records[:seq]))


def test_an_imported_run_is_snapshotted_like_a_live_one(sqlite_url: str, tmp_path: Path) -> None:
    count = SNAPSHOT_EVERY_EVENTS + 500
    with EventLog.open(sqlite_url) as log:
        log.append("big", [RunStarted(config=fleet_config(3))])
        for start in range(0, count, 2500):
            log.append("big", [probe_ok(i % 3) for i in range(start, start + 2500)])
    exported = tmp_path / "big.jsonl"
    invoke("export", "big", "-o", str(exported), "--db", sqlite_url)
    copy = _import_and_check_snapshots(exported, tmp_path)
    original = json.loads(invoke("membership", "big", "--json", "--db", sqlite_url).stdout)
    assert {**copy, "run": "big"} == original


def test_an_imported_old_run_is_snapshotted_like_a_live_one(tmp_path: Path) -> None:
    """An old export (one v1 probe line per shard) is snapshotted on the same cadence: a
    v1 row reads as a round of one result, as it was one event."""
    count = SNAPSHOT_EVERY_EVENTS + 500
    items = [RunStarted(config=fleet_config(3)), *(probe_ok_v1(i % 3) for i in range(count))]
    exported = tmp_path / "old.jsonl"
    exported.write_text("".join(line + "\n" for line in export_lines("big", items)))
    copy = _import_and_check_snapshots(exported, tmp_path)
    assert (copy["seq"], copy["epoch"], copy["serving"]) == (count + 1, 0, [0, 1, 2])


def _import_and_check_snapshots(exported: Path, tmp_path: Path) -> dict[str, Any]:
    """Import ``exported`` as run "copy"; check its snapshots (the cadence's one, and
    one at the head), each the fold up to its seq; its membership."""
    imported = f"sqlite:///{tmp_path / 'imported.db'}"
    invoke("import", str(exported), "--run", "copy", "--db", imported)
    with EventLog.open(imported) as log:
        head = log.head("copy")
        assert _stored_snapshot_seqs(log, "copy") == [SNAPSHOT_EVERY_EVENTS + 1, head]
        for at in (SNAPSHOT_EVERY_EVENTS + 1, head):
            stored = log.load_snapshot("copy", PROJECTION_VERSION, at_most_seq=at)
            assert stored is not None and stored[0] == at
            expected = fold(log.read("copy", 0, stored[0]))
            assert to_snapshot(from_snapshot(stored[1])) == to_snapshot(expected)
    return json.loads(invoke("membership", "copy", "--json", "--db", imported).stdout)


def test_an_imported_run_whose_last_seq_is_on_the_cadence_imports_with_its_snapshot(
    tmp_path: Path,
) -> None:
    """The head's snapshot falls where the cadence's did: saved once, the import goes on."""
    items = [
        RunStarted(config=fleet_config(3)),
        *(probe_ok_v1(i % 3) for i in range(SNAPSHOT_EVERY_EVENTS)),
    ]
    exported = tmp_path / "even.jsonl"
    exported.write_text("".join(line + "\n" for line in export_lines("even", items)))
    imported = f"sqlite:///{tmp_path / 'imported.db'}"
    invoke("import", str(exported), "--db", imported)
    with EventLog.open(imported) as log:
        assert _stored_snapshot_seqs(log, "even") == [SNAPSHOT_EVERY_EVENTS + 1]
