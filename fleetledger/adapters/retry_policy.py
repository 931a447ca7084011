"""Retry policy for one rollout (docs/reference.md §5), and a gather that cancels its siblings.

``run_rollout`` runs attempts of one prompt until one succeeds or a budget runs out:

- infrastructure failures (see ``failure_taxonomy``) are re-dispatched: each attempt
  re-enters shard selection, which is what makes the retry land somewhere else, with
  capped exponential backoff between attempts (jittered: 64 rollouts that fail together
  must not all retry in the same instant), within ``infra_attempts``;
- a prompt whose infrastructure budget ran out ends the run — unless a drop budget
  (``max_consecutive_dropped``, N > 0) lets it be dropped while fewer than N prompts
  in a row were dropped; a committed prompt clears the streak, so an outage that does
  not recover still ends the run, after N drops;
- data failures get ``data_attempts`` and no backoff (waiting cannot help a
  deterministic failure; one retry is still worth taking because a shard under memory
  pressure can return an empty generation that looks deterministic and is not);
- on an exhausted data budget the run fails, unless a run-wide skip budget allows the
  prompt to be skipped (data skips do not spend the drop budget);
- cancellation is never retried.

It never returns anything but the generator's own result: every failure path raises.
Story: a failed generation used to fall through into a reward-0.0 completion that was
committed as a training row and silently shifted its group's GRPO baseline.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Generic, Literal, NoReturn, TypeVar

from fleetledger.adapters.failure_taxonomy import (
    Classification,
    FailureKind,
    classify_exception,
)
from fleetledger.config import RolloutFailureConfig
from fleetledger.errors import FleetledgerError

__all__ = [
    "FATES",
    "Attempt",
    "DataBudgetExhausted",
    "Fate",
    "PromptDropped",
    "PromptSkipped",
    "RedispatchExhausted",
    "RetryPolicy",
    "RolloutAbandoned",
    "RolloutCounters",
    "gather_cancelling_siblings",
    "run_rollout",
]

S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Budgets for one prompt's attempts, the run-wide skip budget and the drop budget.

    Defaults are the reference's: 5 infra attempts, 2 data attempts, backoff 1 s
    doubling to at most 30 s, no skipping (an exhausted data budget fails the run,
    because a genuinely deterministic failure is almost always a config bug, usually
    the sequence length against the engine's context length), no dropping.

    ``max_consecutive_dropped``: with N > 0, a prompt whose *infrastructure* budget ran
    out is dropped instead of ending the run while fewer than N prompts in a row were
    dropped; 0 (the default) never drops. ``jitter``: the fraction of each backoff that
    is drawn at random — the wait is uniform in ``[(1 - jitter)·d, d]`` for the capped
    exponential ``d`` — so retries of failures that happened together spread out.
    """

    infra_attempts: int = 5
    data_attempts: int = 2
    backoff_base_s: float = 1.0
    max_backoff_s: float = 30.0
    max_skipped_prompts: int = 0
    max_consecutive_dropped: int = 0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        # A zero attempt budget would exit before the first attempt with nothing to
        # raise; rejecting it is what lets every exit path be a success or an error.
        if self.infra_attempts < 1:
            raise ValueError(f"infra_attempts must be >= 1, got {self.infra_attempts}")
        if self.data_attempts < 1:
            raise ValueError(f"data_attempts must be >= 1, got {self.data_attempts}")
        if self.backoff_base_s < 0:
            raise ValueError(f"backoff_base_s must be >= 0, got {self.backoff_base_s}")
        if self.max_backoff_s < self.backoff_base_s:
            raise ValueError(
                f"max_backoff_s ({self.max_backoff_s}) must be >= backoff_base_s "
                f"({self.backoff_base_s})"
            )
        if self.max_skipped_prompts < 0:
            raise ValueError(f"max_skipped_prompts must be >= 0, got {self.max_skipped_prompts}")
        if self.max_consecutive_dropped < 0:
            raise ValueError(
                f"max_consecutive_dropped must be >= 0, got {self.max_consecutive_dropped}"
            )
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"jitter must be within 0..1, got {self.jitter}")

    @classmethod
    def from_config(cls, config: RolloutFailureConfig) -> RetryPolicy:
        """The policy a run's ``rollout_failure`` section asks for (validated there)."""
        return cls(
            infra_attempts=config.max_infra_attempts,
            data_attempts=config.max_data_attempts,
            backoff_base_s=config.backoff_base_s,
            max_backoff_s=config.max_backoff_s,
            max_skipped_prompts=config.max_skipped_prompts,
            max_consecutive_dropped=config.max_consecutive_dropped_prompts,
            jitter=config.backoff_jitter,
        )

    def backoff_s(self, infra_failures: int) -> float:
        """Seconds to wait after the ``infra_failures``-th infra failure: base·2^(n-1), capped."""
        if infra_failures < 1:
            raise ValueError(f"infra_failures must be >= 1, got {infra_failures}")
        # Cap the exponent before exponentiating so a long run cannot overflow a float.
        exponent = min(infra_failures - 1, 64)
        return min(self.backoff_base_s * (2.0**exponent), self.max_backoff_s)

    def jittered_backoff_s(self, infra_failures: int, draw: float) -> float:
        """The wait after the ``infra_failures``-th infra failure for a uniform ``draw``
        in [0, 1]: the ceiling ``backoff_s`` less up to ``jitter`` of it."""
        if not 0.0 <= draw <= 1.0:
            raise ValueError(f"draw must be within 0..1, got {draw}")
        ceiling = self.backoff_s(infra_failures)
        return ceiling * (1.0 - self.jitter * (1.0 - draw))


