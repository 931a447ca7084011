"""The ids of a run's history entries on the wire: ``SEQ.I``, the I-th entry of seq SEQ.

One event can make several entries (a probe round that moves three shards), so the seq
alone cannot say how far a client got: a stream cut between two entries of one seq,
resumed "after SEQ", would lose the second. ``SEQ.I`` is exact. A client may still
resume from a bare ``SEQ``: everything after that seq's entries. The numbering is the
fold's own order, so it is the same whichever seq a reader started folding from.
"""

from __future__ import annotations

from fleetledger.web.problems import bad_request

EntryId = tuple[int, int]  # (seq, index of the entry within its seq)

# "after SEQ" as an id: past every entry SEQ can have.
WHOLE_SEQ = 1 << 30
MAX_DIGITS = 18


def is_digits(text: str) -> bool:
    """Only 0-9: ``str.isdigit`` also takes '²', which ``int`` refuses."""
    return text.isascii() and text.isdigit()


def id_text(entry_id: EntryId) -> str:
    return f"{entry_id[0]}.{entry_id[1]}"


def parse_entry_id(text: str, where: str) -> EntryId:
    """``SEQ.I`` or ``SEQ`` (after all of that seq) as an id; a 400 naming ``where``."""
    seq_text, dot, index_text = text.strip().partition(".")
    parts = [seq_text, index_text] if dot else [seq_text]
    if not all(is_digits(p) and len(p) <= MAX_DIGITS for p in parts):
        raise bad_request(
            f"{where} {text[:40]!r} is not an entry id: give SEQ.I (as the stream sent it) "
            "or SEQ (everything after that seq)"
        )
    return (int(seq_text), int(index_text) if dot else WHOLE_SEQ)


class Numbering:
    """Numbers entries as they come, in the fold's order: the index restarts at each seq."""

    __slots__ = ("last",)

    def __init__(self, last: EntryId = (0, 0)) -> None:
        self.last = last

    def next_id(self, seq: int) -> EntryId:
        last_seq, last_index = self.last
        self.last = (seq, last_index + 1 if seq == last_seq else 0)
        return self.last
