"""Encoding events for storage and reading them back, across schema versions.

A stored event keeps the schema version it was written with. On read, an *upcaster*
lifts the payload one version at a time until it matches the current model. A type
this code does not know, or a version newer than it reads, is an error naming the run
and seq — never a silent skip, because a replay that skips an event folds a different
fleet than the one that ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from fleetledger.events.allocation import cyclic_gc_paused
from fleetledger.events.errors import EventDecodeError
from fleetledger.events.models import EVENT_TYPES, Event, RecordedEvent

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# (event type, version it reads) -> function returning the payload at version + 1.
# Register one whenever a stored type's fields change; never rewrite stored rows.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


# One row of the events table as read: (seq, at_us, type, schema_version, payload).
StoredRow = tuple[int, int, str, int, str]


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

    @property
    def types(self) -> Mapping[str, type[Event]]:
        return self._types

    def encode(self, event: Event) -> tuple[str, int, str]:
        cls = self._types.get(event.type)
        if cls is None or not isinstance(event, cls):
            raise TypeError(f"{type(event).__name__} is not a registered event type")
        return event.type, cls.SCHEMA_VERSION, event.model_dump_json()

    def decode(self, run: str, seq: int | None, type_: str, version: int, payload: Any) -> Event:
        """Decode one stored payload (a JSON string or an already-parsed dict)."""
        cls = self._types.get(type_)
        if cls is None:
            raise EventDecodeError(
                run,
                seq,
                f"unknown event type {type_!r}; this fleetledger knows "
                f"{', '.join(sorted(self._types))}. Was it written by a newer version?",
            )
        current = cls.SCHEMA_VERSION
        if version > current:
            raise EventDecodeError(
                run,
                seq,
                f"event type {type_!r} has schema version {version}, newer than the "
                f"{current} this fleetledger reads; upgrade fleetledger to read this run",
            )
        if version < 1:
            raise EventDecodeError(run, seq, f"schema version {version} is not valid (>= 1)")
        try:
            data = json.loads(payload) if isinstance(payload, str | bytes) else dict(payload)
        except json.JSONDecodeError as exc:
            raise EventDecodeError(run, seq, f"payload is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise EventDecodeError(run, seq, "payload is not a JSON object")
        for from_version in range(version, current):
            upcaster = self._upcasters.get((type_, from_version))
            if upcaster is None:
                raise EventDecodeError(
                    run,
                    seq,
                    f"no upcaster lifts {type_!r} from schema version {from_version} "
                    f"to {from_version + 1}",
                )
            data = upcaster(data)
        if data.get("type", type_) != type_:
            raise EventDecodeError(
                run, seq, f"payload says type {data.get('type')!r} but the row says {type_!r}"
            )
        data["type"] = type_
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise EventDecodeError(
                run, seq, f"invalid {type_!r} event: {describe_validation_error(exc)}"
            ) from None

    def decode_rows(self, run: str, rows: Sequence[StoredRow]) -> list[RecordedEvent]:
        """Decode a page of rows; rows at their type's current version take a fast path.

        Any row the fast path cannot take is decoded on its own, which names its seq.
        """
        types = self._types
        out: list[RecordedEvent] = []
        append = out.append
        with cyclic_gc_paused():
            for seq, at_us, type_, version, payload in rows:
                cls = types.get(type_)
                event: Event | None = None
                if cls is not None and version == cls.SCHEMA_VERSION:
                    try:
                        # The model's literal ``type`` field rejects a payload of another type.
                        event = cls.__pydantic_validator__.validate_json(payload)
                    except ValidationError:
                        event = None
                if event is None:
                    event = self.decode(run, seq, type_, version, payload)
                append(RecordedEvent(run, seq, at_us, event))
        return out
