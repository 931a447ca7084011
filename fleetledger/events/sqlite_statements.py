"""SQLite's statements as text: what ``core_statements`` compiles for SQLite.

A read command on a SQLite ledger runs on the standard library's driver alone, so its
SQL cannot be compiled by SQLAlchemy at open: it is kept here, as Core wrote it, and
``tests/test_statements.py`` compiles it again and compares. Change the tables or the
statements there, then write what it prints here.
"""

from __future__ import annotations

from fleetledger.events.statements import DriverStatement, ListStatement, Statements

SQLITE_STATEMENTS = Statements(
    lock_run=None,
    last_event=DriverStatement(
        (
            "SELECT fleetledger_events.seq, fleetledger_events.at_us, "
            "fleetledger_events.type \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ? ORDER BY fleetledger_events.seq DESC\n"
            " LIMIT ? OFFSET ?"
        ),
        ("run", "param_1", "param_2"),
        {"param_1": 1, "param_2": 0},
    ),
    insert_events=DriverStatement(
        (
            "INSERT INTO fleetledger_events (run_id, seq, event_id, type, schema_version,"
            " at_us, payload) VALUES (?, ?, ?, ?, ?, ?, ?)"
        ),
        ("run_id", "seq", "event_id", "type", "schema_version", "at_us", "payload"),
    ),
    insert_run=DriverStatement(
        "INSERT INTO fleetledger_runs (run_id, started_at_us) VALUES (?, ?)",
        ("run", "at_us"),
    ),
    page=DriverStatement(
        (
            "SELECT fleetledger_events.seq, fleetledger_events.at_us, "
            "fleetledger_events.event_id, fleetledger_events.type, "
            "fleetledger_events.schema_version, fleetledger_events.payload \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ? AND fleetledger_events.seq > ? AND "
            "fleetledger_events.seq <= ? ORDER BY fleetledger_events.seq"
        ),
        ("run", "lo", "hi"),
    ),
    content_page=DriverStatement(
        (
            "SELECT fleetledger_events.seq, fleetledger_events.at_us, "
            "fleetledger_events.type, fleetledger_events.schema_version, "
            "fleetledger_events.payload \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ? AND fleetledger_events.seq > ? AND "
            "fleetledger_events.seq <= ? ORDER BY fleetledger_events.seq"
        ),
        ("run", "lo", "hi"),
    ),
    time_of=DriverStatement(
        (
            "SELECT fleetledger_events.at_us \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ? AND fleetledger_events.seq = ?"
        ),
        ("run", "seq"),
    ),
    run_names=DriverStatement(
        (
            "SELECT fleetledger_runs.run_id \n"
            "FROM fleetledger_runs ORDER BY fleetledger_runs.run_id\n"
            " LIMIT ? OFFSET ?"
        ),
        ("param_1", "param_2"),
        {"param_1": 20, "param_2": 0},
    ),
    run_list=DriverStatement(
        (
            "SELECT fleetledger_runs.run_id, fleetledger_runs.started_at_us \n"
            "FROM fleetledger_runs ORDER BY fleetledger_runs.started_at_us, "
            "fleetledger_runs.run_id"
        ),
        (),
    ),
    event_ids=DriverStatement(
        (
            "SELECT fleetledger_events.seq, fleetledger_events.event_id \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ?"
        ),
        ("run",),
    ),
    count_events=DriverStatement(
        ("SELECT count(*) AS count_1 \nFROM fleetledger_events"),
        (),
    ),
    stored_ids=ListStatement(
        (
            "SELECT fleetledger_events.event_id, fleetledger_events.seq, "
            "fleetledger_events.type, fleetledger_events.schema_version, "
            "fleetledger_events.payload \n"
            "FROM fleetledger_events \n"
            "WHERE fleetledger_events.run_id = ? AND fleetledger_events.event_id IN ("
        ),
        ")",
        ("run", "ids"),
        "ids",
    ),
    snapshot_exists=DriverStatement(
        (
            "SELECT fleetledger_snapshots.seq \n"
            "FROM fleetledger_snapshots \n"
            "WHERE fleetledger_snapshots.run_id = ? AND "
            "fleetledger_snapshots.projection_version = ? AND fleetledger_snapshots.seq ="
            " ?"
        ),
        ("run", "version", "seq"),
    ),
    insert_snapshot=DriverStatement(
        (
            "INSERT INTO fleetledger_snapshots (run_id, projection_version, seq, payload)"
            " VALUES (?, ?, ?, ?)"
        ),
        ("run", "version", "seq", "payload"),
    ),
    load_snapshot=DriverStatement(
        (
            "SELECT fleetledger_snapshots.seq, fleetledger_snapshots.payload \n"
            "FROM fleetledger_snapshots \n"
            "WHERE fleetledger_snapshots.run_id = ? AND "
            "fleetledger_snapshots.projection_version = ? AND fleetledger_snapshots.seq "
            "<= ? ORDER BY fleetledger_snapshots.seq DESC\n"
            " LIMIT ? OFFSET ?"
        ),
        ("run", "version", "at_most", "param_1", "param_2"),
        {"param_1": 1, "param_2": 0},
    ),
)