@dataclass
class RolloutCounters:
    """Run-wide rollout counters per reason, and the skip and drop budgets' state.

    A rising re-dispatch count is the only externally visible sign that the fleet is
    degrading, so these are not optional bookkeeping: the watchdog publishes them.
    Drops (a prompt given up after its infrastructure budget) are counted apart from
    re-dispatches (an attempt retried elsewhere), with the longest streak of drops;
    ``exhausted`` counts prompts whose budget ran out by budget (``infra`` — dropped or
    run-ending —, ``data``, ``skip``).
    Share one instance across every ``run_rollout`` of a run (the budgets are
    run-wide). Mutated only on the event loop, between awaits, so no lock is needed.
    """

    committed: int = 0
    redispatched: Counter[str] = field(default_factory=Counter)
    data_failures: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    exhausted: Counter[str] = field(default_factory=Counter)
    cancelled: int = 0
    consecutive_dropped: int = 0
    max_consecutive_dropped: int = 0  # the streak's high-water mark

    @property
    def skipped_total(self) -> int:
        """Prompts skipped so far in this run (what the skip budget is spent on)."""
        return sum(self.skipped.values())

    def snapshot(self) -> dict[str, object]:
        """A copy safe to hand to a metrics exporter or a log line."""
        return {
            "committed": self.committed,
            "redispatched": dict(self.redispatched),
            "data_failures": dict(self.data_failures),
            "skipped": dict(self.skipped),
            "dropped": dict(self.dropped),
            "exhausted": dict(self.exhausted),
            "cancelled": self.cancelled,
            "consecutive_dropped": self.consecutive_dropped,
            "max_consecutive_dropped": self.max_consecutive_dropped,
        }


@dataclass(frozen=True, slots=True)
class Attempt(Generic[S]):
    """What one attempt is given: its shard and a group id no other attempt shares.

    A fresh group id per attempt means a failed attempt's rows can never collide with
    the retry's.
    """

    prompt_id: object
    group_id: str
    shard: S
    number: int


class PromptSkipped(FleetledgerError):
    """The prompt's data budget ran out and the skip budget allowed dropping it.

    Raised, not returned, so no placeholder can reach the buffer. The caller must
    release whatever slot the prompt held: a skipped prompt never reaches the train
    pump, which therefore will never release its backpressure permit (story: getting
    this wrong leaks one slot per skipped prompt until the pump wedges).
    """

    def __init__(self, prompt_id: object, classification: Classification, attempts: int) -> None:
        super().__init__(
            f"prompt {prompt_id} skipped after {attempts} attempts ({classification.reason})"
        )
        self.prompt_id = prompt_id
        self.classification = classification
        self.attempts = attempts


class PromptDropped(PromptSkipped):
    """The prompt's infrastructure budget ran out and the drop budget allowed dropping it.

    A ``PromptSkipped`` for its caller (the same slot must be released, and nothing
    reaches the buffer); told apart because a drop is the fleet's failure, not the
    prompt's, and spends the drop budget instead of the skip budget.
    """


