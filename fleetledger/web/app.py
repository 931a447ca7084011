"""The aiohttp application: the route table, and the one place errors become answers.

Routes (all ``GET``; the server has no other verb — it never writes):

=====================================================  ==================================
``/api/v1/runs``                                         the runs (``runs --json``)
``/api/v1/runs/{run}/membership[?at=SEQ|TIME]``          ``membership --json``
``/api/v1/runs/{run}/history[?from=SEQ&limit=N&shard=N]``  the replay, a page at a time
``/api/v1/runs/{run}/explain[?at=]``                     ``explain RUN --json``
``/api/v1/runs/{run}/shards/{shard}/explain[?at=]``      ``explain RUN SHARD --json``
``/api/v1/runs/{run}/timeline[?axis=&format=html]``      the timeline's scene
``/api/v1/runs/{run}/stream``                            new entries, server-sent events
``/metrics``                                             Prometheus
``/``, ``/runs/{run}``, ``/static/…``                    the page
=====================================================  ==================================
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Awaitable, Callable

from aiohttp import web

from fleetledger.logs import get_logger
from fleetledger.web import api, page, stream
from fleetledger.web.doors import COOKIE, Doors, doors_for
from fleetledger.web.problems import HttpProblem, problem_body, problem_of
from fleetledger.web.server import DOORS, SERVED, ServedLedger

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_log = get_logger("fleetledger.web")

ROUTES: tuple[tuple[str, str, Callable[..., Awaitable[web.StreamResponse]]], ...] = (
    ("/api/v1/runs", "runs", api.runs),
    ("/api/v1/runs/{run}/membership", "membership", api.membership),
    ("/api/v1/runs/{run}/history", "history", api.history),
    ("/api/v1/runs/{run}/explain", "explain", api.explain_run),
    ("/api/v1/runs/{run}/shards/{shard}/explain", "explain_shard", api.explain_shard),
    ("/api/v1/runs/{run}/timeline", "timeline", api.timeline),
    ("/api/v1/runs/{run}/stream", "stream", stream.stream),
    ("/metrics", "metrics", api.metrics),
    ("/", "page", page.index),
    ("/runs/{run}", "run_page", page.index),
    ("/static/{name}", "static", page.static),
)


def json_problem(status: int, message: str) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps(problem_body(status, message)),
        content_type="application/json",
    )


OPEN_ROUTES = frozenset({"page", "run_page", "static"})
"""Open without the token: the page's shell (no ledger data in it) and its files; the
page then reads everything through the API, showing the token."""


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every refusal and failure as ``{"error", "status"}`` with its status, counted."""
    served = request.app[SERVED]
    route = request.match_info.route.name or "unknown"
    shown_token = False
    try:
        shown_token = _check_doors(request, route)
        response = await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = f"no such path: {request.path}" if exc.status == 404 else exc.reason
        if exc.status == 405:
            reason = f"{request.method} {request.path}: the server only reads; use GET"
        response = json_problem(exc.status, reason)
        if exc.status == 405:
            response.headers["Allow"] = "GET"
    except Exception as exc:
        status, message = problem_of(exc)
        if status == 500:
            _log.error("request failed", path=request.path, error=message)
        response = json_problem(status, message)
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="fleetledger"'
    if shown_token and not response.prepared:
        # The page's stream is opened by the browser without headers: a cookie carries it.
        token = request.app[DOORS].token
        response.set_cookie(COOKIE, token or "", httponly=True, samesite="Strict", path="/")
    served.metrics.requests.labels(route, str(response.status)).inc()
    return response


def _check_doors(request: web.Request, route: str) -> bool:
    """A Host this server answers (DNS rebinding: a page elsewhere that points a name of
    its own at 127.0.0.1 must not read the ledger), and the token where one is set;
    whether the request showed it in a header (the cookie is then set)."""
    doors = request.app[DOORS]
    refused = doors.host_refusal(request.headers.get("Host"))
    if refused is not None:
        raise HttpProblem(*refused)
    if doors.token is None or route in OPEN_ROUTES:
        return False
    authorization = request.headers.get("Authorization")
    if not doors.admits(authorization, request.cookies.get(COOKIE)):
        raise HttpProblem(
            401,
            "this server needs its token: send Authorization: Bearer TOKEN (the page: "
            "open it as /#token=TOKEN)",
        )
    return authorization is not None and doors.admits(authorization, None)


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """``Expect``: the server takes no request body, so a 100-continue is simply let
    through (nothing to continue) and anything else is a 417 in the API's shape — not
    aiohttp's own text, which answers before any middleware."""
    expect = request.headers.get("Expect", "")
    if expect.strip().lower() == "100-continue":
        return None
    return json_problem(417, f"Expect {expect[:60]!r}: the server takes only 100-continue")


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(page.HEADERS)


def make_app(served: ServedLedger, doors: Doors | str | None = None) -> web.Application:
    """The application; ``doors``: who may read (default: a loopback server's). A host
    string in its place is the old call (before 0.2): its doors are that address's."""
    if isinstance(doors, str):
        warnings.warn(
            "make_app(served, host) is deprecated: pass the doors "
            "(fleetledger.web.doors.doors_for(bound_address, host))",
            DeprecationWarning,
            stacklevel=2,
        )
        doors = doors_for(doors, doors, no_auth=True)
    app = web.Application(middlewares=[answer_errors])
    app[SERVED] = served
    app[DOORS] = doors if doors is not None else doors_for("127.0.0.1", "127.0.0.1")
    app.on_response_prepare.append(_security_headers)
    for path, name, handler in ROUTES:
        app.router.add_get(path, handler, name=name, allow_head=False, expect_handler=_expect)
    return app
