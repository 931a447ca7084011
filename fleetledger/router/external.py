"""The field's routers, as worker registries reached over HTTP: SMG and vllm-router.

``router-sync`` keeps an external router's worker set equal to the ledger's serving
set; this file is everything it knows about talking to one. Rules of this file, each
checked against the real binaries (SMG 1.13, vllm-router 0.1.17):

- **A worker is the engine's origin**, ``http://host:port`` without ``/v1``: both
  routers probe ``URL + /health`` and append the client's ``/v1/...`` path, so a base
  URL with ``/v1`` is refused (vllm-router times out probing ``/v1/health``). URLs are
  compared without a trailing slash.
- **SMG** (``smg launch``): ``GET /workers`` lists ``{id, url, status, is_healthy}``;
  ``POST /workers`` with ``{"url": ...}`` answers 202 and adds in the background after
  probing ``/health`` (even with ``--disable-health-check``; a worker failing it is
  probed again every ``--worker-startup-check-interval`` s, 30 by default, and is not
  listed meanwhile); 409 means it is listed already or its add is under way.
  ``DELETE /workers/{id}`` answers 202; the worker is listed ``draining`` at once
  (no new request reaches it) and gone 5 s later. A pending add cannot be cancelled.
  Its own health checks (when on) list a failing worker ``failed``, unhealthy.
- **vllm-router**: ``GET /list_workers`` is ``{"urls": [...]}``; ``POST
  /add_worker?url=`` blocks until the worker answers ``/health`` (up to
  ``--worker-startup-timeout-secs``, 600 by default, re-probing every
  ``--worker-startup-check-interval``, 30 by default) and is abandoned if the caller
  hangs up; ``POST /remove_worker?url=`` answers 200 (also for a URL it never had).
  Its health checker cannot be switched off (an interval of 0 panics it): a worker
  failing it stays listed and is skipped, which only its metrics show
  (``vllm_router_worker_health{worker} 0``), so the listing reads them when it has
  the metrics URL.
- Both count every dispatched request's outcome per worker URL on their Prometheus
  port, also with the circuit breaker off: ``smg_worker_cb_outcomes_total`` /
  ``vllm_router_cb_outcomes_total`` ``{worker, outcome="success"|"failure"}``
  (observed: 2xx and 4xx are successes; 5xx and connection errors failures).
- Every call has a short bounded timeout (an add to vllm-router a longer one, it
  waits for the engine) and fails as :class:`ExternalRouterError`, one line naming
  the router, the call and what came back.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

from prometheus_client.parser import text_string_to_metric_families

from fleetledger.errors import FleetledgerError

__all__ = [
    "OUTCOME_SAMPLES",
    "REGISTRIES",
    "ExternalRouterError",
    "ListedWorker",
    "Presence",
    "Registry",
    "SmgRegistry",
    "VllmRouterRegistry",
    "counter_samples",
    "fetch_metrics",
    "http_origin",
    "worker_url",
]

CALL_TIMEOUT_S = 2.0  # list, remove, metrics: the router answers these at once
ADD_TIMEOUT_S = 30.0  # vllm-router holds an add until the engine answers /health
MAX_BODY = 16 * 1024 * 1024  # a listing or a metrics page; anything larger is refused


class ExternalRouterError(FleetledgerError):
    """An external router could not be reached, or answered what it should not have."""


class Presence(StrEnum):
    """How a listed worker stands in the external router."""

    ROUTED = "routed"
    """Listed and taking new requests."""
    MOVING = "moving"
    """Being added or drained by the router itself: no new request; wait for it."""
    EJECTED = "ejected"
    """Listed, but the router stopped routing to it on its own (its health checks)."""


@dataclass(frozen=True, slots=True)
class ListedWorker:
    """One worker as its router lists it; ``handle`` is what removing it takes (SMG: its
    id; vllm-router: its URL)."""

    url: str
    presence: Presence
    handle: str


class Registry(Protocol):
    """What ``router-sync`` calls on an external router."""

    kind: str
    url: str
    metrics_url: str | None

    def workers(self) -> dict[str, ListedWorker]:
        """Every listed worker by URL."""
        ...

    def add(self, url: str) -> str:
        """Ask for ``url`` to be added; returns what the router said, in one line."""
        ...

    def remove(self, worker: ListedWorker) -> str:
        """Ask for ``worker`` to be removed; returns what the router said, in one line."""
        ...


def http_origin(url: str) -> str | None:
    """``scheme://netloc`` of an HTTP(S) URL with no path beyond ``/``, else None: the
    form a router's own address and its metrics address must take."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.path.strip("/"):
        return None
    if parts.query or parts.fragment:
        return None
    return f"{parts.scheme}://{parts.netloc}"


