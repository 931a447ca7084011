"""The live page: one HTML document, its script and styles, served from the package.

Nothing is fetched from anywhere else and nothing is built: three files under
``static/`` and two style sheets written here from the timeline's own palette and
styles, so a shard's colour on the page is its colour in ``timeline -o x.html``. The
page reads the same ``/api/v1/`` a script would, and follows the run's stream.

Data is never markup: the script puts every text from the ledger in with
``textContent``; the one exception is the timeline, which arrives drawn by the
timeline's HTML painter, whose every text is escaped where it is painted. The Content
Security Policy allows nothing but this server.
"""

from __future__ import annotations

from functools import cache
from html import escape
from importlib.resources import files

from aiohttp import web

from fleetledger.timeline.html import TIMELINE_CSS
from fleetledger.timeline.palette import STATE_COLOURS
from fleetledger.web.server import DOORS, SERVED

CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; img-src 'self' data:; "
    # the timeline's painter colours its end line with a style attribute
    "style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
# On every response of the server (``app``), the API's too.
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}
TYPES = {".js": "text/javascript", ".css": "text/css"}
SHIPPED = ("page.js", "page.css")  # served as they are in static/


def _package_file(name: str) -> str:
    return files("fleetledger.web").joinpath("static", name).read_text(encoding="utf-8")


def states_css() -> str:
    """A state's colour on the page: the timeline palette's colour for it."""
    return "".join(
        f".state-{state.value} .chip {{ background: {colour}; }}\n"
        for state, colour in STATE_COLOURS.items()
    )


@cache
def static_files() -> dict[str, tuple[str, str]]:
    """name → (content type, text) of everything under ``/static/``."""
    out = {name: (TYPES[name[name.rindex(".") :]], _package_file(name)) for name in SHIPPED}
    out["timeline.css"] = ("text/css", TIMELINE_CSS)
    out["states.css"] = ("text/css", states_css())
    return out


async def index(request: web.Request) -> web.Response:
    # Open without the token (the shell only): then it names no ledger either.
    guarded = request.app[DOORS].token is not None
    ledger = "" if guarded else escape(request.app[SERVED].source.display_url, quote=True)
    text = _package_file("index.html").replace("{{ledger}}", ledger)
    return web.Response(text=text, content_type="text/html")


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    found = static_files().get(name)
    if found is None:
        raise web.HTTPNotFound()
    kind, text = found
    return web.Response(text=text, content_type=kind, headers={"Cache-Control": "no-cache"})
