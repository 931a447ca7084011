"""``fleetledger serve``: every endpoint on SQLite and PostgreSQL over real sockets, the
stream followed while a writer appends, and resumed after disconnects at random entries.

What an endpoint answers is held to what the matching command prints (``runs``,
``membership``, ``replay``, ``explain`` with ``--json``), not to values written here:
the server must be another face of the same reads, never a second implementation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.events.models import (
    ActorDeathConfirmed,
    Event,
    ProbeFailure,
    ProbeRound,
    RefitCompleted,
    RefitStarted,
    ReplacementLoaded,
    RestartRequested,
)
from fleetledger.projections.lanes import lanes_of
from fleetledger.store.database import migrate
from fleetledger.store.errors import LedgerOpenError
from fleetledger.store.log import EventLog
from fleetledger.timeline import build_scene
from fleetledger.timeline.html import fragment
from fleetledger.web import feeds, start_server
from fleetledger.web.entry_ids import WHOLE_SEQ, Numbering, id_text, parse_entry_id
from fleetledger.web.feeds import RunFeed
from fleetledger.web.ledger_source import LedgerSource
from fleetledger.web.problems import HttpProblem
from fleetledger.web.server import RunningServer
from tests.builders import dump_tables, run_ended, run_started
from tests.cli_support import invoke
from tests.http_clients import EventStream, Message, get, get_json

pytestmark = pytest.mark.usefixtures("cli_sandbox")

SHARDS = 4


def story(rng: random.Random, n: int) -> list[Event]:
    """``n`` events of a run's life, with many seqs that make several entries at once
    (a round that fails or heals several shards), deaths, restarts and refits."""
    version = 0
    out: list[Event] = []
    for _ in range(n):
        pick = rng.randrange(6)
        shards = tuple(sorted(rng.sample(range(SHARDS), rng.randint(1, SHARDS))))
        if pick <= 1:
            failures = tuple(ProbeFailure(shard=s, kind="timeout", error="slow") for s in shards)
            out.append(ProbeRound(failed=failures))
        elif pick == 2:
            out.append(ProbeRound(ok=shards))
        elif pick == 3:
            version += 1
            out += [
                RefitStarted(weight_version=version, shards=shards),
                RefitCompleted(weight_version=version, shards=shards),
            ]
        elif pick == 4:
            out.append(ActorDeathConfirmed(shard=shards[0], error="ActorDiedError: killed"))
        else:
            s = shards[0]
            out += [
                RestartRequested(shard=s),
                ReplacementLoaded(shard=s, base_url=f"http://127.0.0.1:{9100 + s}/v1"),
            ]
    return out


@pytest.fixture
def writer(ledger_url: str) -> Iterator[EventLog]:
    with EventLog.open(ledger_url) as log:
        yield log


@pytest.fixture
def run(writer: EventLog) -> str:
    """A run with a history worth asking about, ended."""
    writer.append("r1", [run_started(SHARDS)])
    for event in story(random.Random(7), 40):
        writer.append("r1", [event])
    writer.append("r1", [run_ended("failed")])
    return "r1"


@pytest.fixture
def server(ledger_url: str) -> Iterator[RunningServer]:
    served = start_server(ledger_url, port=0, poll_interval_s=0.02)
    yield served
    served.stop()


def api(server: RunningServer, path: str) -> str:
    return f"{server.url}api/v1/{path}"


def cli_json(*args: str) -> Any:
    return json.loads(invoke(*args, "--json").stdout)


def cli_json_lines(*args: str) -> list[Any]:
    return [json.loads(line) for line in invoke(*args, "--json").stdout.splitlines()]


def bare(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as ``replay --json`` prints it: without the stream's id and words."""
    return {k: v for k, v in entry.items() if k not in ("id", "words")}


# ── the JSON endpoints against their commands ─────────────────────────────────


