"""Publishing `memory.fold_thread` by name, so the core never imports the worker package.

Publishing is best effort and bounded: a down broker costs at most about a second (plus the
broker's confirm on RabbitMQ), twice when a kept connection went stale first (one more try on a
new connection: memory_core/io/broker_connections.py), and is logged and counted
(`memory_fold_publish_failures_total`).
The fold request is also recorded on the thread row (`fold_due_at`), so a later finalize
re-publishes a fold whose message never made it (see claim.claim_statement).

Every publish declares its queue exactly as the workers do (memory_core/io/queues.py), and on
RabbitMQ waits for the broker's confirm: a publish that returned is on the broker's disk, and
one the broker refused (a queue declared differently: PRECONDITION_FAILED) raises instead of
vanishing.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from uuid import UUID

from celery import Celery

from memory_core.io.broker_connections import IDLE, drop
from memory_core.io.queues import (
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    FOLD_QUEUE,
    FOLD_TASK,
    is_amqp,
    task_queue,
    task_reprs,
)
from memory_core.logs import get_logger
from memory_core.metrics import FOLD_PUBLISH_FAILURES
from memory_core.settings import get_settings

log = get_logger(__name__)

__all__ = [
    "FINALIZE_QUEUE",
    "FINALIZE_TASK",
    "FOLD_QUEUE",
    "FOLD_TASK",
    "WORKER_APP",
    "WORKER_PACKAGE",
    "publish_fold",
    "publisher_app",
    "reset_publishers",
    "send_by_name",
]
# A publish waits at most this long for the broker (connect, and on RabbitMQ its confirm).
PUBLISH_TIMEOUT_S = 1.0
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
        broker_connection_timeout=PUBLISH_TIMEOUT_S,
        broker_connection_retry=False,
        broker_transport_options=publisher_transport_options(broker_url),
    )
    return app


def reset_publishers() -> None:
    """Forget the publisher apps and close the kept connections (tests; a changed broker)."""
    publisher_app.cache_clear()
    IDLE.clear()


def publisher_transport_options(broker_url: str) -> dict[str, Any]:
    """Bounded I/O for a publish; on RabbitMQ, publisher confirms."""
    if is_amqp(broker_url):
        return {
            "confirm_publish": True,
            "read_timeout": PUBLISH_TIMEOUT_S * 5,  # the confirm: a quorum write, fsync'd
            "write_timeout": PUBLISH_TIMEOUT_S,
        }
    return {
        "socket_connect_timeout": PUBLISH_TIMEOUT_S,
        "socket_timeout": PUBLISH_TIMEOUT_S,
        "max_retries": 0,
    }


def send_by_name(task: str, args: list[Any], queue: str, broker_url: str | None = None) -> str:
    """Publish `task` by name to `queue` on `broker_url`; its task id (raises on broker trouble).

    An explicit connection: Celery lets a CELERY_BROKER_URL environment variable override the
    app's `broker=`, which would silently send to another broker than the one asked for. It is
    kept for the next publish (memory_core/io/broker_connections.py). The message's `argsrepr`
    (what Flower shows) names the job's ids only (`queues.task_reprs`).
    """
    url = broker_url or get_settings().celery_broker_url
    app = publisher_app(url)
    declared = task_queue(url, queue)  # KeyError for a queue that is not ours
    kept = IDLE.take(url)
    if kept is not None:
        try:
            return _send(kept, url, task, args, declared)
        except Exception as exc:  # a kept connection may have gone stale: a broker restart
            log.debug("memory.publish_retried_on_new_connection", error_type=type(exc).__name__)
    return _send(app.connection_for_write(url), url, task, args, declared)


def _send(conn: Any, url: str, task: str, args: list[Any], queue: Any) -> str:
    # Declare on every publish, as a new connection would: a queue deleted (or a Redis broker
    # flushed) since the last one is declared again instead of published into the void.
    conn.declared_entities.clear()
    try:
        sent = publisher_app(url).send_task(
            task, args=args, queue=queue, connection=conn, retry=False, **task_reprs(args)
        )
    except BaseException:
        drop(conn)
        raise
    IDLE.keep(url, conn)
    return str(sent.id)


def publish_fold(thread_id: UUID | str, broker_url: str | None = None) -> bool:
    """Enqueue a fold for the thread; False (logged) when the broker is unreachable."""
    try:
        send_by_name(FOLD_TASK, [str(thread_id)], FOLD_QUEUE, broker_url)
    except Exception as exc:  # any broker/transport error: the row still says a fold is due
        log.warning("memory.fold_publish_failed", thread_id=str(thread_id), error=repr(exc))
        FOLD_PUBLISH_FAILURES.inc()
        return False
    return True
