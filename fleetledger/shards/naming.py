"""How a shard's actor is made and named: the factory the fleet calls at the start and
for every restart, and the name it gives the actor.

A named actor is one a controller that restarts (or a second process) finds again with
``ray.get_actor``; the name is a function of the run's prefix and the shard index only,
so every party derives the same name without asking anyone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.actor import ActorHandle

__all__ = ["ShardFactory", "actor_prefix", "shard_actor_name"]

ShardFactory = Callable[[int], "ActorHandle"]
"""Creates (and names) the actor for one shard index; used at start and for restarts."""


def actor_prefix(run: str) -> str:
    """The prefix of a run's actor names, as ``simulate`` and the campaign name them."""
    return f"fleetledger-{run}"


def shard_actor_name(prefix: str, shard: int) -> str:
    """The actor's name for ``shard`` of the run whose actors are named ``prefix``."""
    return f"{prefix}-shard-{shard}"
