"""Ray glue: the shard actors of one run, probed, called and restarted by index.

Imports Ray at module import; nothing else in ``fleetledger`` imports this module unless
the caller asked for a live fleet, so the ledger, the projections and the forensics CLI
work without Ray installed.

What Ray tells us, measured on these machines (docs/reference.md M2): a SIGKILLed actor makes
the next call, and any call in flight, raise ``ActorDiedError`` within milliseconds —
conclusive. A SIGSTOPped actor produces nothing, ever: only our own deadline sees it,
which is why a probe round is bounded by ``ray.wait(timeout=)`` and a timeout is only a
*failed* probe, counted towards the threshold.

Incarnations. A shard's actor is replaced by :meth:`RayShardFleet.restart`; its
*incarnation* is the number of restarts the run has requested for it (the ledger's
``restart_attempts``, which ``FleetController.restart`` records before it calls the
fleet, so the two counts move together). Everything the fleet learns through a handle
carries the incarnation of that handle: a probe result (``ProbeResult.incarnation``), a
generation whose actor died (:class:`ShardActorDied`, read by :func:`actor_death_of`).
The ledger drops a report whose incarnation is older than the shard's restart count: a
death seen through a replaced actor's old handle is never recorded against its
replacement. A fleet found again by :meth:`RayShardFleet.attach` knows its incarnations
only when told (``incarnations=ledger.membership.restart_attempts``); until then its
reports are untagged and recorded as they come.

What a death looks like to the runtime, read into the ledger's terms (an actor's death,
an engine's death under a live actor): :mod:`fleetledger.controller.runtime_deaths`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import ray
import structlog
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

from fleetledger.adapters.failure_taxonomy import (
    FailureKind,
    classify_exception,
    wrap_generation_failure,
)
from fleetledger.adapters.outcome_reporter import OutcomeWindow
from fleetledger.adapters.retry_policy import Fate
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.controller.runtime_deaths import (
    ShardActorDied,
    actor_death_of,
    death_text,
    engine_death_of,
    probe_result_of,
)
from fleetledger.errors import FleetledgerError
from fleetledger.events.causes import cause_line
from fleetledger.events.errors import LedgerError, first_line
from fleetledger.shards.contract import Generation, GenerationRequest
from fleetledger.shards.naming import ShardFactory, shard_actor_name
from fleetledger.shards.reaping import ProcessRecord, reap
from fleetledger.store.errors import RunAlreadyEnded

__all__ = [
    "GenerationReports",
    "RayShardFleet",
    "ShardSpawnError",
    "local_ray",
]

_log = structlog.get_logger("fleetledger.ray_fleet")


class ShardSpawnError(FleetledgerError, RuntimeError):
    """A shard actor could not be created or did not answer its first probe in time."""


class RayShardFleet:
    """Handles to the shard actors of one run, by shard index, each with its incarnation."""

    def __init__(
        self,
        handles: Mapping[int, ActorHandle],
        *,
        factory: ShardFactory | None = None,
        incarnations: Sequence[int] | Mapping[int, int] | None = None,
    ) -> None:
        """``incarnations``: per shard, the run's restart count when its actor was made
        (``()``: 0 each, a fleet spawned for a new run, as :meth:`spawn` does); ``None``
        (the default for handles made elsewhere): not known, so what is seen through
        them is recorded unchecked (see :meth:`attach`).
        """
        # shard -> the engine processes its actor started (``child_processes()``), read
        # once it answered: reaped after the actor is killed, so none outlives it.
        self._processes: dict[int, tuple[ProcessRecord, ...]] = {}
        self._lock = threading.Lock()  # a handle and its incarnation change together
        self._handles: dict[int, ActorHandle] = dict(handles)
        self._factory = factory
        self._tagged = incarnations is not None
        if isinstance(incarnations, Mapping):
            self._incarnations = dict(incarnations)
        else:
            self._incarnations = dict(enumerate(incarnations or ()))

    @classmethod
    def spawn(
        cls,
        shard_count: int,
        factory: ShardFactory,
        *,
        ready_timeout_s: float = 60.0,
    ) -> RayShardFleet:
        """Create every shard's actor and wait (bounded) until each answers a probe."""
        fleet = cls({}, factory=factory, incarnations=())
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
        incarnations: Sequence[int] | None = None,
    ) -> RayShardFleet:
        """Find a run's named shard actors again, e.g. from a restarted controller.

        A shard whose actor is gone gets a handle-less slot: probing it reports a death,
        which is what a restarted controller must learn about it. Pass
        ``incarnations=ledger.membership.restart_attempts`` so that what is seen through
        these handles is tagged, and a stale death can be told from a real one.
        """
        handles: dict[int, ActorHandle] = {}
        for shard in range(shard_count):
            try:
                handles[shard] = ray.get_actor(shard_actor_name(prefix, shard), namespace)
            except ValueError:
                continue
        return cls(handles, factory=factory, incarnations=incarnations)

    # ── incarnations ────────────────────────────────────────────────────────

    def incarnation(self, shard: int) -> int:
        """How many restarts of ``shard`` the run had requested when its actor was made
        (the restarts of this fleet, counted from what it was given)."""
        with self._lock:
            return self._incarnations.get(shard, 0)

    def _current(self, shard: int) -> tuple[ActorHandle | None, int | None]:
        """The handle and the incarnation tag of ``shard``, read together."""
        with self._lock:
            tag = self._incarnations.get(shard, 0) if self._tagged else None
            return self._handles.get(shard), tag

    # ── probing ─────────────────────────────────────────────────────────────

    def probe(
        self, shards: Iterable[int], timeout_s: float, *, deep: bool = False
    ) -> dict[int, ProbeResult]:
        """Probe ``shards`` concurrently; the whole round is bounded by ``timeout_s``.

        ``deep``: each engine generates one token (``is_alive(deep=True)``), so a wedged
        engine fails the probe instead of answering it. Each result carries the
        incarnation it was obtained through, so the ledger can drop one about an actor
        replaced while the round was out.
        """
        return self._bounded_round(
            shards,
            lambda h: h.is_alive.remote(deep) if deep else h.is_alive.remote(),
            timeout_s,
            f"probe_timeout_s={timeout_s:g}",
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
        tags: dict[int, int | None] = {}
        results: dict[int, ProbeResult] = {}
        for shard in shards:
            handle, tags[shard] = self._current(shard)
            if handle is None:
                results[shard] = ProbeResult(
                    "died", "no actor for this shard in the cluster", incarnation=tags[shard]
                )
            else:
                refs[call(handle)] = shard
        if not refs:
            return results
        ready, _ = ray.wait(
            list(refs), num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic())
        )
        try:
            ray.get(ready, timeout=0)
            results.update((refs[ref], ProbeResult.ok(tags[refs[ref]])) for ref in ready)
        except Exception:  # at least one failed: look at each
            for ref in ready:
                shard = refs[ref]
                try:
                    ray.get(ref, timeout=0)
                    results[shard] = ProbeResult.ok(tags[shard])
                except Exception as exc:
                    results[shard] = probe_result_of(exc, tags[shard])
        for shard in refs.values():
            results.setdefault(
                shard,
                ProbeResult("timeout", f"no answer within {bound}", incarnation=tags[shard]),
            )
        return results

    def wait_ready(self, shards: Iterable[int], timeout_s: float) -> None:
        """Block until every shard answers a probe; raise naming the ones that did not."""
        shards_asked = tuple(shards)
        pending = set(shards_asked)
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
        for shard in shards_asked:
            self._record_processes(shard, max(1.0, deadline - time.monotonic()))

    def _record_processes(self, shard: int, timeout_s: float) -> None:
        """Ask a ready actor which processes its engine started (``child_processes()``;
        none by the contract's default), to reap them once the actor is gone."""
        handle, _ = self._current(shard)
        if handle is None:
            return
        try:
            records = ray.get(handle.child_processes.remote(), timeout=timeout_s)
        except Exception as exc:
            # The actor answered its probe: it is up. A failure here (it froze, or died,
            # right after) is the probes' business, not a failed start — only its
            # engine processes go unrecorded, so a later kill cannot reap them.
            problem = cause_line(death_text(exc))
            _log.warning("engine processes not recorded", shard=shard, problem=problem)
            return
        with self._lock:
            self._processes[shard] = tuple(ProcessRecord(**r) for r in records)

    def _kill(self, shard: int, handle: ActorHandle) -> None:
        """Kill ``shard``'s actor and reap the engine processes it had started: Ray
        cleans up an actor's process group, but an engine process that left it (or a
        cluster with that cleanup off) would otherwise live on holding its memory."""
        with self._lock:
            records = self._processes.pop(shard, ())
        ray.kill(handle, no_restart=True)
        if records:
            reap(records)

    # ── calls ───────────────────────────────────────────────────────────────

    async def generate(self, shard: int, request: GenerationRequest) -> Generation:
        """One generation on ``shard``. Cancelling the caller cancels the actor's task too.

        Raises :class:`ShardActorDied` (tagged with the incarnation the call went
        through) when the runtime says the actor is gone; the engine's own errors as
        :func:`~fleetledger.adapters.failure_taxonomy.wrap_generation_failure` types
        them. Story: a cancelled sibling used to keep generating against the fleet for a
        result already being discarded.
        """
        handle, incarnation = self._current(shard)
        if handle is None:
            raise ConnectionError(f"shard {shard} has no actor in the cluster")
        ref = handle.generate.remote(request)
        try:
            result: Generation = await ref
            return result
        except asyncio.CancelledError:
            ray.cancel(ref)
            raise
        except RayTaskError as exc:
            if engine_death_of(exc) is not None:  # the engine died under a live actor
                raise ShardActorDied(
                    shard=shard,
                    incarnation=incarnation,
                    death=death_text(engine_death_of(exc) or exc),
                    prompt_id=request.prompt_id,
                    group_id=request.group_id,
                ) from exc
            # The worker was alive and raised: the boundary decides. Its engine's own
            # error (an engine core dead under it, a device out of memory, anything
            # never seen) is this shard's failure, re-dispatched elsewhere; only an
            # explicit data failure stays the prompt's.
            raise wrap_generation_failure(
                exc, shard=shard, prompt_id=request.prompt_id, group_id=request.group_id
            ) from exc
        except RayActorError as exc:
            if isinstance(exc, ActorUnavailableError):
                raise
            raise ShardActorDied(
                shard=shard,
                incarnation=incarnation,
                death=death_text(exc),
                prompt_id=request.prompt_id,
                group_id=request.group_id,
            ) from exc

    def set_weight_version(
        self, shards: Sequence[int], version: int, timeout_s: float
    ) -> dict[int, ProbeResult]:
        """Tell ``shards`` they hold ``version``; one bounded round, outcomes per shard."""
        return self._bounded_round(
            shards, lambda h: h.set_weight_version.remote(version), timeout_s, f"{timeout_s:g}s"
        )

    def base_urls(self, timeout_s: float = 30.0) -> list[str | None]:
        """Each shard's base URL as its actor reports it (``base_url()``), in shard order:
        an HTTP engine's ``.../v1``, else the contract's default ``ray://<actor name>``."""
        return [self._base_url_of(self.handle(s), timeout_s) for s in self.shards]

    @staticmethod
    def _base_url_of(handle: ActorHandle, timeout_s: float) -> str | None:
        url: str | None = ray.get(handle.base_url.remote(), timeout=timeout_s)
        return url or None

    def processes(self) -> dict[int, tuple[ProcessRecord, ...]]:
        """Per shard, the engine processes its current actor reported when it was ready
        (what is reaped after the actor); shards without any are left out."""
        with self._lock:
            return {shard: records for shard, records in self._processes.items() if records}

    def handle(self, shard: int) -> ActorHandle:
        handle, _ = self._current(shard)
        if handle is None:
            raise ConnectionError(f"shard {shard} has no actor in the cluster")
        return handle

    def pids(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Each shard's actor process id (the contract's ``pid()``), for chaos tests."""
        return {
            shard: ray.get(self.handle(shard).pid.remote(), timeout=timeout_s)
            for shard in self.shards
        }

    # ── restarts ────────────────────────────────────────────────────────────

    def restart(self, shard: int, *, ready_timeout_s: float) -> str | None:
        """Replace ``shard``'s actor with a fresh one, wait until it answers, and return
        its base URL (the actor's ``base_url()``, ``None`` when it serves no HTTP).

        The old actor is killed first (it may be frozen rather than gone; a second live
        engine under the same index would serve from weights nobody tracks). The
        incarnation moves on at once, with the old handle dropped in the same step, so
        nothing seen through the old handle can carry the new incarnation. Raises
        :class:`ShardSpawnError` when the replacement is not ready (or does not tell its
        URL) in time.
        """
        if self._factory is None:
            raise ShardSpawnError(f"shard {shard}: this fleet was given no factory to restart it")
        with self._lock:
            old = self._handles.pop(shard, None)
            self._incarnations[shard] = self._incarnations.get(shard, 0) + 1
        if old is not None:
            self._kill(shard, old)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                handle = self._factory(shard)
                break
            except ValueError as exc:  # the name is freed only once Ray has reaped the old one
                if time.monotonic() >= deadline:
                    raise ShardSpawnError(f"shard {shard}: {first_line(exc)}") from exc
                time.sleep(0.05)
        with self._lock:
            self._handles[shard] = handle
        self.wait_ready([shard], max(0.1, deadline - time.monotonic()))
        try:
            return self._base_url_of(handle, max(0.1, deadline - time.monotonic()))
        except Exception as exc:
            raise ShardSpawnError(
                f"shard {shard}: the replacement did not tell its base URL: "
                f"{cause_line(death_text(exc))}"
            ) from exc

    def shutdown(self) -> None:
        with self._lock:
            handles = dict(self._handles)
            self._handles.clear()
        for shard, handle in handles.items():
            self._kill(shard, handle)

    @property
    def shards(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(sorted(self._handles))


class GenerationReports:
    """What the rollout path learned from its generations, told to the ledger.

    ``failure(shard, exc)`` is called when a generation raised, *before* the retry
    re-selects (an idle fleet would otherwise re-pick the same lowest-index shard): a
    confirmed actor death is recorded at once with the incarnation it was seen through
    (a stale one is dropped by the ledger), any other infrastructure failure is counted
    in the window and handed over; data failures and cancellations are not the shard's.
    A ledger error is logged, never raised from here: the rollout's own failure must
    keep its classification. ``success`` counts; ``fate`` (``run_rollout``'s
    ``on_fate``) says what became of a failed attempt and hands the window over;
    ``flush`` hands it over (at the end of each step, say).

    A failure and its fate land in one window: ``run_rollout`` tells the fate in the
    same turn of the event loop as the failure, so the failure's hand-over waits for the
    loop's next turn — where a caller that tells no fates has it handed over, still
    before the retry's backoff ends and it re-selects. Two windows would leave a fault's
    cost unable to say what became of the failure (its window said no fate).
    """

    def __init__(self, ledger: Ledger, adapter: str) -> None:
        self.ledger = ledger
        self.adapter = adapter
        self.window = OutcomeWindow()
        self._failure_pending = False

    def success(self, shard: int, *, version: int | None = None, partial: bool = False) -> None:
        """Count a success; ``version``: the weight version the engine attested."""
        self.window.success(shard, version=version, partial=partial)

    def fate(self, shard: int, fate: Fate) -> None:
        """What became of an attempt that failed on ``shard`` (``run_rollout``'s
        ``on_fate``): handed over now, with the failure it follows, so a fault's cost
        says it."""
        self.window.fate(shard, fate)
        self._guarded(self.flush)

    def failure(self, shard: int, exc: BaseException) -> None:
        def record() -> None:
            death = actor_death_of(exc)
            if death is not None:
                self.flush()
                self.ledger.actor_died(
                    shard, death.text, incarnation=death.incarnation, what=death.what
                )
            elif classify_exception(exc).kind is FailureKind.INFRA:
                self.window.failure(shard, exc)
                self._flush_soon()

        self._guarded(record)

    def _flush_soon(self) -> None:
        """Hand the window over on the event loop's next turn (its fate told meanwhile
        goes with it), or now outside one."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if not self._failure_pending:
            self._failure_pending = True
            loop.call_soon(self._guarded, self.flush)

    def _guarded(self, append: Callable[[], None]) -> None:
        try:
            append()
        except RunAlreadyEnded as ended:
            self.ledger.late_reports.count("rollout failure", ended)
        except LedgerError as problem:
            _log.error("rollout failure not recorded", problem=str(problem))

    def flush(self) -> None:
        self._failure_pending = False
        outcomes = self.window.take()
        if outcomes:
            self.ledger.report_outcomes(self.adapter, outcomes)


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
