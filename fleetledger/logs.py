"""structlog set-up: every shard transition is one log event with its rule and evidence.

Console lines for a person at a terminal, JSON lines for a log pipeline (one object
per line: ``event``, ``level``, ``timestamp`` and the transition's fields — run, seq,
shard, before, after, rule, evidence, epoch). Logs go to stderr: stdout carries a
command's answer.

Importing structlog costs a read command about a quarter of its start-up budget
(``structlog.dev`` loads rich's traceback and pretty printers), and most commands never
log a line. So the CLI chooses the configuration at start-up without importing structlog
(:func:`defer_logging`), and the choice waits here until structlog is needed. One rule
for everything that logs: structlog is reached through :func:`structlog_ready`, which
imports it and applies the waiting configuration first. The read side's module-level
loggers (:func:`get_logger`) call it on their first log line; a command that runs code
importing structlog itself (the controller, the engines, ``simulate``) calls it before
it imports that code. An unconfigured structlog must never log: its default prints to
stdout, which carries the command's answer.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

LogFormat = Literal["console", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("console", "json")


@dataclass(frozen=True)
class LogSettings:
    """A checked configuration: the level's number, the format, the stream (``None``:
    ``sys.stderr`` as it is when the configuration is applied)."""

    level: int
    fmt: LogFormat
    stream: TextIO | None = None


# The configuration the CLI chose, not yet applied because structlog is not loaded yet.
_pending: LogSettings | None = None


def log_settings(
    level: str = "warning", fmt: str = "console", stream: TextIO | None = None
) -> LogSettings:
    """``level`` and ``fmt`` checked, without structlog. Unknown level or format: a clear
    error."""
    import logging  # not at import: `--version` and `--help` never check a level

    levels = logging.getLevelNamesMapping()
    if level.upper() not in levels:
        raise ValueError(
            f"unknown log level {level!r}; expected one of debug, info, warning, error"
        )
    if fmt not in LOG_FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; expected one of {', '.join(LOG_FORMATS)}")
    return LogSettings(levels[level.upper()], cast("LogFormat", fmt), stream)


def configure_logging(
    level: str = "warning", fmt: LogFormat = "console", stream: TextIO | None = None
) -> None:
    """Configure structlog for the process now. Unknown level or format: a clear error."""
    global _pending
    settings = log_settings(level, fmt, stream)
    _pending = None  # this one replaces whatever was waiting
    _apply(settings)


def defer_logging(
    level: str = "warning", fmt: str = "console", stream: TextIO | None = None
) -> None:
    """Choose the configuration now (an unknown level or format is the same clear error
    as :func:`configure_logging`'s), apply it when structlog is first needed.

    With structlog already loaded (a test, a program that uses the package) it is applied
    at once: that costs nothing, and leaves nothing waiting that a later, unrelated log
    line in the same process would pick up.
    """
    global _pending
    settings = log_settings(level, fmt, stream)
    if "structlog" in sys.modules:
        _pending = None
        _apply(settings)
    else:
        _pending = settings


LOG_LEVEL_ENV = "FLEETLEDGER_LOG"
LOG_FORMAT_ENV = "FLEETLEDGER_LOG_FORMAT"


def defer_logging_from_env() -> str | None:
    """Choose the configuration ``FLEETLEDGER_LOG`` (level) and ``FLEETLEDGER_LOG_FORMAT``
    name, as :func:`defer_logging` does; a bad value gives the default configuration,
    and the warning to say is returned (a logging typo must not stop a command)."""
    level = os.environ.get(LOG_LEVEL_ENV, "warning")
    fmt = os.environ.get(LOG_FORMAT_ENV, "console")
    try:
        defer_logging(level, fmt)
    except ValueError as exc:
        defer_logging()
        return f"{exc}; logging at warning level to the console"
    return None


def structlog_ready() -> ModuleType:
    """structlog, with the configuration chosen by :func:`defer_logging` applied (once):
    the one way to structlog for code that may run before anything configured it."""
    global _pending
    import structlog

    settings, _pending = _pending, None
    if settings is not None:
        _apply(settings)
    return structlog


def _apply(settings: LogSettings) -> None:
    import structlog

    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(sort_keys=True)
        if settings.fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(settings.level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(file=settings.stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


class _LazyLogger:
    """A module-level logger whose module can be imported without structlog: structlog is
    imported (and the waiting configuration applied) on the first log line."""

    __slots__ = ("_bound", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._bound: Any = None

    def __getattr__(self, attr: str) -> Any:
        # Only names the slots do not hold get here: the log methods (warning, info …).
        if self._bound is None:
            self._bound = structlog_ready().get_logger(self._name)
        return getattr(self._bound, attr)


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger for a module that must not import structlog when it is imported (the
    read path of every command): structlog is loaded on its first log line."""
    return cast("FilteringBoundLogger", _LazyLogger(name))
