"""Start-up: each command imports what it needs, and logging still behaves as it did.

The commands run in a fresh interpreter (``python -c`` calling ``main()``, as the console
script does), which then reports which of the heavy modules it loaded: the test process
has them all, so only a new process can tell. No timing is asserted here; the figures
are ``bench/bench_startup.py``'s.

structlog is loaded only when something logs: the settings (``FLEETLEDGER_LOG``,
``FLEETLEDGER_LOG_FORMAT``) are checked at start-up and applied on the first log line.
These tests hold the behaviour a user sees to what it was when structlog was configured
at start-up: a bad value is one warning line, then ignored; logs go to stderr, in the
chosen format, and never onto stdout, which carries the answer.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetledger.projections.snapshot import PROJECTION_VERSION
from fleetledger.store.log import EventLog
from tests.cli_support import invoke

CLI_PACKAGE = Path(__file__).resolve().parent.parent / "fleetledger" / "cli"

# What no read command needs: migrations, logging, the live side and its frameworks,
# and (on a SQLite ledger, as here) SQLAlchemy: it is read on the standard library alone.
NEVER_FOR_A_READ = (
    "sqlalchemy",
    "alembic",
    "structlog",
    "ray",
    "torch",
    "vllm",
    "aiohttp",
    "fleetledger.simulate",
    "fleetledger.controller",
    "fleetledger.engines",
    "fleetledger.transports",
    "fleetledger.timeline",
)
# Printing JSON needs no table: neither rich nor the replay table's code.
NEVER_FOR_JSON = (*NEVER_FOR_A_READ, "rich", "fleetledger.cli.entry_table")
# `--version` and `--help` read no ledger: not even the log's libraries.
NEVER_FOR_STARTUP = (*NEVER_FOR_JSON, "pydantic", "fleetledger.store.log")
WATCHED = sorted({*NEVER_FOR_STARTUP, "fleetledger.queries"})

SCRIPT = """
import json, sys
args, report = json.loads(sys.argv[1]), sys.argv[2]
sys.argv = ["fleetledger", *args]
from fleetledger.cli import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
sys.stdout.flush()
loaded = sorted(m for m in {watched} if m in sys.modules)
with open(report, "w") as fh:
    json.dump(loaded, fh)
