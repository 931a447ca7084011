"""The reconciliation rule of ``router-sync``: the ledger's serving set against what an
external router lists → a verdict per URL, each with its reason.

Rules of this file: it is pure (no I/O, no clock), and it is the only place that
decides what to add to or remove from an external router. The caller lists the
router, calls :func:`reconcile`, and carries out the REMOVEs first (a removal is what
keeps traffic off a dead engine; an add can wait) and then the ADDs.

The rule is a table, ``(serving in the ledger?, how the router lists it) → (action,
reason)``:

- serving and routed: KEEP; serving and not listed: ADD.
- serving but being added or drained by the router (SMG lists ``pending`` /
  ``draining``): WAIT — an add now would be refused; once drained it is not listed,
  and the next reconciliation adds it.
- serving but ejected by the router on its own (its health checks): REMOVE, and the
  next reconciliation adds it afresh. The ledger alone decides who serves; removing
  and adding again is the one lever a registry API offers to make the router route to
  a worker it gave up on (SMG and vllm-router probe ``/health`` again on the add).
- not serving (any state but HEALTHY/SUSPECT, or no shard of the run has that URL) and
  listed: REMOVE, whoever added it — the router's set is the ledger's, so a worker from
  its own ``--worker-urls`` or an operator's add goes too; unless the router is
  already draining it (WAIT).

A fixed point is what the tests pin: once the router lists exactly the serving set, as
routed, every verdict is KEEP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetledger.router.external import Presence

__all__ = ["RULES", "Action", "Verdict", "reconcile"]


class Action(StrEnum):
    KEEP = "keep"
    ADD = "add"
    REMOVE = "remove"
    WAIT = "wait"


@dataclass(frozen=True, slots=True)
class Verdict:
    url: str
    action: Action
    reason: str


# (serving in the ledger, presence in the router or None: not listed) → (action, reason).
# ``{who}`` is filled with the shard (or why the URL is not serving).
RULES: dict[tuple[bool, Presence | None], tuple[Action, str]] = {
    (True, Presence.ROUTED): (Action.KEEP, "{who} serves in the ledger and is routed"),
    (True, None): (Action.ADD, "{who} serves in the ledger; the router does not list it"),
    (True, Presence.MOVING): (
        Action.WAIT,
        "{who} serves in the ledger; the router is still adding or draining it",
    ),
    (True, Presence.EJECTED): (
        Action.REMOVE,
        "{who} serves in the ledger but the router stopped routing to it on its own: "
        "removed, to be added afresh",
    ),
    (False, Presence.ROUTED): (Action.REMOVE, "{who}: not serving in the ledger"),
    (False, Presence.EJECTED): (Action.REMOVE, "{who}: not serving in the ledger"),
    (False, Presence.MOVING): (
        Action.WAIT,
        "{who}: not serving in the ledger; the router is already moving it",
    ),
}

_ORDER = {Action.REMOVE: 0, Action.ADD: 1, Action.WAIT: 2, Action.KEEP: 3}


def reconcile(
    serving: Mapping[str, int],
    listed: Mapping[str, Presence],
    not_serving: Mapping[str, str] | None = None,
) -> tuple[Verdict, ...]:
    """A verdict for every URL in ``serving`` (URL → shard) or ``listed`` (URL → how the
    router lists it): removals first, then adds, waits, keeps; by URL within each.

    ``not_serving``: URL → why it is not serving (``"shard 2 is DEAD"``), for reasons;
    a listed URL not in it belongs to no shard of the run.
    """
    why_not = not_serving or {}
    verdicts = []
    for url in serving.keys() | listed.keys():
        in_ledger = url in serving
        action, template = RULES[(in_ledger, listed.get(url))]
        who = (
            f"shard {serving[url]}"
            if in_ledger
            else why_not.get(url, "no shard of the run has this URL now")
        )
        verdicts.append(Verdict(url, action, template.format(who=who)))
    verdicts.sort(key=lambda v: (_ORDER[v.action], v.url))
    return tuple(verdicts)
