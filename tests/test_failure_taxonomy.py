"""The failure taxonomy, row by row of docs/reference.md §5.

Ray, aiohttp and openai need not be installed: their error types are matched by
top-level package and class name, so the fakes below are declared in modules of the
same names with the real libraries' class hierarchies (and the real types are checked
too, when the library happens to be importable).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from types import SimpleNamespace
from typing import Any

import pytest

from fleetledger.adapters.failure_taxonomy import (
    MAX_CAUSE_LINKS,
    Classification,
    DeadlineExpired,
    FailureKind,
    GenerationUnavailable,
    NoHealthyShards,
    cause_chain,
    classify_exception,
    classify_generation_failure,
    classify_http_status,
    register_failure_type,
    wrap_generation_failure,
)
from fleetledger.shards.contract import RolloutDataFailure

INFRA = FailureKind.INFRA
DATA = FailureKind.DATA
CANCELLED = FailureKind.CANCELLED


def _fake(module: str, name: str, *bases: type, **attrs: object) -> type:
    return type(name, bases or (Exception,), {"__module__": module, **attrs})


# ray.exceptions, with ray's hierarchy.
RayError = _fake("ray.exceptions", "RayError")
RayTaskError = _fake("ray.exceptions", "RayTaskError", RayError)
RayActorError = _fake("ray.exceptions", "RayActorError", RayError)
ActorDiedError = _fake("ray.exceptions", "ActorDiedError", RayActorError)
ActorUnavailableError = _fake("ray.exceptions", "ActorUnavailableError", RayActorError)
WorkerCrashedError = _fake("ray.exceptions", "WorkerCrashedError", RayError)
NodeDiedError = _fake("ray.exceptions", "NodeDiedError", RayError)
LocalRayletDiedError = _fake("ray.exceptions", "LocalRayletDiedError", RayError)
ObjectLostError = _fake("ray.exceptions", "ObjectLostError", RayError)
OwnerDiedError = _fake("ray.exceptions", "OwnerDiedError", ObjectLostError)
ReferenceCountingAssertionError = _fake(
    "ray.exceptions", "ReferenceCountingAssertionError", ObjectLostError, AssertionError
)
GetTimeoutError = _fake("ray.exceptions", "GetTimeoutError", RayError, TimeoutError)
RayOutOfMemoryError = _fake("ray.exceptions", "OutOfMemoryError", RayError)
RaySystemError = _fake("ray.exceptions", "RaySystemError", RayError)
RayTaskCancelled = _fake("ray.exceptions", "TaskCancelledError", RayError)

# aiohttp.client_exceptions, with aiohttp's hierarchy.
_AIO = "aiohttp.client_exceptions"
ClientError = _fake(_AIO, "ClientError")
ClientConnectionError = _fake(_AIO, "ClientConnectionError", ClientError)
ClientOSError = _fake(_AIO, "ClientOSError", ClientConnectionError, OSError)
ClientConnectorError = _fake(_AIO, "ClientConnectorError", ClientOSError)
ServerConnectionError = _fake(_AIO, "ServerConnectionError", ClientConnectionError)
ServerDisconnectedError = _fake(_AIO, "ServerDisconnectedError", ServerConnectionError)
ServerTimeoutError = _fake(_AIO, "ServerTimeoutError", ServerConnectionError, TimeoutError)
ClientPayloadError = _fake(_AIO, "ClientPayloadError", ClientError)


class ClientResponseError(ClientError):  # type: ignore[misc, valid-type]
    __module__ = _AIO

    def __init__(self, status: int, message: str = "") -> None:
        super().__init__(f"{status}, message={message!r}")
        self.status = status
        self.message = message


# openai._exceptions, with openai's hierarchy.
_OAI = "openai._exceptions"
APIError = _fake(_OAI, "APIError")
APIConnectionError = _fake(_OAI, "APIConnectionError", APIError)
APITimeoutError = _fake(_OAI, "APITimeoutError", APIConnectionError)


class APIStatusError(APIError):  # type: ignore[misc, valid-type]
    __module__ = _OAI

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


class BadRequestError(APIStatusError):
    __module__ = _OAI


class Unrecognised(Exception):
    pass


VLLM_CONTEXT_LENGTH = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens."
)


def _expect(exc: BaseException, kind: FailureKind, reason: str) -> None:
    assert classify_exception(exc) == Classification(kind, reason)


# --- docs/reference.md §5, exception rows --------------------------------------------------------

INFRA_EXCEPTIONS = [
    (TimeoutError("t"), "timeout"),
    (asyncio.TimeoutError(), "timeout"),  # noqa: UP041 — the asyncio spelling is a row
    (ConnectionError("c"), "connection"),
    (ConnectionResetError(), "connection"),
    (ConnectionRefusedError(), "connection"),
    (ConnectionAbortedError(), "connection"),
    (BrokenPipeError(), "connection"),
    # Ray: actor / worker / node / object errors, by type name.
    (ActorDiedError("dead"), "actor_died"),
    (RayActorError("dead"), "actor_died"),
    (ActorUnavailableError("blip"), "actor_unavailable"),
    (WorkerCrashedError(), "worker_crashed"),
    (NodeDiedError(), "node_died"),
    (LocalRayletDiedError(), "node_died"),
    (ObjectLostError(), "object_lost"),
    (OwnerDiedError(), "object_lost"),
    (ReferenceCountingAssertionError(), "object_lost"),  # not the AssertionError row
    (GetTimeoutError(), "timeout"),
    (RayOutOfMemoryError(), "worker_oom"),
    (RaySystemError(), "ray_system"),
    # aiohttp / openai connection-level errors.
    (ClientConnectorError(), "connection"),
    (ClientOSError(), "connection"),
    (ServerDisconnectedError(), "connection"),
    (ServerTimeoutError(), "timeout"),
    (ClientPayloadError(), "payload"),
    (APIConnectionError(), "connection"),
    (APITimeoutError(), "timeout"),
    # Ours.
    (NoHealthyShards("nothing serving"), "no_healthy_shards"),
    (GenerationUnavailable("gone"), "generation_unavailable"),
    (GenerationUnavailable("gone", reason="actor_died"), "actor_died"),
    (DeadlineExpired("generation", 30.0), "deadline:generation"),
]


@pytest.mark.parametrize(("exc", "reason"), INFRA_EXCEPTIONS, ids=lambda v: repr(v)[:48])
def test_infrastructure_exceptions(exc: BaseException, reason: str) -> None:
    _expect(exc, INFRA, reason)
    assert classify_exception(exc).retry_elsewhere


DATA_EXCEPTIONS = [
    (ValueError("v"), "value_error"),
    (json.JSONDecodeError("bad", "{", 0), "value_error"),
    (KeyError("k"), "key_error"),
    (AssertionError("a"), "assertion_error"),
    (RuntimeError("bare"), "runtime_error"),
    (RolloutDataFailure("bad prompt"), "data_failure"),
    (RolloutDataFailure("bad prompt", reason="empty_generation"), "empty_generation"),
    # Unknown -> data, loudly labelled with the type.
    (Unrecognised("?"), "unknown:Unrecognised"),
    (NotImplementedError(), "unknown:NotImplementedError"),  # a RuntimeError, not bare
    (TypeError("t"), "unknown:TypeError"),
    (FileNotFoundError("f"), "unknown:FileNotFoundError"),  # an OSError, not a connection
    (ClientError("generic client error"), "unknown:ClientError"),
    (RayError("generic"), "unknown:RayError"),
    (RayTaskCancelled(), "unknown:TaskCancelledError"),
    # The same class name outside ray is not ray's.
    (_fake("mylib.errors", "ActorDiedError")(), "unknown:ActorDiedError"),
]


@pytest.mark.parametrize(("exc", "reason"), DATA_EXCEPTIONS, ids=lambda v: repr(v)[:48])
def test_data_exceptions(exc: BaseException, reason: str) -> None:
    _expect(exc, DATA, reason)
    assert not classify_exception(exc).retry_elsewhere


# --- HTTP statuses -----------------------------------------------------------------------


@pytest.mark.parametrize("status", [500, 502, 503, 504, 520, 599, 408, 429])
def test_infrastructure_statuses(status: int) -> None:
    assert classify_http_status(status) == Classification(INFRA, f"http_{status}")


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 302])
def test_data_statuses(status: int) -> None:
    assert classify_http_status(status) == Classification(DATA, f"http_{status}")


def test_400_maximum_context_length_is_data_not_retried() -> None:
    # Story: vLLM answers an over-long prompt with 400 "maximum context length";
    # retrying it elsewhere would spend the budget on a prompt no shard can serve.
    assert classify_http_status(400, VLLM_CONTEXT_LENGTH) == Classification(DATA, "context_length")
    assert classify_http_status(400, "missing field") == Classification(DATA, "http_400")


def test_router_no_healthy_body_is_infrastructure_whatever_the_status() -> None:
    body = json.dumps({"error": "no_healthy_shards", "detail": "no serving backend"})
    assert classify_http_status(409, body) == Classification(INFRA, "no_healthy_shards")
    assert classify_http_status(409, "conflict") == Classification(DATA, "http_409")


@pytest.mark.parametrize("status", [99, 600, -1, True, 503.0, "503"])
def test_not_a_status_is_rejected(status: object) -> None:
    with pytest.raises(ValueError, match="not an HTTP status"):
        classify_http_status(status)  # type: ignore[arg-type]


HTTP_EXCEPTIONS = [
    (ClientResponseError(503, "Service Unavailable"), INFRA, "http_503"),
    (ClientResponseError(429, "Too Many Requests"), INFRA, "http_429"),
    (ClientResponseError(408), INFRA, "http_408"),
    # A ClientError is *not* infrastructure by type: the status decides.
    (ClientResponseError(400, VLLM_CONTEXT_LENGTH), DATA, "context_length"),
    (ClientResponseError(404, "Not Found"), DATA, "http_404"),
    (ClientResponseError(422), DATA, "http_422"),
    (BadRequestError(f"Error code: 400 - {VLLM_CONTEXT_LENGTH}", 400), DATA, "context_length"),
    (BadRequestError("Error code: 401", 401), DATA, "http_401"),
    (APIStatusError("Error code: 500", 500), INFRA, "http_500"),
    (APIStatusError("Error code: 413", 413), DATA, "http_413"),
]


@pytest.mark.parametrize(("exc", "kind", "reason"), HTTP_EXCEPTIONS, ids=repr)
def test_http_errors_classified_by_status_not_type(
    exc: BaseException, kind: FailureKind, reason: str
) -> None:
    _expect(exc, kind, reason)


# --- cause chains ------------------------------------------------------------------------


def _chain(*links: BaseException) -> BaseException:
    """links[0] raised from links[1] raised from ... (explicit __cause__)."""
    for outer, inner in itertools.pairwise(links):
        outer.__cause__ = inner
    return links[0]


def test_infrastructure_cause_makes_a_wrapper_infrastructure() -> None:
    _expect(_chain(RuntimeError("wrapped"), ConnectionResetError()), INFRA, "connection")
    _expect(_chain(ValueError("parse"), Unrecognised(), TimeoutError()), INFRA, "timeout")


def test_outermost_infrastructure_link_names_the_reason() -> None:
    _expect(_chain(Unrecognised(), ActorDiedError(), ConnectionError()), INFRA, "actor_died")


def test_explicit_data_failure_wins_over_infrastructure_anywhere_in_the_chain() -> None:
    _expect(_chain(RolloutDataFailure("bad prompt"), ActorDiedError()), DATA, "data_failure")
    wrapped = _chain(GenerationUnavailable("x"), Unrecognised(), RolloutDataFailure("bad"))
    _expect(wrapped, DATA, "data_failure")


def test_unknown_wrapper_takes_the_reason_of_its_recognised_cause() -> None:
    _expect(_chain(Unrecognised(), KeyError("k")), DATA, "key_error")


def test_context_is_not_followed() -> None:
    # An error raised while handling another is not caused by it.
    try:
        try:
            raise ConnectionResetError("reset")
        except ConnectionResetError:
            raise RuntimeError("cleanup failed")  # noqa: B904 — the point of the test
    except RuntimeError as exc:
        assert isinstance(exc.__context__, ConnectionResetError)
        _expect(exc, DATA, "runtime_error")


def test_cycle_terminates() -> None:
    a, b = ValueError("a"), Unrecognised("b")
    a.__cause__, b.__cause__ = b, a
    assert cause_chain(a) == [a, b]
    _expect(a, DATA, "value_error")

    c, d = Unrecognised("c"), ConnectionError("d")
    c.__cause__, d.__cause__ = d, c
    _expect(c, INFRA, "connection")

    selfish = Unrecognised("me")
    selfish.__cause__ = selfish
    assert cause_chain(selfish) == [selfish]
    _expect(selfish, DATA, "unknown:Unrecognised")


def test_chain_is_followed_for_exactly_eight_links() -> None:
    assert MAX_CAUSE_LINKS == 8
    reachable = _chain(*[Unrecognised(str(i)) for i in range(7)], ConnectionError())
    assert len(cause_chain(reachable)) == 8
    _expect(reachable, INFRA, "connection")

    too_deep = _chain(*[Unrecognised(str(i)) for i in range(8)], ConnectionError())
    assert len(cause_chain(too_deep)) == 8
    _expect(too_deep, DATA, "unknown:Unrecognised")

    data_too_deep = _chain(
        TimeoutError(), *[Unrecognised() for _ in range(7)], RolloutDataFailure("x")
    )
    _expect(data_too_deep, INFRA, "timeout")


def test_ray_task_error_cause_attribute_is_followed() -> None:
    # Ray keeps a remote task's exception in .cause, not __cause__.
    remote = RayTaskError("task raised")
    remote.cause = ConnectionResetError("engine socket")  # type: ignore[attr-defined]
    _expect(remote, INFRA, "connection")
    remote.cause = ValueError("bad")  # type: ignore[attr-defined]
    _expect(remote, DATA, "value_error")


def test_ray_task_error_dual_class_is_its_cause_class() -> None:
    # ray's as_instanceof_cause builds class "RayTaskError(X)" inheriting from both.
    dual = _fake("ray.exceptions", "RayTaskError(ConnectionError)", RayTaskError, ConnectionError)
    _expect(dual(), INFRA, "connection")
    dual_data = _fake("ray.exceptions", "RayTaskError(ValueError)", RayTaskError, ValueError)
    _expect(dual_data(), DATA, "value_error")


# --- cancellation ------------------------------------------------------------------------


def test_cancellation_is_never_retriable() -> None:
    verdict = classify_exception(asyncio.CancelledError())
    assert verdict == Classification(CANCELLED, "cancelled")
    assert not verdict.retry_elsewhere
    # Even with an infrastructure cause attached.
    _expect(_chain(asyncio.CancelledError(), ConnectionError()), CANCELLED, "cancelled")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(1), GeneratorExit()])
def test_other_teardown_is_not_a_fault(exc: BaseException) -> None:
    _expect(exc, CANCELLED, f"interrupted:{type(exc).__name__}")


def test_asyncio_timeout_expiry_is_a_timeout_not_a_cancellation() -> None:
    # asyncio.timeout raises TimeoutError *from* CancelledError.
    async def expire() -> BaseException:
        try:
            async with asyncio.timeout(0.001):
                await asyncio.sleep(5)
        except TimeoutError as exc:
            return exc
        raise AssertionError("did not expire")

    exc = asyncio.run(expire())
    assert isinstance(exc.__cause__, asyncio.CancelledError)
    _expect(exc, INFRA, "timeout")


# --- wrapping ----------------------------------------------------------------------------


def test_wrap_keeps_reason_and_coordinates() -> None:
    raw = ActorDiedError("actor gone")
    try:
        raise wrap_generation_failure(raw, shard=3, prompt_id="p7", group_id="g1") from raw
    except GenerationUnavailable as wrapped:
        assert wrapped.__cause__ is raw
        assert (wrapped.shard, wrapped.prompt_id, wrapped.group_id) == (3, "p7", "g1")
        assert "shard=3" in str(wrapped) and "prompt=p7" in str(wrapped)
        _expect(wrapped, INFRA, "actor_died")


def test_wrap_data_failure() -> None:
    raw = ClientResponseError(400, VLLM_CONTEXT_LENGTH)
    wrapped = wrap_generation_failure(raw, shard=0, prompt_id=1)
    assert type(wrapped) is RolloutDataFailure
    wrapped.__cause__ = raw
    _expect(wrapped, DATA, "context_length")


# --- the real libraries, when installed ---------------------------------------------------


def test_real_ray_error_types() -> None:
    exceptions = pytest.importorskip("ray.exceptions")
    _expect(exceptions.ActorDiedError(), INFRA, "actor_died")
    _expect(exceptions.ActorUnavailableError("x", None), INFRA, "actor_unavailable")
    _expect(exceptions.WorkerCrashedError(), INFRA, "worker_crashed")
    _expect(exceptions.GetTimeoutError(), INFRA, "timeout")
    task_error = exceptions.RayTaskError(
        "generate", "Traceback", ValueError("bad"), proctitle="t", pid=1, ip="127.0.0.1"
    )
    _expect(task_error.as_instanceof_cause(), DATA, "value_error")


def test_real_aiohttp_error_types() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    _expect(aiohttp.ServerDisconnectedError(), INFRA, "connection")
    _expect(aiohttp.ServerTimeoutError(), INFRA, "timeout")
    # __str__ reads only request_info.real_url; a stand-in avoids RequestInfo's signature.
    info = SimpleNamespace(real_url="http://engine/v1/chat/completions")
    response_error = aiohttp.ClientResponseError(info, (), status=400, message=VLLM_CONTEXT_LENGTH)
    _expect(response_error, DATA, "context_length")


# --- classification never raises -----------------------------------------------------------


def test_an_aiohttp_response_error_without_request_info_is_classified_by_its_status() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    # As adapters and tests build them: no request information, so str() itself raises.
    bare = aiohttp.ClientResponseError(None, (), status=503, message="engine overloaded")
    with pytest.raises(AttributeError):
        str(bare)
    _expect(bare, INFRA, "http_503")
    context = aiohttp.ClientResponseError(None, (), status=400, message=VLLM_CONTEXT_LENGTH)
    _expect(context, DATA, "context_length")
    wrapped = wrap_generation_failure(bare, shard=1)
    assert isinstance(wrapped, GenerationUnavailable) and "ClientResponseError" in str(wrapped)


def test_an_aiohttp_response_error_without_request_info_is_retried_elsewhere() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    from fleetledger.adapters.retry_policy import RetryPolicy, RolloutCounters, run_rollout

    shards = iter(range(10))
    seen: list[int] = []

    async def generate(attempt: object) -> str:
        seen.append(attempt.shard)  # type: ignore[attr-defined]
        if len(seen) == 1:
            raise aiohttp.ClientResponseError(None, (), status=502, message="bad gateway")
        return "ok"

    async def no_wait(_seconds: float) -> None:
        return None

    counters = RolloutCounters()
    result = asyncio.run(
        run_rollout(
            generate,
            select_shard=lambda: contextlib.nullcontext(next(shards)),
            policy=RetryPolicy(),
            counters=counters,
            sleep=no_wait,
        )
    )
    assert result == "ok" and seen == [0, 1] and counters.redispatched == {"http_502": 1}


class Hostile(Exception):
    """Every way of reading it fails: its text, its attributes."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    def __getattribute__(self, name: str) -> object:
        if name in ("message", "status", "status_code", "reason", "cause"):
            raise RuntimeError(f"no {name} for you")
        return super().__getattribute__(name)


