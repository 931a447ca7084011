"""The server's lifetime: the ledger it reads, its runs' feeds, the pump that keeps the
followed feeds caught up, and the aiohttp application that answers.

The pump catches up every feed that has a client streaming it when the ledger moved:
on PostgreSQL it is told (``LISTEN``: each append notifies on commit); on SQLite it
looks at the ledger file's stamp every ``FILE_LOOK_S`` (two ``stat`` calls, no read)
and reads the tails when the stamp moved. On both it also reads them every
``poll_interval_s`` whatever it was told — the fallback for a lost notification. A
feed nobody streams is caught up by the request that asks for it. Reads block, so they
run on a small pool of worker threads; the event loop only moves what they return.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web

from fleetledger.errors import FleetledgerError
from fleetledger.logs import get_logger
from fleetledger.store.log import EventLog
from fleetledger.store.postgres_listen import AppendListener
from fleetledger.store.sqlite_file import FileStamp, change_stamp
from fleetledger.store.urls import parse_db_url, sqlite_path
from fleetledger.web.doors import Doors, DoorsRefused, doors_for
from fleetledger.web.feeds import RunFeed
from fleetledger.web.guard import GuardedHandler, Limits, accept_burst, quiet_accept_errors
from fleetledger.web.ledger_source import LedgerSource
from fleetledger.web.metrics import ServeMetrics

DEFAULT_PORT = 8321
DEFAULT_HOST = "127.0.0.1"
FULL_LOOK_S = 1.0  # the tails are read at least this often, whatever the news says
FILE_LOOK_S = 0.005  # a SQLite ledger's file stamp is looked at this often
READ_THREADS = 4

T = TypeVar("T")


class ServeError(FleetledgerError):
    """The server cannot start: the address is taken or cannot be bound."""


_log = get_logger("fleetledger.web")


class ServedLedger:
    """Everything one server holds: the ledger source, the feeds, the metrics."""

    def __init__(self, db_url: str | None, *, poll_interval_s: float | None = None) -> None:
        if poll_interval_s is not None and not poll_interval_s > 0:
            raise ValueError(f"the poll interval must be positive, got {poll_interval_s}")
        self.source = LedgerSource(db_url)
        self._poll_asked = poll_interval_s
        self.executor = ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fleetledger-read")
        self.feeds: dict[str, RunFeed] = {}
        self.metrics = ServeMetrics()
        self.listening = False
        self.closing = asyncio.Event()
        self._wake = asyncio.Event()
        self._listener: Any = None
        self._pump_task: asyncio.Task[None] | None = None
        self._last_problem = ""
        self._file = None
        if self.source.backend == "sqlite":
            self._file = sqlite_path(parse_db_url(self.source.url))
        self._stamp: FileStamp | None = None

    @property
    def poll_interval_s(self) -> float:
        return FULL_LOOK_S if self._poll_asked is None else self._poll_asked

    def _file_moved(self) -> bool:
        """On SQLite: whether the ledger file's stamp moved since the last look."""
        if self._file is None:
            return False
        stamp = change_stamp(self._file)
        moved, self._stamp = stamp != self._stamp, stamp
        return moved

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a read thread."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def _head_seq(self, run: str) -> int:
        with self.source.reading() as log:
            return log.run_head(run).seq  # an unknown run: UnknownRun, naming the runs

    async def feed(self, run: str) -> RunFeed:
        """The run's feed, caught up with everything committed before the call."""
        if self.source.replaced():
            self._forget_feeds()
        feed = self.feeds.get(run)
        if feed is None:
            head = await self.read(self._head_seq, run)
            feed = self.feeds.setdefault(run, RunFeed(self.source, run, head))
        await feed.catch_up(self.executor)
        return feed

    def first_look(self) -> str | None:
        """Open the ledger now: None if it can be read, else why not (one line)."""
        try:
            with self.source.reading() as log:
                log.runs()
        except FleetledgerError as exc:
            return str(exc)
        return None

    def with_log(self, fn: Callable[[EventLog], T]) -> Callable[[], T]:
        """``fn`` given the open log, for :meth:`read`."""

        def call() -> T:
            with self.source.reading() as log:
                return fn(log)

        return call

    # ── the pump ────────────────────────────────────────────────────────────────

    async def start(self) -> None:
        self.closing = asyncio.Event()
        self._wake = asyncio.Event()
        # The listener is the pump's first work, not the server's start: a database that
        # never answers would hold the start (and the URL it prints) to its connect timeout.
        self._pump_task = asyncio.create_task(self._pump(), name="fleetledger-pump")

    async def _listen_if_pushed(self) -> None:
        """On PostgreSQL, listen for appends; tried again by the pump until it works."""
        if self.source.backend != "postgresql" or self._listener is not None:
            return
        self._listener = await self.read(self._new_listener, asyncio.get_running_loop())
        if self._listener is not None:
            self._listener.start()

    def _new_listener(self, loop: asyncio.AbstractEventLoop) -> AppendListener | None:
        def on_loop(fn: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server stopped
                loop.call_soon_threadsafe(fn, *args)

        try:
            with self.source.reading() as log:
                return AppendListener(
                    log.database,
                    lambda run, seq: on_loop(self._wake.set),
                    lambda state: on_loop(self._listening_is, state),
                )
        except Exception as exc:  # no ledger yet: poll, and try again later
            self._say_problem(f"not listening for appends ({exc}); polling")
            return None

    def _listening_is(self, state: str) -> None:
        self.listening = state == "listening"
        self.metrics.listening.set(1 if self.listening else 0)
        if not self.listening:
            self._say_problem(state)
        self._wake.set()  # catch up at once: appends may have gone unannounced

    def follower_joined(self) -> None:
        """A client began to follow a run: the pump, which may be taking a long nap (no
        one followed anything), looks again now and from then on every ``FILE_LOOK_S``."""
        self._wake.set()

    def _say_problem(self, text: str) -> None:
        """One warning per distinct problem, not one per poll."""
        if text != self._last_problem:
            self._last_problem = text
            _log.warning("serve", problem=text, ledger=self.source.display_url)

    async def _pump(self) -> None:
        loop = asyncio.get_running_loop()
        await self._listen_if_pushed()
        looked = loop.time()
        while not self.closing.is_set():
            followed = [f for f in self.feeds.values() if f.subscribers and not f.ended]
            # The file's stamp is looked at often only while someone follows a run.
            quick = self._file is not None and followed
            try:
                await asyncio.wait_for(
                    self._wake.wait(), FILE_LOOK_S if quick else self.poll_interval_s
                )
            except TimeoutError:
                pass
            told = self._wake.is_set()
            self._wake.clear()
            now = loop.time()
            if not (told or (quick and self._file_moved()) or now - looked >= self.poll_interval_s):
                continue
            looked = now
            await self._listen_if_pushed()
            if self.source.replaced():
                self._forget_feeds()
            for feed in followed:
                try:
                    await feed.catch_up(self.executor)
                except Exception as exc:  # the ledger is away: say so once, go on
                    self._say_problem(f"run {feed.run!r}: {exc}")

    def _forget_feeds(self) -> None:
        """The ledger file was replaced: what the feeds folded is another ledger's. Their
        streams end (clients resume by id against the new file); feeds start afresh."""
        feeds, self.feeds = self.feeds, {}
        for feed in feeds.values():
            feed.drop_subscribers()

    async def stop(self) -> None:
        self.closing.set()
        if self._pump_task is not None:
            self._pump_task.cancel()
            try:
                await self._pump_task
            except asyncio.CancelledError:
                pass
        if self._listener is not None:
            await self.read(self._listener.stop)
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.source.close()


SERVED = web.AppKey("served", ServedLedger)  # the application's one piece of state
DOORS = web.AppKey("doors", Doors)  # who may read it (fleetledger.web.doors)


# ── running it ─────────────────────────────────────────────────────────────────


@dataclass
class RunningServer:
    """A server started in this process (``start_server``): its URL, and how to stop it."""

    url: str
    port: int
    served: ServedLedger
    _loop: asyncio.AbstractEventLoop
    _thread: threading.Thread
    _stop: asyncio.Event

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)


