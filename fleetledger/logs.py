"""structlog set-up: every shard transition is one log event with its rule and evidence.

Console lines for a person at a terminal, JSON lines for a log pipeline (one object
per line: ``event``, ``level``, ``timestamp`` and the transition's fields — run, seq,
shard, before, after, rule, evidence, epoch). Logs go to stderr: stdout carries a
command's answer.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog

LogFormat = Literal["console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("console", "json")


def configure_logging(
    level: str = "warning", fmt: LogFormat = "console", stream: TextIO | None = None
) -> None:
    """Configure structlog for the process. Unknown level or format: a clear error."""
    levels = logging.getLevelNamesMapping()
    if level.upper() not in levels:
        raise ValueError(
            f"unknown log level {level!r}; expected one of debug, info, warning, error"
        )
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(LOG_FORMATS)}")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(levels[level.upper()]),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stderr),
        cache_logger_on_first_use=False,
    )
