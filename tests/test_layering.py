"""The package's shape: which part may import which, no cycle between parts, modules that
say what they are for and functions that stay short, and read-only commands that never
load the controller.

The table is the layering table of the README's Layout (the design's, extended by the parts
`store`, `config`, `shards`, `adapters`, `router`, `embedding`, `timeline` and `web`).
Every import counts — at module level, inside a function, under ``TYPE_CHECKING`` —
because a lazy import against the table is the same dependency, only discovered later.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fleetledger"
MAX_FUNCTION_BODY_LINES = 100

BELOW_CLI = frozenset(
    {
        "errors",
        "logs",
        "events",
        "store",
        "projections",
        "weight_sync",
        "queries",
        "config",
        "shards",
        "adapters",
        "controller",
        "router",
        "transports",
        "engines",
        "embedding",
        "timeline",
        "web",
    }
)
# part -> the parts it may import (``errors`` may be imported from anywhere). ``logs``
# (structlog set-up; it imports nothing of ours) is allowed where the part logs: its
# ``get_logger`` loads structlog only on a first log line, which keeps it off the read
# path. Never in the pure core: a fold that logs is a fold with an effect.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "logs": frozenset(),
    "events": frozenset(),
    "store": frozenset({"events", "logs"}),
    "projections": frozenset({"events"}),
    "weight_sync": frozenset({"events", "projections"}),
    "queries": frozenset({"events", "store", "projections", "logs"}),
    "config": frozenset({"events"}),
    "shards": frozenset({"logs"}),
    "adapters": frozenset({"events", "store", "config", "shards", "logs"}),
    "controller": frozenset(
        {
            "events",
            "store",
            "projections",
            "queries",
            "weight_sync",
            "config",
            "shards",
            "adapters",
            "logs",
        }
    ),
    "router": frozenset(
        {"events", "store", "projections", "queries", "config", "adapters", "logs"}
    ),
    "transports": frozenset({"events", "projections", "weight_sync", "logs"}),
    "engines": frozenset({"shards", "transports", "weight_sync", "projections", "events", "logs"}),
    # The run's lifetime for an embedder: the controller and the refit machinery
    # together (it composes controller and transports, which neither may do).
    "embedding": BELOW_CLI - {"errors", "router", "engines", "embedding", "timeline", "web"},
    # A run's picture: one scene from the history, painted as PNG, HTML or an SVG fragment.
    "timeline": frozenset({"events", "projections"}),
    # The read-only HTTP face of a ledger (API, stream, page): what a read command sees.
    "web": frozenset({"events", "store", "projections", "queries", "timeline", "logs"}),
    "simulate": BELOW_CLI,
    "cli": BELOW_CLI | {"simulate"},
    "migrations": frozenset({"events", "store"}),
}


def part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def modules() -> list[Path]:
    return sorted(
        p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE
    )


def imported_parts(path: Path) -> set[str]:
    """The parts of ``fleetledger`` that the module at ``path`` imports, anywhere in it."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative imports are not used in this package
                names = ["fleetledger.<relative>"]
            elif node.module:
                names = [node.module]
                if node.module == "fleetledger":
                    # The package root holds only ``__version__``: anyone may read it.
                    names = [
                        f"fleetledger.{alias.name}"
                        for alias in node.names
                        if alias.name != "__version__"
                    ]
        for name in names:
            parts = name.split(".")
            if parts[0] == "fleetledger" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_every_part_of_the_package_is_in_the_layering_table():
    parts = {part_of(p) for p in modules()}
    assert parts - {"__init__"} <= set(MAY_IMPORT), sorted(parts - set(MAY_IMPORT))


def test_no_module_imports_against_the_layering_table():
    violations = []
    for path in modules():
        part = part_of(path)
        allowed = MAY_IMPORT.get(part, frozenset()) | {part, "errors"}
        for imported in sorted(imported_parts(path) - allowed):
            violations.append(f"{path.relative_to(PACKAGE.parent)} ({part}) imports {imported}")
    assert violations == []


def test_there_is_no_cycle_between_parts():
    graph: dict[str, set[str]] = {}
    for path in modules():
        part = part_of(path)
        graph.setdefault(part, set()).update(imported_parts(path) - {part})
    state: dict[str, str] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycle.extend([*trail, node, nxt])
                return True
            if nxt not in state and visit(nxt, [*trail, node]):
                return True
        state[node] = "done"
        return False

    for node in sorted(graph):
        if node not in state and visit(node, []):
            break
    assert cycle == [], " → ".join(cycle)