def test_runs_and_membership_answer_what_the_commands_print(
    server: RunningServer, run: str, ledger_url: str
) -> None:
    assert get_json(api(server, "runs")) == (200, cli_json("runs", "--db", ledger_url))
    head = cli_json("membership", run, "--db", ledger_url)
    assert get_json(api(server, f"runs/{run}/membership")) == (200, head)
    moment = cli_json("membership", run, "--db", ledger_url, "--at", "9")["at"]
    for at in ("1", "9", moment, "2099-01-01T00:00:00Z"):
        expected = cli_json("membership", run, "--db", ledger_url, "--at", at)
        assert get_json(api(server, f"runs/{run}/membership?at={at}")) == (200, expected), at


def test_history_pages_join_into_the_replay_and_never_split_a_seq(
    server: RunningServer, run: str, ledger_url: str
) -> None:
    replayed = cli_json_lines("replay", run, "--db", ledger_url)
    pages, joined, next_seq = 0, [], 1
    while next_seq is not None:
        status, page = get_json(api(server, f"runs/{run}/history?from={next_seq}&limit=3"))
        assert status == 200, page
        if page["next"] is not None:  # the page ends where a seq ends
            assert page["entries"][-1]["seq"] < page["next"]
        joined += page["entries"]
        next_seq, pages = page["next"], pages + 1
    assert [bare(e) for e in joined] == replayed
    assert pages > 3
    ids = [parse_entry_id(e["id"], "id") for e in joined]
    assert ids == sorted(set(ids))  # every entry its own id, in the fold's order
    shard_page = get_json(api(server, f"runs/{run}/history?from=1&limit=5000&shard=2"))[1]
    by_shard = cli_json_lines("replay", run, "--db", ledger_url, "--shard", "2")
    assert [bare(e) for e in shard_page["entries"]] == by_shard
    latest = get_json(api(server, f"runs/{run}/history?limit=4"))[1]
    assert [bare(e) for e in latest["entries"]] == replayed[-4:]
    assert latest["stream_after"] == joined[-1]["id"] and latest["ended"] is True


def test_explanations_answer_what_explain_prints(
    server: RunningServer, run: str, ledger_url: str
) -> None:
    for path, args in (
        (f"runs/{run}/explain", ()),
        (f"runs/{run}/explain?at=12", ("--at", "12")),
        (f"runs/{run}/shards/1/explain", ("1",)),
        (f"runs/{run}/shards/3/explain?at=20", ("3", "--at", "20")),
    ):
        status, answer = get_json(api(server, path))
        assert status == 200, answer
        words = invoke("explain", run, *args, "--db", ledger_url).stdout
        assert answer.pop("text") == words.rstrip("\n")
        assert answer == cli_json("explain", run, *args, "--db", ledger_url)


def test_the_timeline_is_the_painters_own_scene(
    server: RunningServer, run: str, writer: EventLog
) -> None:
    scene = build_scene(lanes_of(writer.read(run)))
    status, kind, body = get(api(server, f"runs/{run}/timeline?format=html"))
    assert (status, kind) == (200, "text/html; charset=utf-8")
    assert body.decode() == fragment(scene)
    status, data = get_json(api(server, f"runs/{run}/timeline?axis=seq"))
    assert status == 200
    assert [lane["shard"] for lane in data["lanes"]] == list(range(SHARDS))
    assert data["end_label"] == build_scene(lanes_of(writer.read(run)), "seq").end_label


