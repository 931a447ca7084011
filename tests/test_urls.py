"""Database URLs are read without SQLAlchemy, and read as SQLAlchemy reads them.

A read of a SQLite ledger never imports SQLAlchemy, so ``store.urls`` parses and renders
URLs itself; the engines of write opens and of PostgreSQL are built from the same URL.
These properties hold the two readings together: the same parts (or both refuse),
the same text when shown (password hidden or not), the same URL for an engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from fleetledger.store.errors import LedgerOpenError
from fleetledger.store.urls import parse_db_url, split_url

SCHEMES = ["sqlite", "sqlite+pysqlite", "postgresql", "postgres", "postgresql+psycopg", "my_db"]
# Every character the grammar treats specially, a few it does not, and non-ASCII ones
# (a non-ASCII digit is a digit to int(), so a port may be one).
CHARS = "ab09:/@?&=%+[]._- #\n\té١"


def _parts(url: Any, render: Callable[..., str]) -> tuple[object, ...]:
    return (
        url.drivername,
        url.username,
        url.password,
        url.host,
        url.port,
        url.database,
        dict(url.query),
        render(hide_password=True),
        render(hide_password=False),
    )


def _sqlalchemy(text: str) -> object:
    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        return "refused"
    return _parts(url, url.render_as_string)


def _ours(text: str) -> object:
    try:
        url = split_url(text)
    except ValueError:
        return "refused"
    return _parts(url, url.render)


url_texts = st.one_of(
    st.builds(lambda s, rest: f"{s}://{rest}", st.sampled_from(SCHEMES), st.text(CHARS)),
    st.text(CHARS),
)


@settings(max_examples=1500)
@given(url_texts)
@example("sqlite:///relative/ledger.db")
@example("sqlite:////abs/ledger.db?mode=ro&uri=true&timeout=2")
@example("postgresql://user:p%40ss@[::1]:5432/db?options=-c%20a%3Db&x=1&x=2")
@example("postgresql://h:/db")
@example("postgresql://postgres@127.0.0.1:notaport/db")
@example("sqlite://")
@example("://")
def test_a_url_reads_as_sqlalchemy_reads_it(text: str) -> None:
    assert _ours(text) == _sqlalchemy(text)


@settings(max_examples=500)
@given(url_texts)
def test_the_engine_gets_the_url_sqlalchemy_would_have_parsed(text: str) -> None:
    try:
        ours = split_url(text)
    except ValueError:
        return
    assert ours.sqlalchemy() == make_url(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not a url", "it is not of the form scheme://"),
        ("postgresql://postgres@127.0.0.1:notaport/db", "port 'notaport' is not a number"),
        ("postgresql://postgres@127.0.0.1:/db", "port '' is not a number"),
    ],
)
def test_a_url_that_does_not_parse_says_what_does_not_fit(text: str, problem: str) -> None:
    with pytest.raises(LedgerOpenError, match="cannot parse database URL") as info:
        parse_db_url(text)
    assert problem in str(info.value)
    assert "\n" not in str(info.value)