def _body_lines(func: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its docstring and signature aside."""
    body = func.body
    first = body[0]
    if (
        len(body) > 1
        and isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        first = body[1]
    return (func.end_lineno or first.lineno) - first.lineno + 1


def test_every_module_says_what_it_is_for_and_no_function_runs_long():
    """Modules are split by concept, not by size: each has a docstring (its one job), and
    the size that is capped is a function's body — a long function is several steps
    that want names. (A cap on module lines drove splits by size instead: code was moved
    "back under the module limit" rather than to where it belonged.)"""
    undocumented = [
        str(p.relative_to(PACKAGE.parent))
        for p in modules()
        if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text("utf-8")))
    ]
    long = {
        f"{p.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}": n
        for p in modules()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := _body_lines(node)) > MAX_FUNCTION_BODY_LINES
    }
    assert (undocumented, long) == ([], {})


def test_no_module_docstring_cites_an_issue_or_a_document_outside_the_repository():
    offenders = []
    for path in modules():
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        text = path.read_text(encoding="utf-8")
        for needle in ("REFERENCE §", "MACHINE-NOTES", "DESIGN rule", "shared/seed"):
            if needle in text:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}: {needle}")
        lowered = doc.lower()
        if "issue " in lowered and any(ch.isdigit() for ch in lowered.split("issue ", 1)[1][:3]):
            offenders.append(f"{path.relative_to(PACKAGE.parent)}: an issue number")
    assert offenders == []


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "some-run"],
        ["explain", "some-run"],
        ["membership", "some-run"],
        ["runs"],
        ["watch", "some-run"],
        ["export", "some-run"],
        ["timeline", "some-run", "-o", "x.html"],
    ],
)
def test_read_commands_never_load_the_controller(argv, tmp_path):
    """A read command answers from the log through ``queries``: it loads neither the
    imperative shell, nor the router, the adapters or the shard contract, nor a
    transport, nor Ray. (The run does not exist: the command
    fails after the imports it needs, which is what is measured.)"""
    script = (
        "import sys\n"
        "from fleetledger.cli import main\n"
        f"sys.argv = ['fleetledger', *{argv!r}, '--db', 'sqlite:///{tmp_path}/l.db']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[:2] in (\n"
        "    ['fleetledger', 'controller'], ['fleetledger', 'transports'],\n"
        "    ['fleetledger', 'simulate'], ['fleetledger', 'engines'],\n"
        "    ['fleetledger', 'router'], ['fleetledger', 'adapters'],\n"
        "    ['fleetledger', 'shards']) or m == 'ray')\n"
        "print('LOADED', loaded)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert "LOADED []" in done.stdout, done.stdout + done.stderr


# Third-party packages that cost start-up time or may be absent (extras): importing one
# inside the function that needs it keeps the read commands fast and the core installable
# without it.
HEAVY_OR_OPTIONAL = frozenset(
    {
        "aiohttp",
        "alembic",
        "matplotlib",
        "openai",
        "PIL",
        "psutil",
        "psycopg",
        "psycopg2",
        "ray",
        "safetensors",
        "sqlalchemy",
        "structlog",
        "tokenizers",
        "torch",
        "transformers",
        "uvicorn",
        "vllm",
    }
)


def _function_local_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import inside a function body, ``TYPE_CHECKING`` aside."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(path))
    found: list[tuple[int, str]] = []
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if isinstance(node, ast.Import):
                found += [(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((node.lineno, node.module))
    return sorted(set(found))


def _says_why(line: str) -> bool:
    """A comment on the line that is more than a linter's ``noqa``."""
    comment = line.partition("#")[2].strip()
    return bool(comment) and not (comment.startswith("noqa") and " - " not in comment)


def test_a_function_local_import_is_heavy_optional_or_says_why():
    """An import inside a function hides a dependency until the call: allowed for the
    command line (start-up time is its budget), for a heavy or optional third-party
    package, and otherwise only with a comment on the line saying why."""
    offenders = []
    for path in modules():
        if part_of(path) == "cli":
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        for lineno, module in _function_local_imports(path):
            if module.split(".")[0] in HEAVY_OR_OPTIONAL or _says_why(lines[lineno - 1]):
                continue
            offenders.append(f"{path.relative_to(PACKAGE.parent)}:{lineno} imports {module}")
    assert offenders == []


def test_no_rule_is_guarded_by_an_assert():
    """``python -O`` strips ``assert``: a rule it guards silently stops holding. A rule is
    checked by code that raises, or pinned by a test."""
    asserts = [
        f"{p.relative_to(PACKAGE.parent)}:{node.lineno}"
        for p in modules()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert asserts == []