def _bound_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), refused in one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


@dataclass(frozen=True)
class Access:
    """What ``serve`` was told about who may read: ``--allow-host``, the token, and
    ``--no-auth`` (fleetledger.web.doors)."""

    allow_hosts: tuple[str, ...] = ()
    token: str | None = None
    no_auth: bool = False


@contextlib.asynccontextmanager
async def _serving(
    db_url: str | None,
    host: str,
    port: int,
    poll_interval_s: float | None,
    access: Access = Access(),
    limits: Limits | None = None,
) -> AsyncIterator[tuple[str, int, ServedLedger]]:
    """The server up from enter to exit: (url, port, served)."""
    from fleetledger.web.app import make_app  # it imports this module (SERVED): a cycle

    sock = _bound_socket(host, port)
    try:
        doors = doors_for(
            sock.getsockname()[0],
            host,
            allow_hosts=access.allow_hosts,
            token=access.token,
            no_auth=access.no_auth,
        )
    except DoorsRefused as refused:
        sock.close()
        raise ServeError(str(refused)) from None
    served = ServedLedger(db_url, poll_interval_s=poll_interval_s)
    await served.start()
    runner = web.AppRunner(make_app(served, doors), shutdown_timeout=1.0, access_log=None)
    listening: asyncio.Server | None = None
    try:
        await runner.setup()
        loop = asyncio.get_running_loop()
        quiet_accept_errors(loop)
        bounds = limits or Limits()
        server = runner.server
        if server is None:  # setup() makes it; without it there is nothing to serve
            raise ServeError("the web application did not set up its server")
        listening = await loop.create_server(
            lambda: GuardedHandler(server, loop=loop, limits=bounds, access_log=None),
            sock=sock,
            backlog=accept_burst(),
        )
        bound_port = sock.getsockname()[1]
        yield url_of(host, bound_port), bound_port, served
    finally:
        served.closing.set()  # streams end before the runner waits for their handlers
        if listening is not None:
            listening.close()
        await runner.cleanup()
        await served.stop()
        sock.close()


