"""Running the ``fleetledger`` command in-process, as the console script would.

``cli_sandbox`` (a fixture in conftest) gives each command test an empty working
directory, no ledger or logging settings from the environment, and puts structlog's
configuration back afterwards: every command points structlog at the stderr CliRunner
captures, which is closed after the command, so a later test's warning would be written
to a closed file.
"""

from __future__ import annotations

from typer.testing import CliRunner, Result

from fleetledger import cli as cli_module

CLI_ENV_VARS = ("FLEETLEDGER_DB", "FLEETLEDGER_LOG", "FLEETLEDGER_LOG_FORMAT")


def run_cli(
    *args: str, input: bytes | str | None = None, env: dict[str, str | None] | None = None
) -> Result:
    """Run one command; the ledger comes only from ``--db`` (or ``env``), never the shell's."""
    return CliRunner().invoke(
        cli_module.app, list(args), input=input, env={"FLEETLEDGER_DB": None, **(env or {})}
    )


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
