"""Encoding events for storage and reading them back, across schema versions.

A stored event keeps the type and schema version it was written with. On read, an
*upcaster* lifts the payload one version at a time until it matches a current model;
where the record changed shape, a step changes the type too (version 1 of the probe
record was one ``probe_succeeded`` / ``probe_failed`` per shard, version 2 is the
``probe_round``: see :mod:`fleetledger.events.legacy`), so the folds know one shape of
each fact. A type this code does not know, a version newer than it reads, or a link
missing from the chain is an error naming the run and seq — never a silent skip,
because a replay that skips an event folds a different fleet than the one that ran.

Everything read from outside (an import line, a bundle member) goes through
:func:`load_json`, which refuses what ``json.loads`` would let through and then
misread or write back as something that is not JSON: ``NaN``/``Infinity`` and numbers
that overflow a float (exported as invalid JSON), a key twice in one object (the last
silently wins), a lone UTF-16 surrogate escape (not a character: unwritable as UTF-8),
nesting deeper than :data:`MAX_JSON_DEPTH`, and an integer longer than Python reads.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from fleetledger.events.errors import EventDecodeError
from fleetledger.events.legacy import PROBE_V1_UPCASTERS
from fleetledger.events.models import (
    EVENT_TYPES,
    Event,
    RecordedColumns,
    RecordedEvent,
    us_from_datetime,
)

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# (event type, version it reads) -> function returning the payload at version + 1, of
# the same type or, where the record changed shape, of the type it became (its output's
# ``type``). Register one whenever a stored type's fields change; never rewrite stored
# rows. The v1 per-shard probe events lift to the v2 round (``events.legacy``).
UPCASTERS: dict[tuple[str, int], Upcaster] = {**PROBE_V1_UPCASTERS}


# One row of the events table as read: (seq, at_us, event_id, type, schema_version, payload).
StoredRow = tuple[int, int, str, str, int, str]
# The same for a fold, without the id, and without the seq (a page of rows is read by a
# range of seqs and holds every seq of it, so row i of a page is its first seq + i):
# (at_us, type, schema_version, payload).
ContentRow = tuple[int, str, int, str]
# The fields a stored payload leaves out: each has its own column (``event_id``,
# ``type``). Rows written before schema revision 0003 hold both (``OLD_FORM_OPENING``).
NOT_IN_PAYLOAD = frozenset({"id", "type"})
# Repeated payloads a codec keeps decoded (see ``EventCodec.decode_rows``): a long run
# repeats a handful (a probe of each shard, a healthy round); a payload seen once (an
# adapter window) is not kept, and a run of many distinct repeats empties it when full.
TEMPLATE_CACHE_SIZE = 4096
# How a payload stored with its id begins (every row written before schema revision
# 0003). A payload stored without it never does: its first key is a field of the event.
OLD_FORM_OPENING = '{"id":"'
# The row type and version a cached payload was read as, and its event without an id.
_Template = tuple[str, int, Event]


# Opens an id-less payload for validation (``_first_of``): ``{"id":"-",`` then its fields.
# A payload of no fields (``{}``) then reads ``{"id":"-",}``, which the validator refuses,
# and the row goes the slow way (``decode``), which gives it its id.
_STAND_IN_ID = "-"
_STAND_IN = '{"id":"' + _STAND_IN_ID + '",'

_new = object.__new__
_put = object.__setattr__


def _with_id(event: Event, event_id: str) -> Event:
    """A copy of a validated ``event`` with another id: what ``model_copy`` does, without
    its per-call overhead (a replay makes one per row). The one place pydantic's slots
    are set by hand: a model without extra fields or private attributes (``Event``'s
    ``extra="forbid"``) has None in both."""
    copy = _new(type(event))
    _put(copy, "__dict__", {**event.__dict__, "id": event_id})
    _put(copy, "__pydantic_fields_set__", event.__pydantic_fields_set__)
    _put(copy, "__pydantic_extra__", None)
    _put(copy, "__pydantic_private__", None)
    return copy


# The deepest nesting an imported document may have. An event line is an object (1)
# holding ``data`` (2); a run_started's config (3) holds the free-form ``settings`` (4):
# 64 leaves settings 60 levels. A hostile 100,000-deep line stops json's parser at
# Python's recursion limit (caught); anything deeper than 64 is refused before pydantic
# or json.dumps recurse through it.
MAX_JSON_DEPTH = 64
# Stamps are microseconds since the epoch, written back as ISO 8601 in UTC: a time is
# storable when its UTC instant is one Python's datetime holds.
FIRST_STAMP = us_from_datetime(datetime.min.replace(tzinfo=UTC))
LAST_STAMP = us_from_datetime(datetime.max.replace(tzinfo=UTC))
# A \uD800..\uDFFF escape: only a lone one (not half of a pair) is refused.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class JSONRefused(ValueError):
    """Text :func:`load_json` refuses; ``problem`` says why (the caller says where)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def _no_constant(name: str) -> Any:
    raise JSONRefused(f"{name} is not a JSON number (JSON has no NaN or infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JSONRefused(
            f"the number {cut(text, 24)} overflows a float (it would be written back as inf)"
        )
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise JSONRefused(f"duplicate key {cut(repr(key))} in one object")
            seen.add(key)
    return obj


