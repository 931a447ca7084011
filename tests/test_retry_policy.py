"""Retry policy for one rollout: budgets, backoff, skipping, cancellation, re-selection.

Real asyncio throughout; only ``sleep`` is injected, and the tests assert on the delays
it was asked for, never on elapsed time.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.adapters.failure_taxonomy import (
    FailureKind,
    GenerationUnavailable,
    NoHealthyShards,
)
from fleetledger.adapters.retry_policy import (
    Attempt,
    DataBudgetExhausted,
    PromptDropped,
    PromptSkipped,
    RedispatchExhausted,
    RetryPolicy,
    RolloutCounters,
    gather_cancelling_siblings,
    run_rollout,
)
from fleetledger.shards.contract import RolloutDataFailure

OK = object()


class Script:
    """A generator whose attempts raise or return, in order; records every attempt."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes = list(outcomes)
        self.attempts: list[Attempt[int]] = []

    async def __call__(self, attempt: Attempt[int]) -> object:
        self.attempts.append(attempt)
        await asyncio.sleep(0)  # a real suspension point, as a generation has
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class Shards:
    """A leasing selector handing out 0, 1, 2, ...; counts leases taken and returned."""

    def __init__(self) -> None:
        self.calls = 0
        self.held = 0

    @contextmanager
    def __call__(self) -> Iterator[int]:
        self.calls += 1
        self.held += 1
        try:
            yield self.calls - 1
        finally:
            self.held -= 1


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


def _run(
    generate: Callable[[Attempt[int]], Coroutine[Any, Any, object]],
    *,
    policy: RetryPolicy | None = None,
    counters: RolloutCounters | None = None,
    sleeps: Sleeps | None = None,
    select: Callable[[], AbstractContextManager[int]] | None = None,
    prompt_id: object = "p0",
) -> object:
    return asyncio.run(
        run_rollout(
            generate,
            select_shard=select or Shards(),
            policy=policy or RetryPolicy(),
            counters=counters if counters is not None else RolloutCounters(),
            prompt_id=prompt_id,
            sleep=sleeps if sleeps is not None else Sleeps(),
            # The top of the jitter range: each wait is exactly the backoff's ceiling.
            jitter_draw=lambda: 1.0,
        )
    )


# --- policy ------------------------------------------------------------------------------


