"""The one output path of every command: JSON, JSON Lines, tables, and the rules they keep.

- Data is never markup: run ids, reasons and error texts come from the log and may
  hold brackets (``[rank0] …``); everything printed through rich goes as ``Text`` or
  with ``markup=False``.
- ``--json`` prints one document (indented) or, for a stream of entries, JSON Lines
  (one compact object per line, for ``grep`` and ``jq``), written by the two functions
  below and nowhere else.
- stdout carries the answer; progress and status go to stderr. A pipe closed early
  (``… | head``) ends the command quietly, as other filters do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TextIO

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from fleetledger.errors import FleetledgerError

# A fold shorter than this shows no progress bar: it would only flicker.
PROGRESS_DELAY_S = 1.0
# Off a terminal (a pipe, a file) lines are not wrapped: one entry, one line, for grep.
UNWRAPPED_WIDTH = 100_000

out = Console(highlight=False, soft_wrap=True)


class CommandLineError(FleetledgerError):
    """An option value that cannot be used (two exclusive options, a bad port)."""


def print_json(doc: Any) -> None:
    """One JSON document on stdout (``--json`` of a command that answers once)."""
    typer.echo(json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False))


def write_json_lines(docs: Iterable[Any], stream: TextIO | None = None) -> None:
    """One compact JSON object per line (``--json`` of a command that streams)."""
    write = (stream or sys.stdout).write
    dumps = json.dumps
    for doc in docs:
        write(dumps(doc, ensure_ascii=False) + "\n")


def stdout_console() -> Console:
    """A console on the current stdout: wraps to a terminal, never wraps into a pipe."""
    stream = sys.stdout
    terminal = stream.isatty()
    return Console(
        file=stream,
        highlight=False,
        width=None if terminal else UNWRAPPED_WIDTH,
        soft_wrap=False,
    )


@contextmanager
def stdout_may_close() -> Iterator[None]:
    """``replay … | head`` closes the pipe early: stop quietly, like other filters do.

    Without this the broken pipe would be reported as an error (and Python would
    complain again when it flushes stdout at exit).
    """
    try:
        yield
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a file (captured by a test runner)
            pass
        raise typer.Exit(code=1) from None


class FoldProgress:
    """A transient progress bar on stderr for a fold long enough to wonder about.

    It appears only once ``delay_s`` has passed, and only when stderr is a terminal: a
    pipe or a log file gets no bar, and stdout never does (it carries the answer).
    """

    def __init__(self, label: str, *, delay_s: float | None = None) -> None:
        self.label = label
        self.delay_s = PROGRESS_DELAY_S if delay_s is None else delay_s
        self.console = Console(stderr=True)
        self._began = time.monotonic()
        self._progress: Progress | None = None
        self._task: int | None = None

    def update(self, done: int, total: int) -> None:
        if self._progress is None:
            if not self.console.is_terminal or time.monotonic() - self._began < self.delay_s:
                return
            self._progress = Progress(
                TextColumn("{task.description}", markup=False),  # run ids are not markup
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("events"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._task = self._progress.add_task(self.label, total=total)
            self._progress.start()
        assert self._task is not None
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()

    def __enter__(self) -> FoldProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
