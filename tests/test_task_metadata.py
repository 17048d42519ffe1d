"""Task metadata carries ids only: what Flower keeps (Celery's task events) and what the broker
keeps of a job no task runs (`memory.dead`), on both brokers (issue 30, items 11 and 12)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from functools import partial

import pytest
import redis
from celery import Celery

from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.queues import FINALIZE_QUEUE, FINALIZE_TASK, FOLD_QUEUE
from memory_core.settings import get_settings
from memory_core.write.enqueue import enqueue_turn
from tests.support.brokers import BROKERS
from tests.support.raw_jobs import checkout_worker_argv, dead_letters, send_raw
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events
from tests.support.task_events import TaskEvents, strings
from tests.support.workers import send_finalize

MEMORY_JOB_REFUSED = "memory_job_refused"  # memory_core.events (a new name)
pytestmark = pytest.mark.workers
on_both_brokers = pytest.mark.parametrize("broker", BROKERS, indirect=True)
MARK = "c0ntent-" + uuid.uuid4().hex[:12]


@pytest.fixture
def task_events(broker: str) -> Iterator[TaskEvents]:
    events = TaskEvents(broker).start()
    yield events
    events.stop()


def _succeeded(task_events: TaskEvents, task_id: str) -> bool:
    return "task-succeeded" in task_events.types(task_id)


def _leaks(values: list[str]) -> list[str]:
    return [v for v in values if MARK in v]


@on_both_brokers
def test_task_events_carry_ids_only_whatever_the_producer_sent(
    task_events: TaskEvents,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
) -> None:
    start_worker(argv=checkout_worker_argv())
    tid = uuid.uuid4()
    readme = make_snapshot(tid, 1, owner_id=f"owner-{MARK}", user_query=f"query {MARK}")
    ours = make_snapshot(tid, 2, owner_id=f"owner-{MARK}", answer=f"answer {MARK}")
    sent = [send_finalize(agent, readme)]  # the README's snippet: Celery's default argsrepr
    outcome = enqueue_turn(ours, broker_url=broker)  # the enqueue path
    assert outcome.status == "enqueued" and outcome.task_id
    sent.append(outcome.task_id)
    for task_id in sent:
        wait_for(partial(_succeeded, task_events, task_id), 60, "succeeded")
    received = [e for t in sent for e in task_events.of(t) if e["type"] == "task-received"]
    assert [e["args"] for e in received] == [
        f"[<dict thread_id={tid} session_id={s['session_id']}>]" for s in (readme, ours)
    ]
    assert _leaks([s for e in list(task_events.events) for s in strings(e)]) == []


@on_both_brokers
def test_a_job_no_task_runs_is_acked_with_its_event_and_never_dead_lettered(
    start_worker: Callable[..., WorkerProcess],
    broker: str,
    redis_client: redis.Redis,
    events_stream: str,
) -> None:
    w = start_worker(argv=checkout_worker_argv())
    snap = make_snapshot(uuid.uuid4(), 1, user_query=f"query {MARK}")
    jobs = {
        send_raw(broker, FINALIZE_QUEUE, "memory.no_such_task", [snap]): "unknown_task",
        send_raw(
            broker,
            FINALIZE_QUEUE,
            FINALIZE_TASK,
            content_type="application/x-yaml",
            body=f"- {MARK}\n".encode(),
        ): "serializer",
        send_raw(broker, FOLD_QUEUE, FINALIZE_TASK, body=b"\xff[" + MARK.encode()): "undecodable",
    }
    refused: dict[str, str] = {}

    def all_refused() -> bool:
        for e in drain_events(redis_client, events_stream):
            if e.event == MEMORY_JOB_REFUSED:
                refused[e.fields["message_id"]] = e.fields["reason"]
        return len(refused) >= len(jobs)

    wait_for(all_refused, 60, "three refusals", w.log)
    assert refused == jobs
    assert dead_letters(broker) == []  # memory.dead holds poison jobs only
    assert MARK not in w.log() and w.alive()


def test_jobs_the_workers_send_name_ids_only_in_their_headers(broker: str) -> None:
    # Retries and `delay()` from worker code go through MemoryTask.apply_async.
    from workers.lifecycle_tasks import forget_owner_task

    if get_settings().celery_broker_url != broker:  # pragma: no cover - the fixture's broker
        pytest.skip("the worker app is bound to the session broker")
    forget_owner_task.apply_async([f"owner-{MARK}"], queue=FOLD_QUEUE)
    client = redis.Redis.from_url(broker)
    (raw,) = client.lrange(FOLD_QUEUE, 0, -1)
    headers = json.loads(raw)["headers"]
    assert (headers["argsrepr"], headers["kwargsrepr"]) == ("[<str>]", "{}")
