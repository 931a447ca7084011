"""Points in a run as a person names them: a seq, or an ISO 8601 time with a zone.

Times need a zone: the log stamps events in UTC, and a naive "10:25" would mean a
different moment on every machine that reads it. A time names the last event stamped
at or before it — "the fleet at 10:25:43" is everything recorded by then, none after.
"""

from __future__ import annotations

import re
from datetime import datetime

from fleetledger.errors import FleetledgerError
from fleetledger.events.codec import cut, stamp_of
from fleetledger.store.log import EventLog
from fleetledger.store.records import RunHead

TIME_EXAMPLE = "2026-11-29T10:25:43Z"
# A seq as a person types it: ASCII digits only ('²'.isdigit() is true, int('²') fails).
_SEQ = re.compile(r"-?[0-9]+")
# Seqs are stored as 64-bit integers: a longer number names no event of any run.
MAX_SEQ_DIGITS = 19


class PointError(FleetledgerError):
    """A point that names no moment of the run: not a seq or a time, or a time without
    a zone."""


def parse_time(text: str, option: str, *, or_seq: bool = False) -> int:
    """An ISO 8601 time with a zone, as stamped microseconds since the epoch (UTC).

    ``or_seq``: the option also takes a seq, and the error says so. A time whose UTC
    instant is outside what a stored stamp can be (``0001-01-01T00:00:00+14:00`` is
    still year 0 in UTC) is refused too: it names no moment a log can hold or print.
    """
    shown = cut(repr(text))
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        expected = "a seq (an integer) or an ISO 8601 time" if or_seq else "an ISO 8601 time"
        raise PointError(
            f"{option} {shown} is not {expected}; give e.g. "
            + ("812, " if or_seq else "")
            + f"{TIME_EXAMPLE} or 2026-11-29T11:25:43+01:00"
        ) from None
    if at.tzinfo is None:
        raise PointError(
            f"{option} {shown} has no time zone; give one (e.g. {cut(text.strip())}Z or "
            f"{cut(text.strip())}+00:00): stored times are UTC, and a naive time means a "
            "different moment on each machine"
        )
    try:
        return stamp_of(at)
    except ValueError as exc:
        raise PointError(f"{option} {shown}: {exc}") from None


def is_seq(text: str) -> bool:
    return _SEQ.fullmatch(text.strip()) is not None


def seq_of_point(log: EventLog, head: RunHead, point: str, option: str) -> int:
    """``point`` as a seq of the run: an integer is a seq, anything else a time."""
    if is_seq(point):
        if len(point.strip().removeprefix("-")) > MAX_SEQ_DIGITS:
            raise PointError(
                f"{option} {cut(point.strip())} is not a seq of run {head.run!r}: it has "
                f"seqs 1..{head.seq}"
            )
        return int(point)
    return log.seq_at(head.run, parse_time(point, option, or_seq=True), head=head)
