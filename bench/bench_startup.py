"""Hand-run benchmark of the command line's start-up (issue 14), side by side in one run.

Run it by hand (not part of the test suite; it asserts nothing about timing)::

    python bench/bench_startup.py [--repeat 15] [--db-dir DIR]

Every figure is the median wall time of a fresh process (``subprocess.run``, output to
a pipe, as a script or ``jq`` would read it), on a small demo ledger written first by
``fleetledger demo``:

- ``python -c pass`` and ``python -c "import pydantic"``: the floor no command can go
  under (the interpreter, and the library of the event models every ledger command
  reads); ``python -c "import sqlalchemy"`` beside them, for what a read of a SQLite
  ledger no longer loads (it was most of a read command's start-up);
- ``fleetledger --version`` and ``fleetledger --help``: the CLI's own start-up;
- ``fleetledger membership RUN --json`` and ``fleetledger replay RUN --json``: a read
  command, start-up plus opening the ledger, reading and folding the run.

Targets: start-up (``--version``, ``--help``) ≤ 250 ms; a read command ≤ 100 ms above
the start-up target (≤ 350 ms). The commands run in turn, one repeat of each per round,
so load from elsewhere on the machine hits them alike; one warm-up round (disk cache,
``.pyc`` files, kept in a temporary ``PYTHONPYCACHEPREFIX`` unless ``--shell-bytecode``)
is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONSOLE = Path(sys.executable).parent / "fleetledger"
STARTUP_TARGET_MS = 250.0
READ_TARGET_MS = STARTUP_TARGET_MS + 100.0  # a read command: ≤ 100 ms plus start-up


def _clean_env(db_url: str, pycache: Path | None) -> dict[str, str]:
    """The shell's environment without fleetledger's settings, pointed at the demo ledger.

    ``pycache``: where the processes keep their bytecode (``PYTHONPYCACHEPREFIX``), so
    the package's modules are compiled once, in the warm-up round, as an installed
    package's are, even where the shell sets ``PYTHONDONTWRITEBYTECODE`` — and nothing
    is written into the source tree. ``None``: the shell's own setting.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETLEDGER_")}
    env["FLEETLEDGER_DB"] = db_url
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _demo_run(env: dict[str, str], cwd: Path) -> str:
    subprocess.run(
        [str(CONSOLE), "demo"], env=env, cwd=cwd, capture_output=True, check=True, timeout=300
    )
    done = subprocess.run(
        [str(CONSOLE), "runs", "--json"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    runs = json.loads(done.stdout)
    return str(runs[-1]["run"])


def _time_once(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.perf_counter()
    subprocess.run(argv, env=env, cwd=cwd, capture_output=True, check=True, timeout=120)
    return (time.perf_counter() - began) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="timed runs of each command")
    parser.add_argument("--db-dir", type=Path, default=None, help="where the demo ledger goes")
    parser.add_argument(
        "--shell-bytecode",
        action="store_true",
        help="keep the shell's bytecode settings (with PYTHONDONTWRITEBYTECODE=1 every "
        "start compiles the modules that have no .pyc yet)",
    )
    args = parser.parse_args()
    if not CONSOLE.exists():
        sys.exit(f"{CONSOLE} is not installed (pip install -e .)")

    if args.db_dir is not None:
        args.db_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.db_dir) as tmp:
        cwd = Path(tmp)
        pycache = None if args.shell_bytecode else cwd / "pycache"
        env = _clean_env(f"sqlite:///{cwd / 'startup.db'}", pycache)
        run = _demo_run(env, cwd)
        py, cli = sys.executable, str(CONSOLE)
        cases: list[tuple[str, list[str], float | None]] = [
            ("python -c pass", [py, "-c", "pass"], None),
            ('python -c "import pydantic"', [py, "-c", "import pydantic"], None),
            ('python -c "import sqlalchemy"', [py, "-c", "import sqlalchemy"], None),
            ("fleetledger --version", [cli, "--version"], STARTUP_TARGET_MS),
            ("fleetledger --help", [cli, "--help"], STARTUP_TARGET_MS),
            (
                "fleetledger membership RUN --json",
                [cli, "membership", run, "--json"],
                READ_TARGET_MS,
            ),
            ("fleetledger replay RUN --json", [cli, "replay", run, "--json"], READ_TARGET_MS),
        ]
        for _, argv, _ in cases:  # warm-up: the page cache, the .pyc files
            _time_once(argv, env, cwd)
        times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
        for _ in range(args.repeat):
            for name, argv, _ in cases:
                times[name].append(_time_once(argv, env, cwd))

    cache = "the shell's bytecode settings" if args.shell_bytecode else "a bytecode cache"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"CLI start-up, {args.repeat} runs each, demo run {run} "
        f"(python {sys.version.split()[0]}, {cache}; load average {load})"
    )
    print(f"{'command':<50} {'median':>9} {'min':>9} {'max':>9}  target")
    for name, _, target in cases:
        got = times[name]
        median = statistics.median(got)
        verdict = (
            ""
            if target is None
            else (f"≤ {target:.0f} ms: {'meets' if median <= target else 'MISSES'}")
        )
        print(f"{name:<50} {median:7.1f}ms {min(got):7.1f}ms {max(got):7.1f}ms  {verdict}")
    version = statistics.median(times["fleetledger --version"])
    floor = statistics.median(times['python -c "import pydantic"'])
    for name in ("fleetledger membership RUN --json", "fleetledger replay RUN --json"):
        median = statistics.median(times[name])
        print(f"{name + ' above --version':<50} {median - version:7.1f}ms  ≤ 100 ms")
        # What is not the interpreter and the models' library: typer, the package's
        # own modules and the command's work.
        print(f"{name + ' above import pydantic':<50} {median - floor:7.1f}ms")


if __name__ == "__main__":
    main()