def test_classification_never_raises_on_a_hostile_exception() -> None:
    verdict = classify_exception(Hostile())
    assert verdict.kind is DATA and verdict.reason.endswith("Hostile")
    response = ClientResponseError(503)
    response.__cause__ = Hostile()
    assert classify_exception(response).kind is INFRA
    assert "text cannot be read" in str(wrap_generation_failure(Hostile()))


# --- Ray's RPC layer, aiohttp by class and by name --------------------------------------------


def test_ray_rpc_errors_are_infrastructure() -> None:
    _expect(_fake("ray.exceptions", "RpcError", RayError)(), INFRA, "rpc")
    exceptions = pytest.importorskip("ray.exceptions")
    _expect(exceptions.RpcError("unavailable"), INFRA, "rpc")


def test_aiohttp_connection_errors_by_class_when_the_library_is_loaded() -> None:
    aiohttp = pytest.importorskip("aiohttp")
    _expect(
        aiohttp.ClientConnectorError(
            SimpleNamespace(ssl=None, host="h", port=1), OSError(111, "refused")
        ),
        INFRA,
        "connection",
    )
    _expect(aiohttp.ServerDisconnectedError(), INFRA, "connection")

    # A subclass defined outside aiohttp, re-exported under another module name: its MRO
    # still holds aiohttp's class, and the class check finds it either way.
    class AdapterDisconnect(aiohttp.ClientConnectionError):
        __module__ = "myadapter.errors"

    _expect(AdapterDisconnect(), INFRA, "connection")