class RolloutAbandoned(FleetledgerError):
    """A budget is exhausted and the run must fail; the last failure is the ``__cause__``."""

    def __init__(
        self, message: str, *, prompt_id: object, classification: Classification, attempts: int
    ) -> None:
        super().__init__(message)
        self.prompt_id = prompt_id
        self.classification = classification
        self.attempts = attempts


class RedispatchExhausted(RolloutAbandoned):
    """The same infrastructure failure followed the prompt across every re-selection."""


class DataBudgetExhausted(RolloutAbandoned):
    """A data failure exhausted its budget and skipping was not allowed (``budget`` says why).

    ``budget`` is ``"data"`` (skipping disabled) or ``"skip"`` (run-wide skip budget
    spent).
    """

    def __init__(
        self,
        message: str,
        *,
        budget: str,
        prompt_id: object,
        classification: Classification,
        attempts: int,
    ) -> None:
        super().__init__(
            message, prompt_id=prompt_id, classification=classification, attempts=attempts
        )
        self.budget = budget


def _new_group_id() -> str:
    return uuid.uuid4().hex


async def run_rollout(
    generate: Callable[[Attempt[S]], Awaitable[T]],
    *,
    select_shard: Callable[[], AbstractContextManager[S]],
    policy: RetryPolicy,
    counters: RolloutCounters,
    prompt_id: object = None,
    new_group_id: Callable[[], str] = _new_group_id,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    jitter_draw: Callable[[], float] = random.random,
    on_fate: Callable[[S, Fate], object] | None = None,
) -> T:
    """Run one prompt's attempts under ``policy``; return the first success or raise.

    Each attempt takes a fresh lease from ``select_shard()`` -- a context manager
    yielding the shard, e.g. ``ShardSelector.acquire``; it may raise
    ``NoHealthyShards``, which is infrastructure -- and awaits ``generate`` with a new
    :class:`Attempt` inside it (a selector without leases: ``lambda:
    contextlib.nullcontext(pick())``). Raises
    :class:`RedispatchExhausted` or :class:`DataBudgetExhausted` (the run must fail),
    :class:`PromptSkipped` (drop this prompt; :class:`PromptDropped` when the drop
    budget let an infrastructure-exhausted prompt go), or ``CancelledError`` unchanged.
    ``sleep`` and ``jitter_draw`` (a uniform draw in [0, 1) per backoff) are injectable
    so tests observe the backoff without waiting. ``on_fate(shard, fate)``: told what
    became of each attempt that failed for its shard (infrastructure; a data failure is
    the prompt's, no fault's cost), by that shard — ``redispatched`` (tried
    again), ``dropped`` (the prompt given up: skipped or dropped) or ``ended_run`` (a
    budget ran out: the run must fail) — so an outcome window can say what a fault cost.
    """
    infra_failures = 0
    data_failures = 0
    attempt_number = 0
    while True:
        attempt_number += 1
        leased: S | None = None  # the attempt's shard, once a lease gave one
        try:
            # The lease is held for the whole attempt and released on every exit, so a
            # failed or cancelled attempt cannot leak an in-flight count (which would
            # bias selection away from a shard that is actually fine).
            with select_shard() as shard:
                leased = shard
                result = await generate(
                    Attempt(
                        prompt_id=prompt_id,
                        group_id=new_group_id(),
                        shard=shard,
                        number=attempt_number,
                    )
                )
        except asyncio.CancelledError:
            # Teardown must not look like a transient fault: counted, never retried.
            counters.cancelled += 1
            raise
        except Exception as exc:
            verdict = classify_exception(exc)
            infra = verdict.kind is FailureKind.INFRA  # the shard's: a fault's cost
            with _telling_fate(on_fate if infra else None, leased):
                if infra:
                    infra_failures += 1
                    if infra_failures >= policy.infra_attempts:
                        _drop_or_fail(
                            exc,
                            verdict,
                            policy,
                            counters,
                            prompt_id,
                            attempt_number,
                            infra_failures,
                        )
                    counters.redispatched[verdict.reason] += 1
                else:
                    data_failures += 1
                    counters.data_failures[verdict.reason] += 1
                    if data_failures >= policy.data_attempts:
                        _skip_or_fail(exc, verdict, policy, counters, prompt_id, attempt_number)
            if infra:
                await sleep(policy.jittered_backoff_s(infra_failures, jitter_draw()))
        else:
            counters.committed += 1
            counters.consecutive_dropped = 0
            return result


