"""An engine's word on the weights behind one answer, as it is spelled on the wire.

Why the engine's, not the ledger's: the ledger learns of a load only after the trainer
hears every participant finished it, so a version read from the ledger at routing time
named an older version than the engine generated with in 22 of 25 answers (a refit per
step). The engine knows the instant its load completes; it stamps every answer with the
version it held at the answer's first token and at its last (they differ when a refit
lands mid-generation) and says when the weights it serves from are partial (a load that
began and never completed).

Spelled the same by every engine (the simulated one, the vLLM one) and read by every
party that passes or counts answers (the router, the rollout loop, a user's client):

- headers ``x-fleetledger-weight-version: N`` (first token) and
  ``x-fleetledger-weight-version-end: M`` (last token; a non-streamed answer only);
- a streamed answer, whose headers leave before its last token, ends with the SSE
  comment line ``: x-fleetledger-weight-version-end M`` before ``data: [DONE]`` (every
  SSE parser skips a comment; the ``openai`` client's stream yields the same events);
- ``x-fleetledger-weights: partial`` where the engine's weights are partial;
- ``x-fleetledger-weight-version-source: ledger``, added by the router only where the
  engine said nothing (a foreign engine) and the version is the ledger's view instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "END_COMMENT_PREFIX",
    "VERSION_SOURCE_HEADER",
    "WEIGHTS_HEADER",
    "WEIGHT_VERSION_END_HEADER",
    "WEIGHT_VERSION_HEADER",
    "Attested",
    "attestation_headers",
    "end_comment",
    "end_in_line",
    "read_attestation",
]

WEIGHT_VERSION_HEADER = "x-fleetledger-weight-version"
"""The weight version the engine held at the answer's first token."""
WEIGHT_VERSION_END_HEADER = "x-fleetledger-weight-version-end"
"""The weight version the engine held at the answer's last token."""
WEIGHTS_HEADER = "x-fleetledger-weights"
"""``partial``: the engine's weights are partial (a load began and did not complete)."""
VERSION_SOURCE_HEADER = "x-fleetledger-weight-version-source"
"""``ledger``: the engine said nothing, the version is the router's view of the ledger."""
END_COMMENT_PREFIX = f": {WEIGHT_VERSION_END_HEADER} "
"""How a streamed answer's last line names the version at its last token."""

Source = Literal["engine", "ledger"]


@dataclass(frozen=True, slots=True)
class Attested:
    """The weights behind one answer: the version at its first token and at its last,
    whether they were partial, and who said so (the engine, or the ledger's view)."""

    start: int
    end: int
    partial: bool = False
    source: Source = "engine"

    @property
    def moved(self) -> bool:
        """Whether a refit landed while the answer was generated."""
        return self.end != self.start


def attestation_headers(start: int, end: int | None, partial: bool) -> list[tuple[str, str]]:
    """The headers an engine sends with an answer (``end``: None for a stream, whose last
    token comes after its headers: its end is :func:`end_comment`)."""
    headers = [(WEIGHT_VERSION_HEADER, str(start))]
    if end is not None:
        headers.append((WEIGHT_VERSION_END_HEADER, str(end)))
    if partial:
        headers.append((WEIGHTS_HEADER, "partial"))
    return headers


def end_comment(version: int) -> bytes:
    """A streamed answer's last line before ``data: [DONE]``: the version at its last token."""
    return f"{END_COMMENT_PREFIX}{version}\n\n".encode()


def _version(headers: Mapping[str, str], name: str) -> int | None:
    text = headers.get(name)
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        raise ValueError(f"header {name}: {text!r} is not a weight version (an integer >= 0)")
    return int(text)


def read_attestation(headers: Mapping[str, str], end: int | None = None) -> Attested | None:
    """The attestation in an answer's ``headers`` (case-insensitive mappings, as HTTP
    clients give them); None where the answer carries none. ``end``: the version a
    stream's end line named (:func:`end_in_line`), which wins over a header. A malformed
    version is a ``ValueError`` naming the header."""
    start = _version(headers, WEIGHT_VERSION_HEADER)
    if start is None:
        return None
    if end is None:
        end = _version(headers, WEIGHT_VERSION_END_HEADER)
    partial = (headers.get(WEIGHTS_HEADER) or "").strip() == "partial"
    source: Source = "ledger" if headers.get(VERSION_SOURCE_HEADER) == "ledger" else "engine"
    return Attested(start, start if end is None else end, partial, source)


def end_in_line(line: str) -> int | None:
    """The version a stream's line names as its end, or None (any other line)."""
    if not line.startswith(END_COMMENT_PREFIX):
        return None
    text = line[len(END_COMMENT_PREFIX) :].strip()
    if not text.isdigit():
        raise ValueError(f"stream line {line!r}: the end version is not an integer >= 0")
    return int(text)
