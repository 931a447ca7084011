"""The codec's cache of repeated payloads never changes what a read returns.

A payload is cached from its second sighting on (a payload seen once is garbage as soon
as it is folded); a read decodes a few rows at a time. Whatever the mix of repeated and
unique payloads and the page sizes, every read returns what decoding each row on its own
returns: the same events, with the row's id (``read``) or without one (a fold's read).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fleetledger.store.log as log_module
from fleetledger.events.models import Event, OutcomeWindowReported, ShardOutcomes
from fleetledger.store.log import EventLog
from tests.builders import probe_failed, probe_ok, run_started

RUN = "cached"


def _event(choice: int, unique: int) -> Event:
    """A repeated payload (probes of one of two shards, one failure text) or, for
    choice 3, an adapter window whose counts make it unique."""
    if choice == 0:
        return probe_ok(0)
    if choice == 1:
        return probe_ok(1)
    if choice == 2:
        return probe_failed(1, "timeout", "no answer within 2s")
    return OutcomeWindowReported(
        adapter="router", outcomes=(ShardOutcomes(shard=0, successes=unique + 1),)
    )


def _content(event: Event) -> dict:
    return event.model_dump(exclude={"id"})


@settings(max_examples=40, deadline=None)
@given(
    choices=st.lists(st.integers(0, 3), min_size=1, max_size=120),
    decode_page=st.sampled_from([1, 2, 3, 7, 64]),
    read_page=st.sampled_from([5, 20_000]),
    cache_size=st.sampled_from([2, 4096]),
)
def test_every_read_returns_what_each_row_decodes_to_alone(
    choices, decode_page, read_page, cache_size
):
    with (
        tempfile.TemporaryDirectory() as tmp,
        pytest.MonkeyPatch.context() as patch,
    ):
        patch.setattr(log_module, "DECODE_PAGE", decode_page)
        patch.setattr(log_module, "READ_PAGE", read_page)
        patch.setattr("fleetledger.events.codec.TEMPLATE_CACHE_SIZE", cache_size)
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        events = [run_started(2), *(_event(c, n) for n, c in enumerate(choices))]
        with EventLog.open(url) as log:
            log.append(RUN, events)
        with EventLog.open(url) as log:  # a fresh codec: its cache starts empty
            stored = list(log.read_stored(RUN))
            alone = [
                log.codec.decode(RUN, seq, type_, version, payload, event_id)
                for page in stored
                for seq, _at, event_id, type_, version, payload in page
            ]
            for _ in range(2):  # the second read meets a warm cache
                read = list(log.read(RUN))
                assert [r.event for r in read] == alone
                assert [r.event.id for r in read] == [e.id for e in events]
                folded = [r for page in log.read_pages(RUN, ids=False) for r in page]
                assert [r.seq for r in folded] == list(range(1, len(events) + 1))
                assert [_content(r.event) for r in folded] == [_content(e) for e in alone]
                assert {r.event.id for r in folded} == {""}
