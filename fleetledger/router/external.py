"""The field's routers, as worker registries reached over HTTP: SMG and vllm-router.

``router-sync`` keeps an external router's worker set equal to the ledger's serving
set; this file is everything it knows about talking to one. Rules of this file, each
checked against the real binaries (SMG 1.13, vllm-router 0.1.17):

- **A worker is the engine's origin**, ``http://host:port`` without ``/v1``: both
  routers probe ``URL + /health`` and append the client's ``/v1/...`` path, so a base
  URL with ``/v1`` is refused (vllm-router times out probing ``/v1/health``). Listed
  URLs are compared **exactly**: SMG keeps ``http://h:p/`` and ``http://h:p`` as two
  workers and sends the first one's requests to ``http://h:p//v1/...`` (404 to every
  request, which it counts as successes), so a listed URL that is not exactly a
  serving shard's origin is not that shard.
- **SMG** (``smg launch``): ``GET /workers`` lists ``{id, url, status, is_healthy}``;
  ``POST /workers`` with ``{"url": ...}`` answers 202 with the new worker's id and adds
  in the background after probing ``/health`` (even with ``--disable-health-check``; a
  worker failing it is probed again every ``--worker-startup-check-interval`` s, 30 by
  default, up to ``--worker-startup-timeout-secs``, 1800 by default, and is not listed
  meanwhile). Such a pending add cannot be cancelled (a ``DELETE`` of its id fails in
  the background, and the add still lands): ``GET /workers/{id}`` says ``pending``
  until it lands (``ready``) or is given up (404). 409 means the URL is listed already
  or its add is under way (``WORKER_CREATE_IN_PROGRESS``, naming the id).
  ``DELETE /workers/{id}`` answers 202; the worker is listed ``draining`` at once
  (no new request reaches it) and gone 5 s later. Its own health checks (when on) list
  a failing worker ``failed``, unhealthy.
- **vllm-router**: ``GET /list_workers`` is ``{"urls": [...]}``; ``POST
  /add_worker?url=`` blocks until the worker answers ``/health`` (up to
  ``--worker-startup-timeout-secs``, 600 by default, re-probing every
  ``--worker-startup-check-interval``, 30 by default) and is abandoned if the caller
  hangs up (:class:`Hangup`); ``POST /remove_worker?url=`` answers 200 (also for a URL
  it never had). Its health checker cannot be switched off (an interval of 0 panics
  it): a worker failing it stays listed and is skipped, which only its metrics show
  (``vllm_router_worker_health{worker} 0``, read by :meth:`Registry.ejected`).
- Both count every dispatched request's outcome per worker URL on their Prometheus
  port, also with the circuit breaker off: ``smg_worker_cb_outcomes_total`` /
  ``vllm_router_cb_outcomes_total`` ``{worker, outcome="success"|"failure"}``
  (observed: 2xx and 4xx are successes; 5xx and connection errors failures).
- Every call has **one deadline for the whole exchange** (connecting, sending, every
  read of the answer; an add to vllm-router a longer one, it waits for the engine)
  and fails as :class:`ExternalRouterError`, one line naming the router, the call and
  what came back. A per-read timeout is not enough: a router that trickles one byte a
  second would hold a call forever. Resolving a host name is the one step left to the
  system's resolver and its own timeouts.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from fleetledger.errors import FleetledgerError

__all__ = [
    "ADD_TIMEOUT_S",
    "CALL_TIMEOUT_S",
    "OUTCOME_SAMPLES",
    "REGISTRIES",
    "AddAnswer",
    "ExternalRouterError",
    "Hangup",
    "ListedWorker",
    "Presence",
    "Registry",
    "SmgRegistry",
    "VllmRouterRegistry",
    "counter_samples",
    "fetch_metrics",
    "http_origin",
]

CALL_TIMEOUT_S = 2.0  # list, remove, metrics, an add's state: the router answers at once
ADD_TIMEOUT_S = 30.0  # vllm-router holds an add until the engine answers /health
MAX_BODY = 16 * 1024 * 1024  # a listing or a metrics page; anything larger is refused


class ExternalRouterError(FleetledgerError):
    """An external router could not be reached, or answered what it should not have."""


class Presence(StrEnum):
    """How a listed worker stands in the external router."""

    ROUTED = "routed"
    """Listed and taking new requests."""
    ADDING = "adding"
    """Listed while the router is still adding it: no request yet, but soon."""
    DRAINING = "draining"
    """Being removed by the router: no new request reaches it; gone soon."""
    EJECTED = "ejected"
    """Listed, but the router stopped routing to it on its own (its health checks)."""


@dataclass(frozen=True, slots=True)
class ListedWorker:
    """One worker as its router lists it; ``handle`` is what removing it takes (SMG: its
    id; vllm-router: its URL)."""

    url: str
    presence: Presence
    handle: str


@dataclass(frozen=True, slots=True)
class AddAnswer:
    """What a router said to an add."""

    said: str
    """Its answer, in one line."""
    accepted: bool
    """It took a new add (a 2xx), as opposed to one it had listed or under way already."""
    pending: str | None = None
    """The router's handle on an add it completes later and cannot cancel (SMG: the
    worker's id), None when there is none (listed already, or added before answering)."""


