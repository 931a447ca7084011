"""The JSON endpoints: each reads what the matching command reads and answers its JSON.

Parameters are checked here, in words that name the parameter (``at``, ``from``,
``limit``, ``shard``); the reads run on the server's read threads; a live run's
"now" is its feed, caught up first, so an answer includes every event committed before
the request. Documented in ``docs/http.md``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from fleetledger.events.models import shard_outside
from fleetledger.projections.json_form import json_value
from fleetledger.projections.lanes import lanes_of
from fleetledger.projections.membership import membership_document
from fleetledger.queries import RunReader, read_history
from fleetledger.queries.runs import list_runs
from fleetledger.store.log import EventLog
from fleetledger.timeline import build_scene
from fleetledger.timeline.html import fragment
from fleetledger.web.entry_ids import Numbering, id_text, is_digits
from fleetledger.web.feeds import WireEntry
from fleetledger.web.problems import bad_request, not_found
from fleetledger.web.server import SERVED, ServedLedger

HISTORY_LIMIT = 100  # entries per page unless asked
MAX_HISTORY_LIMIT = 5_000
AXES = ("time", "seq")
FORMATS = ("json", "html")


def _json(body: Any) -> web.Response:
    return web.Response(text=json.dumps(body), content_type="application/json")


def _served(request: web.Request) -> ServedLedger:
    return request.app[SERVED]


def int_param(request: web.Request, name: str, default: int | None, *, low: int = 0) -> int | None:
    text = request.query.get(name)
    if text is None:
        return default
    if not is_digits(text.strip()) or len(text.strip()) > 18 or int(text) < low:
        raise bad_request(f"{name}={text[:40]!r}: give an integer of at least {low}")
    return int(text)


def choice_param(request: web.Request, name: str, choices: tuple[str, ...]) -> str:
    value = request.query.get(name, choices[0])
    if value not in choices:
        raise bad_request(f"{name}={value[:40]!r}: choose one of {', '.join(choices)}")
    return value


def at_seq(reader: RunReader, at: str | None) -> int | None:
    """``?at=SEQ|TIME`` as a seq of the run; a seq outside it is refused naming its range."""
    seq = reader.seq_of(at, "at")
    if seq is not None and not 1 <= seq <= reader.head.seq:
        raise bad_request(f"at={at!r}: run {reader.run!r} has seqs 1..{reader.head.seq}")
    return seq


def shard_problem(text: str, shard_count: int) -> str | None:
    """Why ``text`` names no shard of a run of ``shard_count`` shards; None if it does."""
    if not is_digits(text) or len(text) > 9:
        return "not a shard number"
    return shard_outside(int(text), shard_count)


def shard_param(request: web.Request, reader: RunReader) -> int:
    """The path's shard: one the run does not have is not found (404)."""
    text = request.match_info["shard"]
    problem = shard_problem(text, reader.config.shard_count)
    if problem is not None:
        raise not_found(f"shard {text[:40]!r}: run {reader.run!r}: {problem}")
    return int(text)


def shard_filter(text: str | None, shard_count: int, run: str) -> int | None:
    """The ``?shard=`` filter: one the run does not have is a bad request (400)."""
    if text is None:
        return None
    problem = shard_problem(text, shard_count)
    if problem is not None:
        raise bad_request(f"shard={text[:40]!r}: run {run!r}: {problem}")
    return int(text)


# ── endpoints ──────────────────────────────────────────────────────────────────


async def runs(request: web.Request) -> web.Response:
    served = _served(request)
    listings = await served.read(served.with_log(list_runs))
    return _json([listing.as_json() for listing in listings])


async def membership(request: web.Request) -> web.Response:
    served, run = _served(request), request.match_info["run"]
    at = request.query.get("at")
    if at is None:  # now: the feed, caught up, its document serialised once per seq
        feed = await served.feed(run)
        return web.Response(body=feed.membership_json, content_type="application/json")

    def read(log: EventLog) -> dict[str, Any]:
        reader = RunReader(log, run)
        return membership_document(reader.view(at_seq(reader, at)))

    return _json(await served.read(served.with_log(read)))


def _entries_json(run: str, meta: dict[str, Any], entries: list[WireEntry]) -> str:
    head = json.dumps({"run": run, **meta})[:-1]
    return head + ',"entries":[' + ",".join(e.json for e in entries) + "]}"


