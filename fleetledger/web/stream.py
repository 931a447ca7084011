"""``GET /api/v1/runs/{run}/stream``: a run's new history entries as server-sent events.

Each entry is an ``entry`` event whose ``id`` is the entry's ``SEQ.I`` (:mod:`.entry_ids`)
and whose data is the entry's JSON (``replay --json``'s line, with ``id``). A ``head``
event (no id) says the seq the run has reached whenever it moves, entries or not. When
the run has ended the stream sends its ``end`` entry, an ``ended`` event, and closes.

Where it starts: after ``Last-Event-ID`` (the header a browser's ``EventSource`` sends
when it reconnects), else after ``?after=ID``, else at the head (new entries only). A
resumed stream first sends what the client missed — from the feed's kept entries, or
from the log — then goes on live; ids only grow, so nothing is sent twice. A comment
line every ``KEEPALIVE_S`` keeps proxies from closing a quiet stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from aiohttp import web

from fleetledger.logs import get_logger
from fleetledger.queries import Follower
from fleetledger.web.entry_ids import WHOLE_SEQ, EntryId, Numbering, id_text, parse_entry_id
from fleetledger.web.feeds import (
    Batch,
    RunFeed,
    Subscriber,
    WireEntry,
    lag_seconds,
    wire_entries,
)
from fleetledger.web.problems import bad_request, problem_body, problem_of
from fleetledger.web.server import SERVED, ServedLedger

KEEPALIVE_S = 15.0
_log = get_logger("fleetledger.web")
HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",  # nginx: pass each event on, do not buffer the stream
}


def _resume_point(request: web.Request) -> EntryId | None:
    header = request.headers.get("Last-Event-ID")
    if header:
        return parse_entry_id(header, "Last-Event-ID")
    after = request.query.get("after")
    return None if after is None else parse_entry_id(after, "after")


def _missed_from_log(served: ServedLedger, run: str, after: EntryId) -> list[WireEntry]:
    """In a read thread: every entry after ``after`` up to the log's head."""
    seq, index = after
    from_seq = seq + 1 if index == WHOLE_SEQ else max(seq, 1)
    with served.source.reading() as log:
        follower = Follower(log, run, from_seq=from_seq)
        entries = follower.poll()
    config = follower.history.view.config
    return [e for e in wire_entries(entries, Numbering(), config) if e.id > after]


def _message(entry: WireEntry) -> bytes:
    return f"id: {id_text(entry.id)}\nevent: entry\ndata: {entry.json}\n\n".encode()


class _Writer:
    """One client's response, and how far it got."""

    def __init__(self, response: web.StreamResponse, served: ServedLedger, sent: EntryId) -> None:
        self.response = response
        self.served = served
        self.sent = sent

    async def entries(self, batch: list[WireEntry], *, live: bool) -> bool:
        """Write what the client has not had; True once the run's end was written."""
        fresh = [e for e in batch if e.id > self.sent]
        if not fresh:
            return False
        await self.response.write(b"".join(_message(e) for e in fresh))
        self.sent = fresh[-1].id
        if live:
            for entry in fresh:
                self.served.metrics.stream_lag.observe(lag_seconds(entry))
        return any(e.ends_run for e in fresh)

    async def event(self, name: str, data: object) -> None:
        await self.response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())


async def stream(request: web.Request) -> web.StreamResponse:
    served, run = request.app[SERVED], request.match_info["run"]
    after = _resume_point(request)
    feed = await served.feed(run)
    if after is not None and after[0] > feed.seq:
        raise bad_request(
            f"resume point {id_text(after) if after[1] != WHOLE_SEQ else after[0]}: "
            f"run {run!r} has seqs 1..{feed.seq}"
        )
    subscriber = feed.subscribe()  # from here on, every batch reaches this client
    served.follower_joined()
    response = web.StreamResponse(headers=HEADERS)
    # Where this client stands, taken with the subscription (no await between them).
    writer = _Writer(response, served, feed.last_id if after is None else after)
    served.metrics.stream_clients.inc()
    try:
        await response.prepare(request)
        await _follow(served, feed, writer, subscriber, after)
    except ConnectionResetError:
        pass  # the client went away: nothing to answer
    except Exception as exc:  # the ledger failed as the stream began: say so, end it
        status, message = problem_of(exc)
        if status == 500:
            _log.error("stream failed", path=request.path, error=message)
        with contextlib.suppress(Exception):
            await writer.event("error", problem_body(status, message))
    finally:
        feed.unsubscribe(subscriber)
        served.metrics.stream_clients.dec()
    return response


async def _next_batch(served: ServedLedger, subscriber: Subscriber) -> Batch | None:
    """The next batch; None after ``KEEPALIVE_S`` without one, or when the server stops."""
    getting = asyncio.ensure_future(subscriber.queue.get())
    stopping = asyncio.ensure_future(served.closing.wait())
    try:
        await asyncio.wait({getting, stopping}, timeout=KEEPALIVE_S, return_when="FIRST_COMPLETED")
    finally:
        stopping.cancel()
        if not getting.done():
            getting.cancel()
    return getting.result() if getting.done() and not getting.cancelled() else None


async def _follow(
    served: ServedLedger,
    feed: RunFeed,
    writer: _Writer,
    subscriber: Subscriber,
    after: EntryId | None,
) -> None:
    if after is None and feed.ended:
        # Following a run that has ended tells how it ended: its end entry, at once.
        after = writer.sent = (feed.seq - 1, WHOLE_SEQ)
    ended = False
    if after is not None:
        missed = feed.recent_after(after)
        if missed is None:
            missed = await served.read(_missed_from_log, served, feed.run, after)
        ended = await writer.entries(missed, live=False)
    ended = ended or (feed.ended and writer.sent >= feed.last_id)
    await writer.event("head", {"seq": feed.seq})
    # Batches come in the feed's order and carry every entry after the subscription:
    # the run's end arrives in one of them, after everything before it.
    while not ended:
        batch = await _next_batch(served, subscriber)
        if served.closing.is_set():
            return  # the server is stopping: the client reconnects to the next one
        if batch is None:
            await writer.response.write(b": keepalive\n\n")
            continue
        if subscriber.dropped:
            served.metrics.dropped.inc()
            return  # the client reconnects with its last id and catches up
        ended = await writer.entries(batch.entries, live=True)
        await writer.event("head", {"seq": batch.seq})
    await writer.event("ended", {"seq": feed.seq})
