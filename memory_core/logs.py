"""Logging: a library is a guest in its host.

The library logs through the standard `logging` module under the `memory_core` logger, which
carries a `NullHandler`: nothing reaches the host's stdout or stderr unless the host configures
logging. Records carry event names and ids, never snapshot content (no query, answer, SQL or
owner id; error descriptions are built by `describe_error`).

`log = get_logger(__name__)`, then `log.info("memory.finalize_saved", thread_id=..., seq=...)`:
the level is checked first, so a disabled level costs one comparison on the hot path (no
formatting, no record). The message is a `LogEvent`:
plain handlers print `memory.finalize_saved thread_id=... seq=...`; `configure_logging` (used
by the CLI and the workers) renders it as one JSON object per line.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import MutableMapping
from typing import IO, Any

LIBRARY_LOGGER = "memory_core"


class LogEvent:
    """An event name and its fields; rendered lazily, only if a handler formats it."""

    __slots__ = ("fields", "name")

    def __init__(self, name: str, fields: dict[str, Any]) -> None:
        self.name = name
        self.fields = fields

    def __str__(self) -> str:
        return " ".join([self.name, *(f"{k}={v}" for k, v in self.fields.items())])


def log_event(logger: logging.Logger, level: int, name: str, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, LogEvent(name, fields))


class EventLogger:
    """structlog-style calls (`log.warning("event", key=value)`) on a standard logger."""

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def debug(self, name: str, **fields: Any) -> None:
        log_event(self.logger, logging.DEBUG, name, **fields)

    def info(self, name: str, **fields: Any) -> None:
        log_event(self.logger, logging.INFO, name, **fields)

    def warning(self, name: str, **fields: Any) -> None:
        log_event(self.logger, logging.WARNING, name, **fields)

    def error(self, name: str, **fields: Any) -> None:
        log_event(self.logger, logging.ERROR, name, **fields)

    def log(self, level: int, name: str, **fields: Any) -> None:
        log_event(self.logger, level, name, **fields)


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def describe_error(exc: BaseException) -> str:
    """`ClassName at file.py:123 (function)`: where an unexpected error came from, no message.

    Exception messages may quote the data being processed (a driver error citing a row, a
    validation error citing input), so unexpected errors are described by class and origin.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return type(exc).__name__
    last = frames[-1]
    return f"{type(exc).__name__} at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} ({last.name})"


def _unpack_log_event(
    _: Any, __: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    msg = getattr(record, "msg", None)
    if isinstance(msg, LogEvent):
        event_dict["event"] = msg.name
        for key, value in msg.fields.items():
            event_dict.setdefault(key, value)
    return event_dict


def configure_logging(level: int | str = logging.INFO, stream: IO[str] | None = None) -> None:
    """JSON lines on `stream` (stderr) for every logger: the library's, Celery's, structlog's.

    For processes this project owns (the CLI, the workers); a host embedding the library
    configures logging its own way.
    """
    import structlog  # noqa: PLC0415 - only processes we own pay for it, not a host

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, _unpack_log_event],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(default=str),
        ],
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_memory_handler", False):
            root.removeHandler(old)
    handler._memory_handler = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


logging.getLogger(LIBRARY_LOGGER).addHandler(logging.NullHandler())
