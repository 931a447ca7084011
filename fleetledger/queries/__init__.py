"""The read side: what a read command or a resumed controller asks of a run's log.

Folding is the projections' business and storing is the log's; what lives here is the
I/O between them: where a fold starts (the nearest snapshot), which rows it reads,
what ``--at 10:25:43Z`` means as a seq, which cited events an explanation needs, and —
for a live run — when to look again. A command opens one :class:`RunReader`, which
looks up the run's head and configuration once; everything after reads rows by seq.
Nothing here writes, and nothing here passes through ``controller/``.
"""

from importlib import import_module
from typing import Any

from fleetledger.queries.follow import DEFAULT_POLL_INTERVAL_S, Follower
from fleetledger.queries.history import read_history
from fleetledger.queries.points import TIME_EXAMPLE, PointError, parse_time
from fleetledger.queries.reader import RunReader
from fleetledger.queries.views import load_view

# The explanations' reads import the explanations: only ``explain`` pays for them.
_LAZY = {"explain_from_log": "evidence", "read_evidence": "evidence"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"fleetledger.queries.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_POLL_INTERVAL_S",
    "TIME_EXAMPLE",
    "Follower",
    "PointError",
    "RunReader",
    "explain_from_log",
    "load_view",
    "parse_time",
    "read_evidence",
    "read_history",
]
