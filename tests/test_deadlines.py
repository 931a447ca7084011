"""Deadlines relabel only their own expiry; everything else passes through untouched.

Expiries here are real (a few milliseconds) and the bodies they cut short would take
minutes, so no assertion depends on how long anything took.
"""

from __future__ import annotations

import asyncio
import math
from contextlib import AbstractContextManager, nullcontext

import pytest

from fleetledger.adapters.deadlines import Deadline, DeadlineExpired, RolloutDeadlines
from fleetledger.adapters.failure_taxonomy import Classification, FailureKind, classify_exception
from fleetledger.adapters.retry_policy import Attempt, RetryPolicy, RolloutCounters, run_rollout

SHORT = 0.005
LONG = 300.0


async def _hang() -> None:
    await asyncio.Event().wait()


def test_own_expiry_is_relabelled_with_name_and_seconds() -> None:
    deadline = Deadline("generation", SHORT)

    async def main() -> None:
        async with deadline:
            await _hang()

    with pytest.raises(DeadlineExpired) as raised:
        asyncio.run(main())
    expired = raised.value
    assert (expired.name, expired.seconds) == ("generation", SHORT)
    assert isinstance(expired, TimeoutError)
    assert type(expired.__cause__) is TimeoutError  # asyncio's own, kept in the chain
    assert "generation" in str(expired)
    assert deadline.expired()
    assert classify_exception(expired) == Classification(FailureKind.INFRA, "deadline:generation")


def test_timeout_error_raised_by_the_wrapped_code_is_not_relabelled() -> None:
    own = TimeoutError("the engine's own read timeout")
    deadline = Deadline("generation", LONG)

    async def main() -> None:
        async with deadline:
            await asyncio.sleep(0)
            raise own

    with pytest.raises(TimeoutError) as raised:
        asyncio.run(main())
    assert raised.value is own and not isinstance(raised.value, DeadlineExpired)
    assert not deadline.expired()


def test_an_inner_timeout_expiring_passes_through_ours_unrelabelled() -> None:
    async def main() -> None:
        async with Deadline("environment", LONG), asyncio.timeout(SHORT):
            await _hang()

    with pytest.raises(TimeoutError) as raised:
        asyncio.run(main())
    assert not isinstance(raised.value, DeadlineExpired)


def test_nested_deadlines_each_report_only_themselves() -> None:
    async def inner_fires() -> None:
        async with Deadline("stream", LONG), Deadline("generation", SHORT):
            await _hang()

    async def outer_fires() -> None:
        async with Deadline("stream", SHORT), Deadline("generation", LONG):
            await _hang()

    with pytest.raises(DeadlineExpired) as inner:
        asyncio.run(inner_fires())
    assert inner.value.name == "generation"
    with pytest.raises(DeadlineExpired) as outer:
        asyncio.run(outer_fires())
    assert outer.value.name == "stream"


@pytest.mark.parametrize("seconds", [None, LONG])
def test_outer_cancellation_propagates_as_cancellation(seconds: float | None) -> None:
    async def main() -> None:
        entered = asyncio.Event()

        async def guarded() -> None:
            async with Deadline("stream", seconds):
                entered.set()
                await _hang()

        task = asyncio.create_task(guarded())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())


def test_no_deadline_waits_and_returns_normally() -> None:
    deadline = Deadline("environment", None)

    async def main() -> str:
        async with deadline:
            for _ in range(10):
                await asyncio.sleep(0)
            return "done"

    assert asyncio.run(main()) == "done"
    assert not deadline.expired()


def test_a_deadline_can_be_reused_but_not_entered_twice_at_once() -> None:
    deadline = Deadline("generation", LONG)

    async def main() -> None:
        async with deadline:
            await asyncio.sleep(0)
        async with deadline:
            with pytest.raises(RuntimeError, match="already in use"):
                async with deadline:
                    pass

    asyncio.run(main())


@pytest.mark.parametrize("seconds", [0, -1.0, math.inf, math.nan])
def test_nonsense_durations_are_rejected(seconds: float) -> None:
    with pytest.raises(ValueError):
        Deadline("generation", seconds)
    with pytest.raises(ValueError):
        RolloutDeadlines(environment_s=seconds)


def test_rollout_deadlines_default_to_waiting_indefinitely() -> None:
    deadlines = RolloutDeadlines()
    made = [deadlines.stream(), deadlines.generation(), deadlines.environment()]
    assert [(d.name, d.seconds) for d in made] == [
        ("stream", None),
        ("generation", None),
        ("environment", None),
    ]
    configured = RolloutDeadlines(stream_s=600, generation_s=120, environment_s=30)
    assert configured.generation().seconds == 120 and configured.environment().seconds == 30


def test_an_expired_generation_deadline_is_redispatched_by_the_retry_policy() -> None:
    deadlines = RolloutDeadlines(generation_s=SHORT)
    shards: list[int] = []
    delays: list[float] = []

    async def generate(attempt: Attempt[int]) -> str:
        async with deadlines.generation():
            if attempt.number == 1:
                await _hang()  # a wedged shard
            return f"served by {attempt.shard}"

    def select() -> AbstractContextManager[int]:
        shards.append(len(shards))
        return nullcontext(shards[-1])

    async def no_wait(seconds: float) -> None:
        delays.append(seconds)

    counters = RolloutCounters()
    result = asyncio.run(
        run_rollout(
            generate,
            select_shard=select,
            policy=RetryPolicy(),
            counters=counters,
            sleep=no_wait,
            jitter_draw=lambda: 1.0,  # the top of the jitter range: the backoff's ceiling
        )
    )
    assert result == "served by 1"
    assert counters.redispatched == {"deadline:generation": 1} and delays == [1.0]
