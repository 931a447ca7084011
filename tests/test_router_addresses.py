"""router-sync's addresses are checked before it starts: one line, status 2.

It once started with ``http:// 127.0.0.1:1``, a 5,000-character host or a bad
``--smg-metrics`` and retried forever (issue 36)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fleetledger.router.addresses import address_problem

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"

BAD = {
    "http:// 127.0.0.1:1": "spaces or control characters",
    " http://127.0.0.1:1": "spaces or control characters",
    "http://127.0.0.1:1\n": "spaces or control characters",
    "http://127.0.0.1:99999": "Port out of range",
    "http://127.0.0.1:abc": "not a URL",
    "http://127.0.0.1:0": "port 0",
    "ftp://127.0.0.1:1": "give http://host:port",
    "127.0.0.1:30000": "give http://host:port",
    "http://": "no host",
    "http://" + "a" * 5000 + ":1": "host of 5000 characters",
    "http://" + "a" * 64 + ".example:1": "is no host name",
    "http://user:secret@127.0.0.1:1": "a user or password",
    "http://127.0.0.1:1/?x=1": "no query or fragment",
}


@pytest.mark.parametrize("url", sorted(BAD))
def test_an_address_no_router_could_have_is_named_why(url):
    problem = address_problem(url)
    assert problem is not None and BAD[url] in problem


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:30000", "https://smg.internal:443", "http://[::1]:8080", "http://h"]
)
def test_a_router_address_passes(url):
    assert address_problem(url) is None


@pytest.mark.parametrize(
    "option", ["--smg", "--vllm-router", "--smg-metrics", "--vllm-router-metrics"]
)
def test_router_sync_refuses_a_bad_address_before_it_starts(option, sqlite_url):
    args = [option, "http://user:secret@" + "a" * 5000 + ":1"]
    if option.endswith("-metrics"):
        args = ["--smg" if "smg" in option else "--vllm-router", "http://127.0.0.1:1", *args]
    done = subprocess.run(
        [str(CONSOLE_SCRIPT), "router-sync", "r", *args, "--db", sqlite_url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fleetledger: error: {option} ") and "secret" not in line
    assert len(line) < 300
