"""Progress of a long command on a terminal: events done of total, rate, time left.

Shown only where someone is watching: stderr is a terminal, the command was not asked
for ``--json``, and the work has taken more than :data:`SHOW_AFTER_S` (a command that
ends sooner prints nothing). Redrawn in place on one line of stderr, at most every
:data:`REDRAW_S`, and erased when the work ends, so what stays on the screen is the
command's own output. Never written to a pipe or a file: a script reading stderr sees
exactly what it saw before.
"""

from __future__ import annotations

import io
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from typing import IO, TypeVar

T = TypeVar("T")
S = TypeVar("S", bound=Sized)

SHOW_AFTER_S = 1.0
REDRAW_S = 0.2
# Items counted between looks at the clock (a look costs more than a count).
LOOK_EVERY = 512
# A total known only on demand (counting a file's lines): asked for once, when shown.
Total = int | Callable[[], int | None] | None


class Progress:
    """Counts done work and draws it; ``clock`` is injectable so its rule is testable."""

    def __init__(
        self,
        what: str,
        total: Total,
        stream: IO[str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self._total = total
        self.stream = stream
        self.clock = clock
        self.done = 0
        self.started = clock()
        self.width = _width(stream)
        self._next_look = LOOK_EVERY
        self._drawn_at: float | None = None

    @property
    def total(self) -> int | None:
        if callable(self._total):
            self._total = self._total()
        return self._total

    def update(self, done: int, total: int) -> None:
        """Where a fold stands (a ``history`` reader's ``on_page``)."""
        self.done, self._total = done, total
        self.look()

    def advance(self, n: int) -> None:
        self.done += n
        if self.done >= self._next_look:
            self._next_look = self.done + LOOK_EVERY
            self.look()

    def look(self) -> None:
        """Draw the line if the work has run long enough and the last drawing is old."""
        now = self.clock()
        if now - self.started < SHOW_AFTER_S:
            return
        if self._drawn_at is not None and now - self._drawn_at < REDRAW_S:
            return
        self._drawn_at = now
        # One row, never wrapped: ``\r`` and the erase reach back over one row only.
        self.stream.write("\r\033[K" + self.line(now)[: self.width - 1])
        self.stream.flush()

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        total = self.total
        if total is None or total <= 0:
            return f"{self.what}: {self.done:,} events · {rate:,.0f}/s"
        shown = min(self.done, total)
        left = (total - shown) / rate if rate > 0 else 0.0
        return (
            f"{self.what}: {shown:,} of {total:,} events ({100 * shown / total:.0f}%) · "
            f"{rate:,.0f}/s · {_duration(left)} left"
        )

    def erase(self) -> None:
        if self._drawn_at is not None:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn_at = None

    def count(self, items: Iterable[T]) -> Iterator[T]:
        """``items``, each counted as one event as it is taken."""
        for item in items:
            yield item
            self.advance(1)

    def count_pages(self, pages: Iterable[S]) -> Iterator[S]:
        """``pages``, each counted as its length in events."""
        for page in pages:
            yield page
            self.advance(len(page))


class Silent(Progress):
    """No progress shown: what a pipe, a file or ``--json`` gets. Counts nothing."""

    def __init__(self) -> None:
        super().__init__("", None, sys.stderr)

    def advance(self, n: int) -> None:
        pass

    def update(self, done: int, total: int) -> None:
        pass

    def count(self, items: Iterable[T]) -> Iterator[T]:
        return iter(items)

    def count_pages(self, pages: Iterable[S]) -> Iterator[S]:
        return iter(pages)


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _width(stream: IO[str]) -> int:
    """The terminal's columns (a very long row where it says none: a test's buffer)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return 1 << 16


def stdout_is_a_file() -> bool:
    """stdout is a regular file (``> out.jsonl``), not a terminal or a reader."""
    try:
        return stat.S_ISREG(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def shows_progress(quiet: bool, stream: IO[str] | None = None) -> bool:
    """Progress goes to a terminal's stderr only, and never with ``--json``."""
    stream = sys.stderr if stream is None else stream
    try:
        return not quiet and stream.isatty()
    except ValueError:  # a closed stream
        return False


@contextmanager
def progress_bar(what: str, total: Total, *, quiet: bool = False) -> Iterator[Progress]:
    """A :class:`Progress` on stderr where :func:`shows_progress`, else a silent one;
    its line is erased when the block ends, however it ends."""
    progress = Progress(what, total, sys.stderr) if shows_progress(quiet) else Silent()
    try:
        yield progress
    finally:
        progress.erase()


def lines_of(path: str) -> int | None:
    """The lines of a regular file (an export's events), counted a megabyte at a time;
    None for anything else, or a file that cannot be read again (the import then says
    why). Never a pipe or a device (``<(zcat run.jsonl.gz)``, ``/dev/stdin``): a second
    reader of a pipe would take the lines the import is reading."""
    try:
        with open(path, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return None
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return None
