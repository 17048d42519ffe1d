"""Publishing `memory.fold_thread` by name, so the core never imports the worker package.

Publishing is best effort and bounded: a down broker costs at most about a second and is only
logged. The fold request is also recorded on the thread row (`fold_due_at`), so a later
finalize re-publishes a fold whose message never made it (see ConversationThread.claim_next_seq).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from uuid import UUID

from celery import Celery

from memory_core.logs import get_logger
from memory_core.metrics import FOLD_PUBLISH_FAILURES
from memory_core.settings import get_settings

log = get_logger(__name__)

FOLD_TASK = "memory.fold_thread"
FOLD_QUEUE = "memory.fold"
FINALIZE_TASK = "memory.finalize_turn"
FINALIZE_QUEUE = "memory.finalize"
# The worker package: `workers/` in a checkout, `memory_core.workers` once installed (the wheel
# has one top-level name, docs/ARCHITECTURE.md "Names"). Tools start workers by this name.
WORKER_PACKAGE = "memory_core.workers"
WORKER_APP = f"{WORKER_PACKAGE}.app"


@lru_cache(maxsize=4)
def publisher_app(broker_url: str) -> Celery:
    app = Celery("agent-memory-publisher", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        broker_connection_timeout=1.0,
        broker_connection_retry=False,
        broker_transport_options={
            "socket_connect_timeout": 1.0,
            "socket_timeout": 1.0,
            "max_retries": 0,
        },
    )
    return app


def send_by_name(task: str, args: list[Any], queue: str, broker_url: str | None = None) -> str:
    """Publish `task` by name to `queue` on `broker_url`; its task id (raises on broker trouble).

    An explicit connection: Celery lets a CELERY_BROKER_URL environment variable override the
    app's `broker=`, which would silently send to another broker than the one asked for.
    """
    url = broker_url or get_settings().celery_broker_url
    app = publisher_app(url)
    with app.connection_for_write(url) as conn:
        return str(app.send_task(task, args=args, queue=queue, connection=conn, retry=False).id)


def publish_fold(thread_id: UUID | str, broker_url: str | None = None) -> bool:
    """Enqueue a fold for the thread; False (logged) when the broker is unreachable."""
    try:
        send_by_name(FOLD_TASK, [str(thread_id)], FOLD_QUEUE, broker_url)
    except Exception as exc:  # any broker/transport error: the row still says a fold is due
        log.warning("memory.fold_publish_failed", thread_id=str(thread_id), error=repr(exc))
        FOLD_PUBLISH_FAILURES.inc()
        return False
    return True
