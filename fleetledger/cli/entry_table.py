"""The replay table: one row per history entry, in the same fixed columns everywhere.

The words of each entry are ``projections.entry_words``'; ``EntryTable`` prints rows a
few at a time so a million-entry replay and a live watch line up under one header.
Rules, reasons and error texts come from the log: every cell is
:func:`~fleetledger.cli.output.safe_text`, never markup, controls escaped.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.table import Column, Table

from fleetledger.cli.output import data_row, terminal_safe
from fleetledger.events.models import FleetConfig, datetime_from_us
from fleetledger.projections.entry_words import Row, describe
from fleetledger.projections.explain.words import CauseQuotes
from fleetledger.projections.history import Entry, TransitionEntry

# Rows per rendered table: rich measures a whole table before printing it, so a long
# replay is printed as a stack of tables with the same fixed columns.
TABLE_CHUNK = 500
# Narrower than this, the detail goes under its row instead of beside it: beside the
# fixed columns (about 60 characters) an 80-column terminal left it 20, one word a line.
NARROW_WIDTH = 110
DETAIL_INDENT = "    "


# ── rendering entries ──────────────────────────────────────────────────────────


def _time(at_us: int) -> str:
    # The whole date: a row is quoted on its own, in a post-mortem a year later too;
    # milliseconds are enough for a person to order what happened.
    return datetime_from_us(at_us).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


class EntryTable:
    """Prints entries as rows of one table with fixed columns, a few rows at a time.

    The columns before the detail have fixed widths, so tables printed one after the
    other (chunks of a replay, single rows of a watch) line up under one header.
    """

    def __init__(self, console: Console, config: FleetConfig, seq_width: int) -> None:
        self.console = console
        self.config = config
        self.seq_width = max(3, seq_width)
        self.narrow = console.width < NARROW_WIDTH
        self.quotes = CauseQuotes()  # each cause whole once, then by its seq

    def _table(self, header: bool) -> Table:
        # The header's rule spans the terminal; off a terminal (a pipe, a file) there is
        # none: it was drawn as wide as the longest detail (1,089 characters once).
        return Table(
            Column("time (UTC)", width=23, no_wrap=True),
            Column("seq", width=self.seq_width, justify="right", no_wrap=True),
            Column("shard", width=5, overflow="fold"),
            Column("what", width=22, overflow="fold"),
            Column("why / detail", overflow="fold"),
            box=box.SIMPLE_HEAD if self.console.is_terminal else None,
            show_header=header,
            show_edge=False,
            pad_edge=False,
        )

    def header(self) -> None:
        if self.narrow:
            self._print_lines([self._narrow_head("time (UTC)", "seq", "shard", "what")], "")
            return
        self._print(self._table(header=True))

    def _narrow_head(self, time: str, seq: str, shard: str, what: str) -> str:
        return f"{time:<23}  {seq:>{self.seq_width}}  {shard:<5}  {what}".rstrip()

    def _print_lines(self, lines: list[str], style: str) -> None:
        """Lines of our own making (their data already made terminal-safe)."""
        from rich.text import Text

        for line in lines:
            if self.console.is_terminal:
                self.console.print(Text(line, style=style), soft_wrap=True)
            else:
                self.console.file.write(line.rstrip() + "\n")

    def _narrow_rows(self, entries: Iterable[Entry], header: bool) -> None:
        """One entry as its row (time, seq, shard, what), its detail wrapped under it."""
        import textwrap

        if header:
            self.header()
        width = max(self.console.width, 40)
        for entry in entries:
            shard, what, detail, style = self._described(entry)
            head = self._narrow_head(_time(entry.at_us), str(entry.seq), shard, what)
            lines = [terminal_safe(head)]
            lines += textwrap.wrap(
                terminal_safe(detail),
                width=width,
                initial_indent=DETAIL_INDENT,
                subsequent_indent=DETAIL_INDENT,
                break_on_hyphens=False,
            )
            self._print_lines(lines, style)

    def _described(self, entry: Entry) -> Row:
        if isinstance(entry, TransitionEntry):
            self.quotes.learn(entry.cause, entry.seq)
        shard, what, detail, style = describe(entry, self.config)
        return shard, what, self.quotes.once(detail), style

    def _print(self, table: Table) -> None:
        if self.console.is_terminal:
            self.console.print(table)
            return
        # Off a terminal there are no colours to keep, and the padding rich adds to the
        # last column would leave trailing blanks on every line of a file.
        with self.console.capture() as captured:
            self.console.print(table)
        self.console.file.write(
            "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
        )

    def rows(self, entries: Iterable[Entry], *, header: bool = False) -> None:
        if self.narrow:
            self._narrow_rows(entries, header)
            return
        table = self._table(header)
        count = 0
        for entry in entries:
            shard, what, detail, style = self._described(entry)
            # Not markup, controls escaped: rules and reasons come from the log and may
            # hold brackets ("[rank0] …") and ESC sequences.
            data_row(table, _time(entry.at_us), entry.seq, shard, what, detail, style=style)
            count += 1
            if count == TABLE_CHUNK:
                self._print(table)
                table, count = self._table(False), 0
        if count or header:
            self._print(table)
