"""Worker logging: JSON lines on stderr, with the task id and the job's ids bound per task.

The library logs through the standard `logging` module (memory_core.logs); the worker renders
those records, Celery's and structlog's alike, through `configure_logging`. Only ids that parse
as UUIDs are bound: a job's fields are the agent's input and never reach a log unchecked.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import structlog
from celery.signals import task_postrun, task_prerun

from memory_core.logs import configure_logging as _configure

_configured = False


def configure_logging(level: int | str | None = None) -> None:
    global _configured  # noqa: PLW0603 - configure once per process
    if _configured:
        return
    _configured = True
    _configure(level or os.environ.get("MEMORY_LOG_LEVEL", "INFO").upper() or logging.INFO)


def _uuid_text(value: Any) -> str | None:
    if not isinstance(value, str) or len(value) != 36:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


@task_prerun.connect
def _bind_task(task_id: str | None = None, task: Any = None, args: Any = None, **_: Any) -> None:
    structlog.contextvars.clear_contextvars()
    ids: dict[str, str] = {"task_id": task_id or "", "task": getattr(task, "name", "")}
    first = args[0] if args else None
    fields = first if isinstance(first, dict) else {"thread_id": first}
    for key in ("thread_id", "session_id"):
        if (value := _uuid_text(fields.get(key))) is not None:
            ids[key] = value
    structlog.contextvars.bind_contextvars(**ids)


@task_postrun.connect
def _unbind_task(**_: Any) -> None:
    structlog.contextvars.clear_contextvars()
