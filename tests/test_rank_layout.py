"""docs/reference.md §2: the refit communicator's layout as a pure function."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetledger.projections.rank_layout import (
    RankLayout,
    RankLayoutError,
    layout_words,
    rank_layout,
    shard_ranks_of,
)
from fleetledger.projections.shard_states import ShardState
from tests.projection_builders import Fleet, fleet_config, put_in


def layout(survivors, dp, workers, trainers) -> RankLayout:
    return rank_layout(
        survivors=survivors, dp_size=dp, total_workers=workers, train_world_size=trainers
    )


# ── the reference's examples ───────────────────────────────────────────────────


def test_dp4_4_workers_8_trainers_shard_2_absent():
    lay = layout([0, 1, 3], 4, 4, 8)
    assert dict(lay.shard_prefixes) == {0: 0, 1: 1, 3: 2}
    assert lay.world_size == 11
    assert lay.workers_per_shard == 1
    assert [lay.rank_of(s, 0) for s in (0, 1, 3)] == [8, 9, 10]


def test_dp4_8_workers_8_trainers_shard_1_absent():
    lay = layout([0, 2, 3], 4, 8, 8)
    assert dict(lay.shard_prefixes) == {0: 0, 2: 2, 3: 4}
    assert lay.world_size == 14
    assert lay.shard_ranks(3) == range(12, 14)
    assert lay.shard_ranks(0) == range(8, 10)
    assert lay.shard_ranks(2) == range(10, 12)


def test_dp2_8_workers_16_trainers_only_shard_1_left():
    lay = layout([1], 2, 8, 16)
    assert dict(lay.shard_prefixes) == {1: 0}
    assert lay.world_size == 20
    assert lay.shard_ranks(1) == range(16, 20)
    assert lay.survivors == (1,)


def test_design_example_2_trainers_4_shards_of_2_ranks_shard_1_absent():
    lay = layout([0, 2, 3], 4, 8, 2)
    assert lay.world_size == 8
    assert lay.shard_ranks(0) == range(2, 4)
    assert lay.shard_ranks(2) == range(4, 6)
    assert lay.shard_ranks(3) == range(6, 8)


def test_the_full_fleet_has_no_holes():
    lay = layout(range(3), 3, 6, 1)
    assert dict(lay.shard_prefixes) == {0: 0, 1: 2, 2: 4}
    assert lay.world_size == 7


def test_rank_of_adds_trainers_prefix_and_local_rank():
    lay = layout([0, 2, 3], 4, 8, 8)
    assert lay.rank_of(3, 0) == 12
    assert lay.rank_of(3, 1) == 13
    assert lay.rank_of(2, 1) == 11


def test_as_dict_names_every_part_of_the_layout():
    lay = layout([0, 2, 3], 4, 8, 8)
    assert lay.as_dict() == {
        "world_size": 14,
        "train_world_size": 8,
        "workers_per_shard": 2,
        "shard_prefixes": {"0": 0, "2": 2, "3": 4},
    }


# ── survivors are deduplicated and sorted ──────────────────────────────────────


def test_survivors_are_deduplicated_and_sorted():
    lay = layout([3, 0, 3, 2, 0], 4, 8, 8)
    assert lay.survivors == (0, 2, 3)
    assert dict(lay.shard_prefixes) == {0: 0, 2: 2, 3: 4}
    assert lay.world_size == 14
    assert lay == layout([0, 2, 3], 4, 8, 8)


def test_survivors_may_be_any_iterable():
    assert layout(iter({2, 0}), 4, 4, 1) == layout([0, 2], 4, 4, 1)


def test_the_layout_cannot_be_changed_through_its_prefixes():
    lay = layout([0, 1], 2, 2, 1)
    with pytest.raises(TypeError):
        lay.shard_prefixes[0] = 5  # type: ignore[index]


# ── errors ─────────────────────────────────────────────────────────────────────


@pytest.mark.parametrize("dp", [0, -1])
def test_a_dp_size_that_is_not_positive_is_refused(dp):
    with pytest.raises(RankLayoutError, match="dp_size must be positive"):
        layout([0], dp, 4, 1)


@pytest.mark.parametrize(("workers", "dp"), [(6, 4), (3, 2), (0, 2), (-4, 2)])
def test_workers_that_are_not_evenly_sharded_are_refused(workers, dp):
    with pytest.raises(RankLayoutError, match="not evenly sharded"):
        layout([0], dp, workers, 1)


@pytest.mark.parametrize("survivors", [[], (), iter(())])
def test_no_survivors_is_refused(survivors):
    with pytest.raises(RankLayoutError, match="no surviving shards"):
        layout(survivors, 4, 4, 8)


@pytest.mark.parametrize("index", [-1, 4, 99])
def test_a_shard_index_outside_dp_is_refused(index):
    with pytest.raises(
        RankLayoutError,
        match=rf"shard {index} is out of range: this run has shard_count=4 \(valid shards 0\.\.3\)",
    ):
        layout([0, index], 4, 4, 8)


def test_a_negative_trainer_world_is_refused():
    with pytest.raises(RankLayoutError, match="train_world_size"):
        layout([0], 1, 1, -1)


def test_rank_layout_error_is_a_value_error():
    assert issubclass(RankLayoutError, ValueError)


def test_rank_of_refuses_an_absent_shard_and_an_out_of_range_local_rank():
    lay = layout([0, 2, 3], 4, 8, 8)
    with pytest.raises(RankLayoutError, match="shard 1 is not in this layout"):
        lay.rank_of(1, 0)
    with pytest.raises(RankLayoutError, match="shard 1 is not in this layout"):
        lay.shard_ranks(1)
    with pytest.raises(RankLayoutError, match="local rank 2 out of range"):
        lay.rank_of(0, 2)
    with pytest.raises(RankLayoutError, match="local rank -1 out of range"):
        lay.rank_of(0, -1)


# ── properties ─────────────────────────────────────────────────────────────────


@st.composite
def layout_inputs(draw):
    dp = draw(st.integers(1, 8))
    width = draw(st.integers(1, 4))
    trainers = draw(st.integers(0, 8))
    survivors = draw(st.lists(st.integers(0, dp - 1), min_size=1, max_size=2 * dp))
    return survivors, dp, width, trainers


@settings(max_examples=300, deadline=None)
@given(layout_inputs())
def test_ranks_are_contiguous_with_trainers_first_and_shards_in_order(inputs):
    survivors, dp, width, trainers = inputs
    lay = layout(survivors, dp, dp * width, trainers)
    alive = sorted(set(survivors))

    assert lay.survivors == tuple(alive)
    assert lay.workers_per_shard == width
    assert lay.world_size == trainers + len(alive) * width

    worker_ranks = [lay.rank_of(s, local) for s in alive for local in range(width)]
    # No two workers share a rank; trainers own 0..trainers-1; nothing is left out.
    assert len(set(worker_ranks)) == len(worker_ranks)
    assert all(r >= trainers for r in worker_ranks)
    assert sorted([*range(trainers), *worker_ranks]) == list(range(lay.world_size))
    # Shard order is rank order, and each shard's ranks are one contiguous block.
    assert worker_ranks == list(range(trainers, lay.world_size))
    for k, s in enumerate(alive):
        assert lay.shard_prefixes[s] == k * width
        assert lay.shard_ranks(s) == range(trainers + k * width, trainers + (k + 1) * width)
    for s in set(range(dp)) - set(alive):
        with pytest.raises(RankLayoutError):
            lay.rank_of(s, 0)


@settings(max_examples=200, deadline=None)
@given(layout_inputs(), st.randoms(use_true_random=False))
def test_the_layout_does_not_depend_on_the_order_or_repetition_of_survivors(inputs, rnd):
    survivors, dp, width, trainers = inputs
    shuffled = [*survivors, *survivors]
    rnd.shuffle(shuffled)
    assert layout(shuffled, dp, dp * width, trainers) == layout(
        sorted(set(survivors)), dp, dp * width, trainers
    )


# ── the view's layout ──────────────────────────────────────────────────────────


def test_the_view_layout_covers_every_shard_while_none_is_absent():
    fleet = Fleet(shard_count=4, workers_per_shard=2, train_world_size=2)
    lay = fleet.view.layout()
    assert lay == layout([0, 1, 2, 3], 4, 8, 2)
    assert lay.world_size == 10


def test_the_view_layout_skips_absent_shards_but_keeps_suspect_and_stale_ones():
    # The layout rule's example, reached through the fold: shard 1 absent → world 8.
    fleet = Fleet(shard_count=4, workers_per_shard=2, train_world_size=2)
    fleet.actor_died(1)
    lay = fleet.view.layout()
    assert lay.world_size == 8
    assert (lay.shard_ranks(0), lay.shard_ranks(2), lay.shard_ranks(3)) == (
        range(2, 4),
        range(4, 6),
        range(6, 8),
    )
    fleet.probe_failed(2)
    fleet.weights_partial(1)  # 0, 2 and 3 become STALE: still members of the refit
    assert fleet.view.layout() == lay


@pytest.mark.parametrize(
    ("state", "member"),
    [
        (ShardState.HEALTHY, True),
        (ShardState.SUSPECT, True),
        (ShardState.STALE, True),
        (ShardState.DEAD, False),
        (ShardState.RESTARTING, False),
        (ShardState.RETIRED, False),
    ],
)
def test_the_view_layout_includes_a_shard_exactly_when_it_is_not_absent(state, member):
    fleet = Fleet(shard_count=3, workers_per_shard=2, train_world_size=3)
    put_in(fleet, 1, state)
    lay = fleet.view.layout()
    assert (1 in lay.survivors) is member
    expected = [0, 1, 2] if member else [0, 2]
    assert lay == layout(expected, 3, 6, 3)


def test_the_view_layout_refuses_when_every_shard_is_absent():
    fleet = Fleet(fleet_config(shard_count=2))
    fleet.actor_died(0)
    fleet.actor_died(1)
    with pytest.raises(RankLayoutError, match="no surviving shards"):
        fleet.view.layout()


@settings(max_examples=200, deadline=None)
@given(
    dp=st.integers(1, 8),
    workers=st.integers(1, 4),
    trainers=st.integers(1, 4),
    data=st.data(),
)
def test_the_layouts_words_give_each_survivor_its_global_ranks(dp, workers, trainers, data):
    """The one notation every command prints: each survivor once, with exactly the ranks
    the communicator gives it, after the trainers'."""
    survivors = data.draw(st.sets(st.integers(0, dp - 1), min_size=1))
    built = layout(survivors, dp, dp * workers, trainers)
    words = layout_words(
        built.world_size, trainers, shard_ranks_of(built.shard_prefixes, trainers, workers)
    )
    head, _, placed = words.partition(": ")
    assert head == f"world {built.world_size}"
    parts = placed.split(", ")
    assert parts[0] == f"trainers → ranks 0–{trainers - 1}"
    assert parts[1:] == [
        f"shard {s} → ranks {built.rank_of(s, 0)}–{built.rank_of(s, workers - 1)}"
        for s in sorted(survivors)
    ]
