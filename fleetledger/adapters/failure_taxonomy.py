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
- Runtime (Ray) and HTTP-client (aiohttp, openai) error types are matched by class when
  their library is loaded and otherwise by qualified name (top-level package and class
  name) along the MRO, so neither library needs to be installed and a subclass
  (``ActorDiedError`` of ``RayActorError``) inherits its parent's row. An embedder adds
  its own types (httpx, grpc, its engine's) to either side with
  :func:`register_failure_type`; registered rows are read before the built-in ones.
- At the generation call site the boundary decides (:func:`classify_generation_failure`):
  an error that comes back across the runtime's boundary from a live generation worker
  — a task error wrapping the engine's own exception: an engine core that died under
  its worker, a device out of memory, something never seen before — means "this shard
  could not serve it", so it is infrastructure and re-dispatched; only an explicit data
  failure stays data.
- Classification never raises: an HTTP error whose ``str()`` fails (aiohttp's
  ``ClientResponseError`` built without request information) is classified by its
  ``status`` and ``message`` attributes, never by ``__str__``.

Reason strings are short and stable because they are counter labels.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from fleetledger.errors import FleetledgerError
from fleetledger.shards.contract import RolloutDataFailure, RolloutFailure

__all__ = [
    "MAX_CAUSE_LINKS",
    "Classification",
    "DeadlineExpired",
    "FailureKind",
    "GenerationUnavailable",
    "NoHealthyShards",
    "cause_chain",
    "classify_exception",
    "classify_generation_failure",
    "classify_http_status",
    "exception_text",
    "register_failure_type",
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


# --- our own failure vocabulary (RolloutFailure and RolloutDataFailure, which an engine
# raises, are the shard contract's: ``fleetledger.shards.contract``) ----------------


class GenerationUnavailable(RolloutFailure):
    """Infrastructure: this shard could not serve the request; another one may.

    Story: a dead worker's error was re-raised as GenerationUnavailable so the retry
    policy knows the prompt is fine and worth re-dispatching elsewhere.
    """

    default_reason = "generation_unavailable"


class NoHealthyShards(GenerationUnavailable):
    """Infrastructure: nothing is serving right now (e.g. mid-recovery); back off, retry."""

    default_reason = "no_healthy_shards"


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
    # Ray: actor / worker / node / object failures, its RPC layer and its get() timeout.
    ("ray", "ActorDiedError"): "actor_died",
    ("ray", "ActorUnavailableError"): "actor_unavailable",
    ("ray", "RayActorError"): "actor_died",
    ("ray", "WorkerCrashedError"): "worker_crashed",
    ("ray", "NodeDiedError"): "node_died",
    ("ray", "LocalRayletDiedError"): "node_died",
    ("ray", "ObjectLostError"): "object_lost",
    ("ray", "OutOfMemoryError"): "worker_oom",
    ("ray", "RaySystemError"): "ray_system",
    ("ray", "RpcError"): "rpc",
    ("ray", "GetTimeoutError"): "timeout",
    # aiohttp: connection-level failures, every class of the family by its own name: an
    # error unpickled where aiohttp is not importable (another process's, a stand-in)
    # has no aiohttp base classes in its MRO, only its module and name.
    ("aiohttp", "ServerTimeoutError"): "timeout",
    ("aiohttp", "ConnectionTimeoutError"): "timeout",
    ("aiohttp", "SocketTimeoutError"): "timeout",
    ("aiohttp", "ClientConnectionError"): "connection",
    ("aiohttp", "ClientConnectionResetError"): "connection",
    ("aiohttp", "ClientOSError"): "connection",
    ("aiohttp", "ClientConnectorError"): "connection",
    ("aiohttp", "ClientConnectorDNSError"): "connection",
    ("aiohttp", "ClientProxyConnectionError"): "connection",
    ("aiohttp", "UnixClientConnectorError"): "connection",
    ("aiohttp", "ClientSSLError"): "connection",
    ("aiohttp", "ClientConnectorSSLError"): "connection",
    ("aiohttp", "ClientConnectorCertificateError"): "connection",
    ("aiohttp", "ServerConnectionError"): "connection",
    ("aiohttp", "ServerDisconnectedError"): "connection",
    ("aiohttp", "ServerFingerprintMismatch"): "connection",
    # A truncated response body is a transport problem, not a bad prompt.
    ("aiohttp", "ClientPayloadError"): "payload",
    # openai client (wraps httpx): connection failures and its timeout.
    ("openai", "APITimeoutError"): "timeout",
    ("openai", "APIConnectionError"): "connection",
}

# Where a library keeps the classes of the table when it is loaded: matched by class
# too, so a re-export under another module name, or a subclass defined elsewhere, is
# recognised even where its MRO names differ.
_LIBRARY_MODULES: dict[str, tuple[str, ...]] = {
    "ray": ("ray.exceptions",),
    "aiohttp": ("aiohttp",),
    "openai": ("openai",),
}

# Exceptions that carry an HTTP status: (package, class) -> attribute holding the status.
_NAMED_STATUS: dict[tuple[str, str], str] = {
    ("aiohttp", "ClientResponseError"): "status",
    ("openai", "APIStatusError"): "status_code",
}

# Ray wraps an exception raised inside a task in RayTaskError and keeps it in ``.cause``
# (not ``__cause__``); following it is what makes a remote ConnectionError infrastructure.
_RAY_TASK_ERROR = ("ray", "RayTaskError")

# Rows an embedder registered: (package, class) -> (kind, reason), read first.
_REGISTERED: dict[tuple[str, str], tuple[FailureKind, str]] = {}


def register_failure_type(
    exc_type: type[BaseException] | str, kind: FailureKind, reason: str
) -> Callable[[], None]:
    """Classify ``exc_type`` (a class, or ``"package.ClassName"``) and its subclasses as
    ``kind`` with the counter label ``reason``; returns a function that removes the row.

    For the types fleetledger cannot know: an HTTP client (``httpx.ConnectError`` is
    infrastructure), an RPC layer (grpc), an engine's own exceptions. A registered row
    overrides a built-in one; an explicit :class:`RolloutDataFailure` still wins.
    """
    if kind is FailureKind.CANCELLED:
        raise ValueError("cancellation is decided by the exception's type, not registered")
    if not reason:
        raise ValueError("a registered failure type needs a reason (its counter label)")
    if isinstance(exc_type, str):
        package, _, name = exc_type.rpartition(".")
        if not package or not name:
            raise ValueError(f"{exc_type!r}: give a class or 'package.ClassName'")
        key = (package.partition(".")[0], name)
    else:
        key = (exc_type.__module__.partition(".")[0], exc_type.__name__)
    _REGISTERED[key] = (kind, reason)

    def unregister() -> None:
        _REGISTERED.pop(key, None)

    return unregister


def _mro_keys(exc: BaseException) -> Iterator[tuple[str, str]]:
    for cls in type(exc).__mro__:
        yield (cls.__module__.partition(".")[0], cls.__name__)


def _loaded_class(key: tuple[str, str]) -> type | None:
    """The library's own class for ``key``, if the library is already imported."""
    for module_name in _LIBRARY_MODULES.get(key[0], ()):
        module = sys.modules.get(module_name)
        found = getattr(module, key[1], None) if module is not None else None
        if isinstance(found, type):
            return found
    return None


def _named(exc: BaseException, table: dict[tuple[str, str], str]) -> str | None:
    for key in _mro_keys(exc):
        hit = table.get(key)
        if hit is not None:
            return hit
    for key, hit in table.items():
        cls = _loaded_class(key)
        if cls is not None and isinstance(exc, cls):
            return hit
    return None


def _registered(exc: BaseException) -> Classification | None:
    if not _REGISTERED:
        return None
    for key in _mro_keys(exc):
        row = _REGISTERED.get(key)
        if row is not None:
            return Classification(*row)
    return None


def _http_status(exc: BaseException) -> int | None:
    attribute = _named(exc, _NAMED_STATUS)
    if attribute is None:
        return None
    status = getattr(exc, attribute, None)
    return status if isinstance(status, int) and not isinstance(status, bool) else None


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or the type's name where ``__str__`` itself fails (never raises)."""
    try:
        return str(exc)
    except Exception:
        return f"<{type(exc).__name__}: its text cannot be read>"


def _http_detail(exc: BaseException) -> str:
    """The response's text as the error carries it, read from attributes first:
    aiohttp's ``ClientResponseError.__str__`` needs request information that adapters
    and tests often leave out."""
    message = getattr(exc, "message", None)
    if isinstance(message, str):
        return message
    return exception_text(exc)


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
    registered = _registered(exc)
    if registered is not None:
        return registered
    status = _http_status(exc)
    if status is not None and 100 <= status <= 599:
        return classify_http_status(status, _http_detail(exc))
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
    ``TimeoutError from CancelledError``, and that is a timeout, not a teardown. Never
    raises: whatever an exception object does when inspected, it gets a verdict.
    """
    if isinstance(exc, asyncio.CancelledError):
        return Classification(FailureKind.CANCELLED, "cancelled")
    if not isinstance(exc, Exception):
        return Classification(FailureKind.CANCELLED, f"interrupted:{type(exc).__name__}")
    try:
        return _classify_chain(cause_chain(exc))
    except Exception:  # a hostile exception object must not crash the retry loop
        return Classification(_DATA, f"unclassifiable:{type(exc).__name__}")


def _classify_chain(chain: list[BaseException]) -> Classification:
    for link in chain:
        if isinstance(link, RolloutDataFailure):
            return Classification(_DATA, link.reason)
    verdicts = [verdict for verdict in map(_classify_link, chain) if verdict is not None]
    for verdict in verdicts:
        if verdict.kind is _INFRA:
            return verdict
    if verdicts:
        return verdicts[0]
    return Classification(_DATA, f"unknown:{type(chain[0]).__name__}")


def classify_generation_failure(exc: BaseException) -> Classification:
    """Classify a failure seen at the generation call site, where the boundary decides.

    As :func:`classify_exception`, except that an error which came back across the
    runtime's boundary from the generation worker (a Ray task error anywhere in the
    chain) is infrastructure unless it is an explicit data failure: the worker was
    alive and could not serve the prompt, and another shard may.
    """
    verdict = classify_exception(exc)
    if verdict.kind is not _DATA:
        return verdict
    try:
        chain = cause_chain(exc)
        if any(isinstance(link, RolloutDataFailure) for link in chain):
            return verdict
        crossed = [i for i, link in enumerate(chain) if _RAY_TASK_ERROR in set(_mro_keys(link))]
    except Exception:
        return verdict
    if not crossed:
        return verdict
    remote = chain[crossed[0] + 1] if crossed[0] + 1 < len(chain) else chain[crossed[0]]
    return Classification(_INFRA, f"remote:{type(remote).__name__}")


def wrap_generation_failure(
    exc: Exception,
    *,
    shard: int | str | None = None,
    prompt_id: object = None,
    group_id: object = None,
) -> RolloutFailure:
    """Retype a raw generation error as GenerationUnavailable or RolloutDataFailure.

    Classified as at the generation call site (:func:`classify_generation_failure`).
    The caller raises the result ``from exc`` so the original stays in the chain. The
    reason is the raw error's, so counters say ``actor_died`` rather than a wrapper name.
    Story: failures used to be printed and turned into a zero-reward row; now they are
    classified and raised, with the coordinates attached.
    """
    verdict = classify_generation_failure(exc)
    cls = GenerationUnavailable if verdict.kind is _INFRA else RolloutDataFailure
    return cls(
        f"generation failed: {type(exc).__name__}: {exception_text(exc)}",
        reason=verdict.reason,
        shard=shard,
        prompt_id=prompt_id,
        group_id=group_id,
    )
