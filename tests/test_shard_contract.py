"""The shard contract holds the fleet to it: every method the fleet calls on an engine's
actor is declared by ``GenerationShard``, and the optional ones — those with a default —
are exactly the ``OptionalShardMethods`` protocol."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
from pathlib import Path

from fleetledger.shards.contract import GenerationShard, OptionalShardMethods

FLEET = Path(__file__).resolve().parent.parent / "fleetledger" / "controller" / "ray_fleet.py"


def _remote_calls(path: Path) -> set[str]:
    """Names ``m`` of every ``<handle>.m.remote(...)`` call in the module."""
    called = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "remote"
            and isinstance(node.func.value, ast.Attribute)
        ):
            called.add(node.func.value.attr)
    return called


def test_the_fleet_calls_only_methods_the_contract_declares():
    called = _remote_calls(FLEET)
    assert called, "the fleet's calls were not found: the test no longer reads them"
    declared = {name for name, _ in inspect.getmembers(GenerationShard, inspect.isfunction)}
    assert called - declared == set()


def test_the_fleet_never_looks_a_method_up_by_name():
    text = FLEET.read_text(encoding="utf-8")
    tree = ast.parse(text)
    by_name = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
    ]
    assert by_name == []


def test_the_optional_methods_are_the_protocol_and_have_defaults():
    abstract = set(GenerationShard.__abstractmethods__)
    defaulted = {
        name
        for name, member in inspect.getmembers(GenerationShard, inspect.isfunction)
        if not name.startswith("_") and name not in abstract
    }
    protocol = {
        name
        for name, member in vars(OptionalShardMethods).items()
        if inspect.isfunction(member) and not name.startswith("_")
    }
    assert abstract == {"is_alive", "generate", "weight_version", "set_weight_version"}
    assert defaulted == protocol


def test_the_defaults_say_nothing_of_the_kind():
    class Minimal(GenerationShard):
        async def is_alive(self, deep: bool = False) -> bool:
            return True

        async def generate(self, request):
            raise NotImplementedError

        async def weight_version(self) -> int:
            return 0

        async def set_weight_version(self, version: int) -> int:
            return version

    async def answers():
        shard = Minimal()
        return await shard.base_url(), await shard.pid(), await shard.child_processes()

    assert asyncio.run(answers()) == (None, os.getpid(), [])