async def history(request: web.Request) -> web.Response:
    """``?from=SEQ``: the entries from that seq on, ``limit`` at a time (a seq's entries
    never split), with ``next`` to ask for the page after; without it, the run's latest
    entries (those the feed keeps) with ``stream_after``, the id to stream on from."""
    served, run = _served(request), request.match_info["run"]
    limit = int_param(request, "limit", HISTORY_LIMIT, low=1) or HISTORY_LIMIT
    if limit > MAX_HISTORY_LIMIT:
        raise bad_request(f"limit={limit}: at most {MAX_HISTORY_LIMIT} entries a page")
    from_seq = int_param(request, "from", None, low=1)
    shard_text = request.query.get("shard")
    if from_seq is None:
        feed = await served.feed(run)
        shard = shard_filter(shard_text, len(feed.membership["shards"]), run)
        kept = [e for e in feed.recent if e.about(shard)][-limit:]
        # After the last entry; with none in the feed's window, after the head's seq
        # (never "0.0", which would replay the whole run into the stream).
        after = id_text(feed.last_id) if feed.last_id[0] else str(feed.seq)
        meta = {"head": feed.seq, "ended": feed.ended, "stream_after": after}
        return web.Response(text=_entries_json(run, meta, kept), content_type="application/json")

    def read(log: EventLog) -> str:
        reader = RunReader(log, run)
        shard = shard_filter(shard_text, reader.config.shard_count, run)
        if from_seq > reader.head.seq:
            raise bad_request(f"from={from_seq}: run {run!r} has seqs 1..{reader.head.seq}")
        page, next_seq = _history_page(log, reader, from_seq, limit, shard)
        meta = {"from": from_seq, "head": reader.head.seq, "next": next_seq}
        return _entries_json(run, meta, page)

    return web.Response(
        text=await served.read(served.with_log(read)), content_type="application/json"
    )


def _history_page(
    log: EventLog, reader: RunReader, from_seq: int, limit: int, shard: int | None
) -> tuple[list[WireEntry], int | None]:
    """Up to ``limit`` entries from ``from_seq``, whole seqs only; and the next page's seq."""
    numbering = Numbering()
    page: list[WireEntry] = []
    for entry in read_history(log, reader.run, from_seq=from_seq, head=reader.head, finish=False):
        if len(page) >= limit and entry.seq != page[-1].seq:
            return page, entry.seq
        wired = WireEntry.of(entry, numbering.next_id(entry.seq), reader.config)
        if wired.about(shard):
            page.append(wired)
    return page, None


async def explain_run(request: web.Request) -> web.Response:
    return await _explain(request, shard_in_path=False)


async def explain_shard(request: web.Request) -> web.Response:
    return await _explain(request, shard_in_path=True)


async def _explain(request: web.Request, *, shard_in_path: bool) -> web.Response:
    served, run = _served(request), request.match_info["run"]
    at = request.query.get("at")

    def read(log: EventLog) -> dict[str, Any]:
        reader = RunReader(log, run)
        shard = shard_param(request, reader) if shard_in_path else None
        explanation = reader.explain(shard, at_seq(reader, at))
        return {**explanation.as_json(), "text": explanation.text}

    return _json(await served.read(served.with_log(read)))


async def timeline(request: web.Request) -> web.Response:
    """The timeline's scene, as data (JSON) or drawn (``format=html``: the fragment the
    page sets, painted by ``timeline -o x.html``'s own painter); one per head seq."""
    served, run = _served(request), request.match_info["run"]
    axis = choice_param(request, "axis", AXES)
    fmt = choice_param(request, "format", FORMATS)
    feed = await served.feed(run)
    seq = feed.seq
    key = (seq, axis, fmt)
    drawn = feed.drawings.get(key)
    if drawn is None:
        drawn = await served.read(served.with_log(lambda log: _draw(log, feed.run, seq, axis, fmt)))
        if seq >= max((k[0] for k in feed.drawings), default=0):
            feed.drawings = {key: drawn}  # only the latest: a live run moves on
    kind = "text/html" if fmt == "html" else "application/json"
    return web.Response(text=drawn, content_type=kind)


def _draw(log: EventLog, run: str, seq: int, axis: str, fmt: str) -> str:
    scene = build_scene(lanes_of(log.read(run, 0, seq)), axis)  # type: ignore[arg-type]
    return fragment(scene) if fmt == "html" else json.dumps(json_value(scene))


async def metrics(request: web.Request) -> web.Response:
    body = _served(request).metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
