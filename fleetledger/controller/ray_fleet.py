"""Ray glue: the shard actors of one run, probed, called and restarted by index.

Imports Ray at module import; nothing else in ``fleetledger`` imports this module unless
the caller asked for a live fleet, so the ledger, the projections and the forensics CLI
work without Ray installed.

What Ray tells us, measured on these machines (docs/reference.md M2): a SIGKILLed actor makes
the next call, and any call in flight, raise ``ActorDiedError`` within milliseconds —
conclusive. A SIGSTOPped actor produces nothing, ever: only our own deadline sees it,
which is why a probe round is bounded by ``ray.wait(timeout=)`` and a timeout is only a
*failed* probe, counted towards the threshold.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

from fleetledger.controller.failure_taxonomy import wrap_generation_failure
from fleetledger.controller.generation_shard import Generation, GenerationRequest
from fleetledger.controller.ledger import ProbeResult
from fleetledger.errors import FleetledgerError
from fleetledger.events.errors import first_line

__all__ = [
    "RayShardFleet",
    "ShardSpawnError",
    "actor_death_of",
    "local_ray",
    "probe_result_of",
]

ShardFactory = Callable[[int], ActorHandle]
"""Creates (and names) the actor for one shard index; used at start and for restarts."""


class ShardSpawnError(FleetledgerError, RuntimeError):
    """A shard actor could not be created or did not answer its first probe in time."""


def probe_result_of(exc: BaseException) -> ProbeResult:
    """Map what a probe raised onto the ledger's probe outcome.

    Only the runtime's "the actor died" is conclusive. ``ActorUnavailableError`` (a
    subclass of ``RayActorError``) means the actor may come back, so it is a failed probe.
    """
    text = f"{type(exc).__name__}: {first_line(exc)}"
    if isinstance(exc, ActorUnavailableError):
        return ProbeResult("error", text)
    if isinstance(exc, RayActorError):
        return ProbeResult("died", text)
    if isinstance(exc, GetTimeoutError | TimeoutError):
        return ProbeResult("timeout", text)
    return ProbeResult("error", text)


def shard_actor_name(prefix: str, shard: int) -> str:
    return f"{prefix}-shard-{shard}"


class RayShardFleet:
    """Handles to the shard actors of one run, by shard index."""

    def __init__(
        self,
        handles: Mapping[int, ActorHandle],
        *,
        factory: ShardFactory | None = None,
    ) -> None:
        self._handles: dict[int, ActorHandle] = dict(handles)
        self._factory = factory
        self._incarnations: dict[int, int] = {}

    @classmethod
    def spawn(
        cls, shard_count: int, factory: ShardFactory, *, ready_timeout_s: float = 60.0
    ) -> RayShardFleet:
        """Create every shard's actor and wait (bounded) until each answers a probe."""
        fleet = cls({}, factory=factory)
        try:
            for shard in range(shard_count):
                fleet._handles[shard] = factory(shard)
            fleet.wait_ready(range(shard_count), ready_timeout_s)
        except BaseException:
            fleet.shutdown()  # named actors would otherwise outlive the failed start
            raise
        return fleet

    @classmethod
    def attach(
        cls,
        shard_count: int,
        prefix: str,
        *,
        namespace: str | None = None,
        factory: ShardFactory | None = None,
    ) -> RayShardFleet:
        """Find a run's named shard actors again, e.g. from a restarted controller.

        A shard whose actor is gone gets a handle-less slot: probing it reports a death,
        which is what a restarted controller must learn about it.
        """
        handles: dict[int, ActorHandle] = {}
        for shard in range(shard_count):
            try:
                handles[shard] = ray.get_actor(shard_actor_name(prefix, shard), namespace)
            except ValueError:
                continue
        return cls(handles, factory=factory)

    # ── probing ─────────────────────────────────────────────────────────────

    def probe(self, shards: Iterable[int], timeout_s: float) -> dict[int, ProbeResult]:
        """Probe ``shards`` concurrently; the whole round is bounded by ``timeout_s``."""
        return self._bounded_round(
            shards, lambda h: h.is_alive.remote(), timeout_s, f"probe_timeout_s={timeout_s:g}"
        )

    def _bounded_round(
        self,
        shards: Iterable[int],
        call: Callable[[ActorHandle], Any],
        timeout_s: float,
        bound: str,
    ) -> dict[int, ProbeResult]:
        """One call per shard, all in flight at once, one deadline for the lot.

        The deadline starts before the first call is submitted, so submitting to a large
        fleet does not stretch the round; results are fetched in one ``ray.get`` when all
        succeeded (one call per result costs ~0.4 ms: 25 ms over 64 shards).
        """
        deadline = time.monotonic() + timeout_s
        refs: dict[Any, int] = {}
        results: dict[int, ProbeResult] = {}
        for shard in shards:
            handle = self._handles.get(shard)
            if handle is None:
                results[shard] = ProbeResult("died", "no actor for this shard in the cluster")
            else:
                refs[call(handle)] = shard
        if not refs:
            return results
        ready, _ = ray.wait(
            list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
        )
        try:
            ray.get(ready, timeout=0)
            results.update((refs[ref], ProbeResult.ok()) for ref in ready)
        except Exception:  # at least one failed: look at each
            for ref in ready:
                try:
                    ray.get(ref, timeout=0)
                    results[refs[ref]] = ProbeResult.ok()
                except Exception as exc:
                    results[refs[ref]] = probe_result_of(exc)
        for shard in refs.values():
            results.setdefault(shard, ProbeResult("timeout", f"no answer within {bound}"))
        return results

    def wait_ready(self, shards: Iterable[int], timeout_s: float) -> None:
        """Block until every shard answers a probe; raise naming the ones that did not."""
        pending = set(shards)
        deadline = time.monotonic() + timeout_s
        last: dict[int, ProbeResult] = {}
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                detail = ", ".join(
                    f"shard {s}: {last[s].kind} {last[s].error}".rstrip()
                    if s in last
                    else f"shard {s}"
                    for s in sorted(pending)
                )
                raise ShardSpawnError(f"not ready within {timeout_s:g}s: {detail}")
            last = self.probe(pending, min(left, 5.0))
            dead = {s: r for s, r in last.items() if r.kind == "died"}
            if dead:
                detail = ", ".join(f"shard {s}: {r.error}" for s, r in sorted(dead.items()))
                raise ShardSpawnError(f"died while starting: {detail}")
            pending = {s for s, r in last.items() if r.kind != "ok"}

    # ── calls ───────────────────────────────────────────────────────────────

    async def generate(self, shard: int, request: GenerationRequest) -> Generation:
        """One generation on ``shard``. Cancelling the caller cancels the actor's task too.

        Story: a cancelled sibling used to keep generating against the fleet for a
        result already being discarded.
        """
        ref = self.handle(shard).generate.remote(request)
        try:
            result: Generation = await ref
            return result
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except RayTaskError as exc:
            # The worker was alive and raised: the boundary decides. Its engine's own
            # error (an engine core dead under it, a device out of memory, anything
            # never seen) is this shard's failure, re-dispatched elsewhere; only an
            # explicit data failure stays the prompt's.
            raise wrap_generation_failure(
                exc, shard=shard, prompt_id=request.prompt_id, group_id=request.group_id
            ) from exc

    def set_weight_version(
        self, shards: Sequence[int], version: int, timeout_s: float
    ) -> dict[int, ProbeResult]:
        """Tell ``shards`` they hold ``version``; one bounded round, outcomes per shard."""
        return self._bounded_round(
            shards, lambda h: h.set_weight_version.remote(version), timeout_s, f"{timeout_s:g}s"
        )

    def incarnation(self, shard: int) -> int:
        """How many times ``shard``'s actor has been replaced by :meth:`restart`."""
        return self._incarnations.get(shard, 0)

    def handle(self, shard: int) -> ActorHandle:
        handle = self._handles.get(shard)
        if handle is None:
            raise ConnectionError(f"shard {shard} has no actor in the cluster")
        return handle

    def call(self, shard: int, method: str, *args: Any, timeout_s: float = 30.0) -> Any:
        """Call one actor method and wait for it (the simulation's controls, mostly)."""
        return ray.get(getattr(self.handle(shard), method).remote(*args), timeout=timeout_s)

    def pids(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Process id per shard (simulated shards only: a real engine need not expose it)."""
        return {shard: self.call(shard, "pid", timeout_s=timeout_s) for shard in self._handles}

    # ── restarts ────────────────────────────────────────────────────────────

    def restart(self, shard: int, *, ready_timeout_s: float) -> None:
        """Replace ``shard``'s actor with a fresh one and wait until it answers.

        The old actor is killed first (it may be frozen rather than gone; a second live
        engine under the same index would serve from weights nobody tracks). Raises
        :class:`ShardSpawnError` when the replacement is not ready in time.
        """
        if self._factory is None:
            raise ShardSpawnError(f"shard {shard}: this fleet was given no factory to restart it")
        old = self._handles.pop(shard, None)
        if old is not None:
            ray.kill(old, no_restart=True)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                self._handles[shard] = self._factory(shard)
                self._incarnations[shard] = self.incarnation(shard) + 1
                break
            except ValueError as exc:  # the name is freed only once Ray has reaped the old one
                if time.monotonic() >= deadline:
                    raise ShardSpawnError(f"shard {shard}: {first_line(exc)}") from exc
                time.sleep(0.05)
        self.wait_ready([shard], max(0.1, deadline - time.monotonic()))

    def shutdown(self) -> None:
        for handle in self._handles.values():
            ray.kill(handle, no_restart=True)
        self._handles.clear()

    @property
    def shards(self) -> tuple[int, ...]:
        return tuple(sorted(self._handles))


def actor_death_of(exc: BaseException) -> str | None:
    """The runtime's "this actor is gone" anywhere in ``exc``'s cause chain, as text.

    A rollout that saw its shard die learned something conclusive; recording it at once
    (instead of as one more reported failure) is what makes the retry land elsewhere.
    """
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < 8:
        seen.add(id(link))
        if isinstance(link, RayActorError) and not isinstance(link, ActorUnavailableError):
            return f"{type(link).__name__}: {first_line(link)}"
        link = link.__cause__
    return None


@contextmanager
def local_ray(num_cpus: int | None = None) -> Iterator[None]:
    """A local Ray cluster for the duration, unless one is already initialised.

    No dashboard, no auth token written under ~/.ray, temporary files in a fresh
    directory under the system's temp dir (Ray's socket paths must stay short).
    """
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    temp_dir = tempfile.mkdtemp(prefix="fl-ray-")
    ray.init(
        num_cpus=num_cpus or max(2, os.cpu_count() or 2),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        _temp_dir=temp_dir,
    )
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
