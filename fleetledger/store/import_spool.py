"""An import's checked rows parked on disk until the write lock is taken.

SQLite admits one writer to the whole file at a time, and an import writes its run in
one transaction. Checking the lines inside that transaction would hold every other
writer — a live run's controller appending to the same ledger — for as long as the
lines take to read and check (a week of a 256-shard fleet: ~10 s; a slow pipe: as long
as it likes), past their busy timeout. So on SQLite the rows are pulled (and with them
checked) into an anonymous temporary file first, a page at a time, and written from it
in a transaction that only inserts. Memory holds a page either way; the disk holds
about the rows' own size for the length of the import.
"""

from __future__ import annotations

import marshal
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetledger.events.jsonl import ImportRow

# Rows marshalled at a time, at most: a page of them is what memory holds while parking
# (and twice while one is written or read back, the page and its bytes). Bounded by
# bytes too: a line may hold a megabyte.
SPOOL_PAGE = 1000
SPOOL_PAGE_BYTES = 4 << 20


class RowSpool:
    """Rows written to an anonymous temporary file in ``directory`` (gone when closed,
    or with the process), read back in the order they came. The ledger's own directory,
    not the system's temporary one: that is often memory (tmpfs), or small, and the
    rows are about the run's own size."""

    def __init__(self, directory: Path | None = None) -> None:
        self._file = tempfile.TemporaryFile(dir=directory)
        self.count = 0

    def fill(self, rows: Iterable[ImportRow]) -> None:
        """Pull every row (whatever checks pulling them runs, runs here) and park it."""
        page: list[tuple[int, str, int, str, int, str]] = []
        size = 0
        for r in rows:
            page.append((r.seq, r.event_id, r.at_us, r.type, r.schema_version, r.payload))
            size += len(r.payload)
            if len(page) == SPOOL_PAGE or size >= SPOOL_PAGE_BYTES:
                marshal.dump(page, self._file)
                self.count += len(page)
                page, size = [], 0
        if page:
            marshal.dump(page, self._file)
            self.count += len(page)

    def rows(self) -> Iterator[ImportRow]:
        # The log imports this module; a read (most commands) never loads the export code.
        from fleetledger.events.jsonl import ImportRow  # only when an import writes

        self._file.seek(0)
        while True:
            try:
                page = marshal.load(self._file)
            except EOFError:
                return
            for fields in page:
                yield ImportRow(*fields)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RowSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
