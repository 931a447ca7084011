"""What went wrong with a request, as a status and one line of JSON.

Every error a handler meets is answered here, by its class, in a table: an unknown run
or shard is 404, a malformed parameter or a point outside the run is 400, a ledger that
cannot be read right now (missing, being migrated, a lost connection) is 503. The body
is ``{"error": "<one line>", "status": N}``: the same one-line words the CLI prints,
never a traceback. Anything unexpected is 500 with its type and first line, and logged.
"""

from __future__ import annotations

from typing import Any

from fleetledger.errors import FleetledgerError
from fleetledger.queries import PointError
from fleetledger.store.errors import BeforeTheRun, LedgerOpenError, LedgerReadError, UnknownRun


class HttpProblem(FleetledgerError):
    """A request the API refuses on its own account (a bad parameter, an unknown shard)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def not_found(message: str) -> HttpProblem:
    return HttpProblem(404, message)


def bad_request(message: str) -> HttpProblem:
    return HttpProblem(400, message)


# The first class in this order that an error is an instance of decides its status.
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (UnknownRun, 404),
    (PointError, 400),
    (BeforeTheRun, 400),  # ?at= a time before the run's first event
    (LedgerOpenError, 503),  # missing, foreign, too new, unreachable, needs migrating
    (LedgerReadError, 503),  # a lost connection, a file truncated under us
    (FleetledgerError, 500),
)


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "(no message)"


def problem_of(exc: BaseException) -> tuple[int, str]:
    """(status, one line) for an error a handler raised."""
    if isinstance(exc, HttpProblem):
        return exc.status, _one_line(str(exc))
    for cls, status in STATUS_OF:
        if isinstance(exc, cls):
            return status, _one_line(str(exc))
    first = str(exc).splitlines()[0] if str(exc) else ""
    return 500, _one_line(f"internal error: {type(exc).__name__}: {first}")


def problem_body(status: int, message: str) -> dict[str, Any]:
    return {"error": message, "status": status}