def cut(text: str, limit: int = 80) -> str:
    """``text`` cut short for an error line, which must not carry a megabyte of input."""
    return text if len(text) <= limit else text[:limit] + "…"


def _deeper_than(doc: Any, limit: int) -> bool:
    stack = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


# One decoder for every document: json.loads with hooks builds a new one per call.
_DECODER = json.JSONDecoder(
    parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_object
)


def load_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse one JSON document strictly; raises :class:`JSONRefused` naming the problem."""
    try:
        doc = _DECODER.decode(text)
    except JSONRefused:
        raise
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}" if exc.lineno > 1 else f"column {exc.colno}"
        raise JSONRefused(f"not valid JSON: {exc.msg} at {at}") from None
    except RecursionError:
        raise JSONRefused(f"nested deeper than {max_depth} levels") from None
    except ValueError:  # int(): more digits than the interpreter converts
        raise JSONRefused(
            f"an integer has more than {sys.get_int_max_str_digits()} digits"
        ) from None
    if text.count("[") + text.count("{") > max_depth and isinstance(doc, dict | list):
        if _deeper_than(doc, max_depth):
            raise JSONRefused(f"nested deeper than {max_depth} levels")
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise JSONRefused(
                "a \\u escape names a lone UTF-16 surrogate, which is not a character"
            ) from None
    return doc


def stamp_of(at: datetime) -> int:
    """The stored stamp of an aware time; ValueError when it has none."""
    stamp = us_from_datetime(at)  # ValueError for a naive time
    if not FIRST_STAMP <= stamp <= LAST_STAMP:
        raise ValueError(
            "in UTC that is outside the times fleetledger stores "
            "(0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z)"
        )
    return stamp


def describe_validation_error(exc: ValidationError) -> str:
    """Pydantic's error list as one line: 'field.path: message; ...'."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(event)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


