"""The one output path of every command: JSON, JSON Lines, tables, and the rules they keep.

- Data is never markup: run ids, reasons and error texts come from the log and may
  hold brackets (``[rank0] …``) and terminal controls (``ESC [2J``). Text output is
  printed by :func:`say` (a message, a table) with its cells made by :func:`safe_text`
  or :func:`data_row`, and nowhere else: never read as markup, every control shown as a
  visible escape (``\\x1b``).
- ``--json`` prints one document (indented) or, for a stream of entries, JSON Lines
  (one compact object per line, for ``grep`` and ``jq``), written by the two functions
  below and nowhere else.
- stdout carries the answer; progress and status go to stderr. A pipe closed early
  (``… | head``) ends the command quietly, as other filters do; any other failure to
  write stdout (a full disk behind ``> file``) is one error line naming stdout.
- A file a command writes (``export -o``/``--bundle``, ``timeline -o``) goes through
  :func:`whole_file` and nowhere else: it appears whole, mode 0600 (exports and pictures
  carry the run's configuration and URLs), or not at all; it is never the ledger itself;
  and an error names the file.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

import typer

from fleetledger.errors import FleetledgerError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from fleetledger.store.database import Database

# rich is imported where text is printed (a message, a table, a progress bar), not when
# the CLI starts: ``--json``, ``--version`` and ``--help`` never load it.

# Off a terminal (a pipe, a file) lines are not wrapped: one entry, one line, for grep.
UNWRAPPED_WIDTH = 100_000


class CommandLineError(FleetledgerError):
    """An option value that cannot be used (two exclusive options, a bad port)."""


class OutputFileError(FleetledgerError):
    """An output cannot or must not be written; names the file (or stdout) and why."""


# ``json.dumps`` escapes C0 controls (ESC is ``\u001b``) but, with ``ensure_ascii=False``,
# writes DEL, C1 controls, bidi controls and lone surrogates as they are. Outside its
# strings a JSON text is ASCII, so escaping them as ``\uXXXX`` keeps the same JSON.
_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def json_text_safe(text: str) -> str:
    """A JSON text with DEL, C1 and bidi controls (and lone surrogates) as ``\\uXXXX``:
    the same JSON, and nothing a terminal would act on."""
    return _JSON_UNSAFE.sub(_json_escape, text)


def print_json(doc: Any) -> None:
    """One JSON document on stdout (``--json`` of a command that answers once)."""
    dumped = json.dumps(doc, indent=2, sort_keys=False, ensure_ascii=False)
    typer.echo(_JSON_UNSAFE.sub(_json_escape, dumped))


def write_json_lines(docs: Iterable[Any], stream: TextIO | None = None) -> None:
    """One compact JSON object per line (``--json`` of a command that streams)."""
    write = (stream or sys.stdout).write
    dumps, escape = json.dumps, _JSON_UNSAFE.sub
    for doc in docs:
        write(escape(_json_escape, dumps(doc, ensure_ascii=False)) + "\n")


# ── text output: data is never markup, and no control reaches the terminal ────────

# What a terminal obeys instead of showing: C0 and C1 controls and DEL (ESC opens every
# clear-screen, cursor, title and clipboard sequence), the bidi controls that reorder
# what a reader sees (U+202E shows "gpj.exe" as "exe.jpg"), the Unicode line and
# paragraph separators, and lone surrogates (a JSON "\ud800" decodes to one; it cannot
# be encoded, so printing it would crash the command).
_TERMINAL_CONTROLS = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]"
)
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _visible_escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every character a terminal would obey shown as its escape (``\\x1b``).

    A newline is escaped too (``\\n``: one entry stays one line, and a reason cannot
    forge the next row); ``keep_newlines`` keeps the line breaks of a text whose lines
    are ours (``explain``). Backslashes are left as they are: text is shown as written.
    """
    if keep_newlines:
        return "\n".join(terminal_safe(line) for line in text.split("\n"))
    return _TERMINAL_CONTROLS.sub(_visible_escape, text)


def safe_text(value: object, style: str = "", *, keep_newlines: bool = False) -> Text:
    """Data as rich ``Text`` (a table cell, a line): never markup, controls escaped."""
    from rich.text import Text

    return Text(terminal_safe(str(value), keep_newlines=keep_newlines), style=style)


