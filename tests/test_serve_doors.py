"""``serve``'s doors: the Host check follows the bound address, not its spelling; off
loopback a token (or an explicit ``--no-auth``); a malformed Host is a 400 in one line.

A hostile pass found ``serve --host 127.1`` (also ``127.0.0.2``, ``2130706433``,
``127.000.000.001``) bound loopback and answered ``Host: evil.example``, and
``--host 0.0.0.0`` served the whole ledger to anyone with no token and no warning
(issue 36). Real servers on real sockets, a real SQLite ledger, the command's own
process where its words and status are what is tested.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetledger.store.log import EventLog
from fleetledger.web import start_server
from fleetledger.web.doors import DoorsRefused, doors_for, host_name, is_loopback
from fleetledger.web.server import Access, RunningServer, ServeError
from tests.builders import run_started
from tests.http_clients import get

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
TOKEN = "s3cret-token-of-enough-length"


@pytest.fixture
def ledger(sqlite_url: str) -> str:
    with EventLog.open(sqlite_url) as log:
        log.append("r", [run_started(2)])
    return sqlite_url


def _serve(ledger: str, host: str, access: Access | None = None) -> RunningServer:
    return start_server(ledger, host, port=0, access=access or Access())


@pytest.fixture
def serving() -> Iterator[list[RunningServer]]:
    started: list[RunningServer] = []
    yield started
    for server in started:
        server.stop()


# ── the pure rules ───────────────────────────────────────────────────────────


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("127.255.255.254", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("not an address", False),
    ],
)
def test_loopback_is_the_bound_address_not_a_name(address, loopback):
    assert is_loopback(address) is loopback


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("localhost:8321", "localhost"),
        ("LOCALHOST", "localhost"),
        ("[::1]:8321", "::1"),
        ("[::1]", "::1"),
        ("127.1:80", "127.1"),
        ("evil.example:80", "evil.example"),
    ],
)
def test_a_host_header_names_a_host_and_maybe_a_port(raw, name):
    assert host_name(raw) == name


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("x:99999", "the port is not a number"),
        ("x:abc", "the port is not a number"),
        ("x:", "the port is not a number"),
        ("::1", "must be [bracketed]"),
        ("[::1", "must be [bracketed]"),
        ("[::1]x", "must be [bracketed]"),
        (":80", "no name"),
        ("", "no Host header"),
        (None, "no Host header"),
    ],
)
def test_a_malformed_host_is_refused_in_one_line(raw, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        host_name(raw)


def test_off_loopback_the_doors_need_a_token_or_no_auth_said_outright():
    with pytest.raises(DoorsRefused, match="not loopback: anyone who reaches it"):
        doors_for("0.0.0.0", "0.0.0.0")
    with pytest.raises(DoorsRefused, match="at least 16"):
        doors_for("0.0.0.0", "0.0.0.0", token="short")
    with pytest.raises(DoorsRefused, match="one or the other"):
        doors_for("0.0.0.0", "0.0.0.0", token=TOKEN, no_auth=True)
    assert doors_for("0.0.0.0", "0.0.0.0", no_auth=True).hosts == frozenset()
    doors = doors_for("10.1.2.3", "box", token=TOKEN, allow_hosts=["Box.Example"])
    assert doors.hosts == {"box.example"} and not doors.loopback
    assert doors.admits(f"Bearer {TOKEN}", None) and doors.admits(None, TOKEN)
    assert not doors.admits(f"Bearer {TOKEN}x", None) and not doors.admits("Basic x", "")
    assert not doors.admits(None, None)


# ── real servers ─────────────────────────────────────────────────────────────

LOOPBACK_SPELLINGS = ["127.0.0.1", "127.1", "127.0.0.2", "2130706433", "127.000.000.001", "::1"]


@pytest.mark.parametrize("spelled", LOOPBACK_SPELLINGS)
def test_every_loopback_spelling_gets_the_host_check(spelled, ledger, serving):
    server = _serve(ledger, spelled)
    serving.append(server)
    url = f"{server.url}api/v1/runs"
    status, _, body = get(url, headers={"Host": "evil.example"})
    assert status == 403 and "'evil.example' is not this server's" in json.loads(body)["error"]
    for own in (
        "localhost",
        f"localhost:{server.port}",
        spelled if ":" not in spelled else "[::1]",
    ):
        assert get(url, headers={"Host": own})[0] == 200, own


@pytest.mark.parametrize("raw", ["x:99999", "localhost:abc", "::1", "[::1"])
def test_a_malformed_host_is_400_not_500(raw, ledger, serving):
    server = _serve(ledger, "127.0.0.1")
    serving.append(server)
    status, kind, body = get(f"{server.url}api/v1/runs", headers={"Host": raw})
    assert (status, kind) == (400, "application/json; charset=utf-8"), body
    assert "\n" not in json.loads(body)["error"]


def test_a_non_loopback_bind_without_a_token_does_not_start(ledger):
    with pytest.raises(ServeError, match=re.escape("binds 0.0.0.0, not loopback")):
        _serve(ledger, "0.0.0.0")


def test_off_loopback_the_api_needs_the_token_and_the_page_shows_nothing_without_it(
    ledger, serving
):
    server = _serve(ledger, "0.0.0.0", Access(token=TOKEN))
    serving.append(server)
    base = f"http://127.0.0.1:{server.port}/"
    status, _, body = get(f"{base}api/v1/runs")
    assert status == 401 and "needs its token" in json.loads(body)["error"]
    assert (
        get(f"{base}api/v1/runs", headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})[0]
        == 401
    )
    assert get(f"{base}metrics")[0] == 401
    # The token in a header: answered, and the cookie the page's stream will carry.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/api/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    answer = conn.getresponse()
    cookie = answer.getheader("Set-Cookie") or ""
    assert answer.status == 200 and json.loads(answer.read())[0]["run"] == "r"
    conn.close()
    assert cookie.startswith(f"fleetledger_token={TOKEN}") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie
    assert get(f"{base}api/v1/runs", headers={"Cookie": f"fleetledger_token={TOKEN}"})[0] == 200
    # The page's shell and files are open, and name no ledger.
    status, _, page = get(base)
    assert status == 200 and b'data-ledger=""' in page and ledger.encode() not in page
    assert get(f"{base}static/page.js")[0] == 200


def test_no_auth_serves_anyone_and_says_so_once(ledger):
    proc = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "serve", "--host", "0.0.0.0", "--port", "0", "--no-auth",
         "--db", ledger],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        port = int(url.rsplit(":", 1)[1].rstrip("/"))
        assert get(f"http://127.0.0.1:{port}/api/v1/runs")[0] == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warnings = [line for line in err.splitlines() if "--no-auth" in line]
    assert len(warnings) == 1 and "anyone who can reach" in warnings[0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--host", "0.0.0.0"], "not loopback: anyone who reaches it"),
        (["--host", "0.0.0.0", "--token-file", "/nonexistent/token"], "No such file"),
        (["--host", "0.0.0.0", "--token-file", "EMPTY"], "give one token"),
    ],
)
def test_the_command_refuses_open_doors_in_one_line_with_status_2(args, said, ledger, tmp_path):
    empty = tmp_path / "token"
    empty.write_text("\n")
    argv = [a if a != "EMPTY" else str(empty) for a in args]
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "serve", *argv, "--port", "0", "--db", ledger],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0] and "Traceback" not in done.stderr


def test_the_old_make_app_call_with_a_host_still_works_and_warns(ledger):
    from fleetledger.web.app import DOORS, make_app
    from fleetledger.web.server import ServedLedger

    with pytest.warns(DeprecationWarning, match="make_app\\(served, host\\) is deprecated"):
        app = make_app(ServedLedger(ledger), "127.0.0.1")
    assert app[DOORS].loopback and "localhost" in app[DOORS].hosts
