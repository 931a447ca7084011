"""Running the ``fleetledger`` command in-process, as the console script would.

``cli_sandbox`` (a fixture in conftest) gives each command test an empty working
directory, no ledger or logging settings from the environment, and puts structlog's
configuration back afterwards: every command points structlog at the stderr CliRunner
captures, which is closed after the command, so a later test's warning would be written
to a closed file.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import structlog
from typer.testing import CliRunner, Result

from fleetledger import cli as cli_module

CLI_ENV_VARS = ("FLEETLEDGER_DB", "FLEETLEDGER_LOG", "FLEETLEDGER_LOG_FORMAT")


def run_cli(
    *args: str, input: bytes | str | None = None, env: dict[str, str | None] | None = None
) -> Result:
    """Run one command; the ledger comes only from ``--db`` (or ``env``), never the shell's.

    structlog's configuration is put back afterwards whether or not the test uses
    ``cli_sandbox``: the command pointed it at a stream CliRunner closes, and a later
    module's first log line would fail on it (seen: a test without the fixture broke
    four tests of the next module).
    """
    saved = structlog.get_config()
    try:
        return CliRunner().invoke(
            cli_module.app, list(args), input=input, env={"FLEETLEDGER_DB": None, **(env or {})}
        )
    finally:
        structlog.configure(**saved)


def invoke(
    *args: str, input: bytes | str | None = None, env: dict[str, str | None] | None = None
) -> Result:
    """Run one command that must succeed, with no traceback anywhere in its output."""
    result = run_cli(*args, input=input, env=env)
    assert result.exit_code == 0, (
        f"fleetledger {' '.join(args)} exited {result.exit_code}\n"
        f"stdout: {result.stdout}\nstderr: {result.stderr}\nexception: {result.exception!r}"
    )
    assert "Traceback" not in result.stdout + result.stderr
    return result


def run_with_a_terminal(
    argv: list[str], *, terminal: str, env: dict[str, str], timeout: float = 120
) -> tuple[int, bytes, bytes]:
    """Run ``argv`` with its ``terminal`` stream ("stdout" or "stderr") on a real
    pseudo-terminal and the other on a pipe; returns (status, the pipe's bytes, what
    the terminal received)."""
    leader, follower = pty.openpty()
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, terminal: follower}
    proc = subprocess.Popen(argv, stdout=streams["stdout"], stderr=streams["stderr"], env=env)
    os.close(follower)
    received: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the child closed its end
                return
            if not chunk:
                return
            received.append(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        reader.join(timeout=10)
        os.close(leader)
    piped = err if terminal == "stdout" else out
    return proc.returncode, piped or b"", b"".join(received)


# ── a fresh interpreter, its own peak memory measured ──────────────────────────


@dataclass(frozen=True)
class Child:
    returncode: int
    stdout: str
    stderr: str
    peak_rss_mb: float


# A child's ru_maxrss counts the memory of the process it was forked from (Linux keeps
# the forking process's high-water mark across exec): measured straight from a large
# test process, a 50 MB child reads as that process's size. So a small parent starts
# the command and reports the command's own peak.
MEASURING_PARENT = (
    "import os, subprocess, sys\n"
    "proc = subprocess.Popen(sys.argv[1:])\n"
    "_, status, usage = os.wait4(proc.pid, 0)\n"
    "open(os.environ['CHILD_RSS_FILE'], 'w').write(str(usage.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def fleetledger_command(*args: str) -> list[str]:
    """``fleetledger ARGS`` in a fresh interpreter of this venv (the installed script's
    own entry point)."""
    code = "import sys; sys.argv[0] = 'fleetledger'; from fleetledger.cli import main; main()"
    return [sys.executable, "-c", code, *args]


def command_env() -> dict[str, str]:
    """The environment a command process gets: none of the shell's ledger settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}


def run_child(
    args: list[str], cwd: Path, stdin_from: Iterable[bytes] | None = None, timeout: float = 300
) -> Child:
    """``fleetledger ARGS`` in a fresh interpreter; its own peak RSS, from ``os.wait4``.

    ``stdin_from`` (chunks: a file's, or a run generated on the fly) is fed through a
    pipe, a stream that cannot seek, by a thread: the child may refuse, and close the
    pipe, long before the chunks end.
    """
    out, err, rss = cwd / "child.stdout", cwd / "child.stderr", cwd / "child.rss"
    env = {**command_env(), "CHILD_RSS_FILE": str(rss)}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-c", MEASURING_PARENT, *fleetledger_command(*args)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin_from is not None else subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    feeder = None
    if stdin_from is not None:
        assert proc.stdin is not None
        feeder = threading.Thread(target=_feed, args=(stdin_from, proc.stdin), daemon=True)
        feeder.start()
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    try:
        _, status, _usage = os.wait4(proc.pid, 0)
    finally:
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if feeder is not None:
        feeder.join(timeout=60)
    child = Child(
        proc.returncode,
        out.read_text(encoding="utf-8", errors="replace"),
        err.read_text(encoding="utf-8", errors="replace"),
        int(rss.read_text(encoding="utf-8")) / 1024,  # kilobytes on Linux
    )
    out.unlink()
    err.unlink()
    rss.unlink()
    return child


def file_chunks(source: Path) -> Iterator[bytes]:
    with source.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            yield chunk


def _feed(chunks: Iterable[bytes], pipe: IO[bytes]) -> None:
    try:
        for chunk in chunks:
            pipe.write(chunk)
    except BrokenPipeError:
        pass  # the child refused the input and closed its end: the point of some tests
    finally:
        try:
            pipe.close()
        except BrokenPipeError:
            pass


# ── progress on a terminal ─────────────────────────────────────────────────────

PROGRESS_SCRIPT = (
    "import sys\n"
    "from fleetledger.cli import progress\n"
    "progress.SHOW_AFTER_S = float(sys.argv[1])\n"
    "from fleetledger.cli import main\n"
    "sys.argv = ['fleetledger', *sys.argv[2:]]\n"
    "main()\n"
)


def with_progress_after(delay_s: float, *args: str) -> list[str]:
    """``fleetledger ARGS`` with progress shown after ``delay_s`` (0: a small run shows it)."""
    return [sys.executable, "-c", PROGRESS_SCRIPT, str(delay_s), *args]


def stderr_on_a_terminal(argv: list[str]) -> tuple[str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal and stdout on a pipe (as in
    ``replay > file``); returns (stdout, what the terminal received, controls removed)."""
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    status, stdout, received = run_with_a_terminal(argv, terminal="stderr", env=env)
    assert status == 0, (stdout, received)
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", received.decode(errors="replace"))
    return stdout.decode(), drawn
