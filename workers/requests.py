"""What the workers say about a job: ids only, whatever the producer put in the message.

Celery copies a message's `argsrepr` / `kwargsrepr` headers into the `task-received` event
(and into its log records), and a producer that did not set them sends the whole snapshot
there: Flower kept owner ids, queries and answers, also after `forget_owner`. `MemoryRequest`
(every memory task's `Request`) rewrites both from the decoded arguments with
`memory_core.io.queues.task_reprs` before any event or log sees them, and withholds tracebacks
from task events (a chained exception's message may quote what it was processing).

A message Celery refuses before any task runs (an unknown task name, a body that is not a task
message, another serializer, an undecodable body) is Celery's to reject, which on RabbitMQ
dead-letters it into `memory.dead`, content and all, and logs its whole body. `refuse_message`
(the worker's consumer, workers/app.py) acks it instead, with a `memory_job_refused` event and
`memory_jobs_refused_total`: `memory.dead` keeps poison jobs only (docs/OPERATIONS.md).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.request import Request

from memory_core.events import MEMORY_JOB_REFUSED, emit_event
from memory_core.io.queues import (
    FINALIZE_QUEUE,
    FOLD_QUEUE,
    MEMORY_TASKS,
    canonical_uuid,
    task_reprs,
)
from memory_core.io.redis_client import get_redis
from memory_core.logs import get_logger
from memory_core.metrics import JOBS_REFUSED

log = get_logger(__name__)
_celery_log = logging.getLogger(__name__)

OUR_TASKS = frozenset(MEMORY_TASKS)
OUR_QUEUES = frozenset({FINALIZE_QUEUE, FOLD_QUEUE})
# A task name an event may carry: a dotted identifier, as producers' code writes them.
_TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,127}")
# Why a job was refused: the `reason` of its event and metric, and the event's `error`.
REFUSALS = {
    "unknown_task": "no worker runs a task of this name",
    "not_a_task": "not a task message (no task name)",
    "serializer": "content type not accepted (the memory tasks take JSON only)",
    "undecodable": "the body does not decode",
    "invalid_message": "not a valid task message",
    "wrong_arguments": "wrong arguments for the task",
    "invalid_argument": "an argument is invalid for the task",
}


class MemoryRequest(Request):
    """Celery's request, with ids-only `argsrepr` / `kwargsrepr` and no traceback in events.

    Also refuses, as an invalid message (`on_invalid_task`), what Celery would otherwise
    take and fail on later: arguments that are not a list, keyword arguments that are not
    a mapping, an ETA no clock can hold."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self._args, (list, tuple)) or not isinstance(self._kwargs, dict):
            raise InvalidTaskError("arguments must be a list and keyword arguments a mapping")
        if self._eta is not None:
            try:
                self._eta.timestamp()
            except (OverflowError, ValueError, OSError):
                raise InvalidTaskError("ETA out of range") from None
        reprs = task_reprs(self._args, self._kwargs)
        self._argsrepr, self._kwargsrepr = reprs["argsrepr"], reprs["kwargsrepr"]
        self._request_dict.update(reprs)  # the pool child logs and retries from these
        self.name = self._type  # a `shadow` header names nothing else in events
        for slot in ("_root_id", "_parent_id"):  # producer-chosen, shown in task-received
            if not canonical_uuid(getattr(self, slot)):
                setattr(self, slot, None)

    def send_event(self, type: str, **fields: Any) -> None:
        if "traceback" in fields:
            fields["traceback"] = ""
        super().send_event(type, **fields)


def message_ids(message: Any) -> dict[str, str]:
    """What an event may say about a message: its id if a UUID, its task name if it is a
    plain dotted name, its queue if it is one of ours; "" for each otherwise."""
    headers = message.headers if isinstance(message.headers, dict) else {}
    properties = message.properties if isinstance(message.properties, dict) else {}
    info = message.delivery_info if isinstance(message.delivery_info, dict) else {}
    message_id = next(
        (v for v in (headers.get("id"), properties.get("correlation_id")) if canonical_uuid(v)),
        "",
    )
    task = headers.get("task")
    queue = info.get("routing_key")
    return {
        "message_id": str(message_id).lower(),
        "task": task if isinstance(task, str) and _TASK_NAME.fullmatch(task) else "",
        "queue": queue if queue in OUR_QUEUES else "",
    }


def record_refusal(
    code: str, ids: dict[str, str], *, detail: str = "", log_as: str = "memory.job_refused"
) -> None:
    """Log, count and emit one refusal (`memory_job_refused`, `reason` = `code`, `error` =
    `detail`, both fixed texts of ours); never raises."""
    task = ids.get("task", "")
    error = detail or REFUSALS[code]
    log.warning(log_as, reason=error, refusal=code, **ids)
    JOBS_REFUSED.labels(task if task in OUR_TASKS else "other", code).inc()
    emit_event(
        get_redis(),
        MEMORY_JOB_REFUSED,
        error=error,
        reason=code,
        message_id=ids.get("message_id", ""),
        task=task,
        queue=ids.get("queue", ""),
    )


def refuse_message(consumer: Any, message: Any, reason: str) -> None:
    """Ack a message no task will run, with its event and metric (see the module docstring).
    Its content goes nowhere: not to the log, not to a task event, not to `memory.dead`."""
    ids = message_ids(message)
    record_refusal(reason, ids)
    message.ack_log_error(_celery_log, consumer.connection_errors)
    dispatcher = consumer.event_dispatcher
    if ids["message_id"] and dispatcher is not None and dispatcher.enabled:
        dispatcher.send("task-rejected", uuid=ids["message_id"], requeue=False)


def request_ids(task: Any) -> dict[str, str]:
    """`message_ids` of the job a task is running (its request)."""
    request = task.request
    info = getattr(request, "delivery_info", None) or {}
    queue = info.get("routing_key") if isinstance(info, dict) else None
    task_id = getattr(request, "id", None)
    return {
        "message_id": str(task_id).lower() if canonical_uuid(task_id) else "",
        "task": task.name,
        "queue": queue if queue in OUR_QUEUES else "",
    }