class EventCodec:
    """Turns events into (type, version, JSON) and stored rows back into events."""

    def __init__(
        self,
        types: Mapping[str, type[Event]] = EVENT_TYPES,
        upcasters: Mapping[tuple[str, int], Upcaster] = UPCASTERS,
    ) -> None:
        self._types = dict(types)
        self._upcasters = dict(upcasters)
        # Types only upcasters read (no model of their own), each with the last version
        # one reads: a row of such a type at a later version is from a newer fleetledger.
        self._lifted: dict[str, int] = {}
        for type_, version in self._upcasters:
            if type_ not in self._types:
                self._lifted[type_] = max(version, self._lifted.get(type_, version))
        self._templates: dict[str, _Template] = {}
        # Payloads decoded once and not cached (yet): see ``_remember``.
        self._seen_once: set[str] = set()

    @property
    def types(self) -> Mapping[str, type[Event]]:
        return self._types

    def encode(self, event: Event) -> tuple[str, int, str]:
        """(type, schema version, stored payload): the event's JSON without its id and
        type, which the row holds in columns of their own.

        Story: with the id inside, no two payloads were alike, so a reader cut each
        payload at its id before it could see a repeat, and a million rows carried a
        million copies of ids their own column already held (a quarter of a probe row).
        Without it, the payload of a repeated fact is byte-identical to the last one's.
        """
        cls = self._types.get(event.type)
        if cls is None or not isinstance(event, cls):
            raise TypeError(f"{type(event).__name__} is not a registered event type")
        return event.type, cls.SCHEMA_VERSION, stored_payload(cls, event)

    def decode(
        self,
        run: str,
        seq: int | None,
        type_: str,
        version: int,
        payload: Any,
        event_id: str | None = None,
    ) -> Event:
        """Decode one stored payload (a JSON string or an already-parsed dict).

        ``event_id`` is the row's: a payload stored without its id gets it; one stored
        with an id must hold this one. Without ``event_id``, an id-less payload decodes
        to an event with a fresh id (a fold never reads ids).

        From the row's (type, version), upcasters lift the payload one version at a time
        — across a change of type where one says so (a v1 ``probe_succeeded`` becomes a
        v2 ``probe_round``) — until it is a type of ``types`` at its ``SCHEMA_VERSION``.
        Each failure names run and seq: a type neither known nor lifted, a version newer
        than this code reads, a missing link in the chain, a payload invalid for the
        type it is read as.
        """
        cls = self._types.get(type_)
        if cls is None and type_ not in self._lifted:
            older = sorted(self._lifted)
            also = f" (and reads the older {', '.join(older)})" if older else ""
            raise EventDecodeError(
                run,
                seq,
                f"unknown event type {cut(repr(type_))}; this fleetledger knows "
                f"{', '.join(sorted(self._types))}{also}. Was it written by a newer version?",
            )
        # A current type reads up to its model's version; a lifted-only one up to the
        # version its last upcaster reads.
        readable = cls.SCHEMA_VERSION if cls is not None else self._lifted[type_]
        if version > readable:
            raise EventDecodeError(
                run,
                seq,
                f"event type {type_!r} has schema version {version}, newer than the "
                f"{readable} this fleetledger reads; upgrade fleetledger to read this run",
            )
        if version < 1:
            raise EventDecodeError(run, seq, f"schema version {version} is not valid (>= 1)")
        try:
            data = json.loads(payload) if isinstance(payload, str | bytes) else dict(payload)
        except json.JSONDecodeError as exc:
            raise EventDecodeError(run, seq, f"payload is not valid JSON: {exc}") from None
        except (RecursionError, ValueError):  # json: too deep; int(): too many digits
            problem = "payload nests too deeply or holds an integer too long to read"
            raise EventDecodeError(run, seq, problem) from None
        if not isinstance(data, dict):
            raise EventDecodeError(run, seq, "payload is not a JSON object")
        if data.get("type", type_) != type_:
            raise EventDecodeError(
                run, seq, f"payload says type {data.get('type')!r} but the row says {type_!r}"
            )
        data["type"] = type_
        if event_id is not None:
            held = data.setdefault("id", event_id)
            if held != event_id:
                raise EventDecodeError(
                    run, seq, f"payload id {cut(repr(held))} is not the row's id {event_id!r}"
                )
        now, at = type_, version  # what the payload is as lifted so far
        while cls is None or at != cls.SCHEMA_VERSION:
            upcaster = self._upcasters.get((now, at))
            if upcaster is None:
                raise EventDecodeError(
                    run,
                    seq,
                    f"no upcaster lifts {now!r} from schema version {at} to {at + 1}",
                )
            try:
                data = upcaster(data)
            except ValidationError as exc:  # the upcaster checked what it was given
                raise EventDecodeError(
                    run, seq, f"invalid {now!r} event: {describe_validation_error(exc)}"
                ) from None
            step = f"{now!r} v{at}"
            now, at = data.setdefault("type", now), at + 1
            cls = self._types.get(now)
            if cls is not None and at > cls.SCHEMA_VERSION:
                raise EventDecodeError(
                    run,
                    seq,
                    f"the upcaster of {step} made a {now!r} event at schema version {at}, "
                    f"newer than the {cls.SCHEMA_VERSION} this fleetledger reads",
                )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            lifted = "" if now == type_ else f" (lifted from {type_!r} v{version})"
            raise EventDecodeError(
                run, seq, f"invalid {now!r} event{lifted}: {describe_validation_error(exc)}"
            ) from None

    def difference(
        self, run: str, seq: int, type_: str, version: int, payload: str, event: Event
    ) -> str | None:
        """None when the stored row at ``seq`` holds ``event``; else how the two differ.

        Compared as the codec encodes them now: a row stored by an import (its own key
        order and escapes) or at an older schema version holds the same event when its
        decoded, upcast event encodes to the same payload — so a v1 ``probe_succeeded``
        row holds the one-shard ``probe_round`` it is read as, and resending what was
        read from an imported old run is a retry, not a conflict.
        """
        fresh = self.encode(event)
        if (type_, version, payload) == fresh:
            return None
        if type_ == fresh[0]:
            stored = self.decode(run, seq, type_, version, payload, event.id)
        else:
            # Another type is still the same event when the row is read as this type (a
            # lifted old row); one that is read as another, or not at all, is not.
            try:
                stored = self.decode(run, seq, type_, version, payload, event.id)
            except EventDecodeError:
                return f"a {type_!r} event, not {fresh[0]!r}"
            if stored.type != fresh[0]:
                return f"a {type_!r} event, not {fresh[0]!r}"
        if self.encode(stored)[2] == fresh[2]:
            return None
        old, new = stored.model_dump(mode="json"), event.model_dump(mode="json")
        fields = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
        read_as = "" if stored.type == type_ else f" (read as {stored.type!r})"
        return f"a {type_!r} event{read_as} with other {', '.join(fields) or 'content'}"

    def decode_rows(self, run: str, rows: Sequence[StoredRow]) -> list[RecordedEvent]:
        """Decode a page of rows, validating a repeated payload at its first two sightings
        only (``_remember``).

        Validation is complete where data enters (``append`` encodes a validated event;
        an import decodes every line through :meth:`decode`); a stored row is read back
        as what was validated. Most rows of a long run repeat a payload (the same shard
        answered again, the same healthy round), and a payload holds no id (the row's
        ``event_id`` column does), so the payload is the key of a cache of validated
        events: a repeat costs a lookup and a copy with the row's id. A payload the cache
        lacks goes through :meth:`_uncached`.
        """
        templates = self._templates
        out: list[RecordedEvent] = []
        append = out.append
        recorded = tuple.__new__  # RecordedEvent's own __new__ is a Python function
        for seq, at_us, event_id, type_, version, payload in rows:
            template = templates.get(payload)
            if template is None or template[0] != type_ or template[1] != version:
                event = self._uncached(run, seq, event_id, type_, version, payload)
            else:
                event = _with_id(template[2], event_id)
            append(recorded(RecordedEvent, (run, seq, at_us, event)))
        return out

    def decode_contents(
        self, run: str, first_seq: int, rows: Sequence[ContentRow]
    ) -> RecordedColumns:
        """Decode a page of rows, seqs ``first_seq`` on, for a fold, which reads what
        events say, never their ids; by column (``RecordedColumns``).

        Every row of a repeated payload gets one shared event whose ``id`` is empty (the
        log refuses to append such an event, so a fold's events cannot be written back
        as if they were the rows'); a repeat costs a dictionary lookup. The rows come
        without their ids and seqs, two fifths less to fetch; the first row of each
        payload is validated whole (:meth:`decode`, naming its seq).
        """
        templates = self._templates
        ats: list[int] = []
        events: list[Event] = []
        add_at, add_event = ats.append, events.append
        for at_us, type_, version, payload in rows:
            template = templates.get(payload)
            if template is None or template[0] != type_ or template[1] != version:
                add_event(self._uncached(run, first_seq + len(ats), None, type_, version, payload))
            else:
                add_event(template[2])
            add_at(at_us)
        return RecordedColumns(run, first_seq, ats, events)

    def _uncached(
        self,
        run: str,
        seq: int,
        event_id: str | None,
        type_: str,
        version: int,
        payload: str,
    ) -> Event:
        """A row whose payload the cache does not hold as it is; ``event_id`` None for a
        fold (``decode_contents``), which gets the event without an id.

        A payload stored with its id (before schema revision 0003) is looked up by what
        follows the id: the row's own id, or for a fold whatever id is there, cut at its
        closing quote (a stored id holds no quote in practice; one that did only makes
        the key longer, a cache miss). Any other is decoded whole (:meth:`_first_of`,
        naming its seq when it fails) and cached unless it must not be.
        """
        key = payload
        if payload.startswith(OLD_FORM_OPENING):
            if event_id is None:
                cut_at = payload.find('",', 7)
                key = payload[cut_at:] if cut_at > 0 else payload
            elif payload.startswith(event_id, 7):
                key = payload[len(event_id) + 7 :]
            template = self._templates.get(key)
            if template is not None and template[0] == type_ and template[1] == version:
                return template[2] if event_id is None else _with_id(template[2], event_id)
        event, cacheable = self._first_of(run, seq, event_id, type_, version, payload)
        if cacheable:
            bare = self._remember(key, type_, version, event)
            return bare if event_id is None else event
        if event_id is None and event.id != "":
            return _with_id(event, "")
        return event

    def _remember(self, rest: str, type_: str, version: int, first: Event) -> Event:
        """``first`` without its id; cached as what ``rest`` decodes to from the second
        time ``rest`` is seen on.

        Story: a cache of every payload filled with adapter windows, which never repeat;
        each lived until the cache was cleared, long enough for the garbage collector to
        promote it (17,000 ``ShardOutcomes`` in the oldest generation at a full
        collection), so a bulk read paid a full collection every ~50,000 events. A
        payload that repeats (a probe of one shard, a healthy round) is cached at its
        second sighting; one seen once is garbage as soon as it is folded."""
        bare = first if first.id == "" else _with_id(first, "")
        seen = self._seen_once
        if rest in seen:
            seen.discard(rest)
            templates = self._templates
            if len(templates) >= TEMPLATE_CACHE_SIZE:
                templates.clear()
            templates[rest] = (type_, version, bare)
        else:
            if len(seen) >= TEMPLATE_CACHE_SIZE:
                seen.clear()
            seen.add(rest)
        return bare

    def _first_of(
        self, run: str, seq: int, event_id: str | None, type_: str, version: int, payload: str
    ) -> tuple[Event, bool]:
        """Decode a payload the cache has not seen, validating it whole, with the row's id
        (a payload stored with its own must hold the row's: an import refuses a line whose
        id differs, so only damage gets here); and whether its text may be cached, which
        an id-less payload that holds an id after all may not: only a whole decode holds
        that id to the row's, and a cache hit would skip it."""
        cls = self._types.get(type_)
        event: Event | None = None
        old_form = payload.startswith(OLD_FORM_OPENING)
        if cls is not None and version == cls.SCHEMA_VERSION:
            # An id-less payload is validated with a stand-in id (the model requires one,
            # and would otherwise draw a fresh one, which costs more than the rest of the
            # validation); the row's id replaces it.
            text = payload if old_form else _STAND_IN + payload[1:].lstrip()
            try:
                # The model's literal ``type`` field rejects a payload of another type.
                event = cls.__pydantic_validator__.validate_json(text)
            except ValidationError:
                event = None
        if event is None or (not old_form and event.id != _STAND_IN_ID):
            # Refused, or an id-less payload that holds an id after all (written by
            # something else): ``decode`` reads it whole and holds that id to the row's.
            decoded = self.decode(run, seq, type_, version, payload, event_id)
            return decoded, old_form or '"id"' not in payload
        if old_form:
            if event_id is not None and event.id != event_id:
                raise EventDecodeError(
                    run, seq, f"payload id {cut(event.id)!r} is not the row's id {event_id!r}"
                )
            return event, True
        return _with_id(event, "" if event_id is None else event_id), True


def stored_payload(cls: type[Event], event: Event) -> str:
    """What a row stores of ``event`` (of class ``cls``): see :meth:`EventCodec.encode`."""
    return cls.__pydantic_serializer__.to_json(event, exclude=NOT_IN_PAYLOAD).decode()
