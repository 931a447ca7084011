"""What the runtime says of a shard's death, read into the ledger's terms.

A call into a shard's actor can end in three ways that matter to the fleet: the runtime
says the actor is gone (Ray's ``ActorDiedError``: conclusive), the engine under a live
actor says it is gone (:class:`EngineDead`: conclusive too, but its own fact — the actor
was alive), or anything else (a failed probe, an infrastructure failure). This module
reads which, from the exception a probe or a generation raised, and keeps the runtime's
account of the cause on one line.

Death causes are handed to the ledger whole (:func:`death_text`): Ray's text names the
pid, the node, the exit type and the out-of-memory or preemption story, on several
lines, of which the first says only "the actor died unexpectedly"; the ledger reads it
into a cause's fields when it records it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from fleetledger.adapters.failure_taxonomy import GenerationUnavailable, cause_chain, exception_text
from fleetledger.controller.ledger import ProbeResult
from fleetledger.events.models import MAX_TEXT, DeathOf, clip_text
from fleetledger.shards.contract import EngineDead

__all__ = [
    "ActorDeath",
    "ShardActorDied",
    "actor_death_of",
    "death_text",
    "engine_death_of",
    "probe_result_of",
]

CLIPPED = " … [clipped to the event's limit]"


class ShardActorDied(GenerationUnavailable):
    """A generation's actor is gone (the runtime said so): infrastructure, retried
    elsewhere, and conclusive about the incarnation it was sent to.

    ``death`` is the runtime's whole cause (:func:`death_text`); ``incarnation`` the
    incarnation of the handle the call went through (``None``: not known).
    """

    default_reason = "actor_died"

    def __init__(
        self,
        *,
        shard: int,
        incarnation: int | None,
        death: str,
        prompt_id: object = None,
        group_id: object = None,
    ) -> None:
        super().__init__(
            f"generation failed: the actor of shard {shard} (incarnation {incarnation}) died",
            shard=shard,
            prompt_id=prompt_id,
            group_id=group_id,
        )
        self.incarnation = incarnation
        self.death = death


@dataclass(frozen=True, slots=True)
class ActorDeath:
    """A shard's conclusive death, as :func:`actor_death_of` finds it: the runtime's
    "this actor is gone" (``what="actor"``), or the engine's own :class:`EngineDead`
    under a live actor (``what="engine"``, ``text`` its message, without Ray's
    traceback)."""

    text: str
    incarnation: int | None = None  # of the handle it was seen through; None: not known
    what: DeathOf = "actor"


def death_text(exc: BaseException) -> str:
    """The runtime's whole account of a failure, ``Type: text``, clipped to an event's text.

    What the ledger reads into a cause when it records it (``events/causes.py``): Ray's
    death cause spans lines (class, actor id, pid, ip, then the exit type and its
    story), which the reader takes apart; the one line a log or an explanation shows is
    :func:`~fleetledger.events.causes.cause_line` of it. Past the event's limit the
    text ends with a visible elision rather than mid-word in silence.
    """
    lines = [line.rstrip() for line in exception_text(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: " + "\n".join(lines) if lines else type(exc).__name__
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - len(CLIPPED)] + CLIPPED
    return clip_text(text)


def probe_result_of(exc: BaseException, incarnation: int | None = None) -> ProbeResult:
    """Map what a probe raised onto the ledger's probe outcome.

    Only the runtime's "the actor died" is conclusive, and the engine's own "I am gone"
    under a live actor, recorded as the engine's death (``what="engine"``) with its own
    message. ``ActorUnavailableError`` (a subclass of ``RayActorError``) means the actor
    may come back, so it is a failed probe.
    """
    engine = engine_death_of(exc)
    if engine is not None:  # the engine under a live actor: conclusive too
        return ProbeResult("died", engine.message, incarnation=incarnation, what="engine")
    kind: Literal["timeout", "error", "died"]
    if isinstance(exc, ActorUnavailableError):
        kind = "error"
    elif isinstance(exc, RayActorError):
        kind = "died"
    elif isinstance(exc, GetTimeoutError | TimeoutError):
        kind = "timeout"
    else:
        kind = "error"
    return ProbeResult(kind, death_text(exc), incarnation=incarnation)


def engine_death_of(exc: BaseException) -> EngineDead | None:
    """The engine's own "I am gone" (:class:`EngineDead`) in what a call raised: Ray
    delivers it inside a task error, as ``cause`` (and as an instance of its class).

    The ``cause`` first: the task error is an ``EngineDead`` too, but its text is Ray's
    remote traceback, and the ledger records the engine's own message.
    """
    for link in cause_chain(exc):
        cause = getattr(link, "cause", None) if isinstance(link, RayTaskError) else None
        if isinstance(cause, EngineDead):
            return cause
        if isinstance(link, EngineDead):
            return link
    return None


def actor_death_of(exc: BaseException) -> ActorDeath | None:
    """The runtime's "this actor is gone" anywhere in ``exc``'s cause chain.

    A rollout that saw its shard die learned something conclusive; recording it at once
    (instead of as one more reported failure) is what makes the retry land elsewhere.
    Through :meth:`RayShardFleet.generate` it carries the incarnation it was seen
    through; pass it on: ``ledger.actor_died(shard, death.text,
    incarnation=death.incarnation, what=death.what)`` (what :class:`GenerationReports`
    does). An :class:`EngineDead` behind it (the engine died under a live actor, which
    ``generate`` also raises as :class:`ShardActorDied`) is the engine's death:
    ``what="engine"``, the engine's own message as the text.
    """
    for link in cause_chain(exc):
        if isinstance(link, ShardActorDied):
            engine = engine_death_of(link)
            if engine is not None:
                return ActorDeath(engine.message, link.incarnation, "engine")
            return ActorDeath(link.death, link.incarnation)
        if isinstance(link, RayActorError) and not isinstance(link, ActorUnavailableError):
            return ActorDeath(death_text(link))
    engine = engine_death_of(exc)
    return None if engine is None else ActorDeath(engine.message, what="engine")