Fate = Literal["redispatched", "dropped", "ended_run"]
"""What became of a failed attempt (``run_rollout``'s ``on_fate``)."""
FATES: tuple[Fate, ...] = ("redispatched", "dropped", "ended_run")


@contextmanager
def _telling_fate(on_fate: Callable[[S, Fate], object] | None, shard: S | None) -> Iterator[None]:
    """Around the decision on one failed attempt: tell ``on_fate`` what it was."""
    fate: Fate = "redispatched"
    try:
        yield
    except PromptSkipped:  # PromptDropped included
        fate = "dropped"
        raise
    except RolloutAbandoned:
        fate = "ended_run"
        raise
    finally:
        if on_fate is not None and shard is not None:
            on_fate(shard, fate)


def _drop_or_fail(
    exc: Exception,
    verdict: Classification,
    policy: RetryPolicy,
    counters: RolloutCounters,
    prompt_id: object,
    attempts: int,
    infra_failures: int,
) -> NoReturn:
    """Decide an exhausted infrastructure budget: always raises (drop, or fail the run).

    ``exhausted["infra"]`` counts every prompt whose infrastructure budget ran out,
    dropped or not: with ``dropped`` (by reason) beside it, a reader tells how many were
    given up from how many ended the run — and neither is a re-dispatch."""
    counters.exhausted["infra"] += 1
    budget = policy.max_consecutive_dropped
    if budget and counters.consecutive_dropped < budget:
        counters.dropped[verdict.reason] += 1
        counters.consecutive_dropped += 1
        counters.max_consecutive_dropped = max(
            counters.max_consecutive_dropped, counters.consecutive_dropped
        )
        raise PromptDropped(prompt_id, verdict, attempts) from exc
    streak = (
        f"; {counters.consecutive_dropped} prompts dropped in a row reached "
        f"max_consecutive_dropped_prompts {budget}"
        if budget
        else ""
    )
    raise RedispatchExhausted(
        f"prompt {prompt_id}: {infra_failures} infrastructure failures (last: "
        f"{verdict.reason}) across {attempts} attempts{streak}",
        prompt_id=prompt_id,
        classification=verdict,
        attempts=attempts,
    ) from exc


def _skip_or_fail(
    exc: Exception,
    verdict: Classification,
    policy: RetryPolicy,
    counters: RolloutCounters,
    prompt_id: object,
    attempts: int,
) -> NoReturn:
    """Decide an exhausted data budget: always raises (skip or fail the run)."""
    budget: str | None = None
    if policy.max_skipped_prompts == 0:
        budget = "data"
    elif counters.skipped_total >= policy.max_skipped_prompts:
        budget = "skip"
    if budget is not None:
        counters.exhausted[budget] += 1
        raise DataBudgetExhausted(
            f"prompt {prompt_id}: data failure {verdict.reason} after {attempts} attempts; "
            f"{budget} budget exhausted (skipped {counters.skipped_total}/"
            f"{policy.max_skipped_prompts})",
            budget=budget,
            prompt_id=prompt_id,
            classification=verdict,
            attempts=attempts,
        ) from exc
    counters.skipped[verdict.reason] += 1
    raise PromptSkipped(prompt_id, verdict, attempts) from exc


async def gather_cancelling_siblings(*aws: Awaitable[T]) -> list[T]:
    """Like ``asyncio.gather``, but a failure cancels and drains the siblings first.

    Story: ``asyncio.gather`` propagates the first exception and leaves the other
    awaitables running detached, so a failed group left N-1 generations running against
    the fleet for a result already being discarded. (``asyncio.TaskGroup`` would cancel
    them, but raises an ``ExceptionGroup``, which the taxonomy cannot see through.)

    The first failure is re-raised unchanged once every sibling has finished. If this
    task is itself cancelled while draining, the draining still completes and the
    cancellation is then raised instead.
    """
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        if await _drain(tasks):
            raise asyncio.CancelledError from None
        raise


async def _drain(tasks: Sequence[asyncio.Future[T]]) -> bool:
    """Wait until every task is done, even through cancellation; True if we were cancelled."""
    pending = {task for task in tasks if not task.done()}
    cancelled = False
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            cancelled = True
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # mark retrieved: no "exception was never retrieved" noise
    return cancelled
