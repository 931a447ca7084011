"""Every switch on a type is a table, and every table covers exactly its types.

An event type added to the vocabulary but missing from one table would be folded and
then silently dropped from the history, printed as its bare type name, or refused
half-way through a replay. A stray key is dead code that looks alive. Both are caught
here, before any run meets them: the fold (``fleet_view._HANDLERS``), the history
(``history.ENTRY_BUILDERS``) and the event words (``explain.EVENT_WORDS``) are held to
``EVENT_TYPES``; the replay table's wording (``entry_words.ENTRY_WORDING``) and the
run explanation's findings (``explain.FINDINGS``) to the history's entry types; and the
shard explanation's sentences (``explain.BECAUSE``) to the inputs that move a shard.
"""

from __future__ import annotations

import inspect

import pytest

from fleetledger.events.models import EVENT_TYPES, Event, RunEnded, RunStarted
from fleetledger.projections import history
from fleetledger.projections.entry_words import ENTRY_WORDING
from fleetledger.projections.explain import BECAUSE, EVENT_WORDS, FINDINGS, describe_event
from fleetledger.projections.fleet_view import _HANDLERS
from fleetledger.projections.history import ENTRY_BUILDERS, ENTRY_TYPES, Entry, History
from fleetledger.projections.shard_states import RULES, Input
from tests.projection_builders import every_event_naming, fleet_config

EVENT_CLASSES = set(EVENT_TYPES.values())


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("fleet_view._HANDLERS (the fold)", _HANDLERS),
        ("history.ENTRY_BUILDERS (the history)", ENTRY_BUILDERS),
        ("explain.EVENT_WORDS (what an event says)", EVENT_WORDS),
    ],
)
def test_every_event_type_has_exactly_one_row_in_each_event_table(
    name: str, table: dict[type[Event], object]
) -> None:
    missing = {cls.__name__ for cls in EVENT_CLASSES - set(table)}
    stray = {cls.__name__ for cls in set(table) - EVENT_CLASSES}
    assert not missing, f"{name} has no row for {sorted(missing)}"
    assert not stray, f"{name} has rows for types outside EVENT_TYPES: {sorted(stray)}"


def test_entry_types_are_every_entry_class_the_history_defines() -> None:
    defined = {
        cls
        for _, cls in inspect.getmembers(history, inspect.isclass)
        if issubclass(cls, Entry) and cls is not Entry and cls.__module__ == history.__name__
    }
    assert set(ENTRY_TYPES) == defined
    assert len(ENTRY_TYPES) == len(defined)  # and each is listed once


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("entry_words.ENTRY_WORDING (the replay table)", ENTRY_WORDING),
        ("explain.FINDINGS (trouble in a run)", FINDINGS),
    ],
)
def test_every_history_entry_type_has_exactly_one_row_in_each_entry_table(
    name: str, table: dict[type[Entry], object]
) -> None:
    missing = {cls.__name__ for cls in set(ENTRY_TYPES) - set(table)}
    stray = {cls.__name__ for cls in set(table) - set(ENTRY_TYPES)}
    assert not missing, f"{name} has no row for {sorted(missing)}"
    assert not stray, f"{name} has rows for types outside history.ENTRY_TYPES: {sorted(stray)}"


def test_every_input_that_can_move_a_shard_has_its_sentences() -> None:
    moving = {
        signal
        for signal, row in RULES.items()
        if any(branch.target is not None for branches in row.values() for branch in branches)
    }
    assert set(BECAUSE) == moving
    assert Input.REPORTED_SUCCESS not in BECAUSE  # it clears a streak, it never moves a shard


def test_observations_are_the_events_with_no_history_entry_of_their_own() -> None:
    observed = {
        cls.__name__
        for cls, build in ENTRY_BUILDERS.items()
        if build is History._no_entry_of_its_own
    }
    assert observed == {
        "RunStarted",
        "ActorDeathConfirmed",
        "ProbeRound",
        "OutcomeWindowReported",
        "ProgressReported",
    }


def test_every_event_is_said_in_words_not_by_its_type_name() -> None:
    events = [
        RunStarted(config=fleet_config()),
        RunEnded(outcome="failed", cause="stalled"),
        *every_event_naming(1, 3),
    ]
    assert {type(e) for e in events} == EVENT_CLASSES
    for event in events:
        line = describe_event(event, 1)
        assert line and line != event.type, event
