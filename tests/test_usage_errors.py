"""Usage errors are one line, like every other error; help shows its defaults.

A usage error (a value of the wrong type, a missing argument, an unknown option or
command) prints exactly one line on stderr, ``fleetledger: error: …``, and exits 2:
no "Usage:" block, no "Try --help", no box. It holds for the in-process runner the
other tests use (``CliRunner`` invoking ``fleetledger.cli.app``) and for the installed
console script alike. ``--help`` is plain text, so square brackets in help texts
(``[default: 1.0]``) are shown, not read as markup.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from click.testing import Result

from fleetledger.cli import app
from tests.cli_support import invoke, run_cli
from tests.test_bad_input import assert_cli_error

pytestmark = pytest.mark.usefixtures("cli_sandbox")

CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"
BOX = set("╭╮╰╯│─━┃")

CASES = [
    (("explain", "RUN", "abc"), "SHARD must be an integer, got 'abc'"),
    (("replay", "RUN", "--from", "x"), "--from must be an integer, got 'x'"),
    (("replay", "RUN", "--shard", "1.5"), "--shard must be an integer, got '1.5'"),
    (("watch", "RUN", "--interval", "soon"), "--interval must be a number, got 'soon'"),
    (("replay",), "missing argument RUN"),
    (("explain",), "missing argument RUN"),
    (("timeline", "RUN"), "missing option --output"),
    (("replay", "RUN", "--frm", "3"), "No such option: --frm; did you mean --from?"),
    (("membership", "RUN", "--at"), "Option '--at' requires an argument"),
    (("runs", "--json=yes"), "Option '--json' does not take a value"),
    (("explain", "RUN", "1", "2"), "unexpected extra argument"),
    (("runz",), "No such command 'runz'. Did you mean 'runs'?"),
    (("frobnicate",), "No such command 'frobnicate'"),
    (("--frm",), "No such option: --frm"),
]


def assert_one_usage_line(result: Result, fragment: str) -> str:
    line = assert_cli_error(result, [fragment])
    shown = result.stdout + result.stderr
    assert "Usage:" not in shown and "Try " not in shown and "--help" not in shown
    assert not BOX & set(shown), shown
    return line


@pytest.mark.parametrize(("args", "fragment"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_usage_error_is_one_line_and_status_2(args: tuple[str, ...], fragment: str) -> None:
    assert_one_usage_line(run_cli(*args), fragment)
    assert not Path("fleetledger.db").exists(), "a usage error opened (created) a ledger"


def test_a_control_character_in_a_bad_option_is_shown_escaped() -> None:
    result = run_cli("replay", "RUN", "--\x1b[2J")
    line = assert_one_usage_line(result, "No such option: --")
    assert "\x1b" not in result.stderr and "\\x1b[2J" in line


def test_the_console_script_prints_the_same_one_line() -> None:
    for args, fragment in (CASES[0], CASES[7], CASES[11]):
        proc = subprocess.run(
            [str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert proc.stderr.splitlines() == [f"fleetledger: error: {fragment}"]


def test_fleetledger_alone_still_prints_the_help() -> None:
    result = run_cli()
    assert "Usage: fleetledger" in result.stdout + result.stderr
    assert "Commands:" in result.stdout + result.stderr
    assert "fleetledger: error" not in result.stdout + result.stderr


# ── help ───────────────────────────────────────────────────────────────────────


def help_of(command: str) -> str:
    """``COMMAND --help`` with its lines joined (click wraps help at 80 columns)."""
    return " ".join(invoke(command, "--help").stdout.split())


def test_import_help_shows_the_run_option_text_intact() -> None:
    assert "--run <str> Import under this run id." in help_of("import")


def test_watch_help_shows_the_interval_default() -> None:
    assert "--interval S Seconds between looks at the log. [default: 1.0]" in help_of("watch")


def test_simulate_help_shows_the_run_default_in_brackets() -> None:
    shown = help_of("simulate")
    assert "Run id [default: sim-<time>-<random>]." in shown
    assert "Generation shards (Ray actors). [default: 4]" in shown


COMMANDS = sorted(getattr(typer.main.get_command(app), "commands", {}))


def test_every_command_is_listed() -> None:
    assert {"explain", "import", "replay", "runs", "timeline", "watch"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_keeps_its_square_brackets(command: str) -> None:
    shown = help_of(command)
    assert shown.startswith(f"Usage: fleetledger {command} ")
    assert (
        "--db <str> Ledger database URL [default: $FLEETLEDGER_DB or sqlite:///fleetledger.db]"
        in shown
    )
    assert not BOX & set(shown)
