"""Shard selection: least outstanding among serving shards, ties low, counts never leak."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.adapters.failure_taxonomy import FailureKind, classify_exception
from fleetledger.adapters.shard_selector import NoHealthyShards, ShardSelector
from fleetledger.controller.ledger import Ledger, ProbeResult
from fleetledger.events.models import FailureCount, ShardOutcomes
from fleetledger.projections.shard_states import ShardState
from fleetledger.store.log import EventLog
from tests.builders import fleet_config


@dataclass
class StaticView:
    """A serving set set by hand, for the tests that are about counting, not the fold."""

    serving: tuple[int, ...]
    states: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return self.states


def selector_over(*serving: int) -> tuple[ShardSelector, StaticView]:
    view = StaticView(tuple(serving))
    return ShardSelector(lambda: view), view


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    with EventLog.open(sqlite_url) as log:
        yield Ledger.start(log, "selector-run", fleet_config(4, unhealthy_threshold=2))


# ── least outstanding, ties low ──────────────────────────────────────────────


def test_least_outstanding_with_ties_to_the_lowest_index() -> None:
    selector, _ = selector_over(0, 1, 2)
    with selector.acquire() as first, selector.acquire() as second:
        assert (first, second) == (0, 1)  # all at 0 → 0; then 1 and 2 tie at 0 → 1
        with selector.acquire() as third:
            assert third == 2
            with selector.acquire() as fourth:
                assert fourth == 0  # all at 1 → lowest index again
                assert selector.in_flight_counts() == {0: 2, 1: 1, 2: 1}
        with selector.acquire() as fifth:
            assert fifth == 2  # 2 released: the only shard at 0
    assert selector.in_flight_counts() == {}
    assert selector.total_in_flight == 0


def test_the_serving_set_need_not_start_at_zero_or_be_contiguous() -> None:
    selector, _ = selector_over(5, 3, 9)
    with selector.acquire() as a, selector.acquire() as b, selector.acquire() as c:
        assert (a, b, c) == (3, 5, 9)


def test_a_slow_shard_is_avoided_while_its_requests_pile_up() -> None:
    selector, _ = selector_over(0, 1)
    slow = selector.acquire()
    assert slow.__enter__() == 0  # shard 0 never answers
    chosen = []
    for _ in range(5):
        with selector.acquire() as shard:
            chosen.append(shard)
    assert chosen == [1] * 5
    slow.__exit__(None, None, None)
    assert selector.in_flight(0) == 0


# ── release ──────────────────────────────────────────────────────────────────


def test_release_happens_even_when_the_body_raises() -> None:
    selector, _ = selector_over(0, 1)
    with pytest.raises(ConnectionError, match="reset"), selector.acquire() as shard:
        assert selector.in_flight(shard) == 1
        raise ConnectionError("connection reset by peer")
    assert selector.in_flight_counts() == {}
    with selector.acquire() as shard:
        assert shard == 0  # not biased away from the shard whose request failed


def test_release_happens_when_a_coroutine_is_cancelled() -> None:
    selector, _ = selector_over(0, 1)

    async def main() -> None:
        entered = asyncio.Event()

        async def hang() -> None:
            with selector.acquire():
                entered.set()
                await asyncio.Event().wait()  # a generation that never returns

        task = asyncio.create_task(hang())
        await entered.wait()
        assert selector.in_flight(0) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert selector.in_flight_counts() == {}


def test_release_is_floored_at_zero() -> None:
    selector, _ = selector_over(0, 1)
    selector.release(0)  # never acquired
    selector.release(0)
    assert selector.in_flight(0) == 0
    with selector.acquire() as held:
        assert held == 0
        selector.release(0)  # a stray extra release while a request is in flight
        assert selector.in_flight(0) == 0
    # A count of -1 would have made shard 0 look idler than shard 1 forever.
    assert selector.in_flight_counts() == {}
    with selector.acquire() as a, selector.acquire() as b:
        assert (a, b) == (0, 1)


# ── the serving set, from real events ────────────────────────────────────────


def test_no_serving_shard_is_a_no_healthy_shards_error_with_the_fleet_counts(
    ledger: Ledger,
) -> None:
    selector = ShardSelector.for_ledger(ledger)
    ledger.record_probes({i: ProbeResult("died", "ActorDiedError") for i in range(3)})
    ledger.restart_requested(3)  # shard 3: not serving either, and not dead
    with pytest.raises(NoHealthyShards) as info:
        with selector.acquire():
            pytest.fail("no shard serves; nothing may be selected")
    # Infrastructure: the prompt is fine, so the retry policy backs off and tries again.
    assert classify_exception(info.value).kind is FailureKind.INFRA
    assert "no healthy shards" in str(info.value)
    assert "HEALTHY" not in str(info.value)  # states with no shard are left out
    assert "DEAD 3" in str(info.value) and "RESTARTING 1" in str(info.value)
    assert selector.in_flight_counts() == {}  # a refused selection holds nothing


def test_a_shard_leaving_the_serving_set_stops_being_selected_at_once(ledger: Ledger) -> None:
    selector = ShardSelector.for_ledger(ledger)
    with selector.acquire() as doomed:
        assert doomed == 0
        ledger.record_probes({0: ProbeResult("died", "ActorDiedError: gone")})
        assert ledger.view.state_of(0) is ShardState.DEAD
        # Whatever its count, a shard out of the serving set is never chosen.
        for _ in range(6):
            with selector.acquire() as shard:
                assert shard != 0
        assert selector.in_flight(0) == 1  # its request still counts until it ends
    assert selector.in_flight(0) == 0
    with selector.acquire() as shard:
        assert shard == 1


def test_suspect_shards_still_serve_and_stale_ones_do_not(ledger: Ledger) -> None:
    selector = ShardSelector.for_ledger(ledger)
    ledger.record_probes({0: ProbeResult("timeout", "no answer in 2s")})
    assert ledger.view.state_of(0) is ShardState.SUSPECT
    with selector.acquire() as shard:
        assert shard == 0  # one blip must not cost a shard's worth of throughput
    # The reported streak (what adapters saw) condemns shard 0; it leaves at once.
    ledger.report_outcomes(
        "rollout-adapter",
        [
            ShardOutcomes(
                shard=0, failures=(FailureCount(category="infra", reason="timeout", count=2),)
            )
        ],
    )
    assert ledger.view.state_of(0) is ShardState.DEAD
    ledger.restart_requested(0)
    ledger.replacement_loaded(0)
    assert ledger.view.state_of(0) is ShardState.STALE
    with selector.acquire() as shard:
        assert shard == 1  # STALE holds start-up weights: no traffic
    ledger.refit_completed(1)
    assert ledger.view.state_of(0) is ShardState.HEALTHY
    with selector.acquire() as shard:
        assert shard == 0  # back in the serving set after a refit that included it


def test_the_view_is_read_on_every_selection() -> None:
    selector, view = selector_over(0, 1, 2)
    with selector.acquire() as shard:
        assert shard == 0
    view.serving = (2,)
    with selector.acquire() as shard:
        assert shard == 2
    view.serving = ()
    view.states = {"HEALTHY": 0, "DEAD": 3}
    with pytest.raises(NoHealthyShards, match=r"fleet: DEAD 3\)"):
        selector.acquire().__enter__()


# ── concurrency ──────────────────────────────────────────────────────────────


def test_many_threads_acquiring_and_releasing_leave_no_count_behind() -> None:
    selector, _ = selector_over(0, 1, 2, 3)
    threads, rounds = 8, 400
    start = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(rounds):
                try:
                    with selector.acquire() as shard:
                        assert 0 <= shard < 4
                        assert selector.in_flight(shard) >= 1
                        if (i + n) % 7 == 0:
                            raise TimeoutError("generation timed out")
                except TimeoutError:
                    pass
        except BaseException as exc:  # surfaced by the main thread below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert selector.in_flight_counts() == {}


def test_many_coroutines_leave_no_count_behind() -> None:
    selector, _ = selector_over(0, 1, 2)

    chosen: dict[int, int] = {}

    async def rollout(i: int) -> None:
        with selector.acquire() as shard:
            chosen[i] = shard
            await asyncio.sleep(0)
            if i % 5 == 0:
                raise ConnectionResetError(f"rollout {i}")

    async def main() -> list[BaseException | None]:
        return await asyncio.gather(*(rollout(i) for i in range(200)), return_exceptions=True)

    results = asyncio.run(main())
    assert sum(isinstance(r, ConnectionResetError) for r in results) == 40
    # Each coroutine acquires before its first await, so all 200 were in flight together
    # and least-outstanding dealt them out in turn.
    assert [chosen[i] for i in range(200)] == [i % 3 for i in range(200)]
    assert selector.in_flight_counts() == {}


# ── the property ─────────────────────────────────────────────────────────────

SHARDS = 5
operation = st.one_of(
    st.tuples(st.just("serve"), st.frozensets(st.integers(0, SHARDS - 1))),
    st.tuples(st.just("acquire"), st.just(0)),
    st.tuples(st.just("release"), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(operation, max_size=60))
def test_the_chosen_shard_has_the_least_in_flight_and_the_lowest_index(
    operations: list[tuple[str, object]],
) -> None:
    view = StaticView(tuple(range(SHARDS)))
    selector = ShardSelector(lambda: view)
    held: list[tuple[AbstractContextManager[int], int]] = []
    model = dict.fromkeys(range(SHARDS), 0)
    for kind, arg in operations:
        if kind == "serve":
            assert isinstance(arg, frozenset)
            view.serving = tuple(sorted(arg))
        elif kind == "release" and held:
            assert isinstance(arg, int)
            lease, shard = held.pop(arg % len(held))
            lease.__exit__(None, None, None)
            model[shard] -= 1
        elif kind == "acquire":
            lease = selector.acquire()
            if not view.serving:
                with pytest.raises(NoHealthyShards):
                    lease.__enter__()
                continue
            shard = lease.__enter__()
            least = min(model[s] for s in view.serving)
            assert shard in view.serving
            assert model[shard] == least
            assert shard == min(s for s in view.serving if model[s] == least)
            model[shard] += 1
            held.append((lease, shard))
        assert {s: selector.in_flight(s) for s in range(SHARDS)} == model
    for lease, _ in held:
        lease.__exit__(None, None, None)
    assert selector.in_flight_counts() == {}
