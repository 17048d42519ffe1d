"""Every exit of `memory.finalize_turn`, run in this process: fast, no worker.

The task body runs as a worker runs it (`run_job`: a request with a task id, a retry count and
the delivery info of its queue), against the real Postgres, Redis and broker: nothing mocked,
no eager mode. A retry is a `Retry` *and* the job back on its broker queue with its countdown;
a reject says whether the job goes back to the queue. The exits of `memory.fold_thread` are in
test_task_branches_fold.py, which shares the helpers here. The same exits through real worker
subprocesses stay in tests/workers/test_exits.py and tests/workers/test_jobs.py;
docs/RELIABILITY.md, "Every exit of a job", lists them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Task

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.ports import free_port
from memory_core.fold.publisher import FINALIZE_QUEUE
from memory_core.metrics import FINALIZE, TASK_UNEXPECTED
from memory_core.settings import get_settings
from tests.support.faults import RowLock, engine_with_lock_timeout
from tests.support.jobs import (
    DEAD_POSTGRES,
    a_job,
    configure,
    discarded,
    private_events,
    rejected,
    retried,
    run_job,
    take_jobs,
)
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events, stored_seqs, thread_row
from workers import tasks

BOTH = pytest.mark.parametrize(
    "task", [tasks.finalize_turn, tasks.fold_thread], ids=lambda t: t.name
)


def log_names(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [getattr(r.msg, "name", r.getMessage()) for r in caplog.records]


@pytest.fixture(autouse=True)
def events(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[str]:
    yield from private_events(monkeypatch, redis_client)


# ---------------------------------------------------------------- rejected: bad input, final


@BOTH
@pytest.mark.parametrize("args", [(), ("a", "b")], ids=["no-args", "two-args"])
def test_a_job_with_the_wrong_arguments_is_rejected_without_touching_anything(
    task: Task, args: tuple[Any, ...], events: str, redis_client: redis.Redis
) -> None:
    assert discarded(task, *args).reason == "wrong arguments"  # acked: not dead-lettered
    assert tasks.MemoryTask._memory is None  # not even a memory was built
    [refused] = drain_events(redis_client, events)
    assert (refused.event, refused.fields["reason"]) == ("memory_job_refused", "wrong_arguments")
    assert refused.fields["task"] == task.name


@BOTH
def test_a_job_delivered_more_than_max_deliveries_is_dead_lettered_with_an_event(
    task: Task, events: str, redis_client: redis.Redis
) -> None:
    """RabbitMQ's quorum queues count lost deliveries (x-delivery-count): the 9th delivery
    (MEMORY_MAX_DELIVERIES=8) is not run but rejected without requeue, which dead-letters it."""
    job = a_job(task)
    tid = job["thread_id"] if isinstance(job, dict) else job
    reject = rejected(task, job, headers={"x-delivery-count": 8})
    assert reject.requeue is False and reject.reason.startswith("delivered 9 times")
    [event] = drain_events(redis_client, events)
    assert (event.event, event.thread_id, event.attempt) == ("memory_job_dead_lettered", tid, 9)
    assert event.fields["task"] == task.name
    assert thread_row(uuid.UUID(tid)) is None  # not run
    # The 8th delivery still runs; so does every one on Redis, which counts none.
    for headers in ({"x-delivery-count": 7}, {}):
        run_job(task, a_job(task), headers=headers)
    assert drain_events(redis_client, events) == []


@pytest.mark.parametrize("snapshot", ["not a snapshot", 42, None, [{"thread_id": "x"}]])
def test_a_job_that_is_not_a_snapshot_is_rejected_with_an_event(
    snapshot: Any, events: str, redis_client: redis.Redis
) -> None:
    reject = discarded(tasks.finalize_turn, snapshot)
    [event] = drain_events(redis_client, events)
    assert (event.event, event.thread_id, event.session_id) == ("memory_finalize_rejected", "", "")
    expected = f"invalid turn snapshot: expected a JSON object, got {type(snapshot).__name__}"
    assert event.error == expected == reject.reason


@pytest.mark.parametrize(
    ("field", "value"),
    [("agent_type", "robot"), ("session_id", "nope"), ("thread_id", "nope"), ("answer", 7)],
)
def test_an_invalid_snapshot_is_rejected_with_an_event_and_no_row(
    field: str, value: Any, events: str, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    snap = {**make_snapshot(tid, 1), field: value}
    discarded(tasks.finalize_turn, snap)
    [event] = drain_events(redis_client, events)
    assert event.event == "memory_finalize_rejected"
    assert event.error.startswith(f"invalid turn snapshot: {field}: ")
    assert event.thread_id == ("" if field == "thread_id" else str(tid))
    assert thread_row(tid) is None and take_jobs(FINALIZE_QUEUE, thread_id=str(tid)) == []


def test_a_turn_for_another_owners_thread_is_rejected_and_the_thread_untouched(
    events: str, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    assert run_job(tasks.finalize_turn, make_snapshot(tid, 1))["status"] == "saved"
    reject = discarded(tasks.finalize_turn, make_snapshot(tid, 2, owner_id="someone-else"))
    assert reject.reason == f"thread {tid} not found"
    [event] = drain_events(redis_client, events)
    assert (event.event, event.thread_id) == ("memory_finalize_rejected", str(tid))
    row = thread_row(tid)
    assert stored_seqs(tid) == [1] and row is not None and row.owner_id == "user-42"


# ---------------------------------------------------------------- done


def test_an_accepted_turn_lands_in_postgres_and_the_working_copy(
    events: str, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    for n in (1, 2):
        result = run_job(tasks.finalize_turn, make_snapshot(tid, n))
        assert result == {"status": "saved", "seq": n, "cache": "ok"}
    assert stored_seqs(tid) == [1, 2]
    context = RedisConversationMemory(redis_client).get_context(tid, "user-42")
    assert [turn.seq for turn in context.recent] == [1, 2]
    assert drain_events(redis_client, events) == []


def test_a_redelivered_turn_is_a_duplicate_and_lands_once() -> None:
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1)
    task_id = str(uuid.uuid4())  # a redelivery keeps its task id
    assert run_job(tasks.finalize_turn, snap, task_id=task_id)["status"] == "saved"
    again = run_job(tasks.finalize_turn, snap, task_id=task_id)
    assert (again["status"], again["seq"]) == ("duplicate", 1)
    assert stored_seqs(tid) == [1]


# ---------------------------------------------------------------- still in the broker


def test_a_turn_on_a_locked_thread_is_retried_with_nothing_written(
    row_lock: RowLock, redis_client: redis.Redis
) -> None:
    tid = uuid.uuid4()
    run_job(tasks.finalize_turn, make_snapshot(tid, 1))
    assert row_lock.hold(tid)  # a long transaction holds the thread row
    # In a worker the wait ends at the 30 s soft time limit; a lock timeout ends it sooner.
    engine = engine_with_lock_timeout(get_settings().database_url, "am-branches", 200)
    try:
        tasks.MemoryTask._memory = RedisConversationMemory(redis_client, engine=engine)
        when, reason = retried(tasks.finalize_turn, make_snapshot(tid, 2), retries=2)
    finally:
        engine.dispose()
    assert 4 <= when <= 5  # 2^retries s, plus up to 1 s of jitter
    assert reason.startswith("postgres: LockNotAvailable SQLSTATE 55P03")
    row_lock.release()
    assert stored_seqs(tid) == [1]


@pytest.mark.parametrize(("retries", "base"), [(0, 1), (3, 8), (6, 60), (30, 60)])
def test_a_turn_without_postgres_is_retried_with_a_bounded_backoff(
    retries: int, base: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(monkeypatch, DATABASE_URL=DEAD_POSTGRES)
    tid = uuid.uuid4()
    before = FINALIZE.labels("failed")._value.get()
    when, reason = retried(tasks.finalize_turn, make_snapshot(tid, 1), retries=retries)
    assert base <= when <= base + 1  # min(2^retries, MEMORY_FINALIZE_RETRY_CAP_S) + jitter
    assert reason.startswith("postgres: OperationalError")
    assert FINALIZE.labels("failed")._value.get() == before + 1


def test_an_error_inside_the_core_is_a_failed_save_and_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: Any, **__: Any) -> list[Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr("memory_core.write.session_handler.derive_artifacts", broken)
    tid = uuid.uuid4()
    unexpected = TASK_UNEXPECTED.labels(tasks.finalize_turn.name)._value.get()
    when, reason = retried(tasks.finalize_turn, make_snapshot(tid, 1))
    assert 1 <= when <= 2 and reason.startswith("error: RuntimeError at ")
    assert stored_seqs(tid) == []
    assert TASK_UNEXPECTED.labels(tasks.finalize_turn.name)._value.get() == unexpected


@BOTH
def test_an_error_in_the_tasks_own_code_is_logged_counted_and_retried(
    task: Task, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Settings that cannot load: the task's own `self.memory` raises, outside the core.
    configure(monkeypatch, MEMORY_MAX_RECENT_MESSAGES="20")
    before = TASK_UNEXPECTED.labels(task.name)._value.get()
    with caplog.at_level(logging.WARNING, logger=tasks.__name__):
        when, _ = retried(task, a_job(task), retries=3)
    assert 8 <= when <= 9  # MemoryTask's backoff: min(2^retries, 60) s + jitter
    assert "memory.task_unexpected_error" in log_names(caplog)
    assert TASK_UNEXPECTED.labels(task.name)._value.get() == before + 1


@pytest.fixture
def dead_broker() -> Iterator[None]:
    """The tasks' Celery app publishing to a port where nothing listens."""
    app = tasks.app

    def reconnect() -> None:  # drop the pooled broker connections and producers
        app._pool = None
        app.amqp._producer_pool = None

    reconnect()
    with pytest.MonkeyPatch.context() as mp:  # Celery reads CELERY_BROKER_URL first
        mp.setenv("CELERY_BROKER_URL", f"redis://127.0.0.1:{free_port()}/0")
        yield
    reconnect()


@BOTH
def test_a_retry_the_broker_cannot_take_goes_back_to_the_queue(
    task: Task, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, dead_broker: None
) -> None:
    configure(monkeypatch, DATABASE_URL=DEAD_POSTGRES)  # a job that must retry
    with caplog.at_level(logging.WARNING, logger=tasks.__name__):
        reject = rejected(task, a_job(task))
    assert reject.requeue is True  # Celery's own Reject here would drop the job
    assert "memory.retry_not_published" in log_names(caplog)
