"""Test workers and the agent side of the broker: what a test worker runs with, and a producer
that sends jobs by name as an agent service would. The worker subprocess itself is
`memory_core.devservices.workers.WorkerProcess` (fixture `start_worker`)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from memory_core.io.queues import (
    EXCHANGE,
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    FOLD_QUEUE,
    FOLD_TASK,
    is_amqp,
)
from memory_core.settings import get_settings


def worker_test_env(llm_base_url: str, events_stream: str) -> dict[str, str]:
    """What every test worker runs with: the fake LLM, no Langfuse, its own event stream."""
    return {
        "OPENAI_BASE_URL": llm_base_url,
        "OPENAI_API_KEY": "sk-test",
        "LANGFUSE_PUBLIC_KEY": "",
        "LANGFUSE_SECRET_KEY": "",
        "MEMORY_LLM_TIMEOUT_S": "10",
        "MEMORY_EVENTS_STREAM": events_stream,
        # Production waits 30 s on every SIGTERM, busy or idle (Celery's soft shutdown on idle,
        # which hands back waiting ETA retries); tests take the same path in 1 s. A test about
        # the soft shutdown itself sets its own.
        "MEMORY_WORKER_SOFT_SHUTDOWN_S": "1",
    }


def producer(broker_url: str | None = None) -> Celery:
    """A service that does not import this package: it sends jobs by task name (README).
    Celery lets CELERY_BROKER_URL in the environment win over `broker_url`."""
    url = broker_url or get_settings().celery_broker_url
    app = Celery("some-agent-service", broker=url, set_as_current=False)
    app.conf.task_serializer = "json"
    if is_amqp(url):  # a publish that returned is on the broker's disk
        app.conf.broker_transport_options = {"confirm_publish": True}
    return app


def destination(app: Celery, queue: str) -> dict[str, Any]:
    """Where the README's snippet sends a job. RabbitMQ: to the workers' topic exchange with
    the queue's routing key, declaring nothing (a plain declare of the workers' quorum queue
    would fail); Redis: to the queue by name."""
    if is_amqp(str(app.conf.broker_url)):
        return {"exchange": EXCHANGE, "routing_key": queue, "declare": []}
    return {"queue": queue}


def send_finalize(app: Celery, snapshot: Any) -> str:
    """Send a turn; its task id."""
    return str(app.send_task(FINALIZE_TASK, args=[snapshot], **destination(app, FINALIZE_QUEUE)).id)


def send_fold(app: Celery, thread_id: Any) -> None:
    app.send_task(FOLD_TASK, args=[thread_id], **destination(app, FOLD_QUEUE))