def test_aiohttp_connection_errors_by_qualified_name_without_the_library() -> None:
    # The fakes live in modules named aiohttp.client_exceptions: no aiohttp class needed.
    _expect(ClientConnectorError(), INFRA, "connection")
    _expect(ServerDisconnectedError(), INFRA, "connection")
    renamed = _fake("aiohttp", "ClientConnectorError", Exception)
    _expect(renamed(), INFRA, "connection")


# --- the embedder's own types ------------------------------------------------------------------


HttpxConnectError = _fake("httpx", "ConnectError")
EngineDeadError = _fake("vllm.v1.engine.exceptions", "EngineDeadError")


def test_a_registered_type_is_classified_on_its_side_and_can_be_removed() -> None:
    _expect(HttpxConnectError(), DATA, "unknown:ConnectError")
    remove = register_failure_type("httpx.ConnectError", INFRA, "httpx_connect")
    try:
        _expect(HttpxConnectError(), INFRA, "httpx_connect")
        _expect(_fake("httpx", "Sub", HttpxConnectError)(), INFRA, "httpx_connect")
    finally:
        remove()
    _expect(HttpxConnectError(), DATA, "unknown:ConnectError")


def test_a_registered_class_overrides_a_built_in_row_but_not_an_explicit_data_failure() -> None:
    remove = register_failure_type(ConnectionResetError, DATA, "poisoned_prompt")
    try:
        _expect(ConnectionResetError(), DATA, "poisoned_prompt")
        remove_infra = register_failure_type(EngineDeadError, INFRA, "engine_dead")
        try:
            explicit = RolloutDataFailure("prompt too long", reason="context_length")
            explicit.__cause__ = EngineDeadError()
            _expect(explicit, DATA, "context_length")
        finally:
            remove_infra()
    finally:
        remove()
    _expect(ConnectionResetError(), INFRA, "connection")


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (("httpx", INFRA, "x"), "give a class or 'package.ClassName'"),
        (("httpx.ConnectError", FailureKind.CANCELLED, "x"), "cancellation"),
        (("httpx.ConnectError", INFRA, ""), "needs a reason"),
    ],
)
def test_a_bad_registration_is_refused(args: tuple[Any, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        register_failure_type(*args)


# --- the generation call site: the boundary decides -------------------------------------------


def _across_the_boundary(cause: BaseException) -> BaseException:
    exceptions = pytest.importorskip("ray.exceptions")
    error = exceptions.RayTaskError(
        "generate", "Traceback", cause, proctitle="t", pid=1, ip="127.0.0.1"
    )
    return error.as_instanceof_cause()


@pytest.mark.parametrize(
    "cause",
    [EngineDeadError(), ValueError("CUDA out of memory"), Unrecognised("never seen"), KeyError()],
    ids=["engine_dead", "value_error", "unknown", "key_error"],
)
def test_an_engine_error_across_the_boundary_is_infrastructure(cause: BaseException) -> None:
    remote = _across_the_boundary(cause)
    assert classify_exception(remote).kind is DATA  # off the call site: the old rule
    verdict = classify_generation_failure(remote)
    assert verdict == Classification(INFRA, f"remote:{type(cause).__name__}")
    assert isinstance(wrap_generation_failure(remote), GenerationUnavailable)


def test_an_explicit_data_failure_across_the_boundary_stays_data() -> None:
    remote = _across_the_boundary(RolloutDataFailure("too long", reason="context_length"))
    assert classify_generation_failure(remote) == Classification(DATA, "context_length")
    assert isinstance(wrap_generation_failure(remote), RolloutDataFailure)


def test_without_a_boundary_the_generation_site_classifies_as_everywhere() -> None:
    assert classify_generation_failure(ValueError("x")) == Classification(DATA, "value_error")
    assert classify_generation_failure(ConnectionResetError()) == Classification(
        INFRA, "connection"
    )


def _aiohttp_connection_family() -> list[type[BaseException]]:
    """Every connection-level class aiohttp has (the installed one's, found by walking)."""
    aiohttp = pytest.importorskip("aiohttp", reason="aiohttp is not installed")
    family, todo = [], [aiohttp.ClientConnectionError]
    while todo:
        cls = todo.pop()
        family.append(cls)
        todo += cls.__subclasses__()
    return family


@pytest.mark.parametrize("real", _aiohttp_connection_family(), ids=lambda c: c.__name__)
def test_an_aiohttp_connection_error_is_infrastructure_by_its_qualified_name(real) -> None:
    """An aiohttp connection error that crossed into a process where aiohttp's classes are
    not importable (a stand-in with aiohttp's module and name, and none of its bases) is
    still infrastructure, as the real class is: every class of the family is known by
    name, so a class aiohttp adds later fails here, not in a run."""
    stand_in = type(real.__name__, (Exception,), {"__module__": real.__module__})
    assert stand_in.__mro__[1] is Exception  # nothing of aiohttp's hierarchy
    by_name = classify_exception(stand_in("no route to the backend"))
    assert by_name.kind is FailureKind.INFRA
    assert by_name.reason == classify_exception(_instance(real)).reason


def _instance(cls: type[BaseException]) -> BaseException:
    """A real instance, whatever the constructor wants (the classification reads only
    the type)."""
    return cls.__new__(cls)
