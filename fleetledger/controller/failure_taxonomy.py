"""Failure taxonomy (docs/reference.md §5): is a failed rollout the fleet's fault or the prompt's?

Infrastructure failures (the prompt is fine, the fleet is not) are worth re-dispatching
to another shard; data failures are deterministic and prompt-specific, so another shard
would fail identically and they get only a small budget. The split is made here, once,
so the retry policy, the reported-outcome windows and the counters all agree.

Rules, and why each exists:

- HTTP errors are classified by *status*, not by exception type: vLLM answers an
  over-long prompt with 400 "maximum context length", so treating every HTTP client
  error as infrastructure would spend the retry budget on a prompt no shard can serve.
  5xx, 408 and 429 are infrastructure (the set the gym's own client retries).
- Anything unrecognised is data, so an unexpected error fails loudly instead of being
  retried into silence.
- An explicit :class:`RolloutDataFailure` anywhere in the chain wins: code that knows a
  failure is prompt-specific must not have it re-read as infrastructure.
- Otherwise an infrastructure link anywhere in the ``__cause__`` chain makes the whole
  failure infrastructure (a ``RuntimeError`` raised *from* a reset connection is still a
  reset connection). ``__context__`` is not followed: an error raised while handling
  another is not caused by it.
- Cancellation (and any other ``BaseException`` that is not an ``Exception``) is
  teardown, not a fault: it is classified :attr:`FailureKind.CANCELLED` and never
  retried, so shutting the controller down cannot look like a transient fault.
- Runtime (Ray) and HTTP-client (aiohttp, openai) error types are matched by top-level
  package and class name along the MRO, so neither library needs to be installed and a
  subclass (``ActorDiedError`` of ``RayActorError``) inherits its parent's row.

Reason strings are short and stable because they are counter labels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from fleetledger.errors import FleetledgerError

__all__ = [
    "MAX_CAUSE_LINKS",
    "Classification",
    "DeadlineExpired",
    "FailureKind",
    "GenerationUnavailable",
    "NoHealthyShards",
    "RolloutDataFailure",
    "RolloutFailure",
    "cause_chain",
    "classify_exception",
    "classify_http_status",
    "wrap_generation_failure",
]

MAX_CAUSE_LINKS = 8
"""Exceptions examined per classification: the raised one and up to seven causes."""


class FailureKind(StrEnum):
    """What a failure says about where the fault lies, which decides its budget."""

    INFRA = "infra"
    """The fleet is unwell; re-dispatch the prompt elsewhere (with backoff)."""
    DATA = "data"
    """Deterministic and prompt-specific; a small budget, then fail or skip."""
    CANCELLED = "cancelled"
    """Teardown (cancellation, interrupt, exit): never retried, never counted a fault."""


@dataclass(frozen=True, slots=True)
class Classification:
    """The verdict on one failure: its kind and a short, stable counter label."""

    kind: FailureKind
    reason: str

    @property
    def retry_elsewhere(self) -> bool:
        """True only for infrastructure: the one kind another shard can fix."""
        return self.kind is FailureKind.INFRA


_INFRA = FailureKind.INFRA
_DATA = FailureKind.DATA


# --- our own failure vocabulary -------------------------------------------------------


class RolloutFailure(FleetledgerError):
    """A rollout attempt failed; carries the coordinates a raw traceback lacks.

    Story: a bare generation traceback did not say which prompt or trajectory it
    belonged to, so failures are raised typed, with shard/prompt/group attached.
    """

    default_reason = "rollout_failure"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        shard: int | str | None = None,
        prompt_id: object = None,
        group_id: object = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason or self.default_reason
        self.shard = shard
        self.prompt_id = prompt_id
        self.group_id = group_id

    def __str__(self) -> str:
        coords = [
            f"{name}={value}"
            for name, value in (
                ("shard", self.shard),
                ("prompt", self.prompt_id),
                ("group", self.group_id),
            )
            if value is not None
        ]
        base = super().__str__()
        return f"{base} [{' '.join(coords)}]" if coords else base


class GenerationUnavailable(RolloutFailure):
    """Infrastructure: this shard could not serve the request; another one may.

    Story: a dead worker's error was re-raised as GenerationUnavailable so the retry
    policy knows the prompt is fine and worth re-dispatching elsewhere.
    """

    default_reason = "generation_unavailable"


class NoHealthyShards(GenerationUnavailable):
    """Infrastructure: nothing is serving right now (e.g. mid-recovery); back off, retry."""

    default_reason = "no_healthy_shards"


class RolloutDataFailure(RolloutFailure):
    """Data: the failure is the prompt's own; another shard would fail identically.

    Raising it explicitly always wins over any infrastructure error in the chain.
    """

    default_reason = "data_failure"


class DeadlineExpired(FleetledgerError, TimeoutError):
    """Infrastructure: one of *our* deadlines expired (see ``deadlines.Deadline``).

    Carries the deadline's name and seconds so whoever debugs it is sent to the right
    knob; only a genuine expiry of our deadline is ever raised as this type.
    """

    def __init__(self, name: str, seconds: float) -> None:
        super().__init__(f"{name} deadline of {seconds:g}s expired")
        self.name = name
        self.seconds = seconds

    @property
    def reason(self) -> str:
        """Counter label, one per deadline (stream / generation / environment)."""
        return f"deadline:{self.name}"


# --- third-party types, by (top-level package, class name) -----------------------------

# Walked along the MRO, most specific class first, so the first hit wins.
_NAMED_INFRA: dict[tuple[str, str], str] = {
    # Ray: actor / worker / node / object failures and its get() timeout.
    ("ray", "ActorDiedError"): "actor_died",
    ("ray", "ActorUnavailableError"): "actor_unavailable",
    ("ray", "RayActorError"): "actor_died",
    ("ray", "WorkerCrashedError"): "worker_crashed",
    ("ray", "NodeDiedError"): "node_died",
    ("ray", "LocalRayletDiedError"): "node_died",
    ("ray", "ObjectLostError"): "object_lost",
    ("ray", "OutOfMemoryError"): "worker_oom",
    ("ray", "RaySystemError"): "ray_system",
    ("ray", "GetTimeoutError"): "timeout",
    # aiohttp: connection-level failures (ServerDisconnected, ClientOSError, ...).
    ("aiohttp", "ServerTimeoutError"): "timeout",
    ("aiohttp", "ClientConnectionError"): "connection",
    # A truncated response body is a transport problem, not a bad prompt.
    ("aiohttp", "ClientPayloadError"): "payload",
    # openai client (wraps httpx): connection failures and its timeout.
    ("openai", "APITimeoutError"): "timeout",
    ("openai", "APIConnectionError"): "connection",
}

# Exceptions that carry an HTTP status: (package, class) -> attribute holding the status.
_NAMED_STATUS: dict[tuple[str, str], str] = {
    ("aiohttp", "ClientResponseError"): "status",
    ("openai", "APIStatusError"): "status_code",
}

# Ray wraps an exception raised inside a task in RayTaskError and keeps it in ``.cause``
# (not ``__cause__``); following it is what makes a remote ConnectionError infrastructure.
_RAY_TASK_ERROR = ("ray", "RayTaskError")


def _mro_keys(exc: BaseException) -> Iterator[tuple[str, str]]:
    for cls in type(exc).__mro__:
        yield (cls.__module__.partition(".")[0], cls.__name__)


def _named(exc: BaseException, table: dict[tuple[str, str], str]) -> str | None:
    for key in _mro_keys(exc):
        hit = table.get(key)
        if hit is not None:
            return hit
    return None


def _http_status(exc: BaseException) -> int | None:
    attribute = _named(exc, _NAMED_STATUS)
    if attribute is None:
        return None
    status = getattr(exc, attribute, None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def _next_link(exc: BaseException) -> BaseException | None:
    if exc.__cause__ is not None:
        return exc.__cause__
    if _RAY_TASK_ERROR in set(_mro_keys(exc)):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, BaseException):
            return cause
    return None


def cause_chain(exc: BaseException, limit: int = MAX_CAUSE_LINKS) -> list[BaseException]:
    """``exc`` and its ``__cause__`` links, at most ``limit`` exceptions, cycle-safe.

    Bounded because a chain is attacker-shaped input as far as we are concerned (a
    library may chain arbitrarily deep, or build a cycle through ``raise x from y``).
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and len(chain) < limit and id(current) not in seen:
        seen.add(id(current))
        chain.append(current)
        current = _next_link(current)
    return chain


