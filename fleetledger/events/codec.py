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
from typing import Annotated, Any, NamedTuple, Union

from pydantic import Field, TypeAdapter, ValidationError

from fleetledger.events.errors import EventDecodeError
from fleetledger.events.models import EVENT_TYPES, Event, RecordedEvent

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]

# (event type, version it reads) -> function returning the payload at version + 1.
# Register one whenever a stored type's fields change; never rewrite stored rows.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class StoredRow(NamedTuple):
    """One row of the events table, as read."""

    seq: int
    at_us: int
    type: str
    schema_version: int
    payload: str


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
        union = Union[tuple(self._types.values())]  # noqa: UP007 - built at runtime
        self._bulk = TypeAdapter(list[Annotated[union, Field(discriminator="type")]])

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
        """Decode many rows; rows at the current version are validated in one pass.

        The single pass keeps a million-event replay inside pydantic-core instead of a
        Python loop; any row it cannot take is decoded on its own, which names its seq.
        """
        current_rows: list[StoredRow] = []
        decoded: dict[int, Event] = {}
        for row in rows:
            cls = self._types.get(row.type)
            if cls is not None and row.schema_version == cls.SCHEMA_VERSION:
                current_rows.append(row)
            else:
                decoded[row.seq] = self.decode(
                    run, row.seq, row.type, row.schema_version, row.payload
                )
        if current_rows:
            try:
                events = self._bulk.validate_json(
                    "[" + ",".join(r.payload for r in current_rows) + "]"
                )
            except ValidationError:
                events = [
                    self.decode(run, r.seq, r.type, r.schema_version, r.payload)
                    for r in current_rows
                ]
            for row, event in zip(current_rows, events, strict=True):
                if event.type != row.type:
                    raise EventDecodeError(
                        run,
                        row.seq,
                        f"payload says type {event.type!r} but the row says {row.type!r}",
                    )
                decoded[row.seq] = event
        return [RecordedEvent(run, row.seq, row.at_us, decoded[row.seq]) for row in rows]
