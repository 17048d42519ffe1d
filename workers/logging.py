"""structlog for workers: JSON lines with the task id, thread id and session id bound per task."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog
from celery.signals import task_postrun, task_prerun

_configured = False


def configure_logging(level: int = logging.INFO) -> None:
    global _configured  # noqa: PLW0603 - configure once per process
    if _configured:
        return
    _configured = True
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=True,
    )


@task_prerun.connect
def _bind_task(task_id: str | None = None, task: Any = None, args: Any = None, **_: Any) -> None:
    structlog.contextvars.clear_contextvars()
    ids: dict[str, str] = {"task_id": task_id or "", "task": getattr(task, "name", "")}
    first = args[0] if args else None
    if isinstance(first, dict):
        for key in ("thread_id", "session_id"):
            if isinstance(first.get(key), str):
                ids[key] = first[key][:64]
    elif isinstance(first, str):
        ids["thread_id"] = first[:64]
    structlog.contextvars.bind_contextvars(**ids)


@task_postrun.connect
def _unbind_task(**_: Any) -> None:
    structlog.contextvars.clear_contextvars()
