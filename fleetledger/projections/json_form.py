"""The JSON form of the projections' dataclasses: what every ``--json`` prints.

History entries, explanations and their parts all leave the process the same way, so
they are turned into JSON by one function rather than by a ``dict`` written out per
class — a field added to a dataclass is in its JSON at once, under its own name.

Rules of this file:

- A key is a field's name, and every field is a key. Values: ``None``, booleans,
  numbers and strings as they are (stamps, ``*_at_us``, stay microseconds since the
  epoch); an enum as its value; a tuple or list as a list, a set as a sorted list; a
  dict with its keys as strings (JSON has no other keys); a nested dataclass by these
  same rules.
- A key that is not a field is declared by its class, in ``JSON_DERIVED``: the names of
  properties (or class attributes) written before the fields — ``kind``, the ISO form
  of a stamp (``at``, ``started_at``), a duration in seconds. That tuple is the only
  way to add one; no class writes its own dict.
- Pure: the same object always gives the same JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import fields, is_dataclass
from functools import cache
from typing import Any, ClassVar

# Values JSON holds as they are; exact types, so the common case costs one lookup.
_PLAIN: frozenset[type] = frozenset({str, int, float, bool, type(None)})


class JsonForm:
    """Base of the dataclasses that ``--json`` prints: one ``as_json`` for all of them."""

    __slots__ = ()

    # Properties (or class attributes) written before the fields, in this order.
    JSON_DERIVED: ClassVar[tuple[str, ...]] = ()

    def as_json(self) -> dict[str, Any]:
        """This object as JSON-ready values (see the rules of ``json_form``)."""
        out: dict[str, Any] = json_value(self)
        return out


@cache
def _keys(cls: type) -> tuple[str, ...]:
    derived: tuple[str, ...] = getattr(cls, "JSON_DERIVED", ())
    return (*derived, *(f.name for f in fields(cls)))


def _key(key: Any) -> str:
    return str(key.value) if isinstance(key, enum.Enum) else str(key)


def json_value(value: Any) -> Any:
    """``value`` as something ``json.dumps`` writes and ``json.loads`` gives back equal."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    convert = _CONVERTERS.get(kind)
    if convert is None:
        convert = _CONVERTERS[kind] = _converter(kind)
    return convert(value)


def _converter(kind: type) -> Callable[[Any], Any]:
    """How a value of ``kind`` becomes JSON (the rules above), found once per type: a
    replay turns a million values into JSON, and asking each what it is cost a third."""
    if issubclass(kind, enum.Enum):
        return _enum_value
    if is_dataclass(kind):
        keys = _keys(kind)
        return lambda value: {name: json_value(getattr(value, name)) for name in keys}
    if issubclass(kind, tuple | list):
        return lambda value: [json_value(v) for v in value]
    if issubclass(kind, frozenset | set):  # in order, so the same set is the same JSON
        return lambda value: [json_value(v) for v in sorted(value)]
    if issubclass(kind, dict):
        return lambda value: {_key(k): json_value(v) for k, v in value.items()}
    if issubclass(kind, str | int | float):  # a subclass of a plain type
        return _itself
    return _no_form


def _enum_value(value: enum.Enum) -> Any:
    return value.value


def _itself(value: Any) -> Any:
    return value


def _no_form(value: Any) -> Any:
    raise TypeError(f"no JSON form for {type(value).__name__}: {value!r}")


# Each type's converter, built on first sight (``_converter``).
_CONVERTERS: dict[type, Callable[[Any], Any]] = {}