# --- HTTP statuses --------------------------------------------------------------------

_CONTEXT_LENGTH_MARKERS = ("maximum context length", "context length", "context_length")
_NO_HEALTHY_MARKER = "no healthy shards"


def classify_http_status(status: int, detail: str | None = None) -> Classification:
    """Classify an HTTP status (with the response's text, if any) into infra/data.

    5xx, 408 and 429 are infrastructure; every other status is data. ``detail`` only
    refines the reason: a 400 mentioning the context length is ``context_length`` (the
    vLLM over-long-prompt answer), and a body naming "no healthy shards" is
    infrastructure whatever the status, because our router answers an empty serving set
    with a status its clients do *not* retry (409 by default).
    """
    if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
        raise ValueError(f"not an HTTP status: {status!r}")
    text = (detail or "").lower()
    if _NO_HEALTHY_MARKER in text.replace("_", " "):
        return Classification(_INFRA, "no_healthy_shards")
    if status >= 500 or status in (408, 429):
        return Classification(_INFRA, f"http_{status}")
    if status == 400 and any(marker in text for marker in _CONTEXT_LENGTH_MARKERS):
        return Classification(_DATA, "context_length")
    return Classification(_DATA, f"http_{status}")


# --- exceptions -----------------------------------------------------------------------


def _classify_link(exc: BaseException) -> Classification | None:
    """One link, ignoring its causes; ``None`` when the link says nothing recognisable."""
    if isinstance(exc, RolloutDataFailure):
        return Classification(_DATA, exc.reason)
    if isinstance(exc, GenerationUnavailable):
        return Classification(_INFRA, exc.reason)
    if isinstance(exc, DeadlineExpired):
        return Classification(_INFRA, exc.reason)
    status = _http_status(exc)
    if status is not None and 100 <= status <= 599:
        return classify_http_status(status, str(exc))
    named = _named(exc, _NAMED_INFRA)
    if named is not None:
        return Classification(_INFRA, named)
    # asyncio.TimeoutError is TimeoutError on 3.11; both spellings land here.
    if isinstance(exc, TimeoutError):
        return Classification(_INFRA, "timeout")
    if isinstance(exc, ConnectionError):
        return Classification(_INFRA, "connection")
    if isinstance(exc, ValueError):
        return Classification(_DATA, "value_error")
    if isinstance(exc, KeyError):
        return Classification(_DATA, "key_error")
    if isinstance(exc, AssertionError):
        return Classification(_DATA, "assertion_error")
    if type(exc) is RuntimeError:
        return Classification(_DATA, "runtime_error")
    return None


