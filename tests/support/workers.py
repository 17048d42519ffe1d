"""Test workers and the agent side of the broker: what a test worker runs with, and a producer
that sends jobs by name as an agent service would. The worker subprocess itself is
`memory_core.devservices.workers.WorkerProcess` (fixture `start_worker`)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from memory_core.fold_publisher import FINALIZE_QUEUE, FINALIZE_TASK, FOLD_QUEUE, FOLD_TASK
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
        "MEMORY_WORKER_SOFT_SHUTDOWN_S": "10",
    }


def producer() -> Celery:
    """A service that does not import this package: it sends jobs by task name."""
    app = Celery(
        "some-agent-service", broker=get_settings().celery_broker_url, set_as_current=False
    )
    app.conf.task_serializer = "json"
    return app


def send_finalize(app: Celery, snapshot: Any) -> None:
    app.send_task(FINALIZE_TASK, args=[snapshot], queue=FINALIZE_QUEUE)


def send_fold(app: Celery, thread_id: Any) -> None:
    app.send_task(FOLD_TASK, args=[thread_id], queue=FOLD_QUEUE)