class Hangup:
    """Lets another thread end a call in progress: vllm-router abandons an add whose
    caller hangs up, the only way to take back an add it is still waiting on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: _Bounded | None = None
        self._hung = False

    @property
    def hung(self) -> bool:
        return self._hung

    def hang_up(self) -> None:
        with self._lock:
            self._hung = True
            sock = self._sock
        if sock is not None:
            sock.shutdown()

    def _attach(self, sock: _Bounded) -> bool:
        with self._lock:
            self._sock = None if self._hung else sock
            return not self._hung

    def _detach(self) -> None:
        with self._lock:
            self._sock = None


class Registry(Protocol):
    """What ``router-sync`` calls on an external router."""

    kind: str
    url: str
    metrics_url: str | None
    abandons_on_hang_up: bool
    """True when hanging up on an add in progress takes it back (vllm-router)."""

    def workers(self) -> dict[str, ListedWorker]:
        """Every listed worker by URL."""
        ...

    def ejected(self) -> frozenset[str]:
        """Listed workers the router stopped routing to on its own, when only its
        metrics say so (vllm-router); empty where the listing says it (SMG)."""
        ...

    def add(self, url: str, hangup: Hangup | None = None) -> AddAnswer:
        """Ask for ``url`` to be added."""
        ...

    def add_pending(self, handle: str) -> bool:
        """Is the add with this :attr:`AddAnswer.pending` handle still waiting to land?"""
        ...

    def remove(self, worker: ListedWorker) -> str:
        """Ask for ``worker`` to be removed; returns what the router said, in one line."""
        ...


_MAX_HOST = 253  # a DNS name's limits
_MAX_LABEL = 63


def http_origin(url: str) -> str:
    """``scheme://netloc`` of an HTTP(S) URL with no path beyond ``/``: the form a
    router's own address and its metrics address must take. Raises ``ValueError``
    saying what is wrong with any other."""
    if url != url.strip() or any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        # urlsplit takes them, and the sync retried an address nobody could have meant
        # forever: "http:// 127.0.0.1:1".
        raise ValueError("holds spaces or control characters (the form is http://host:port)")
    try:
        parts = urlsplit(url)
        port = parts.port  # reading it checks it: a number from 0 to 65535
    except ValueError as exc:
        raise ValueError(f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError("is not an http(s) URL of the form http://host:port")
    host = parts.hostname
    if not host:
        raise ValueError("names no host (the form is http://host:port)")
    if len(host) > _MAX_HOST or any(len(label) > _MAX_LABEL for label in host.split(".")):
        raise ValueError(f"names a host of {len(host)} characters, which no DNS name is")
    if parts.username is not None or parts.password is not None:
        raise ValueError("carries credentials, which router-sync does not send")
    if port == 0:
        raise ValueError("has port 0, which nothing listens on (the form is http://host:port)")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError("has a path, query or fragment (the form is http://host:port)")
    return f"{parts.scheme}://{parts.netloc}"


# ── HTTP ─────────────────────────────────────────────────────────────────────────────


class _Bounded:
    """A connected socket on which every send and read waits only for what is left of
    one deadline (http.client's own timeout restarts at each read). Closed, like a
    socket, once it and the answer's reader are both closed."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self._readers = 0
        self._closed = False

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no whole answer within the call's deadline")
        self._sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self._arm()
        self._sock.sendall(data)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes, flags)

    def makefile(self, mode: str = "rb", *_args: Any, **_kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:  # SocketIO.close calls it, as on a socket
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def fileno(self) -> int:
        return self._sock.fileno()

    def shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # a blocked read returns at once
        except OSError:
            pass

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()


def _call(
    kind: str,
    base: str,
    method: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    timeout_s: float = CALL_TIMEOUT_S,
    hangup: Hangup | None = None,
) -> tuple[int, bytes]:
    """One request to ``base`` on a fresh connection (a restarted router is simply
    reached again), answered in full within ``timeout_s``; a transport failure, a
    deadline passed or a hang-up is an :class:`ExternalRouterError`."""
    deadline = time.monotonic() + timeout_s
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    conn: http.client.HTTPConnection | None = None
    response: http.client.HTTPResponse | None = None
    try:
        parts = urlsplit(base)
        https = parts.scheme == "https"
        cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
        conn = cls(parts.netloc, timeout=timeout_s)
        conn.connect()
        bounded = _Bounded(conn.sock, deadline)
        conn.sock = bounded
        if hangup is not None and not hangup._attach(bounded):
            raise ConnectionAbortedError("hung up before it was sent")
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read(MAX_BODY + 1)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        if hangup is not None and hangup.hung:
            why = "hung up by router-sync"
        else:
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ExternalRouterError(f"{kind} at {base}: {method} {path} failed ({why})") from None
    finally:
        if hangup is not None:
            hangup._detach()
        if response is not None:
            response.close()
        if conn is not None:
            conn.close()
    if len(payload) > MAX_BODY:
        raise ExternalRouterError(f"{kind} at {base}: {method} {path} answered over {MAX_BODY} B")
    return response.status, payload


def _said(payload: bytes) -> str:
    """A router's answer as one short line."""
    text = payload.decode("utf-8", "replace").strip()
    try:
        loaded = json.loads(text)
    except ValueError:
        loaded = None
    if isinstance(loaded, dict):
        text = str(loaded.get("error") or loaded.get("message") or loaded.get("status") or text)
    line = " ".join(text.split())
    return line[:300] or "(empty answer)"


def _refused(kind: str, base: str, what: str, status: int, payload: bytes) -> ExternalRouterError:
    return ExternalRouterError(f"{kind} at {base}: {what} answered {status}: {_said(payload)}")


def _json(kind: str, base: str, what: str, payload: bytes) -> Any:
    try:
        return json.loads(payload)
    except ValueError:
        raise ExternalRouterError(
            f"{kind} at {base}: {what} is not JSON: {_said(payload)}"
        ) from None


# ── metrics ──────────────────────────────────────────────────────────────────────────

# Per router: the counter of dispatched requests' outcomes by worker URL and outcome.
OUTCOME_SAMPLES: dict[str, str] = {
    "smg": "smg_worker_cb_outcomes_total",
    "vllm-router": "vllm_router_cb_outcomes_total",
}
_VLLM_ROUTER_HEALTH = "vllm_router_worker_health"


def fetch_metrics(kind: str, metrics_url: str) -> str:
    """The router's Prometheus page."""
    status, payload = _call(kind, metrics_url, "GET", "/metrics")
    if status != 200:
        raise _refused(kind, metrics_url, "GET /metrics", status, payload)
    return payload.decode("utf-8", "replace")


def counter_samples(
    kind: str, metrics_url: str, text: str, sample: str, labels: tuple[str, ...]
) -> dict[tuple[str, ...], float]:
    """Every sample named ``sample`` on the page, keyed by the values of ``labels``.

    A page is refused whole (:class:`ExternalRouterError`) when it does not parse, when
    such a sample lacks one of ``labels``, or when its value is not a finite number: a
    router that writes garbage is failing, and its numbers are not evidence.
    """
    found: dict[tuple[str, ...], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name != sample:
                    continue
                missing = [name for name in labels if name not in s.labels]
                if missing:
                    raise ValueError(f"a {sample} sample has no {', '.join(missing)} label")
                value = float(s.value)
                if not math.isfinite(value):
                    raise ValueError(f"a {sample} sample is {value}")
                found[tuple(s.labels[name] for name in labels)] = value
    except ValueError as exc:
        raise ExternalRouterError(
            f"{kind} at {metrics_url}: /metrics is not a usable Prometheus page ({exc})"
        ) from None
    return found


# ── SMG ──────────────────────────────────────────────────────────────────────────────

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class SmgRegistry:
    """SMG's worker registry (``GET/POST /workers``, ``GET/DELETE /workers/{id}``)."""

    kind = "smg"
    abandons_on_hang_up = False  # its add answers at once; the add itself is queued

    def __init__(self, url: str, metrics_url: str | None = None) -> None:
        self.url = url
        self.metrics_url = metrics_url

    def workers(self) -> dict[str, ListedWorker]:
        status, payload = _call(self.kind, self.url, "GET", "/workers")
        if status != 200:
            raise _refused(self.kind, self.url, "GET /workers", status, payload)
        listed = _json(self.kind, self.url, "GET /workers", payload)
        rows = listed.get("workers") if isinstance(listed, dict) else None
        if not isinstance(rows, list):
            raise ExternalRouterError(f"smg at {self.url}: GET /workers has no list of workers")
        workers: dict[str, ListedWorker] = {}
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("url"), str):
                continue
            url = row["url"]
            workers[url] = ListedWorker(url, _smg_presence(row), str(row.get("id", "")))
        return workers

    def ejected(self) -> frozenset[str]:
        return frozenset()  # its listing says "failed"

    def add(self, url: str, hangup: Hangup | None = None) -> AddAnswer:
        status, payload = _call(
            self.kind, self.url, "POST", "/workers", body={"url": url}, hangup=hangup
        )
        said = _said(payload)
        if 200 <= status < 300:  # 202: queued; it lands once the engine answers /health
            try:
                answer = json.loads(payload)
            except ValueError:
                answer = None
            worker_id = answer.get("worker_id") if isinstance(answer, dict) else None
            return AddAnswer(said, True, worker_id if isinstance(worker_id, str) else None)
        if status == 409:  # listed already, or its add is under way (the message names it)
            under_way = _UUID.search(said) if b"IN_PROGRESS" in payload else None
            return AddAnswer(said, False, under_way.group(0) if under_way else None)
        raise _refused(self.kind, self.url, f"POST /workers {url}", status, payload)

    def add_pending(self, handle: str) -> bool:
        path = f"/workers/{quote(handle, safe='')}"
        status, payload = _call(self.kind, self.url, "GET", path)
        if status == 404:  # given up (or landed and removed since)
            return False
        if status != 200:
            raise _refused(self.kind, self.url, f"GET {path}", status, payload)
        row = _json(self.kind, self.url, f"GET {path}", payload)
        return isinstance(row, dict) and row.get("status") == "pending"

    def remove(self, worker: ListedWorker) -> str:
        path = f"/workers/{quote(worker.handle, safe='')}"
        status, payload = _call(self.kind, self.url, "DELETE", path)
        if status in (200, 202, 404):  # 404: gone already
            return _said(payload)
        raise _refused(self.kind, self.url, f"DELETE {path} ({worker.url})", status, payload)


def _smg_presence(row: Mapping[str, Any]) -> Presence:
    status = row.get("status")
    if status == "draining":
        return Presence.DRAINING
    if status == "pending":
        return Presence.ADDING
    if status == "ready" and row.get("is_healthy") is True:
        return Presence.ROUTED
    return Presence.EJECTED  # "failed": its health checks gave up on it


# ── vllm-router ──────────────────────────────────────────────────────────────────────


class VllmRouterRegistry:
    """vllm-router's worker registry (``/list_workers``, ``/add_worker``,
    ``/remove_worker``); with its metrics URL, the workers its health checker gave up
    on."""

    kind = "vllm-router"
    abandons_on_hang_up = True  # its add blocks until the engine answers /health

    def __init__(self, url: str, metrics_url: str | None = None) -> None:
        self.url = url
        self.metrics_url = metrics_url

    def workers(self) -> dict[str, ListedWorker]:
        status, payload = _call(self.kind, self.url, "GET", "/list_workers")
        if status != 200:
            raise _refused(self.kind, self.url, "GET /list_workers", status, payload)
        listed = _json(self.kind, self.url, "GET /list_workers", payload)
        urls = listed.get("urls") if isinstance(listed, dict) else None
        if not isinstance(urls, list):
            raise ExternalRouterError(f"vllm-router at {self.url}: /list_workers has no urls")
        return {u: ListedWorker(u, Presence.ROUTED, u) for u in urls if isinstance(u, str)}

    def ejected(self) -> frozenset[str]:
        if self.metrics_url is None:
            return frozenset()
        text = fetch_metrics(self.kind, self.metrics_url)
        health = counter_samples(
            self.kind, self.metrics_url, text, _VLLM_ROUTER_HEALTH, ("worker",)
        )
        return frozenset(key[0] for key, value in health.items() if value == 0)

    def add(self, url: str, hangup: Hangup | None = None) -> AddAnswer:
        path = f"/add_worker?url={quote(url, safe='')}"
        status, payload = _call(
            self.kind, self.url, "POST", path, timeout_s=ADD_TIMEOUT_S, hangup=hangup
        )
        if status == 200:
            return AddAnswer(_said(payload), True)
        if status == 400 and b"already exists" in payload:
            return AddAnswer(_said(payload), False)
        raise _refused(self.kind, self.url, f"POST {path}", status, payload)

    def add_pending(self, handle: str) -> bool:
        return False  # an add is done when its call returns

    def remove(self, worker: ListedWorker) -> str:
        path = f"/remove_worker?url={quote(worker.handle, safe='')}"
        status, payload = _call(self.kind, self.url, "POST", path)
        if status == 200:
            return _said(payload)
        raise _refused(self.kind, self.url, f"POST {path}", status, payload)


# The routers router-sync drives, by the name its options and windows use.
REGISTRIES: dict[str, Callable[[str, str | None], Registry]] = {
    "smg": SmgRegistry,
    "vllm-router": VllmRouterRegistry,
}
