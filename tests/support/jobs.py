"""Running a task body in-process as a worker would, and reading what it left on the broker.

No worker and no eager mode: the request is pushed as Celery pushes it for a job taken from the
task's queue, and a retry is published to the real broker (tests/test_task_branches*.py).
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, cast

import pytest
import redis
from celery import Task
from celery.exceptions import Reject, Retry

from memory_core.devservices.ports import free_port
from memory_core.fold.publisher import FINALIZE_QUEUE, FOLD_QUEUE
from memory_core.io.redis_client import get_redis
from memory_core.io.redis_kinds import SyncRedis
from memory_core.settings import reset_settings_cache
from tests.support.snapshots import make_snapshot
from workers import tasks
from workers.tasks import Discard

QUEUES = {tasks.finalize_turn.name: FINALIZE_QUEUE, tasks.fold_thread.name: FOLD_QUEUE}
Job = tuple[dict[str, Any], list[Any]]  # a queued job's headers and positional arguments


def configure(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    """Settings from this environment, and a task process with nothing built yet."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset_settings_cache()
    tasks.MemoryTask._memory = None
    tasks.MemoryTask._folder = None


# A local port where nothing listens: Postgres there is down.
DEAD_POSTGRES = f"postgresql://postgres@127.0.0.1:{free_port()}/agent_memory"


def run_job(
    task: Task,
    *args: Any,
    retries: int = 0,
    task_id: str = "",
    headers: dict[str, Any] | None = None,
) -> Any:
    """Run the task body here as a worker would run a job taken from the task's queue
    (`headers`: message headers the broker added, such as RabbitMQ's x-delivery-count)."""
    queue = QUEUES[task.name]
    task.push_request(
        **(headers or {}),
        id=task_id or str(uuid.uuid4()),
        args=list(args),
        kwargs={},
        retries=retries,
        # As Celery publishes jobs (the anonymous exchange, routed by queue name).
        delivery_info={"exchange": "", "routing_key": queue, "priority": 0},
        called_directly=False,
        is_eager=False,
    )
    try:
        return task(*args)
    finally:
        task.pop_request()


def broker() -> SyncRedis:
    """The broker the tasks' app publishes to (Celery reads CELERY_BROKER_URL first)."""
    return get_redis(str(tasks.app.conf.broker_url))


def queued(queue: str) -> list[tuple[str, Job]]:
    """The jobs waiting on `queue`: kombu's Redis transport keeps one list per queue, of
    JSON messages whose body (the task's [args, kwargs, embed]) is base64."""
    jobs: list[tuple[str, Job]] = []
    for raw in cast(list[bytes], broker().lrange(queue, 0, -1)):
        msg = json.loads(raw)
        args = json.loads(base64.b64decode(msg["body"]))[0]
        jobs.append((raw.decode(), (msg["headers"], args)))
    return jobs


def take_jobs(queue: str, *, task_id: str = "", thread_id: str = "") -> list[Job]:
    """Remove and return the jobs of `queue` with this task id or for this thread."""
    taken: list[Job] = []
    for raw, (headers, args) in queued(queue):
        arg = args[0] if args else None
        tid = arg.get("thread_id") if isinstance(arg, dict) else arg
        if headers["id"] == task_id or (thread_id and tid == thread_id):
            broker().lrem(queue, 1, raw)
            taken.append((headers, args))
    return taken


def retried(task: Task, *args: Any, retries: int = 0) -> tuple[float, str]:
    """Run a job that must retry: its countdown and reason, once its retry is on its queue."""
    task_id = str(uuid.uuid4())
    with pytest.raises(Retry) as raised:
        run_job(task, *args, retries=retries, task_id=task_id)
    when = raised.value.when
    assert isinstance(when, int | float)
    [(headers, queued_args)] = take_jobs(QUEUES[task.name], task_id=task_id)
    assert (headers["task"], headers["retries"], queued_args) == (task.name, retries + 1, [*args])
    # Celery keeps the countdown in the message as an ETA: the worker holds it until then.
    eta = datetime.fromisoformat(headers["eta"])
    assert abs((eta - datetime.now(eta.tzinfo)).total_seconds() - when) < 5
    return float(when), str(raised.value.exc)


def rejected(task: Task, *args: Any, headers: dict[str, Any] | None = None) -> Reject:
    """Run a job that must be rejected (Celery's Reject: dead-lettered or requeued)."""
    with pytest.raises(Reject) as raised:
        run_job(task, *args, headers=headers)
    return raised.value


def discarded(task: Task, *args: Any) -> Discard:
    """Run a job that must be refused for good: acked (never dead-lettered), with a reason."""
    with pytest.raises(Discard) as raised:
        run_job(task, *args)
    return raised.value


def a_job(task: Task) -> Any:
    """A well-formed argument for `task`."""
    tid = uuid.uuid4()
    return make_snapshot(tid, 1) if task is tasks.finalize_turn else str(tid)


def private_events(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[str]:
    """A private event stream, no LLM (LLM-free folds), no Langfuse; fresh task caches."""
    stream = f"memory:events:test:{uuid.uuid4().hex[:8]}"
    no_llm = dict.fromkeys(["OPENAI_BASE_URL", "OPENAI_API_KEY", "LANGFUSE_PUBLIC_KEY"], "")
    configure(monkeypatch, MEMORY_EVENTS_STREAM=stream, **no_llm)
    yield stream
    redis_client.delete(stream, f"{stream}:routine")
    monkeypatch.undo()
    configure(monkeypatch)