def test_defaults_are_the_reference_values() -> None:
    policy = RetryPolicy()
    assert (policy.infra_attempts, policy.data_attempts) == (5, 2)
    assert (policy.backoff_base_s, policy.max_backoff_s) == (1.0, 30.0)
    assert (policy.max_skipped_prompts, policy.max_consecutive_dropped) == (0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.infra_attempts = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"infra_attempts": 0},
        {"data_attempts": 0},
        {"backoff_base_s": -1.0},
        {"backoff_base_s": 10.0, "max_backoff_s": 5.0},
        {"max_skipped_prompts": -1},
        {"max_consecutive_dropped": -1},
    ],
)
def test_policy_rejects_budgets_that_cannot_work(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_backoff_doubles_and_caps() -> None:
    policy = RetryPolicy()
    assert [policy.backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert policy.backoff_s(10_000) == 30.0  # no float overflow on a long run
    with pytest.raises(ValueError):
        policy.backoff_s(0)


# --- success and infrastructure failures -------------------------------------------------


def test_success_returns_the_generators_own_result() -> None:
    result = object()
    counters, sleeps, script = RolloutCounters(), Sleeps(), Script(result)
    assert _run(script, counters=counters, sleeps=sleeps) is result
    assert counters.committed == 1 and sleeps.delays == []
    assert len(script.attempts) == 1


def test_infra_failure_is_redispatched_after_backoff() -> None:
    counters, sleeps = RolloutCounters(), Sleeps()
    script = Script(GenerationUnavailable("shard gone", reason="actor_died"), OK)
    assert _run(script, counters=counters, sleeps=sleeps) is OK
    assert sleeps.delays == [1.0]
    assert counters.redispatched == {"actor_died": 1}
    assert counters.committed == 1 and counters.data_failures == {}


def test_backoff_sequence_is_capped_exponential() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    script = Script(*[ConnectionResetError(str(i)) for i in range(8)])
    with pytest.raises(RedispatchExhausted):
        _run(script, policy=RetryPolicy(infra_attempts=8), sleeps=sleeps, counters=counters)
    # No sleep after the last failure: exhaustion is reported at once.
    assert sleeps.delays == [1, 2, 4, 8, 16, 30, 30]
    assert len(script.attempts) == 8
    assert counters.redispatched == {"connection": 7}
    assert counters.exhausted == {"infra": 1} and counters.committed == 0


def test_infra_budget_defaults_to_five_attempts_and_chains_the_last_failure() -> None:
    sleeps = Sleeps()
    failures = [TimeoutError(str(i)) for i in range(5)]
    script = Script(*failures)
    with pytest.raises(RedispatchExhausted) as raised:
        _run(script, sleeps=sleeps, prompt_id="p9")
    assert len(script.attempts) == 5 and sleeps.delays == [1, 2, 4, 8]
    assert raised.value.__cause__ is failures[-1]
    assert raised.value.classification.kind is FailureKind.INFRA
    assert (raised.value.prompt_id, raised.value.attempts) == ("p9", 5)


def test_a_shard_is_selected_afresh_for_every_attempt() -> None:
    shards = Shards()
    script = Script(ConnectionError(), ConnectionError(), OK)
    assert _run(script, select=shards) is OK
    assert shards.calls == 3 and shards.held == 0
    assert [a.shard for a in script.attempts] == [0, 1, 2]
    assert [a.number for a in script.attempts] == [1, 2, 3]


def test_every_attempt_gets_a_fresh_group_id() -> None:
    script = Script(ConnectionError(), ValueError(), ConnectionError(), OK)
    assert _run(script) is OK
    group_ids = [a.group_id for a in script.attempts]
    assert len(set(group_ids)) == 4
    assert {a.prompt_id for a in script.attempts} == {"p0"}


def test_no_healthy_shards_from_the_selector_is_infrastructure() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    shards = Shards()

    def select() -> AbstractContextManager[int]:
        if shards.calls < 2:
            shards.calls += 1
            raise NoHealthyShards("serving set empty")
        return nullcontext(shards.calls)

    script = Script(OK)
    assert _run(script, select=select, sleeps=sleeps, counters=counters) is OK
    assert sleeps.delays == [1, 2]
    assert counters.redispatched == {"no_healthy_shards": 2}
    assert [a.shard for a in script.attempts] == [2]


# --- data failures -----------------------------------------------------------------------


def test_data_failure_retried_once_without_backoff() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    assert _run(Script(ValueError("empty"), OK), sleeps=sleeps, counters=counters) is OK
    assert sleeps.delays == []
    assert counters.data_failures == {"value_error": 1} and counters.committed == 1


def test_exhausted_data_budget_fails_the_run_by_default() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    last = RolloutDataFailure("too long", reason="context_length")
    script = Script(KeyError("k"), last)
    with pytest.raises(DataBudgetExhausted) as raised:
        _run(script, sleeps=sleeps, counters=counters)
    assert raised.value.budget == "data" and raised.value.__cause__ is last
    assert len(script.attempts) == 2 and sleeps.delays == []
    assert counters.data_failures == {"key_error": 1, "context_length": 1}
    assert counters.skipped == {} and counters.exhausted == {"data": 1}


def test_infra_and_data_budgets_are_separate() -> None:
    sleeps = Sleeps()
    script = Script(ValueError(), ConnectionError(), ConnectionError(), OK)
    assert _run(script, sleeps=sleeps) is OK
    assert sleeps.delays == [1, 2]  # only the infra failures back off


def test_explicit_data_failure_over_an_infra_cause_is_not_redispatched() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    wrapped = RolloutDataFailure("bad prompt")
    wrapped.__cause__ = ConnectionResetError()
    with pytest.raises(DataBudgetExhausted):
        _run(Script(wrapped, wrapped), sleeps=sleeps, counters=counters)
    assert sleeps.delays == [] and counters.redispatched == {}


# --- skip budget -------------------------------------------------------------------------


def _prompt(counters: RolloutCounters, policy: RetryPolicy, *outcomes: object) -> object:
    try:
        return _run(Script(*outcomes), policy=policy, counters=counters)
    except (PromptSkipped, DataBudgetExhausted) as exc:
        return exc


def test_skip_budget_is_run_wide() -> None:
    policy = RetryPolicy(data_attempts=1, max_skipped_prompts=2)
    counters = RolloutCounters()
    outcomes = [_prompt(counters, policy, ValueError(str(i))) for i in range(3)]
    assert [type(o) for o in outcomes] == [PromptSkipped, PromptSkipped, DataBudgetExhausted]
    assert outcomes[2].budget == "skip"  # type: ignore[union-attr]
    assert counters.skipped == {"value_error": 2} and counters.exhausted == {"skip": 1}


def test_a_skipped_prompt_raises_and_names_itself() -> None:
    policy = RetryPolicy(max_skipped_prompts=1)
    counters = RolloutCounters()
    cause = AssertionError("bad")
    with pytest.raises(PromptSkipped) as raised:
        _run(Script(ValueError(), cause), policy=policy, counters=counters, prompt_id=42)
    assert raised.value.prompt_id == 42 and raised.value.attempts == 2
    assert raised.value.__cause__ is cause
    assert counters.skipped == {"assertion_error": 1} and counters.consecutive_dropped == 0


def _infra_prompt(counters: RolloutCounters, policy: RetryPolicy, *outcomes: object) -> object:
    try:
        return _run(Script(*outcomes), policy=policy, counters=counters)
    except (PromptSkipped, RedispatchExhausted) as exc:
        return exc


def test_an_infra_exhausted_prompt_is_dropped_while_the_streak_is_under_the_budget() -> None:
    policy = RetryPolicy(infra_attempts=1, max_consecutive_dropped=2)
    counters = RolloutCounters()
    outcomes = [_infra_prompt(counters, policy, ConnectionResetError()) for _ in range(3)]
    assert [type(o) for o in outcomes] == [PromptDropped, PromptDropped, RedispatchExhausted]
    assert "2 prompts dropped in a row reached max_consecutive_dropped_prompts 2" in str(
        outcomes[2]
    )
    assert counters.dropped == {"connection": 2} and counters.skipped == {}
    # Three prompts exhausted their infra budget (two dropped, one ended the run); none
    # of them is a re-dispatch.
    assert counters.exhausted == {"infra": 3} and counters.redispatched == {}
    assert (counters.consecutive_dropped, counters.max_consecutive_dropped) == (2, 2)


def test_a_dropped_prompt_is_a_skipped_prompt_for_its_caller() -> None:
    policy = RetryPolicy(infra_attempts=2, max_consecutive_dropped=1)
    cause = ConnectionResetError("again")
    with pytest.raises(PromptSkipped) as raised:
        _run(Script(ConnectionResetError(), cause), policy=policy, prompt_id=7)
    assert isinstance(raised.value, PromptDropped)
    assert raised.value.prompt_id == 7 and raised.value.attempts == 2
    assert raised.value.__cause__ is cause


def test_a_commit_clears_the_drop_streak_and_keeps_the_high_water_mark() -> None:
    policy = RetryPolicy(infra_attempts=1, max_consecutive_dropped=2)
    counters = RolloutCounters()
    reset = ConnectionResetError
    plan = [reset(), reset(), OK, reset(), reset()]
    outcomes = [_infra_prompt(counters, policy, outcome) for outcome in plan]
    assert [type(o) for o in outcomes[:2] + outcomes[3:]] == [PromptDropped] * 4
    assert outcomes[2] is OK
    assert counters.dropped == {"connection": 4} and counters.committed == 1
    assert counters.exhausted == {"infra": 4} and counters.redispatched == {}
    assert (counters.consecutive_dropped, counters.max_consecutive_dropped) == (2, 2)


def test_an_outage_that_does_not_recover_still_ends_the_run() -> None:
    policy = RetryPolicy(infra_attempts=2, max_consecutive_dropped=3)
    counters = RolloutCounters()
    outcomes = [
        _infra_prompt(counters, policy, NoHealthyShards("none"), NoHealthyShards("none"))
        for _ in range(10)
    ]
    kinds = [type(o) for o in outcomes]
    assert kinds[:3] == [PromptDropped] * 3 and kinds[3] is RedispatchExhausted
    assert sum(counters.dropped.values()) == 3 + sum(k is PromptDropped for k in kinds[4:])


def test_data_skips_do_not_spend_the_drop_budget() -> None:
    policy = RetryPolicy(
        infra_attempts=1, data_attempts=1, max_skipped_prompts=10, max_consecutive_dropped=1
    )
    counters = RolloutCounters()
    skipped = [_prompt(counters, policy, ValueError()) for _ in range(3)]
    assert [type(o) for o in skipped] == [PromptSkipped] * 3
    assert counters.consecutive_dropped == 0
    assert isinstance(_infra_prompt(counters, policy, ConnectionResetError()), PromptDropped)


def test_without_a_drop_budget_an_infra_exhausted_prompt_ends_the_run() -> None:
    counters = RolloutCounters()
    outcome = _infra_prompt(counters, RetryPolicy(infra_attempts=1), ConnectionResetError())
    assert isinstance(outcome, RedispatchExhausted)
    assert counters.dropped == {} and counters.exhausted == {"infra": 1}


def test_the_skip_budget_alone_bounds_skipping() -> None:
    policy = RetryPolicy(data_attempts=1, max_skipped_prompts=3, max_consecutive_dropped=1)
    counters = RolloutCounters()
    outcomes = [_prompt(counters, policy, ValueError()) for _ in range(4)]
    assert [type(o) for o in outcomes] == [PromptSkipped] * 3 + [DataBudgetExhausted]
    assert outcomes[3].budget == "skip"  # type: ignore[union-attr]


@given(
    budget=st.integers(min_value=0, max_value=5),
    plan=st.lists(st.sampled_from(["ok", "infra", "data"]), max_size=30),
)
def test_the_drop_streak_never_exceeds_its_budget_and_only_infra_spends_it(
    budget: int, plan: list[str]
) -> None:
    policy = RetryPolicy(
        infra_attempts=1, data_attempts=1, max_skipped_prompts=100, max_consecutive_dropped=budget
    )
    counters = RolloutCounters()
    streak = 0
    for step in plan:
        outcome = {"ok": OK, "infra": ConnectionResetError(), "data": ValueError()}[step]
        result = (
            _infra_prompt(counters, policy, outcome)
            if step != "data"
            else _prompt(counters, policy, outcome)
        )
        if step == "ok":
            streak = 0
            assert result is OK
        elif step == "infra":
            if streak < budget:
                streak += 1
                assert isinstance(result, PromptDropped)
            else:
                assert isinstance(result, RedispatchExhausted)
        else:
            assert type(result) is PromptSkipped
        assert counters.consecutive_dropped == streak <= budget
        assert counters.max_consecutive_dropped <= budget


# --- jitter ------------------------------------------------------------------------------


@given(
    failures=st.integers(min_value=1, max_value=80),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    draw=st.floats(min_value=0.0, max_value=1.0),
)
def test_a_jittered_wait_stays_within_its_share_of_the_ceiling(
    failures: int, jitter: float, draw: float
) -> None:
    policy = RetryPolicy(jitter=jitter)
    ceiling = policy.backoff_s(failures)
    wait = policy.jittered_backoff_s(failures, draw)
    assert ceiling * (1 - jitter) - 1e-9 <= wait <= ceiling + 1e-9


def test_failures_that_happen_together_do_not_retry_together() -> None:
    """64 rollouts fail at once; their retries are spread, not one thundering herd."""

    async def herd() -> list[float]:
        waits: list[float] = []

        async def record(seconds: float) -> None:
            waits.append(seconds)

        async def one(i: int) -> object:
            return await run_rollout(
                Script(ConnectionResetError(), OK),
                select_shard=Shards(),
                policy=RetryPolicy(),
                counters=RolloutCounters(),
                prompt_id=i,
                sleep=record,
            )

        await asyncio.gather(*(one(i) for i in range(64)))
        return waits

    waits = asyncio.run(herd())
    assert len(waits) == 64 and all(0.5 <= w <= 1.0 for w in waits)
    assert len(set(waits)) > 32  # the default jitter spreads them over [0.5 s, 1 s]


def test_jitter_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"jitter must be within 0\.\.1"):
        RetryPolicy(jitter=1.5)


# --- cancellation ------------------------------------------------------------------------


def test_cancellation_raised_by_the_generator_is_not_retried() -> None:
    sleeps, counters = Sleeps(), RolloutCounters()
    script = Script(asyncio.CancelledError(), OK)
    with pytest.raises(asyncio.CancelledError):
        _run(script, sleeps=sleeps, counters=counters)
    assert len(script.attempts) == 1 and sleeps.delays == []
    assert counters.cancelled == 1 and counters.redispatched == {} and counters.committed == 0


def test_outer_cancellation_mid_generation_propagates() -> None:
    attempts: list[Attempt[int]] = []

    async def hang(attempt: Attempt[int]) -> object:
        attempts.append(attempt)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def main() -> None:
        counters = RolloutCounters()
        task = asyncio.create_task(
            run_rollout(hang, select_shard=Shards(), policy=RetryPolicy(), counters=counters)
        )
        while not attempts:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled() and counters.cancelled == 1

    asyncio.run(main())
    assert len(attempts) == 1


def test_cancellation_during_backoff_stops_retrying() -> None:
    script = Script(ConnectionError(), OK)

    async def main() -> None:
        started = asyncio.Event()

        async def never_wakes(_: float) -> None:
            started.set()
            await asyncio.Event().wait()

        task = asyncio.create_task(
            run_rollout(
                script,
                select_shard=Shards(),
                policy=RetryPolicy(),
                counters=RolloutCounters(),
                sleep=never_wakes,
            )
        )
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(script.attempts) == 1


# --- gather_cancelling_siblings ----------------------------------------------------------


class Sibling:
    """A generation that runs until cancelled, then needs an await to clean up."""

    def __init__(self) -> None:
        self.started = False
        self.drained = False

    async def __call__(self) -> str:
        self.started = True
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # cleanup that only happens if the task is awaited
            self.drained = True
        return "unreachable"


async def _fail_after_siblings_start(siblings: list[Sibling], error: Exception) -> str:
    while not all(s.started for s in siblings):
        await asyncio.sleep(0)
    raise error


def test_gather_returns_results_in_order() -> None:
    async def value(v: int, spins: int) -> int:
        for _ in range(spins):
            await asyncio.sleep(0)
        return v

    result = asyncio.run(gather_cancelling_siblings(value(1, 3), value(2, 0), value(3, 1)))
    assert result == [1, 2, 3]


def test_a_failure_cancels_and_drains_every_sibling() -> None:
    siblings = [Sibling(), Sibling()]
    error = ConnectionResetError("one generation failed")

    async def main() -> None:
        with pytest.raises(ConnectionResetError) as raised:
            await gather_cancelling_siblings(
                siblings[0](), _fail_after_siblings_start(siblings, error), siblings[1]()
            )
        assert raised.value is error
        # Drained *before* the failure surfaced, not merely asked to stop.
        assert all(s.drained for s in siblings)
        assert asyncio.all_tasks() == {asyncio.current_task()}

    asyncio.run(main())


def test_plain_gather_would_leave_siblings_running() -> None:
    # The control for the test above: what the fix exists to prevent.
    siblings = [Sibling()]

    async def main() -> None:
        with pytest.raises(ValueError):
            await asyncio.gather(siblings[0](), _fail_after_siblings_start(siblings, ValueError()))
        assert not siblings[0].drained
        leftovers = asyncio.all_tasks() - {asyncio.current_task()}
        assert len(leftovers) == 1
        for task in leftovers:
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)

    asyncio.run(main())