BAD_REQUESTS = [
    ("runs/nope/membership", 404, "no run 'nope'"),
    ("runs/r1/shards/9/explain", 404, "shard 9 is out of range"),
    ("runs/r1/shards/x/explain", 404, "not a shard number"),
    ("runs/r1/membership?at=yesterday", 400, "not a seq (an integer) or an ISO 8601 time"),
    ("runs/r1/membership?at=999", 400, "has seqs 1.."),
    ("runs/r1/membership?at=2026-01-01T00:00:00", 400, "has no time zone"),
    ("runs/r1/explain?at=0", 400, "has seqs 1.."),
    # A time before the run's first event: the asker's mistake, naming the first seq.
    ("runs/r1/membership?at=2000-01-01T00:00:00Z", 400, "(seq 1); 2000-01-01T00:00:00"),
    ("runs/r1/explain?at=2000-01-01T00:00:00Z", 400, "is before its first event"),
    ("runs/r1/shards/0/explain?at=2000-01-01T00:00:00Z", 400, "is before its first event"),
    ("runs/r1/history?from=0", 400, "from='0'"),
    ("runs/r1/history?from=999", 400, "from=999"),
    ("runs/r1/history?limit=99999", 400, "at most 5000"),
    ("runs/r1/history?shard=7", 400, "shard 7 is out of range"),
    ("runs/r1/timeline?axis=space", 400, "axis='space'"),
    ("runs/r1/timeline?format=pdf", 400, "format='pdf'"),
    ("runs/r1/stream?after=abc", 400, "not an entry id"),
    ("runs/r1/stream?after=999.0", 400, "resume point 999.0"),
    ("runs/nope/stream", 404, "no run 'nope'"),
    ("nothing/here", 404, "no such path"),
    # Digits that are not 0-9 ('²' passes str.isdigit, not int): refused, not a 500.
    ("runs/r1/history?limit=%C2%B2", 400, "limit='²'"),
    ("runs/r1/stream?after=%C2%B2", 400, "not an entry id"),
    ("runs/r1/shards/%C2%B2/explain", 404, "not a shard number"),
]


@pytest.mark.parametrize(("path", "status", "words"), BAD_REQUESTS)
def test_bad_input_is_one_json_line_naming_what_was_wrong(
    server: RunningServer, run: str, path: str, status: int, words: str
) -> None:
    got, body = get_json(api(server, path))
    assert (got, body["status"]) == (status, status)
    assert words in body["error"] and "\n" not in body["error"], body
    assert "Traceback" not in body["error"]


def test_the_server_only_reads(server: RunningServer, run: str, writer: EventLog) -> None:
    engine = writer.database.engine
    assert engine is not None
    before = dump_tables(engine)
    got, body = get_json(api(server, "runs"), method="POST")
    assert got == 405 and "only reads" in body["error"]
    assert get(api(server, "runs"), method="DELETE")[0] == 405
    for path in (
        "runs",
        f"runs/{run}/membership",
        f"runs/{run}/history?from=1",
        f"runs/{run}/explain",
        f"runs/{run}/shards/0/explain",
        f"runs/{run}/timeline",
    ):
        assert get(api(server, path))[0] == 200
    stream = EventStream(api(server, f"runs/{run}/stream?after=0"))
    while stream.next() is not None:
        pass
    assert dump_tables(engine) == before


