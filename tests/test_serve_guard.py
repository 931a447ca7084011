"""``serve`` against slow, hostile and too many clients: heads that never end are timed
out, connections past the cap are refused at once, malformed HTTP gets the API's one JSON
line and one log line — never a traceback (issue 36). Real sockets, a real server; the
file-limit case runs the command in its own process under a lowered ``ulimit -n``.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.store.log import EventLog
from fleetledger.web import start_server
from fleetledger.web.guard import Limits
from fleetledger.web.server import RunningServer
from tests.builders import run_started
from tests.http_clients import get

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"


@pytest.fixture
def ledger(sqlite_url: str) -> str:
    with EventLog.open(sqlite_url) as log:
        log.append("r", [run_started(2)])
    return sqlite_url


@pytest.fixture
def bounded(ledger: str) -> Iterator[RunningServer]:
    server = start_server(ledger, port=0, limits=Limits(head_s=0.5, max_connections=4))
    yield server
    server.stop()


def _until_closed(sock: socket.socket) -> bytes:
    sock.settimeout(30)  # a hang guard: a server that never closes fails here
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _json_answer(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"application/json" in head, head
    return status, json.loads(body)


def test_a_head_that_never_ends_is_408_and_the_connection_closed(bounded):
    with socket.create_connection(("127.0.0.1", bounded.port)) as sock:
        sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        status, body = _json_answer(_until_closed(sock))
    assert status == 408 and "no whole request head within 0.5 s" in body["error"]


def test_an_idle_connection_is_closed_too(bounded):
    with socket.create_connection(("127.0.0.1", bounded.port)) as sock:
        status, _ = _json_answer(_until_closed(sock))  # said nothing at all
    assert status == 408


def test_past_the_cap_a_connection_is_503_at_once_and_the_rest_are_served(bounded):
    held = [socket.create_connection(("127.0.0.1", bounded.port)) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")  # a head left open
        with socket.create_connection(("127.0.0.1", bounded.port)) as extra:
            status, body = _json_answer(_until_closed(extra))
        assert status == 503 and "holds 4 connections, its most" in body["error"]
    finally:
        for sock in held:
            sock.close()
    # The slots are freed as those connections go: a normal request is answered.
    deadline = time.monotonic() + 30
    while (got := get(f"{bounded.url}api/v1/runs")[0]) == 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert got == 200


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GET /api/v1/runs HTTP/1.1\r\nHost: localhost\r\nNo colon here\r\n\r\n", 400),
        (b"GET /api/v1/runs HTTP/9.9\r\nHost: localhost\r\n\r\n", 400),
        (b"G\x00T / HTTP/1.1\r\nHost: localhost\r\n\r\n", 400),
        (
            b"GET /api/v1/runs HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"x" * 70000 + b"\r\n\r\n",
            431,
        ),
    ],
)
def test_malformed_http_gets_the_apis_json_in_one_line(data, status, bounded):
    with socket.create_connection(("127.0.0.1", bounded.port)) as sock:
        sock.sendall(data)
        got_status, body = _json_answer(_until_closed(sock))
    assert got_status in (status, 400), got_status  # aiohttp says 400 for some 431s
    assert set(body) == {"error", "status"} and "\n" not in body["error"]
    assert body["error"].startswith("malformed HTTP request:")
    assert data[:60].decode("latin-1") not in body["error"]  # the request is not echoed


def _limit_files(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_slow_clients_under_a_low_file_limit_leave_a_normal_client_answered(ledger, tmp_path):
    """Under ``ulimit -n 256``, 400 connections that send half a head: a normal request
    is still answered (200, or the cap's 503 — an answer, never a hang), and the log
    says the refusals in lines, not a traceback per accept."""
    err_path = tmp_path / "serve.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            [str(CONSOLE_SCRIPT), "serve", "--port", "0", "--db", ledger],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=lambda: _limit_files(256),
        )
    slow: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1].rstrip("/"))
        for _ in range(400):
            try:
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")
                slow.append(sock)
            except OSError:
                break
        status, _, body = get(f"{url}api/v1/runs", timeout=30)
        assert status in (200, 503), (status, body[:200])
        if status == 503:
            assert "its most" in json.loads(body)["error"]
    finally:
        for sock in slow:
            sock.close()
        proc.terminate()
        proc.wait(timeout=30)
    said = err_path.read_text()
    assert "Traceback" not in said
    assert len(said.splitlines()) < 50, said[-2000:]


def test_an_expectation_the_server_cannot_meet_is_417_in_the_apis_json(bounded):
    status, kind, body = get(f"{bounded.url}api/v1/runs", headers={"Expect": "weird"})
    assert (status, kind.split(";")[0]) == (417, "application/json")
    assert "Expect 'weird'" in json.loads(body)["error"]
    continued = get(f"{bounded.url}api/v1/runs", headers={"Expect": "100-continue"})
    assert continued[0] == 200