def worker_url(url: str) -> str:
    """A worker URL as compared: no trailing slash."""
    return url.rstrip("/")


# ── HTTP ─────────────────────────────────────────────────────────────────────────────


def _call(
    kind: str,
    base: str,
    method: str,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    timeout_s: float = CALL_TIMEOUT_S,
) -> tuple[int, bytes]:
    """One request to ``base`` on a fresh connection (a restarted router is simply
    reached again); a transport failure is an :class:`ExternalRouterError`."""
    parts = urlsplit(base)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.netloc, timeout=timeout_s)
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read(MAX_BODY + 1)
    except (OSError, http.client.HTTPException) as exc:
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ExternalRouterError(f"{kind} at {base}: {method} {path} failed ({why})") from None
    finally:
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
    kind: str, metrics_url: str, text: str, sample: str
) -> dict[tuple[str, ...], float]:
    """Every sample named ``sample`` on the page, keyed by its labels' values in label
    name order (``worker`` first where the router labels by worker)."""
    found: dict[tuple[str, ...], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == sample:
                    key = tuple(s.labels[name] for name in sorted(s.labels, key=_worker_first))
                    found[key] = float(s.value)
    except ValueError as exc:
        raise ExternalRouterError(
            f"{kind} at {metrics_url}: /metrics is not a Prometheus page ({exc})"
        ) from None
    return found


def _worker_first(label: str) -> tuple[int, str]:
    return (0 if label == "worker" else 1, label)


# ── SMG ──────────────────────────────────────────────────────────────────────────────


class SmgRegistry:
    """SMG's worker registry (``GET/POST /workers``, ``DELETE /workers/{id}``)."""

    kind = "smg"

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
            url = worker_url(row["url"])
            workers[url] = ListedWorker(url, _smg_presence(row), str(row.get("id", "")))
        return workers

    def add(self, url: str) -> str:
        status, payload = _call(self.kind, self.url, "POST", "/workers", body={"url": url})
        if status in (200, 201, 202, 409):  # 409: listed already, or its add is under way
            return _said(payload)
        raise _refused(self.kind, self.url, f"POST /workers {url}", status, payload)

    def remove(self, worker: ListedWorker) -> str:
        path = f"/workers/{quote(worker.handle, safe='')}"
        status, payload = _call(self.kind, self.url, "DELETE", path)
        if status in (200, 202, 404):  # 404: gone already
            return _said(payload)
        raise _refused(self.kind, self.url, f"DELETE {path} ({worker.url})", status, payload)


def _smg_presence(row: Mapping[str, Any]) -> Presence:
    status = row.get("status")
    if status in ("draining", "pending"):
        return Presence.MOVING
    if status == "ready" and row.get("is_healthy") is True:
        return Presence.ROUTED
    return Presence.EJECTED  # "failed": its health checks gave up on it


# ── vllm-router ──────────────────────────────────────────────────────────────────────


class VllmRouterRegistry:
    """vllm-router's worker registry (``/list_workers``, ``/add_worker``,
    ``/remove_worker``); with its metrics URL, a worker its health checker gave up on
    is listed as ejected."""

    kind = "vllm-router"

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
        unhealthy = self._unhealthy()
        workers = {}
        for raw in urls:
            if isinstance(raw, str):
                url = worker_url(raw)
                presence = Presence.EJECTED if url in unhealthy else Presence.ROUTED
                workers[url] = ListedWorker(url, presence, raw)
        return workers

    def _unhealthy(self) -> frozenset[str]:
        if self.metrics_url is None:
            return frozenset()
        text = fetch_metrics(self.kind, self.metrics_url)
        samples = counter_samples(self.kind, self.metrics_url, text, _VLLM_ROUTER_HEALTH)
        return frozenset(worker_url(key[0]) for key, value in samples.items() if value == 0)

    def add(self, url: str) -> str:
        path = f"/add_worker?url={quote(url, safe='')}"
        status, payload = _call(self.kind, self.url, "POST", path, timeout_s=ADD_TIMEOUT_S)
        if status == 200 or (status == 400 and b"already exists" in payload):
            return _said(payload)
        raise _refused(self.kind, self.url, f"POST {path}", status, payload)

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
