"""Whether an address given for another router (SMG, vllm-router, their metrics) can be
one: checked before ``router-sync`` starts, so a typo is one line and status 2, never a
sync that retries an address nobody could have meant forever (``http:// 127.0.0.1:1``,
a 5,000-character host, a port past 65535 were all taken and retried).
"""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["address_problem"]

_MAX_HOST = 253  # a DNS name's limit
_MAX_LABEL = 63


def address_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http(s)://host[:port]`` address a router listens on; None
    when it is one."""
    if not url or url != url.strip() or any(c.isspace() or ord(c) < 0x20 for c in url):
        return "holds spaces or control characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "give http://host:port (or https://)"
    host = parts.hostname
    if not host:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "a user or password in a router's address is not sent anywhere: leave it out"
    if len(host) > _MAX_HOST or any(len(label) > _MAX_LABEL for label in host.split(".")):
        return f"host of {len(host)} characters is no host name"
    if port == 0:
        return "port 0 is no router's port"
    if parts.query or parts.fragment:
        return "a router's address has no query or fragment"
    return None
