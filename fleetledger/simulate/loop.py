"""The simulated training loop: rollouts under the retry policy, a train step, a refit.

Each step runs ``groups_per_step`` groups of ``group_size`` rollouts through the
least-outstanding selector; a failed attempt is recorded before the retry re-selects
(with an idle fleet the selector would otherwise re-pick the same lowest-index shard),
by the library's ``GenerationReports`` — which is also what keeps a death seen through
a replaced actor's old handle from being recorded against its replacement;
the trainer steps on the rows; the refit coordinator pushes the new weights to every
shard that is not absent, recovering a failed push. Chaos lands halfway through one
generation time of its step, so a kill hits a shard that is serving.

With ``await_restarts_s`` the last refit waits until no restart is pending, so it takes
every replacement back; with the router, its last outcome window is flushed before the
loop ends the run (a window handed over after the end is refused).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from fleetledger.adapters.deadlines import RolloutDeadlines
from fleetledger.adapters.retry_policy import (
    Attempt,
    Fate,
    PromptSkipped,
    RetryPolicy,
    RolloutAbandoned,
    RolloutCounters,
    gather_cancelling_siblings,
    run_rollout,
)
from fleetledger.controller.fleet_controller import TrainingProgress
from fleetledger.controller.ray_fleet import GenerationReports, local_ray
from fleetledger.controller.refit_recovery import RunFailed
from fleetledger.projections.shard_states import ShardState
from fleetledger.shards.contract import Generation, GenerationRequest
from fleetledger.simulate.account import LoopAccount
from fleetledger.simulate.spec import ADAPTER, RefitRecord, SimulationResult, SimulationSpec
from fleetledger.simulate.wiring import LoopHooks, Wiring, wire
from fleetledger.store.log import EventLog


def _reward(generation: Generation) -> float:
    return (sum(map(ord, generation.text)) % 97) / 96.0


class Simulation:
    """One simulated run: the loop's own state, and the wiring it drives."""

    def __init__(self, spec: SimulationSpec, echo: Callable[[str], None]) -> None:
        self.spec = spec
        self.echo = echo
        self.counters = RolloutCounters()
        self.policy = RetryPolicy.from_config(spec.config.rollout_failure)
        t = spec.config.timeouts
        self.deadlines = RolloutDeadlines(
            stream_s=t.rollout_timeout_s,
            generation_s=t.generation_timeout_s,
            environment_s=t.env_timeout_s,
        )
        self.reports: GenerationReports  # set by run(), once the ledger exists
        self.account = LoopAccount()  # what the loop itself saw (the chaos oracle's)
        self.train_steps = 0
        self.refits: list[RefitRecord] = []
        self.committed_groups = 0
        self.committed_prompts: Counter[str] = Counter()
        self.halted = threading.Event()
        self.step_task: asyncio.Future[None] | None = None
        self.event_loop: asyncio.AbstractEventLoop | None = None
        self.w: Wiring  # set by run() before the controller starts

    # ── the rollout path ───────────────────────────────────────────────────

    async def generate(self, attempt: Attempt[int]) -> Generation:
        request = GenerationRequest(
            prompt_id=str(attempt.prompt_id), group_id=attempt.group_id, prompt="2+2="
        )
        if self.w.routed is not None:  # through the router: it picks and reports
            async with self.deadlines.generation():
                return await self.w.routed.generate(request)
        try:
            async with self.deadlines.generation():
                result = await self.w.fleet.generate(attempt.shard, request)
        except Exception as exc:
            # Recorded before the retry re-selects; a death of a replaced incarnation
            # is dropped by the ledger, a ledger hiccup is logged (never raised here).
            self.reports.failure(attempt.shard, exc)
            raise
        self.reports.success(
            attempt.shard, version=result.weight_version, partial=result.weights_partial
        )
        self.account.success(attempt.shard)
        return result

    def fate(self, shard: int, fate: Fate) -> None:
        """What became of an attempt that failed on ``shard``: into the window, and into
        the loop's own account."""
        self.reports.fate(shard, fate)
        self.account.fate(shard, fate)

    async def group(self, step: int, index: int) -> list[float]:
        prompts = [f"s{step}-g{index}-p{k}" for k in range(self.spec.group_size)]
        generations = await gather_cancelling_siblings(
            *(
                run_rollout(
                    self.generate,
                    select_shard=(
                        self.w.routed.acquire
                        if self.w.routed is not None
                        else self.w.selector.acquire
                    ),
                    policy=self.policy,
                    counters=self.counters,
                    prompt_id=prompt,
                    on_fate=None if self.w.routed is not None else self.fate,
                )
                for prompt in prompts
            )
        )
        self.committed_groups += 1
        self.committed_prompts.update(prompts)
        return [_reward(g) for g in generations]

    # ── one step ───────────────────────────────────────────────────────────

    async def step(self, step: int) -> None:
        loop = asyncio.get_running_loop()
        for chaos in self.spec.chaos:
            if chaos.step == step:
                loop.call_later(self.spec.generation_s / 2, self.w.chaos.inject, chaos)
        rows: list[float] = []
        for result in await asyncio.gather(
            *(self.group(step, g) for g in range(self.spec.groups_per_step)),
            return_exceptions=True,
        ):
            if isinstance(result, PromptSkipped):
                continue
            if isinstance(result, BaseException):
                raise result
            rows += result
        self.reports.flush()
        version: int = await self.w.trainer.step.remote(rows)
        self.train_steps += 1
        if step == self.spec.steps and self.spec.await_restarts_s is not None:
            # After the train step, so no work remains and the wait is not a stall.
            await self.restarts_done(self.spec.await_restarts_s)
        # Pushed to every shard that is not absent; a failed push is recovered.
        outcome = await asyncio.to_thread(self.w.coordinator.refit, version)
        # Checked where the engine has a model: its logprobs against the trainer's.
        diff = await asyncio.to_thread(self.w.check_refit, self.w.fleet, outcome.participants)
        self.refits.append(RefitRecord(version, outcome.participants, diff))

    async def restarts_done(self, timeout_s: float) -> None:
        """Wait at most ``timeout_s`` until no shard is DEAD or RESTARTING.

        A replacement is STALE until a refit includes it, and DEAD or RESTARTING shards
        are absent from a refit: without the wait, a shard restarted during the last
        step would end the run STALE, serving nothing on the last weights.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = _restarts_pending(self.w.ledger.membership.states)
        if not pending:
            return
        self.echo(f"  awaiting the restart of shard(s) {list(pending)} (at most {timeout_s:g}s)")
        while pending and loop.time() < deadline:
            await asyncio.sleep(0.1)
            pending = _restarts_pending(self.w.ledger.membership.states)
        if pending:
            self.echo(
                f"  --await-restarts {timeout_s:g}: shard(s) {list(pending)} still DEAD or "
                "RESTARTING; the last refit goes without them"
            )

    async def flush_router(self) -> None:
        """The router's pending outcome window into the ledger, before the loop ends the
        run: a window handed over after ``run_ended`` is refused, and with it the last
        rollouts' outcomes. A failure is said, never raised: the run must still end."""
        if self.w.routed is None:
            return
        try:
            await self.w.routed.flush_outcomes()
        except Exception as exc:
            self.echo(
                f"  router: its last outcome window was not recorded: {type(exc).__name__}: {exc}"
            )

    # ── the whole run ──────────────────────────────────────────────────────

    def progress(self) -> TrainingProgress:
        return TrainingProgress(
            committed_groups=self.committed_groups,
            train_steps=self.train_steps,
            in_flight=(
                self.w.routed.total_in_flight
                if self.w.routed is not None
                else self.w.selector.total_in_flight
            ),
            work_remains=self.train_steps < self.spec.steps,
        )

    def halt(self, _cause: str) -> None:
        """The controller ended the run (stall abort, exhaustion): stop the step now.

        Called from the watchdog's thread; a step parked on hung generations would
        otherwise never look at the flag. Cancelling drains the step's rollouts.
        """
        self.halted.set()
        task, loop = self.step_task, self.event_loop
        if task is not None and loop is not None:
            loop.call_soon_threadsafe(task.cancel)

    async def loop(self) -> tuple[str, str]:
        self.event_loop = asyncio.get_running_loop()
        ledger = self.w.ledger
        for step in range(1, self.spec.steps + 1):
            if self.halted.is_set():
                break
            self.step_task = asyncio.ensure_future(self.step(step))
            try:
                await self.step_task
            except RolloutAbandoned as exc:
                await self.flush_router()
                return "failed", self.w.controller.end_run_failed(str(exc))
            except RunFailed as exc:  # the refit could not be recovered; the run is ended
                return "failed", str(exc)
            except asyncio.CancelledError:
                if not self.halted.is_set():
                    raise
                break
            finally:
                self.step_task = None
            m = ledger.membership
            snapshot = self.counters.snapshot()
            redispatched = sum(snapshot["redispatched"].values())  # type: ignore[union-attr]
            self.echo(
                f"step {step}/{self.spec.steps}  weights v{self.train_steps}  "
                f"serving {list(m.serving)}  absent {list(m.absent)}  epoch {m.epoch}  "
                f"groups {self.committed_groups}  re-dispatched {redispatched}"
            )
        ledger.catch_up()
        ended = ledger.view.ended
        if ended is not None:
            return ended.outcome, ended.cause
        await self.flush_router()
        ledger.end_run("completed", f"{self.train_steps} of {self.spec.steps} steps done")
        return "completed", f"{self.train_steps} of {self.spec.steps} steps done"

    async def _loop_then_close(self) -> tuple[str, str]:
        try:
            return await self.loop()
        finally:
            if self.w.routed is not None:
                await self.w.routed.close()

    def run(self, log: EventLog) -> SimulationResult:
        spec = self.spec
        run = spec.run or default_run_id()
        hooks = LoopHooks(self.progress, self.counters.snapshot, self.halt)
        with local_ray():
            self.w = wire(spec, log, run, hooks, self.echo)
            self.reports = GenerationReports(self.w.ledger, ADAPTER)
            if self.w.routed is not None:
                self.w.routed.account = self.account
            try:
                self.w.controller.start()
                outcome, cause = asyncio.run(self._loop_then_close())
            except KeyboardInterrupt:
                self.w.end_if_open("aborted", "interrupted (SIGINT) during the simulation")
                raise
            except Exception as exc:
                self.w.end_if_open("failed", f"simulation failed: {type(exc).__name__}: {exc}")
                raise
            finally:
                self.w.close()
        return SimulationResult(
            run,
            outcome,
            cause,
            self.train_steps,
            self.counters.snapshot(),
            tuple(self.refits),
            dict(self.committed_prompts),
            self.account.tallies,
            self.account.waits,
        )


def _restarts_pending(states: tuple[str, ...]) -> tuple[int, ...]:
    absent_until_restarted = (ShardState.DEAD, ShardState.RESTARTING)
    return tuple(i for i, state in enumerate(states) if state in absent_until_restarted)


def run_simulation(
    log: EventLog, spec: SimulationSpec, echo: Callable[[str], None] = print
) -> SimulationResult:
    """Run the simulated training loop of ``spec``, recording everything in ``log``."""
    started = time.monotonic()
    result = Simulation(spec, echo).run(log)
    echo(
        f"run {result.run} {result.outcome} after {time.monotonic() - started:.1f}s: {result.cause}"
    )
    return result


def default_run_id() -> str:
    """``sim-<UTC time>-<random>``: the run id of a simulation not given one."""
    return f"sim-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