def test_outer_cancellation_drains_the_group() -> None:
    siblings = [Sibling(), Sibling()]

    async def main() -> None:
        task = asyncio.create_task(gather_cancelling_siblings(*(s() for s in siblings)))
        while not all(s.started for s in siblings):
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert all(s.drained for s in siblings)

    asyncio.run(main())


def test_cancellation_while_draining_still_drains_then_propagates() -> None:
    state: dict[str, bool] = {"slow_done": False}

    async def main() -> None:
        cleanup_may_finish = asyncio.Event()
        cleanup_started = asyncio.Event()

        async def slow_to_stop() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cleanup_started.set()
                await cleanup_may_finish.wait()
                state["slow_done"] = True
                raise

        async def failing() -> None:
            await asyncio.sleep(0)
            raise ValueError("group failed")

        task = asyncio.create_task(gather_cancelling_siblings(slow_to_stop(), failing()))
        await cleanup_started.wait()
        task.cancel()  # arrives while the group is draining
        for _ in range(5):
            await asyncio.sleep(0)
        assert not task.done()  # still waiting for the slow sibling
        cleanup_may_finish.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert state["slow_done"]

    asyncio.run(main())


def test_counters_snapshot_is_a_copy() -> None:
    counters = RolloutCounters()
    _run(Script(ConnectionError(), OK), counters=counters)
    snap = counters.snapshot()
    counters.redispatched["connection"] += 5
    assert snap["redispatched"] == {"connection": 1} and snap["committed"] == 1


@pytest.mark.parametrize(
    ("outcomes", "raises"),
    [
        ((ConnectionError(), ValueError(), ValueError()), DataBudgetExhausted),
        ((ConnectionError(),) * 5, RedispatchExhausted),
        ((asyncio.CancelledError(),), asyncio.CancelledError),
        ((ValueError(), OK), None),
    ],
    ids=["data-exhausted", "infra-exhausted", "cancelled", "success"],
)
def test_every_attempt_returns_its_lease(
    outcomes: tuple[object, ...], raises: type[BaseException] | None
) -> None:
    shards = Shards()
    script = Script(*outcomes)
    held_during_attempt: list[int] = []
    original = script.__call__

    async def generate(attempt: Attempt[int]) -> object:
        held_during_attempt.append(shards.held)
        return await original(attempt)

    expectation = pytest.raises(raises) if raises else nullcontext()
    with expectation:
        _run(generate, select=shards)
    # Held for the whole attempt (in-flight accounting sees it), returned on every exit.
    assert held_during_attempt == [1] * len(outcomes)
    assert shards.calls == len(outcomes) and shards.held == 0