def classify_exception(exc: BaseException) -> Classification:
    """Classify a rollout failure into infra / data / cancelled with a counter label.

    Order: cancellation of the raised exception itself; an explicit data failure
    anywhere in the (bounded) cause chain; the outermost infrastructure link; else
    data, labelled by the outermost recognised link or ``unknown:<TypeName>``.

    Only the raised exception is tested for cancellation: ``asyncio.timeout`` raises
    ``TimeoutError from CancelledError``, and that is a timeout, not a teardown.
    """
    if isinstance(exc, asyncio.CancelledError):
        return Classification(FailureKind.CANCELLED, "cancelled")
    if not isinstance(exc, Exception):
        return Classification(FailureKind.CANCELLED, f"interrupted:{type(exc).__name__}")

    chain = cause_chain(exc)
    for link in chain:
        if isinstance(link, RolloutDataFailure):
            return Classification(_DATA, link.reason)
    verdicts = [verdict for verdict in map(_classify_link, chain) if verdict is not None]
    for verdict in verdicts:
        if verdict.kind is _INFRA:
            return verdict
    if verdicts:
        return verdicts[0]
    return Classification(_DATA, f"unknown:{type(exc).__name__}")


def wrap_generation_failure(
    exc: Exception,
    *,
    shard: int | str | None = None,
    prompt_id: object = None,
    group_id: object = None,
) -> RolloutFailure:
    """Retype a raw generation error as GenerationUnavailable or RolloutDataFailure.

    The caller raises the result ``from exc`` so the original stays in the chain. The
    reason is the raw error's, so counters say ``actor_died`` rather than a wrapper name.
    Story: failures used to be printed and turned into a zero-reward row; now they are
    classified and raised, with the coordinates attached.
    """
    verdict = classify_exception(exc)
    cls = GenerationUnavailable if verdict.kind is _INFRA else RolloutDataFailure
    return cls(
        f"generation failed: {type(exc).__name__}: {exc}",
        reason=verdict.reason,
        shard=shard,
        prompt_id=prompt_id,
        group_id=group_id,
    )
