"""A message's body framing, decided by the router alone, and the messages it refuses.

Request smuggling lives in the gap between two parsers that read one message's framing
differently: a request with ``Connection: Content-Length`` had the router drop its
``Content-Length`` (a header the ``Connection`` header names is hop-by-hop) while still
forwarding its body, and the backend read that body as a second request — any path,
past the router's allow-list, with no outcome recorded. RFC 9112 §6.1 and §11.2 say
what to do with what is ambiguous: refuse it. So, for requests (from clients) and
answers (from backends) alike, anything whose framing two readers could read two ways
is refused, in one line naming what was wrong:

- ``Connection`` naming a framing or routing header (``Content-Length``,
  ``Transfer-Encoding``, ``Host``): they are the router's, never hop-by-hop;
- both ``Content-Length`` and ``Transfer-Encoding``; more than one of either; a
  ``Content-Length`` that is not one decimal number; a transfer coding other than
  ``chunked`` (the router re-frames what it forwards and decodes no other coding);
- a NUL, CR or LF inside a header's name or value (an obs-fold's line break
  included), and more than one ``Host`` on a request.

What the parser (llhttp) already refuses — a chunk size out of range, a malformed
chunk, a bare LF line ending — is refused by it, with the same answer. What passes is
forwarded with framing the router writes itself from the numbers read here, never a
client's or a backend's framing line copied, so nothing past the framed body is ever
forwarded as another message.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Framing", "Unframed", "read_framing"]

Headers = list[tuple[bytes, bytes]]

_MAX_LENGTH = 2**53  # a body no router would hold; past it a "length" is an attack
_ROUTERS_OWN = frozenset({b"content-length", b"transfer-encoding", b"host"})
_NAMES = {b"content-length": "Content-Length", b"transfer-encoding": "Transfer-Encoding"}


class Unframed(ValueError):
    """A message refused for its framing: the one line saying why."""


class Framing(NamedTuple):
    """How a message's body is framed: a length, chunks, or neither (a request without
    a body; an answer that ends with its connection)."""

    length: int | None
    chunked: bool
    expect_continue: bool  # a request's ``Expect: 100-continue``


def _controls(data: bytes) -> bool:
    return b"\r" in data or b"\n" in data or b"\0" in data


def read_framing(headers: Headers, *, request: bool) -> Framing:
    """The framing of a message with ``headers``, or :class:`Unframed` (module rules)."""
    length: int | None = None
    lengths = codings = hosts = 0
    expect_continue = False
    for name, value in headers:
        if _controls(name) or _controls(value):
            shown = name.decode("latin-1").translate(_VISIBLE)[:40]
            raise Unframed(f"header {shown!r} holds a NUL, CR or LF (an obs-fold included)")
        low = name.lower()
        if low == b"content-length":
            lengths += 1
            text = value.strip(b" \t")
            if not text.isdigit() or len(text) > 16 or int(text) > _MAX_LENGTH:
                shown = value.decode("latin-1").translate(_VISIBLE)[:40]
                raise Unframed(f"Content-Length {shown!r} is not one decimal length")
            length = int(text)
        elif low == b"transfer-encoding":
            codings += 1
            if value.strip(b" \t").lower() != b"chunked":
                shown = value.decode("latin-1").translate(_VISIBLE)[:40]
                raise Unframed(f"Transfer-Encoding {shown!r}: the router takes only chunked")
        elif low == b"connection":
            named = {t.strip(b" \t").lower() for t in value.split(b",")} & _ROUTERS_OWN
            if named:
                which = ", ".join(sorted(_NAMES.get(n, "Host") for n in named))
                raise Unframed(
                    f"Connection names {which}: framing and routing headers are never hop-by-hop"
                )
        elif low == b"host":
            hosts += 1
        elif request and low == b"expect":
            expect_continue = value.strip(b" \t").lower() == b"100-continue"
    if lengths and codings:
        raise Unframed("both Content-Length and Transfer-Encoding: the framing is ambiguous")
    if lengths > 1:
        raise Unframed(f"{lengths} Content-Length headers: the framing is ambiguous")
    if codings > 1:
        raise Unframed(f"{codings} Transfer-Encoding headers: the framing is ambiguous")
    if request and hosts > 1:
        raise Unframed(f"{hosts} Host headers: whose request it is is ambiguous")
    return Framing(length, codings == 1, expect_continue)


# What a refusal shows of a hostile header: printable ASCII, anything else as "?".
_VISIBLE = {c: "?" for c in (*range(0x20), *range(0x7F, 0x100))}