async def _cancel_leftovers() -> None:
    """Cancel and await what the runner let go of (a stream handler still waiting)."""
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in leftover:
        task.cancel()
    await asyncio.gather(*leftover, return_exceptions=True)


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def start_server(
    db_url: str | None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    poll_interval_s: float | None = None,
    access: Access = Access(),
    limits: Limits | None = None,
) -> RunningServer:
    """Serve the ledger from a thread of this process (``simulate --serve``, tests);
    returns once it listens (port 0: a free port, read back into ``url``)."""
    ready: dict[str, Any] = {}
    started = threading.Event()

    async def serve() -> None:
        stop = asyncio.Event()
        try:
            async with _serving(db_url, host, port, poll_interval_s, access, limits) as (
                url,
                bound,
                served,
            ):
                ready.update(url=url, port=bound, served=served, stop=stop)
                started.set()
                await stop.wait()
        except BaseException as exc:
            if not started.is_set():
                ready["error"] = exc
                started.set()
                return
            raise

    loop = asyncio.new_event_loop()

    def main() -> None:
        try:
            loop.run_until_complete(serve())
        finally:
            loop.run_until_complete(_cancel_leftovers())
            loop.close()

    thread = threading.Thread(target=main, name="fleetledger-serve", daemon=True)
    thread.start()
    started.wait()
    if "error" in ready:
        thread.join()
        raise ready["error"]
    return RunningServer(ready["url"], ready["port"], ready["served"], loop, thread, ready["stop"])


def serve_forever(
    db_url: str | None,
    host: str,
    port: int,
    *,
    poll_interval_s: float | None = None,
    on_listening: Callable[[str, ServedLedger], None] | None = None,
    on_first_look: Callable[[str | None], None] | None = None,
    access: Access = Access(),
) -> None:
    """Serve until interrupted (``fleetledger serve``); ``on_listening(url, served)`` once
    the socket is bound, ``on_first_look(problem)`` once the ledger was first looked at
    (None: it can be read; else why not, one line)."""

    async def serve() -> None:
        async with _serving(db_url, host, port, poll_interval_s, access) as (url, _, served):
            if on_listening is not None:
                on_listening(url, served)
            if on_first_look is not None:  # off the loop: the database may never answer
                on_first_look(await served.read(served.first_look))
            await asyncio.Event().wait()

    asyncio.run(serve())
