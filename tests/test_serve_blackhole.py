"""``serve`` in front of a PostgreSQL server that accepts and never answers.

Found by a hostile pass (issue 36): twelve API requests got no answer in 60 s, and
``/static/page.js``, which reads no ledger, took 59.6 s — the ledger was opened under a
lock the event loop also takes, so one hanging connect froze the whole server. Here a
real TCP proxy stands between ``serve`` and the project's real PostgreSQL: first a black
hole (it accepts and holds every connection, sending nothing), then a pipe. The page and
its files answer while API requests wait on the black hole; they end in a 503 in one line
when the connections are dropped; once the proxy passes bytes, the API answers 200.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import pytest

from fleetledger.store.log import EventLog
from fleetledger.web import start_server
from tests.builders import run_started
from tests.fake_engines import wait_until
from tests.http_clients import get

pytestmark = pytest.mark.postgres


class Proxy:
    """A TCP proxy to ``target`` that starts as a black hole."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.passing = threading.Event()
        self.held: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            if not self.passing.is_set():
                self.held.append(client)  # accepted, never answered
                continue
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def hang_up(self) -> None:
        """Close every connection held so far (the server went away)."""
        held, self.held = self.held, []
        for sock in held:
            sock.close()

    def close(self) -> None:
        self._stop = True
        self._server.close()
        self.hang_up()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def proxied(migrated_postgres_url: str) -> Iterator[tuple[Proxy, str]]:
    with EventLog.open(migrated_postgres_url) as log:
        log.append("r", [run_started(2)])
    parts = urlsplit(migrated_postgres_url)
    proxy = Proxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{proxy.port}"
    netloc_via = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
    query = "connect_timeout=60" + (f"&{parts.query}" if parts.query else "")
    yield proxy, urlunsplit((parts.scheme, netloc_via, parts.path, query, ""))
    proxy.close()


def test_a_database_that_never_answers_freezes_nothing_and_serve_recovers(proxied):
    proxy, url = proxied
    server = start_server(url, port=0, poll_interval_s=0.2)
    try:
        with ThreadPoolExecutor(4) as pool:
            api = [pool.submit(get, f"{server.url}api/v1/runs/r/membership") for _ in range(3)]
            wait_until(lambda: len(proxy.held) >= 2, "the API's opens held by the black hole")
            # The page, its files and the metrics read no ledger: answered while the API
            # waits on the black hole (its connect timeout is 60 s; the clients' own
            # bound, 30 s, only keeps a frozen server from hanging the test).
            for path in ("", "static/page.js", "static/page.css", "runs/r", "metrics"):
                assert get(f"{server.url}{path}", timeout=30)[0] == 200, path
            assert not any(f.done() for f in api), "the API did not wait on the black hole"
            proxy.hang_up()  # the database goes away: the waiting requests end, in words
            for done in api:
                status, kind, body = done.result(timeout=60)
                assert (status, kind.split(";")[0]) == (503, "application/json")
                assert "cannot use the ledger database" in json.loads(body)["error"]
        proxy.passing.set()  # and comes back: the next request reads it
        status, _, body = get(f"{server.url}api/v1/runs/r/membership")
        assert status == 200 and json.loads(body)["run"] == "r"
    finally:
        server.stop()
