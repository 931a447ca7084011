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
  ``Content-Length`` that is not one decimal number (llhttp refuses these first, in its
  own words); a transfer coding other than ``chunked`` (the router re-frames what it
  forwards and decodes no other coding);
- more than one ``Host`` on a request.

What the parser (llhttp, strict) already refuses is refused by it, with the same
answer: a NUL, CR, LF or other control byte inside a header's name or value, an
obs-fold, a bare LF line ending, a chunk size out of range, a malformed chunk. What passes is
forwarded with framing the router writes itself from the numbers read here, never a
client's or a backend's framing line copied, so nothing past the framed body is ever
forwarded as another message.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Framing", "Unframed", "read_framing"]

Headers = list[tuple[bytes, bytes]]

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


def read_framing(headers: Headers, lowered: list[bytes], *, request: bool) -> Framing:
    """The framing of a message with ``headers`` (``lowered``: their names lower-cased,
    once, by the caller, who reads the head with them too), or :class:`Unframed` (the
    module's rules). On every request's and every answer's path, so the common case is a
    few scans of the names in C: llhttp has already refused a second ``Content-Length``,
    one that is not digits or overflows, and a length with chunks (a first cut that
    checked all of it again cost 3-4 % of the router's time, by py-spy)."""
    chunked = False
    if b"transfer-encoding" in lowered:
        chunked = _chunked(headers, lowered)
    length: int | None = None
    if b"content-length" in lowered:
        if chunked:
            raise Unframed("both Content-Length and Transfer-Encoding: the framing is ambiguous")
        value = headers[lowered.index(b"content-length")][1]
        text = value.strip(b" \t")
        if not text.isdigit() or len(text) > 15:  # ASCII digits only; under 10**15 bytes
            raise Unframed(f"Content-Length {_shown(value)} is not one decimal length")
        length = int(text)
    if b"connection" in lowered and _may_name_framing(headers, lowered):
        _connection(headers, lowered)
    if not request:
        return Framing(length, chunked, False)
    if lowered.count(b"host") > 1:
        raise Unframed(f"{lowered.count(b'host')} Host headers: whose request it is is ambiguous")
    expect_continue = (
        b"expect" in lowered
        and headers[lowered.index(b"expect")][1].strip(b" \t").lower() == b"100-continue"
    )
    return Framing(length, chunked, expect_continue)


def _chunked(headers: Headers, lowered: list[bytes]) -> bool:
    """A ``Transfer-Encoding`` the router takes: one header, saying ``chunked`` alone."""
    codings = lowered.count(b"transfer-encoding")
    if codings > 1:
        raise Unframed(f"{codings} Transfer-Encoding headers: the framing is ambiguous")
    value = headers[lowered.index(b"transfer-encoding")][1]
    if value.strip(b" \t").lower() != b"chunked":
        raise Unframed(f"Transfer-Encoding {_shown(value)}: the router takes only chunked")
    return True


_PLAIN_CONNECTION = frozenset({b"keep-alive", b"Keep-Alive", b"close", b"Close"})


def _may_name_framing(headers: Headers, lowered: list[bytes]) -> bool:
    """A cheap look first: an answer's ``Connection: keep-alive`` is on every path."""
    value = headers[lowered.index(b"connection")][1]
    return value not in _PLAIN_CONNECTION or lowered.count(b"connection") > 1


def _connection(headers: Headers, lowered: list[bytes]) -> None:
    for low, (_, value) in zip(lowered, headers, strict=True):
        if low != b"connection":
            continue
        named = {t.strip(b" \t").lower() for t in value.split(b",")} & _ROUTERS_OWN
        if named:
            which = ", ".join(sorted(_NAMES.get(n, "Host") for n in named))
            raise Unframed(
                f"Connection names {which}: framing and routing headers are never hop-by-hop"
            )


def _shown(value: bytes) -> str:
    """What a refusal shows of a hostile value: printable ASCII, the rest as "?"."""
    return repr(value.decode("latin-1").translate(_VISIBLE)[:40])


_VISIBLE = {c: "?" for c in (*range(0x20), *range(0x7F, 0x100))}