def test_a_missing_ledger_is_a_clear_503_until_it_appears(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    served = start_server(f"sqlite:///{path}", port=0)
    try:
        status, body = get_json(f"{served.url}api/v1/runs")
        assert status == 503 and str(path) in body["error"], body
        assert not path.exists()  # a read-only server never creates the ledger
        with EventLog.open(f"sqlite:///{path}") as log:
            log.append("late", [run_started(2)])
        status, body = get_json(f"{served.url}api/v1/runs")
        assert status == 200 and [r["run"] for r in body] == ["late"]
    finally:
        served.stop()


def test_a_page_elsewhere_cannot_read_a_loopback_server(server: RunningServer, run: str) -> None:
    """DNS rebinding: a name of another site pointed at 127.0.0.1 reaches the socket,
    and its Host header says so."""
    status, _, body = get(api(server, "runs"), headers={"Host": "evil.example:80"})
    assert status == 403 and "'evil.example' is not this server's" in json.loads(body)["error"]
    assert get(api(server, "runs"), headers={"Host": f"localhost:{server.port}"})[0] == 200


def test_a_sqlite_ledger_replaced_under_the_server_is_read_anew(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'swap.db'}"
    with EventLog.open(url) as log:
        log.append("before", [run_started(2)])
    served = start_server(url, port=0)
    try:
        assert [r["run"] for r in get_json(f"{served.url}api/v1/runs")[1]] == ["before"]
        for leftover in tmp_path.glob("swap.db*"):
            leftover.unlink()
        with EventLog.open(url) as log:
            log.append("after", [run_started(2)])
        assert [r["run"] for r in get_json(f"{served.url}api/v1/runs")[1]] == ["after"]
    finally:
        served.stop()


def test_concurrent_catch_ups_of_an_unreadable_ledger_all_fail(tmp_path: Path) -> None:
    """A request never takes "a later catch-up ran" for "a later catch-up succeeded"."""
    source = LedgerSource(f"sqlite:///{tmp_path / 'absent.db'}")
    feed = RunFeed(source, "r", 1)

    async def three() -> list[BaseException | None]:
        with ThreadPoolExecutor(2) as pool:
            return await asyncio.gather(
                *(feed.catch_up(pool) for _ in range(3)), return_exceptions=True
            )

    outcomes = asyncio.run(three())
    assert all(isinstance(o, LedgerOpenError) for o in outcomes), outcomes
    assert feed.membership == {} and feed.seq == 0


@pytest.mark.postgres
def test_a_database_without_a_ledger_is_503_until_it_is_migrated(postgres_url: str) -> None:
    served = start_server(postgres_url, port=0)
    try:
        status, body = get_json(f"{served.url}api/v1/runs")
        assert status == 503 and "fleetledger migrate" in body["error"], body
        migrate(postgres_url)
        with EventLog.open(postgres_url) as log:
            log.append("after", [run_started(2)])
        status, body = get_json(f"{served.url}api/v1/runs/after/membership")
        assert status == 200 and body["run"] == "after"
    finally:
        served.stop()


@pytest.mark.postgres
def test_a_postgresql_ledger_dropped_and_created_again_is_served_afresh(
    postgres_server_url: str, migrated_postgres_url: str
) -> None:
    """Found by a hostile pass: after the database was dropped and created again under
    the same name, serve kept answering from what it had folded of the old one ("run
    has seqs 1..6; --at 21 is outside it") and would have mixed the two."""
    import psycopg

    from tests.conftest import _admin_url, drop_database

    with EventLog.open(migrated_postgres_url) as log:
        log.append("r", [run_started(2)])
    served = start_server(migrated_postgres_url, port=0, poll_interval_s=0.05)
    try:
        assert get_json(f"{served.url}api/v1/runs/r/membership")[1]["seq"] == 1
        name = migrated_postgres_url.rsplit("/", 1)[1]
        drop_database(postgres_server_url, name)
        with psycopg.connect(_admin_url(postgres_server_url), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        migrate(migrated_postgres_url)
        with EventLog.open(migrated_postgres_url) as log:
            log.append("r", [run_started(3)])
            for _ in range(20):
                log.append("r", [ProbeRound(ok=(0, 1, 2))])
        deadline = time.monotonic() + 30
        while True:  # the first request may meet the dropped connection: 503, once
            status, body = get_json(f"{served.url}api/v1/runs/r/membership")
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 200 and body["seq"] == 21 and len(body["shards"]) == 3, body
        assert get_json(f"{served.url}api/v1/runs/r/membership?at=21")[1]["seq"] == 21
    finally:
        served.stop()


CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"


def test_the_serve_command_prints_its_url_serves_and_stops_on_sigterm(sqlite_url: str) -> None:
    with EventLog.open(sqlite_url) as log:
        log.append("cli", [run_started(2)])
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "serve", "--port", "0", "--db", sqlite_url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
        assert get_json(f"{url}api/v1/runs/cli/membership")[1]["run"] == "cli"
        status, kind, page = get(url)
        assert (status, kind) == (200, "text/html; charset=utf-8") and b"page.js" in page
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "read-only" in err and "Traceback" not in err


def test_a_port_in_use_is_one_line_and_status_2(sqlite_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [str(CONSOLE_SCRIPT), "serve", "--port", str(port), "--db", sqlite_url],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.startswith(f"fleetledger: error: cannot listen on 127.0.0.1:{port}: ")
    assert done.stderr.count("\n") == 1 and done.stdout == ""


# ── the stream ────────────────────────────────────────────────────────────────


def append_in_the_background(
    log: EventLog, run: str, events: list[Event], rng: random.Random
) -> threading.Thread:
    """A writer that appends ``events`` one batch at a time, with pauses, then ends the run."""

    def write() -> None:
        i = 0
        while i < len(events):
            size = rng.randint(1, 4)
            log.append(run, events[i : i + size])
            i += size
            time.sleep(rng.choice((0, 0, 0.002, 0.01, 0.03)))
        log.append(run, [run_ended()])

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def read_until(stream: EventStream, count: int | None) -> tuple[list[Message], bool]:
    """Entry messages until ``count`` of them (None: all), and whether ``ended`` came."""
    entries: list[Message] = []
    while count is None or len(entries) < count:
        message = stream.next()
        if message is None:
            return entries, False
        if message.event == "entry":
            entries.append(message)
        elif message.event == "ended":
            return entries, True
        else:
            assert message.event == "head", message
    return entries, False


def test_a_follower_gets_every_entry_appended_while_it_follows(
    server: RunningServer, writer: EventLog, ledger_url: str
) -> None:
    writer.append("live", [run_started(SHARDS)])
    stream = EventStream(api(server, "runs/live/stream?after=1"))
    assert (stream.status, stream.content_type) == (200, "text/event-stream; charset=utf-8")
    rng = random.Random(11)
    thread = append_in_the_background(writer, "live", story(rng, 120), rng)
    entries, ended = read_until(stream, None)
    thread.join()
    stream.close()
    assert ended
    replayed = [e for e in cli_json_lines("replay", "live", "--db", ledger_url) if e["seq"] > 1]
    assert [bare(m.json()) for m in entries] == replayed
    assert [m.id for m in entries] == [m.json()["id"] for m in entries]
    metrics = get(f"{server.url}metrics")[2].decode()
    observed = next(
        line
        for line in metrics.splitlines()
        if line.startswith("fleetledger_serve_stream_lag_seconds_count")
    )
    assert float(observed.split()[-1]) == len(entries)  # each live entry's lag measured


def test_a_resume_before_a_quiet_window_reads_what_it_missed_from_the_log(
    server: RunningServer, writer: EventLog, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's feed of a run starts a window before the head; when that window holds
    no entry (healthy probes only), a client resuming from before it must still get the
    entries it missed, read from the log — not "nothing new"."""
    monkeypatch.setattr(feeds, "RECENT_WINDOW", 10)
    writer.append("quiet", [run_started(SHARDS)])
    writer.append("quiet", [ActorDeathConfirmed(shard=2, error="ActorDiedError: gone")])
    for _ in range(30):
        writer.append("quiet", [ProbeRound(ok=(0, 1, 3))])
    stream = EventStream(api(server, "runs/quiet/stream"), last_event_id="1.0")
    entries: list[Message] = []
    while (message := stream.next()) is not None and message.event != "head":
        entries.append(message)
    stream.close()
    replayed = [e for e in cli_json_lines("replay", "quiet", "--db", ledger_url) if e["seq"] > 1]
    assert [bare(m.json()) for m in entries] == replayed
    assert [m.id for m in entries] == ["2.0", "2.1"]


@pytest.mark.parametrize("trial", range(3))
def test_a_client_that_drops_and_resumes_misses_nothing_and_gets_nothing_twice(
    server: RunningServer, writer: EventLog, ledger_url: str, trial: int
) -> None:
    """Disconnects at random entries — between two entries of one seq too — while the
    writer goes on; each reconnect sends ``Last-Event-ID`` as a browser does."""
    rng = random.Random(100 + trial)
    run = f"resumed-{trial}"
    writer.append(run, [run_started(SHARDS)])
    thread = append_in_the_background(writer, run, story(rng, 150), rng)
    received: list[Message] = []
    last_id: str | None = "1"
    cuts = 0
    while True:
        stream = EventStream(api(server, f"runs/{run}/stream"), last_event_id=last_id)
        got, ended = read_until(stream, None if cuts >= 6 else rng.randint(1, 12))
        stream.close()  # mid-stream: the server sees the client go away
        received += got
        if got:
            last_id = got[-1].id
        if ended:
            break
        cuts += 1
        time.sleep(rng.choice((0, 0.005, 0.05)))
    thread.join()
    replayed = [e for e in cli_json_lines("replay", run, "--db", ledger_url) if e["seq"] > 1]
    assert [bare(m.json()) for m in received] == replayed
    ids = [m.id for m in received]
    assert len(ids) == len(set(ids))
    split = [
        (a, b)
        for a, b in itertools.pairwise(ids)
        if a is not None and b is not None and a.split(".")[0] == b.split(".")[0]
    ]
    assert split, "the story makes seqs with several entries"


def test_following_an_ended_run_tells_how_it_ended_and_closes(
    server: RunningServer, run: str
) -> None:
    stream = EventStream(api(server, f"runs/{run}/stream"))
    entries, ended = read_until(stream, None)
    assert ended and [m.json()["kind"] for m in entries] == ["end"]
    assert stream.next() is None  # the server closed it
    assert entries[0].json()["seq"] == get_json(api(server, f"runs/{run}/membership"))[1]["seq"]


@pytest.mark.postgres
def test_on_postgresql_appends_are_pushed_not_waited_for(migrated_postgres_url: str) -> None:
    """With a poll slower than the whole test, entries still arrive: LISTEN/NOTIFY."""
    served = start_server(migrated_postgres_url, port=0, poll_interval_s=3600)
    try:
        with EventLog.open(migrated_postgres_url) as log:
            log.append("pushed", [run_started(SHARDS)])
            stream = EventStream(f"{served.url}api/v1/runs/pushed/stream?after=1")
            deadline = time.monotonic() + 30
            while "fleetledger_serve_listening 1.0" not in get(f"{served.url}metrics")[2].decode():
                assert time.monotonic() < deadline, "the server never started listening"
                time.sleep(0.05)
            log.append("pushed", [ActorDeathConfirmed(shard=2, error="ActorDiedError: gone")])
            log.append("pushed", [run_ended("failed")])
            entries, ended = read_until(stream, None)
        assert ended
        assert [(m.json()["kind"], m.json().get("after")) for m in entries][:2] == [
            ("transition", "DEAD"),
            ("epoch", None),
        ]
    finally:
        served.stop()


def test_the_python_follower_of_the_docs_reads_a_whole_run(
    server: RunningServer, run: str, ledger_url: str
) -> None:
    guide = Path(__file__).resolve().parent.parent / "docs" / "http.md"
    found = re.search(r"```python\n(.*?)```", guide.read_text(encoding="utf-8"), re.S)
    assert found is not None
    namespace: dict[str, Any] = {}
    exec(found.group(1), namespace)
    entries = list(namespace["follow"](server.url.rstrip("/"), run, after="0"))
    assert [bare(e) for e in entries] == cli_json_lines("replay", run, "--db", ledger_url)


# ── entry ids: the resume rule ─────────────────────────────────────────────────


@given(st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=60))
def test_entry_ids_order_as_the_fold_and_resume_exactly(seqs: list[int]) -> None:
    """For any run's entries: ids grow in the fold's order, read back as themselves, and
    "after SEQ" falls after every entry of that seq and before the next seq's."""
    seqs = sorted(seqs)
    numbering = Numbering()
    ids = [numbering.next_id(seq) for seq in seqs]
    assert ids == sorted(set(ids))
    assert all(parse_entry_id(id_text(i), "id") == i for i in ids)
    for cut in range(len(ids)):
        after_seq = parse_entry_id(str(ids[cut][0]), "id")
        assert after_seq == (ids[cut][0], WHOLE_SEQ)
        assert [i for i in ids if i > after_seq] == [i for i in ids if i[0] > ids[cut][0]]
        assert [i for i in ids if i > ids[cut]] == ids[cut + 1 :]


@pytest.mark.parametrize("text", ["", "1.2.3", "-1", "1e3", "x.1", "9" * 19, " . "])
def test_a_malformed_resume_point_is_refused_naming_where(text: str) -> None:
    with pytest.raises(HttpProblem, match="Last-Event-ID") as caught:
        parse_entry_id(text, "Last-Event-ID")
    assert caught.value.status == 400