def lasted(delta_us: int) -> str:
    """A run's length in at most 8 characters: ``12.3 s``, ``4 m 03 s``, ``3 h 04 m``,
    ``2 d 03 h``."""
    total = max(delta_us, 0) / 1e6
    if total < 60:
        return f"{total:.1f} s"
    whole = int(total)
    if whole < 3600:
        return f"{whole // 60} m {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} m"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"


def data_row(table: Table, *cells: object, style: str = "") -> None:
    """Add a row of data to ``table``: every cell ``safe_text`` (a ``str`` cell is markup)."""
    table.add_row(*(safe_text(cell) for cell in cells), style=style)


def output_width(stream: TextIO | None = None) -> int | None:
    """The width text is laid out for on ``stream`` (stdout): ``COLUMNS`` when set (the
    user asked for it, piped or not), the terminal's when the stream is one, else
    ``None``: off a terminal a line is not wrapped, so one entry stays one line for
    ``grep``."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    stream = stream or sys.stdout
    with suppress(OSError, ValueError, AttributeError):
        if stream.isatty():
            return os.get_terminal_size(stream.fileno()).columns
    return None


def wrapped(text: str, width: int | None) -> str:
    """``text`` with every line longer than ``width`` folded at word boundaries, each
    continuation indented two past the line's own indent; ``None``: as it is.

    Story: ``explain`` at 80 columns left the terminal to cut its lines mid-word, and a
    45-character cause ran off the right edge of a pasted post-mortem.
    """
    if width is None:
        return text
    import textwrap

    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out += textwrap.wrap(
            line,
            width=width,
            subsequent_indent=indent + "  ",
            break_on_hyphens=False,
            drop_whitespace=True,
        ) or [line]
    return "\n".join(out)


def say(
    message: object = "",
    *,
    style: str = "",
    err: bool = False,
    file: TextIO | None = None,
    keep_newlines: bool = False,
    fold: bool = True,
) -> None:
    """Print one message of text output, the one safe way: on stdout, stderr (``err``)
    or ``file``; never read as markup, every terminal control shown escaped.

    A ``Table`` is printed as it is: its rows went in through :func:`data_row`. Text is
    folded to :func:`output_width` unless ``fold`` is off (an error: one line, whole, to
    paste into a search).
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # A console on the stream as it is now (stdout, stderr or ``file``): a runner that
    # swaps sys.stdout gets the text, as it would from print().
    console = Console(file=file, stderr=err, highlight=False, soft_wrap=True)
    if isinstance(message, Table):
        console.print(message)
    else:  # folded to the width a person reads it at (none into a pipe: one line each)
        safe = terminal_safe(str(message), keep_newlines=keep_newlines)
        stream = file or (sys.stderr if err else sys.stdout)
        console.print(Text(wrapped(safe, output_width(stream) if fold else None), style=style))


def stdout_console() -> Console:
    """A console on the current stdout, as wide as :func:`output_width` (a pipe without
    ``COLUMNS``: unwrapped)."""
    from rich.console import Console

    stream = sys.stdout
    return Console(
        file=stream,
        highlight=False,
        width=output_width() or UNWRAPPED_WIDTH,
        soft_wrap=False,
    )


@contextmanager
def stdout_may_close() -> Iterator[None]:
    """``replay … | head`` closes the pipe early: stop quietly, like other filters do.

    Without this the broken pipe would be reported as an error (and Python would
    complain again when it flushes stdout at exit). Any other unnamed write error in the
    block is stdout's (``> /dev/full``): one error line naming stdout. Flush stdout
    inside the block, so a failure of the last buffer is caught here too.
    """
    try:
        yield
    except BrokenPipeError:
        _discard_stdout()
        raise typer.Exit(code=1) from None
    except OSError as exc:
        if exc.filename is not None:  # a named file failed, not stdout: its error says so
            raise
        # ``export RUN > /dev/full``: say it was stdout (an unnamed write error reads
        # ": No space left on device"), and keep the exit-time flush from saying it again.
        _discard_stdout()
        raise OutputFileError(f"stdout: {exc.strerror or exc}") from None


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so what is still buffered cannot fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (captured by a test runner)
        pass


# ── output files ───────────────────────────────────────────────────────────────

