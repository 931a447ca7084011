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
import subprocess
import threading

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
