"""Who may read the ledger over HTTP: ``serve``'s doors, decided from the address it is
bound to, never from how that address was spelled.

``serve`` hands out the whole ledger. Two ways it leaked, found by a hostile pass:

- the Host check (a page elsewhere that points a name of its own at 127.0.0.1 — DNS
  rebinding — must not read the ledger) was keyed on the spelling of ``--host``:
  ``127.1``, ``127.0.0.2``, ``2130706433`` and ``127.000.000.001`` bind loopback and
  answered ``Host: evil.example``;
- ``--host 0.0.0.0`` or ``::`` served the whole ledger to anyone, with no token, no Host
  check and no warning.

So: a server bound to loopback (127.0.0.0/8 in any notation, ``::1``) answers only
requests addressed to a loopback name, to the address as spelled, or to an
``--allow-host``; a server bound anywhere else needs a token (``--token-file``, or
``FLEETLEDGER_TOKEN``) or an explicit ``--no-auth``, which says once that anyone who can
reach it reads the ledger (Jupyter's and Ray's dashboards take the same stance). The
token is a bearer token, compared in constant time; the page carries it in the URL's
fragment (never sent, never logged), then in a header, and the stream — which a browser
opens without headers — in a cookie the server sets on the first request that showed
it. Pure: the caller binds, reads the file and the environment.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "COOKIE",
    "LOOPBACK_NAMES",
    "TOKEN_ENV",
    "Doors",
    "DoorsRefused",
    "doors_for",
    "host_name",
    "is_loopback",
]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
TOKEN_ENV = "FLEETLEDGER_TOKEN"
COOKIE = "fleetledger_token"
MIN_TOKEN_CHARS = 16


class DoorsRefused(ValueError):
    """``serve`` will not open these doors: the one line saying why and what to give."""


def is_loopback(address: str) -> bool:
    """Whether a bound address (as the socket reports it) is a loopback address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def host_name(raw: str | None) -> str:
    """The name a request's ``Host`` header addresses, lower-cased, its port checked;
    ``ValueError`` (one line) for a Host nobody could have meant: a bad port, a bare IPv6
    address, an empty name."""
    if not raw:
        raise ValueError("a request with no Host header")
    text = raw.strip()
    if text.startswith("["):
        name, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"Host {text[:60]!r}: an IPv6 address must be [bracketed]")
        port = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise ValueError(f"Host {text[:60]!r}: an IPv6 address must be [bracketed]")
        name, _, port_text = text.partition(":")
        port = port_text if ":" in text else None
    if port is not None and not (port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        raise ValueError(f"Host {text[:60]!r}: the port is not a number from 0 to 65535")
    if not name:
        raise ValueError(f"Host {text[:60]!r}: no name")
    return name.lower()


@dataclass(frozen=True)
class Doors:
    """What a request must show: a Host this server answers (``hosts``; empty: any) and,
    with a ``token``, that token."""

    loopback: bool
    hosts: frozenset[str]
    token: str | None = None

    def host_refusal(self, raw: str | None) -> tuple[int, str] | None:
        """(status, one line) for a request whose Host is malformed (400) or not this
        server's (403); None to go on."""
        try:
            name = host_name(raw)
        except ValueError as exc:
            return 400, str(exc)
        if self.hosts and name not in self.hosts:
            shown = ", ".join(sorted(self.hosts))
            return 403, f"Host {name[:60]!r} is not this server's: it answers {shown}"
        return None

    def admits(self, authorization: str | None, cookie: str | None) -> bool:
        """Whether a request shows the token (a bearer header, or the page's cookie)."""
        if self.token is None:
            return True
        expected = self.token.encode()
        shown = [cookie or ""]
        if authorization and authorization[:7].lower() == "bearer ":
            shown.append(authorization[7:].strip())
        # Every candidate compared whole, in constant time for its length.
        return any(hmac.compare_digest(s.encode(), expected) for s in shown)


def doors_for(
    bound: str,
    spelled: str,
    *,
    allow_hosts: Iterable[str] = (),
    token: str | None = None,
    no_auth: bool = False,
) -> Doors:
    """The doors of a server bound to address ``bound`` (as the socket says), asked for
    as ``spelled`` (``--host``)."""
    allowed = frozenset(h.strip("[]").lower() for h in allow_hosts)
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise DoorsRefused(
            f"the token is {len(token)} characters: give at least {MIN_TOKEN_CHARS} "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')"
        )
    if token is not None and no_auth:
        raise DoorsRefused("--no-auth with a token: say one or the other")
    if is_loopback(bound):
        names = LOOPBACK_NAMES | {spelled.strip("[]").lower(), bound.lower()} | allowed
        return Doors(True, frozenset(names), token)
    if token is None and not no_auth:
        raise DoorsRefused(
            f"--host {spelled} binds {bound}, not loopback: anyone who reaches it would read "
            f"the whole ledger; give --token-file FILE (or {TOKEN_ENV}), or --no-auth to "
            "serve it to anyone on purpose"
        )
    return Doors(False, allowed, token)
