"""Plain HTTP clients for the server's tests: a JSON GET and a server-sent-events reader,
on the standard library's ``http.client`` over real sockets (no test client in between)."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


def get(
    url: str, *, method: str = "GET", headers: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, str, bytes]:
    """(status, content type, body) of one request."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, target, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        conn.close()


def get_json(url: str, *, method: str = "GET") -> tuple[int, Any]:
    status, kind, body = get(url, method=method)
    assert kind.startswith("application/json"), (url, status, kind, body[:200])
    return status, json.loads(body)


@dataclass(frozen=True)
class Message:
    """One server-sent event: its type, data and id (None when it carried none)."""

    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        return json.loads(self.data)


class EventStream:
    """A stream of server-sent events, read message by message."""

    def __init__(self, url: str, *, last_event_id: str | None = None, timeout: float = 60) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        self.conn.request("GET", target, headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.content_type = self.response.getheader("Content-Type", "")

    def next(self) -> Message | None:
        """The next message; None when the server closed the stream."""
        event, data, ident = "message", [], None
        while True:
            raw = self.response.readline()  # the body, its chunked framing undone
            if not raw:
                return None
            line = raw.decode("utf-8").rstrip("\n")
            if not line:
                if data or event != "message":
                    return Message(event, "\n".join(data), ident)
                continue
            if line.startswith(":"):
                continue  # a keepalive comment
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                ident = value

    def close(self) -> None:
        self.conn.close()
