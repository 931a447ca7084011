"""The shard-in-range rule is written once (``shard_outside``); the form an append and an
import check a whole event with (``shards_outside``: the extremes put to the rule) says
what the rule says of the first shard out of range, for any shards and any fleet.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetledger.events.models import FleetConfig, ProbeRound, shard_outside, shards_outside
from tests.builders import fleet_config

shards = st.lists(st.integers(min_value=-3, max_value=40), max_size=12)


@given(shards, st.integers(min_value=1, max_value=32))
def test_a_whole_event_is_refused_for_its_first_shard_out_of_range(
    named: list[int], shard_count: int
) -> None:
    first = next((p for s in named if (p := shard_outside(s, shard_count)) is not None), None)
    assert shards_outside(tuple(named), shard_count) == first


def test_the_configuration_refuses_an_event_naming_a_shard_it_lacks() -> None:
    config: FleetConfig = fleet_config(shards=3)
    config.check_event(ProbeRound(ok=(0, 1, 2)))
    with pytest.raises(ValueError, match=r"shard 5 is out of range: this run has shard_count=3"):
        config.check_event(ProbeRound(ok=(0, 5, 7)))
