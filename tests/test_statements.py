"""The log's SQL: SQLite's text is what Core compiles, and each statement runs on both
backends' drivers.

A read on a SQLite ledger runs SQL kept as text (``sqlite_statements``) so that it need
not import SQLAlchemy; this file holds that text to Core's compilation of the same
statements. When it fails, it prints the module to write.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pytest
from sqlalchemy.dialects import sqlite

from fleetledger.events.core_statements import compile_statements
from fleetledger.events.sqlite_statements import SQLITE_STATEMENTS
from fleetledger.events.statements import DriverStatement, ListStatement, Statements

MODULE = Path(__file__).parent.parent / "fleetledger" / "events" / "sqlite_statements.py"


def _literal(text: str, indent: str) -> str:
    """``text`` as adjacent string literals of at most ~80 characters, cut at spaces."""
    pieces: list[str] = []
    for line in text.splitlines(keepends=True):
        pieces.extend(
            textwrap.wrap(
                line, 76, replace_whitespace=False, drop_whitespace=False, break_long_words=False
            )
        )
    if len(pieces) == 1:
        return json.dumps(pieces[0])
    inner = "".join(f"{indent}    {json.dumps(piece)}\n" for piece in pieces)
    return f"(\n{inner}{indent})"


def _statement(value: DriverStatement | ListStatement | None, indent: str) -> str:
    if value is None:
        return "None"
    inner = indent + "    "
    if isinstance(value, DriverStatement):
        args = [_literal(value.sql, inner), repr(value.order)]
        if value.defaults:
            args.append(repr(dict(value.defaults)))
        kind = "DriverStatement"
    else:
        args = [
            _literal(value.before, inner),
            repr(value.after),
            repr(value.order),
            repr(value.listed),
        ]
        kind = "ListStatement"
    body = "".join(f"{inner}{arg},\n" for arg in args)
    return f"{kind}(\n{body}{indent})"


def render_module(statements: Statements) -> str:
    header, _, _ = MODULE.read_text().partition("\nSQLITE_STATEMENTS = ")
    fields = "".join(
        f"    {field.name}={_statement(getattr(statements, field.name), '    ')},\n"
        for field in dataclasses.fields(statements)
    )
    return f"{header}\nSQLITE_STATEMENTS = Statements(\n{fields})\n"


def test_sqlite_statements_are_what_core_compiles_for_sqlite() -> None:
    compiled = compile_statements(sqlite.dialect())
    if compiled != SQLITE_STATEMENTS:
        pytest.fail(
            "fleetledger/events/sqlite_statements.py is not what Core compiles; write:\n\n"
            + render_module(compiled)
        )


@pytest.mark.parametrize("count", [1, 2, 7])
def test_an_in_list_takes_as_many_values_as_it_is_given(count: int) -> None:
    ids = [f"id-{i}" for i in range(count)]
    sql, params = SQLITE_STATEMENTS.stored_ids.bound(ids, run="r")
    assert sql.count("?") == count + 1
    assert params == ("r", *ids)
