"""The rules of ``router-sync``: what to add to or remove from an external router, when
a URL that left the serving set is out of it, and which shard a window of the router's
outcomes goes to; each a verdict with its reason.

Rules of this file: it is pure (no I/O, no clock), and it is the only place that
decides those three things. The caller lists the router, calls :func:`reconcile`, and
carries out the REMOVEs first (a removal is what keeps traffic off a dead engine; an
add can wait) and then the ADDs; then it asks :func:`settle_leave` about every URL that
left. The outcome scraper asks :func:`credit` about every URL the router counted for.

:func:`reconcile` is a table, ``(serving in the ledger?, how the router lists it) →
(action, reason)``:

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
  already draining it, or still adding it (WAIT: SMG cannot remove a worker before its
  add lands, and removes it the moment it is listed ready).

A fixed point is what the tests pin: once the router lists exactly the serving set, as
routed, every verdict is KEEP.

:func:`settle_leave` is a table too, ``(the URL's add in the router, how the router
lists it) → (settlement, reason)``: a URL that left is out (CONFIRMED, which ends its
lag) once the router lists it as taking no new request *and* holds no add of it that
could still land. An SMG add accepted with 202 lands later, whenever the engine
answers ``/health`` — a dead shard's STALE restart at the same URL does — so a leave
waits on it; a vllm-router add still in progress is hung up on, and waits only until
that call ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from fleetledger.router.external import Presence
from fleetledger.router.sync_membership import Membership

__all__ = [
    "RULES",
    "SETTLE_RULES",
    "Action",
    "AddState",
    "Settlement",
    "Verdict",
    "credit",
    "reconcile",
    "settle_leave",
]


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
    (True, Presence.ADDING): (Action.WAIT, "{who} serves in the ledger; the router is adding it"),
    (True, Presence.DRAINING): (
        Action.WAIT,
        "{who} serves in the ledger; the router is still draining it (added again once gone)",
    ),
    (True, Presence.EJECTED): (
        Action.REMOVE,
        "{who} serves in the ledger but the router stopped routing to it on its own: "
        "removed, to be added afresh",
    ),
    (False, Presence.ROUTED): (Action.REMOVE, "{who}: not serving in the ledger"),
    (False, Presence.EJECTED): (Action.REMOVE, "{who}: not serving in the ledger"),
    (False, Presence.DRAINING): (
        Action.WAIT,
        "{who}: not serving in the ledger; the router is already draining it",
    ),
    (False, Presence.ADDING): (
        Action.WAIT,
        "{who}: not serving in the ledger; the router is still adding it (an add cannot "
        "be cancelled): removed once listed",
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


class AddState(StrEnum):
    """Where the router stands with an add of a URL."""

    NONE = "none"
    """No add of it in progress or waiting in the router."""
    CALLING = "calling"
    """An add's call has not returned (a vllm-router add blocks until /health answers)."""
    PENDING = "pending"
    """The router accepted an add it completes later and cannot cancel (SMG's 202)."""


class Settlement(StrEnum):
    CONFIRMED = "confirmed"
    """Out of the router: it takes no new request, and nothing can put it back."""
    WAITING = "waiting"
    FORGOTTEN = "forgotten"
    """Back in the serving set before its removal was confirmed: no lag to measure."""


# (the URL's add in the router, how the router lists it or None) → (settlement, reason).
SETTLE_RULES: dict[tuple[AddState, Presence | None], tuple[Settlement, str]] = {
    (AddState.NONE, None): (Settlement.CONFIRMED, "not listed"),
    (AddState.NONE, Presence.DRAINING): (
        Settlement.CONFIRMED,
        "listed draining: no new request reaches it",
    ),
    # Its own health checks may route to it again: out only once removed.
    (AddState.NONE, Presence.EJECTED): (
        Settlement.WAITING,
        "listed; the router routes nothing to it now, but may again: being removed",
    ),
    (AddState.NONE, Presence.ROUTED): (Settlement.WAITING, "still routed"),
    (AddState.NONE, Presence.ADDING): (
        Settlement.WAITING,
        "the router is adding it: routed once that lands, removed then",
    ),
    **{
        (AddState.CALLING, presence): (
            Settlement.WAITING,
            "an add's call is still open (hung up on where that takes it back)",
        )
        for presence in (None, *Presence)
    },
    **{
        (AddState.PENDING, presence): (
            Settlement.WAITING,
            "the router holds an add of it that it cannot cancel: removed the moment it "
            "lands, out once it lands or is given up",
        )
        for presence in (None, *Presence)
    },
}


def settle_leave(
    serving_again: bool, listed: Presence | None, add: AddState
) -> tuple[Settlement, str]:
    """Is a URL that left the serving set out of the router yet? ``listed``: how the
    router lists it now (None: not listed); ``add``: where the router stands with an
    add of it."""
    if serving_again:
        return Settlement.FORGOTTEN, "back in the serving set before its removal"
    return SETTLE_RULES[(add, listed)]


def credit(url: str, opened: Membership, now: Membership) -> tuple[int | None, str]:
    """The shard a window of the router's counts for ``url`` goes to, or None; with the
    reason. ``opened``: the membership when the window opened (its last scrape);
    ``now``: at its close. Only a shard that served at the URL all window long: one
    that came back in it, or whose URL left and came back (vllm-router keeps a URL's
    counters across a removal and a re-add), would be handed its predecessor's
    failures after the ledger re-admitted it. A shard whose URL left once still gets
    them, as evidence its DEAD or STALE state ignores (``sync_outcomes``)."""
    shard = now.shard_of.get(url)
    if shard is None:
        return None, "no shard of the run has this URL now"
    if opened.serving.get(url) != shard:
        return None, f"shard {shard} was not serving at this URL when the window opened"
    if now.turns.get(url, 0) - opened.turns.get(url, 0) > 1:
        return None, "the URL left the serving set and came back within the window"
    return shard, f"shard {shard} served at this URL when the window opened"