OUTPUT_FILE_MODE = stat.S_IRUSR | stat.S_IWUSR  # 0600, also when an existing file is replaced
# SQLite keeps a ledger in up to four files; replacing any of them loses runs.
_LEDGER_FILES = {
    "": "the ledger {url} itself",
    "-wal": "the write-ahead log (-wal) of the ledger {url}",
    "-shm": "the shared-memory index (-shm) of the ledger {url}",
    "-journal": "the rollback journal (-journal) of the ledger {url}",
}


def ledger_files(database: Database) -> dict[Path, str]:
    """The real paths of the files a SQLite ledger lives in, each with what it is.

    An output path is compared by real path (symlinks and ``..`` resolved) with these, so
    ``-o ledger.db``, ``-o ./x/../ledger.db-wal`` and a symlink to either are all refused.
    Both the ledger path as given and its real path are kept, wherever SQLite puts the
    ``-wal`` of a ledger reached through a symlink. A PostgreSQL ledger has no files here.
    """
    from fleetledger.store.urls import sqlite_path

    if database.backend != "sqlite":
        return {}
    given = sqlite_path(database.url)
    files: dict[Path, str] = {}
    for base in (str(given), os.path.realpath(given)):
        for suffix, what in _LEDGER_FILES.items():
            files[Path(os.path.realpath(base + suffix))] = what.format(url=database.display_url)
    return files


def check_output(target: Path, protect: Mapping[Path, str] | None = None) -> None:
    """Refuse, before any work, an output file that cannot or must not be written.

    ``protect`` maps real paths that must never be replaced (:func:`ledger_files`) to
    what they are. :func:`whole_file` checks again; commands call this first too, so a
    typo fails before a run is read.
    """
    where = target.parent
    if not where.is_dir():
        raise OutputFileError(f"cannot write {target}: there is no directory {where}")
    if target.is_dir():
        raise OutputFileError(f"cannot write {target}: it is a directory; name a file to write")
    real = Path(os.path.realpath(target))
    what = (protect or {}).get(real)
    if what is not None:
        shown = f"{target}" if str(real) == os.path.abspath(target) else f"{target} (= {real})"
        raise OutputFileError(
            f"cannot write {shown}: it is {what}; replacing it would lose the runs in "
            "the ledger — write to another file"
        )
    if not os.access(where, os.W_OK | os.X_OK):
        raise OutputFileError(f"cannot write {target}: the directory {where} is not writable")


@contextmanager
def whole_file(target: Path, protect: Mapping[Path, str] | None = None) -> Iterator[BinaryIO]:
    """Write ``target`` whole or not at all: yields the binary stream to write it through.

    How, and why:

    - The bytes go to a temporary file next to the target (same filesystem, so the
      rename is atomic), created by ``mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW`` under
      a fresh random name, mode 0600. A planted ``FILE.partial`` (a symlink to a victim)
      is never opened, let alone written through.
    - On a clean exit the file is flushed and fsynced, then renamed over the target
      (``os.replace``; a symlink at the target is replaced, not followed), and the
      directory is fsynced so the rename survives a crash. The target keeps the
      temporary file's mode: 0600, also when it replaces a file that was 0644.
    - On every failure — a write error (full disk), an error of the caller's (an
      unknown run found mid-way), Ctrl-C — the temporary file is removed and the target
      is untouched. A write error is re-raised as :class:`OutputFileError` naming the
      target (an ``OSError`` from ``write`` carries no file name).
    """
    import tempfile  # only a command that writes a file needs it

    check_output(target, protect)
    try:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    except OSError as exc:
        raise _write_error(target, exc) from None
    stream = os.fdopen(fd, "wb")
    written = False
    try:
        os.fchmod(fd, OUTPUT_FILE_MODE)  # 0600 whatever the umask
        yield stream
        stream.flush()
        os.fsync(fd)
        stream.close()
        os.replace(name, target)
        written = True
    except OSError as exc:
        if exc.filename not in (None, name, str(target)):  # another file's error names it
            raise
        raise _write_error(target, exc) from None
    finally:
        if not written:
            with suppress(OSError):
                stream.close()
            with suppress(OSError):
                os.unlink(name)
    _sync_directory(target.parent)


def _write_error(target: Path, exc: OSError) -> OutputFileError:
    return OutputFileError(f"{target}: {exc.strerror or exc}")


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; some filesystems cannot, and need not."""
    with suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