sys.exit(code)
""".replace("{watched}", repr(WATCHED))


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    loaded: set[str]


def run_fresh(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Ran:
    """One command in a new interpreter, with none of the shell's fleetledger settings."""
    report = tmp_path / "loaded.json"
    report.unlink(missing_ok=True)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(list(args)), str(report)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**clean, **(env or {})},
        timeout=120,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return Ran(done.returncode, done.stdout, done.stderr, set(json.loads(report.read_text())))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(db URL, run id) of a demo ledger, written once for the module."""
    url = f"sqlite:///{tmp_path_factory.mktemp('demo')}/ledger.db"
    invoke("demo", "--db", url)
    runs = json.loads(invoke("runs", "--json", "--db", url).stdout)
    return url, runs[0]["run"]


# ── what each command loads ────────────────────────────────────────────────────


@pytest.mark.parametrize("args", [["--version"], ["--help"]])
def test_version_and_help_load_no_ledger_no_logging_no_rich(tmp_path: Path, args) -> None:
    ran = run_fresh(tmp_path, *args)
    assert ran.code == 0, ran.stderr
    assert ran.loaded & set(NEVER_FOR_STARTUP) == set()


@pytest.mark.parametrize(
    "args",
    [
        ["membership", "{run}", "--json"],
        ["membership", "{run}", "--at", "5", "--json"],
        ["replay", "{run}", "--json"],
        ["explain", "{run}", "--json"],
        ["explain", "{run}", "1", "--json"],
        ["runs", "--json"],
    ],
    ids=lambda args: " ".join(args),
)
def test_a_read_command_with_json_loads_only_the_read_side(tmp_path, demo, args) -> None:
    url, run = demo
    ran = run_fresh(tmp_path, *(a.format(run=run) for a in args), "--db", url)
    assert ran.code == 0, ran.stderr
    assert ran.stderr == ""
    json.loads(ran.stdout.splitlines()[0] if args[0] == "replay" else ran.stdout)
    assert ran.loaded & set(NEVER_FOR_JSON) == set()
    assert "fleetledger.store.log" in ran.loaded  # the report sees what was loaded


@pytest.mark.parametrize("command", ["membership", "replay"])
def test_a_table_loads_rich_but_not_logging(tmp_path, demo, command) -> None:
    url, run = demo
    ran = run_fresh(tmp_path, command, run, "--db", url)
    assert ran.code == 0, ran.stderr
    assert "rich" in ran.loaded
    assert ran.loaded & set(NEVER_FOR_A_READ) == set()


def test_a_failed_read_loads_no_logging(tmp_path, demo) -> None:
    url, _ = demo
    ran = run_fresh(tmp_path, "membership", "no-such-run", "--json", "--db", url)
    assert ran.code == 2
    assert ran.stderr.startswith("fleetledger: error: ") and len(ran.stderr.splitlines()) == 1
    assert ran.loaded & set(NEVER_FOR_A_READ) == set()


# ── logging: as it was when structlog was configured at start-up ──────────────


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"FLEETLEDGER_LOG": "loud"}, "unknown log level 'loud'"),
        ({"FLEETLEDGER_LOG_FORMAT": "xml"}, "unknown log format 'xml'"),
    ],
)
def test_a_bad_logging_setting_is_one_warning_line_then_ignored(
    tmp_path, demo, env, problem
) -> None:
    url, run = demo
    ran = run_fresh(tmp_path, "membership", run, "--json", "--db", url, env=env)
    assert ran.code == 0, ran.stderr
    assert ran.stderr.splitlines() == [
        f"fleetledger: warning: {problem}; expected one of "
        + ("debug, info, warning, error" if "level" in problem else "console, json")
        + "; logging at warning level to the console"
    ]
    assert json.loads(ran.stdout)["run"] == run
    assert "structlog" not in ran.loaded


def _damage_the_head_snapshot(url: str, run: str) -> None:
    with EventLog.open(url) as log:
        log.save_snapshot(run, PROJECTION_VERSION, log.head(run), '{"projection_')


def test_a_read_that_warns_loads_structlog_and_logs_in_the_chosen_format(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/damaged.db"
    invoke("demo", "--db", url)
    run = json.loads(invoke("runs", "--json", "--db", url).stdout)[0]["run"]
    _damage_the_head_snapshot(url, run)

    as_json = run_fresh(
        tmp_path, "membership", run, "--json", "--db", url, env={"FLEETLEDGER_LOG_FORMAT": "json"}
    )
    assert as_json.code == 0, as_json.stderr
    assert json.loads(as_json.stdout)["run"] == run  # stdout: the answer and nothing else
    (line,) = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert (line["event"], line["level"], line["run"]) == ("snapshot ignored", "warning", run)
    assert line["timestamp"].endswith("Z")
    assert "structlog" in as_json.loaded

    console = run_fresh(tmp_path, "membership", run, "--json", "--db", url)
    assert json.loads(console.stdout)["run"] == run
    (text,) = console.stderr.splitlines()
    assert "snapshot ignored" in text and "[warning  ]" in text

    quiet = run_fresh(
        tmp_path, "membership", run, "--json", "--db", url, env={"FLEETLEDGER_LOG": "error"}
    )
    assert (quiet.stderr, json.loads(quiet.stdout)["run"]) == ("", run)


def test_transitions_are_logged_at_info_on_stderr_in_json(tmp_path) -> None:
    """The controller logs through structlog itself: the command applied the settings
    before the controller was loaded."""
    url = f"sqlite:///{tmp_path}/logged.db"
    ran = run_fresh(
        tmp_path,
        "demo",
        "--json",
        "--db",
        url,
        env={"FLEETLEDGER_LOG": "info", "FLEETLEDGER_LOG_FORMAT": "json"},
    )
    assert ran.code == 0, ran.stderr
    steps = [json.loads(line) for line in ran.stdout.splitlines()]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    logged = [json.loads(line) for line in ran.stderr.splitlines()]
    transitions = [line for line in logged if line["event"] == "shard transition"]
    assert transitions and all(t["level"] == "info" for t in transitions)


def test_transitions_are_not_shown_at_the_default_level(tmp_path) -> None:
    ran = run_fresh(tmp_path, "demo", "--json", "--db", f"sqlite:///{tmp_path}/quiet.db")
    assert ran.code == 0, ran.stderr
    assert ran.stderr == ""
    assert all("step" in json.loads(line) for line in ran.stdout.splitlines())


# ── the rule that keeps structlog configured before anything logs ──────────────

_LOGS_ITSELF = ("fleetledger.controller", "fleetledger.engines", "fleetledger.simulate")


def _imports_of(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found = []
    for child in ast.walk(node):
        names: list[str] = []
        if isinstance(child, ast.Import):
            names = [alias.name for alias in child.names]
        elif isinstance(child, ast.ImportFrom) and child.module:
            names = [child.module]
        if any(name.startswith(_LOGS_ITSELF) for name in names):
            found.append(child)
    return found


def test_a_command_applies_the_logging_settings_before_it_loads_code_that_logs() -> None:
    """The controller, the engines and ``simulate`` log through structlog directly: a
    command that imports them calls ``structlog_ready()`` first, or an unconfigured
    structlog would print to stdout. None of them is imported at a module's top."""
    problems = []
    for path in sorted(CLI_PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(CLI_PACKAGE.parent.parent)
        for statement in tree.body:
            if isinstance(statement, ast.Import | ast.ImportFrom) and _imports_of(statement):
                problems.append(f"{where}:{statement.lineno}: imported when the CLI starts")
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            imports = _imports_of(function)
            if not imports:
                continue
            first = min(node.lineno for node in imports)
            ready = [
                call.lineno
                for call in ast.walk(function)
                if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Name)
                and call.func.id == "structlog_ready"
            ]
            if not ready or min(ready) > first:
                problems.append(f"{where}:{first}: {function.name} imports code that logs first")
    assert problems == []


def test_command_modules_keep_their_annotations_as_objects() -> None:
    """typer reads every command's annotations on every start: as strings, each is
    compiled first (``from __future__ import annotations``), which the commands'
    modules avoid (cli.app)."""
    lazy = []
    for path in sorted(CLI_PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        commands = any(
            isinstance(node, ast.FunctionDef)
            and any(
                isinstance(d, ast.Call)
                and isinstance(d.func, ast.Attribute)
                and d.func.attr == "command"
                for d in node.decorator_list
            )
            for node in tree.body
        )
        future = any(
            isinstance(node, ast.ImportFrom)
            and node.module == "__future__"
            and any(alias.name == "annotations" for alias in node.names)
            for node in tree.body
        )
        if commands and future:
            lazy.append(path.name)
    assert lazy == []
