"""A read that names its upper bound (as every read command does, through ``RunReader``)
still finds damage: a missing row is never read as a shorter run."""

from __future__ import annotations

import sqlite3

import pytest

import fleetledger.store.log as log_module
from fleetledger.events.errors import LedgerError
from fleetledger.events.models import FleetConfig, RunEnded, RunStarted
from fleetledger.queries import RunReader
from fleetledger.store.log import EventLog
from tests.builders import probe_ok
from tests.cli_support import run_cli
from tests.legacy_rows import insert_old_rows, probe_ok_v1

RUN = "holey"
EVENTS = 28  # run_started, 26 probes, run_ended


@pytest.fixture(autouse=True)
def _sandbox(cli_sandbox: None) -> None:
    """The commands below point structlog at the runner's stream: put it back after."""


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(log_module, "READ_PAGE", 10)
    return 10


def _write(url: str, *, old: bool = False) -> None:
    """The run; ``old``: its probes stored as an older fleetledger did, v1 rows."""
    config = FleetConfig(shard_count=2, train_world_size=1, base_urls=("a", "b"))
    with EventLog.open(url) as log:
        log.append(RUN, [RunStarted(config=config)])
        if old:
            insert_old_rows(
                log.database.engine, RUN, [probe_ok_v1(i % 2) for i in range(EVENTS - 2)]
            )
        else:
            log.append(RUN, [probe_ok(i % 2) for i in range(EVENTS - 2)])
    with EventLog.open(url) as log:  # a fresh log: the head may have moved behind its back
        log.append(RUN, [RunEnded(outcome="completed", cause="done")])


def _delete(path: str, seq: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM fleetledger_events WHERE run_id = ? AND seq = ?", (RUN, seq))


@pytest.mark.parametrize("missing", [10, 20, 15], ids=["page-end", "second-page-end", "inside"])
def test_a_missing_row_under_a_named_bound_is_damage(sqlite_url, tmp_path, small_pages, missing):
    _write(sqlite_url)
    _delete(str(tmp_path / "ledger.db"), missing)
    with EventLog.open(sqlite_url) as log:
        with pytest.raises(LedgerError, match="the ledger is damaged"):
            list(log.read(RUN, 0, EVENTS))
        reader = RunReader(log, RUN)
        with pytest.raises(LedgerError, match="the ledger is damaged"):
            reader.view()
    for command in (["replay", RUN], ["membership", RUN], ["explain", RUN]):
        result = run_cli(*command, "--db", sqlite_url)
        assert result.exit_code == 2, result.stdout + result.stderr
        assert "the ledger is damaged" in result.stderr


def test_a_bound_past_the_head_still_ends_at_the_head(sqlite_url, small_pages):
    _write(sqlite_url)
    with EventLog.open(sqlite_url) as log:
        seqs = [r.seq for r in log.read(RUN, 0, EVENTS + 50)]
        assert seqs == list(range(1, EVENTS + 1))
        assert [r.seq for r in log.read(RUN, 25, EVENTS + 5)] == [26, 27, 28]


def test_an_unknown_run_under_a_named_bound_is_an_error(sqlite_url, small_pages):
    _write(sqlite_url)
    with EventLog.open(sqlite_url) as log:
        with pytest.raises(LedgerError, match="no run 'ghost'"):
            list(log.read("ghost", 0, 5))


def _set_payload(path: str, seq: int, payload: str) -> None:
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE fleetledger_events SET payload = ? WHERE run_id = ? AND seq = ?",
            (payload, RUN, seq),
        )


def _payload(path: str, seq: int) -> tuple[str, str]:
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT event_id, payload FROM fleetledger_events WHERE run_id = ? AND seq = ?",
            (RUN, seq),
        ).fetchone()


OTHER_ID = "01234567-89ab-7def-8123-456789abcdef"


@pytest.mark.parametrize(
    "holding",
    [
        # as written before schema revision 0003, the id first: another row's id
        lambda payload: '{"id":"' + OTHER_ID + '","type":"probe_round",' + payload[1:],
        # id-less as written since, yet holding an id after its fields
        lambda payload: payload[:-1] + ',"id":"' + OTHER_ID + '"}',
    ],
    ids=["id_first", "id_after_the_fields"],
)
def test_a_payload_whose_id_is_not_its_rows_is_refused_naming_the_seq(
    sqlite_url, tmp_path, holding
):
    """Repeated payloads decode once; a row whose payload holds another id is not one,
    by either read."""
    _write(sqlite_url)
    path = str(tmp_path / "ledger.db")
    _event_id, payload = _payload(path, 7)
    assert not payload.startswith('{"id"')  # stored without its id
    _set_payload(path, 7, holding(payload))
    with EventLog.open(sqlite_url) as log, pytest.raises(LedgerError, match="seq 7") as caught:
        list(log.read(RUN))
    assert "is not the row's id" in str(caught.value)


@pytest.mark.parametrize(
    ("old", "field", "damaged"),
    [(False, '"ok":[1]', '"ok":["one"]'), (True, '"shard":1', '"shard":"one"')],
    ids=["rounds", "v1-rows"],
)
def test_damaged_content_in_a_repeated_payload_is_found_by_every_read(
    sqlite_url, tmp_path, old, field, damaged
):
    """The cache is keyed by the whole payload after the id: a changed field is a new
    payload, validated whole (a v1 row by its upcaster), by the fold's read too."""
    _write(sqlite_url, old=old)
    path = str(tmp_path / "ledger.db")
    _event_id, payload = _payload(path, 9)
    assert field in payload
    _set_payload(path, 9, payload.replace(field, damaged))
    with EventLog.open(sqlite_url) as log:
        for read in (
            lambda: list(log.read(RUN)),
            lambda: list(log.read_pages(RUN, ids=False)),
        ):
            with pytest.raises(LedgerError, match="seq 9") as caught:
                read()
            assert field.split(":")[0].strip('"') in str(caught.value)
    result = run_cli("membership", RUN, "--db", sqlite_url)
    assert result.exit_code == 2 and "seq 9" in result.stderr


def test_a_payload_holding_another_id_is_refused_even_after_a_fold_read_it(sqlite_url, tmp_path):
    """A fold reads no ids, so it takes such a payload as it is; it must not leave it in
    the codec's cache, where a later read with ids would take it without the check (as
    ``explain`` does: a fold, then the evidence by id, on one open log)."""
    _write(sqlite_url)
    path = str(tmp_path / "ledger.db")
    for seq in (7, 9):  # the same text twice: what the cache keeps from a second sighting
        _event_id, payload = _payload(path, seq)
        _set_payload(path, seq, payload[:-1] + ',"id":"' + OTHER_ID + '"}')
    with EventLog.open(sqlite_url) as log:
        for _ in range(2):
            assert sum(len(page) for page in log.read_pages(RUN, ids=False)) == EVENTS
        with pytest.raises(LedgerError, match="seq 7") as caught:
            list(log.read(RUN))
    assert "is not the row's id" in str(caught.value)
