"""RabbitMQ as the broker: the topology the workers declare, what each producer declares, where
retry countdowns wait, what a dead worker's jobs do, and where a poison job ends.

On the machine's RabbitMQ, in a vhost of the test session's own (fixture `rabbitmq_url`).
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from celery import Celery
from kombu import Connection, Queue

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.rabbitmq import drop_vhost
from memory_core.devservices.rabbitmq import test_vhost as create_vhost
from memory_core.devservices.workers import WorkerExited, WorkerProcess
from memory_core.fold.publisher import publish_fold, reset_publishers
from memory_core.io.queues import (
    DEAD_LETTER_QUEUE,
    EXCHANGE,
    FINALIZE_QUEUE,
    FOLD_QUEUE,
    FOLD_TASK,
)
from memory_core.metrics import FOLD_PUBLISH_FAILURES
from memory_core.settings import Settings
from tests.support.brokers import RABBITMQCTL, ready, vhost_of
from tests.support.snapshots import make_snapshot
from tests.support.state import count_stored, drain_events, thread_row
from tests.support.workers import producer, send_finalize

pytestmark = pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)


def _rabbitmqctl(*args: str) -> list[list[str]]:
    out = subprocess.run(
        [RABBITMQCTL, "-q", *args, "--no-table-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [line.split("\t") for line in out.splitlines() if line.strip()]


def test_the_workers_declare_quorum_queues_each_with_its_key_on_a_topic_exchange(
    start_worker: Callable[..., WorkerProcess], broker: str
) -> None:
    w = start_worker()
    # Quorum queues do not support global QoS: Celery must have noticed and used per-consumer.
    assert "Global QoS is disabled" in w.log()
    vhost = vhost_of(broker)
    queues = {row[0]: row[1:] for row in _rabbitmqctl("list_queues", "-p", vhost, "name", "type")}
    for name in (FINALIZE_QUEUE, FOLD_QUEUE, DEAD_LETTER_QUEUE, "celery_delayed_0"):
        assert queues[name] == ["quorum"], name
    exchanges = dict(_rabbitmqctl("list_exchanges", "-p", vhost, "name", "type"))
    # Topic, not direct: native delayed delivery re-routes a countdown's message by its key.
    assert (exchanges[EXCHANGE], exchanges["celery_delayed_delivery"]) == ("topic", "topic")
    bindings = {
        (row[0], row[1], row[2])
        for row in _rabbitmqctl(
            "list_bindings", "-p", vhost, "source_name", "destination_name", "routing_key"
        )
    }
    assert (EXCHANGE, FINALIZE_QUEUE, FINALIZE_QUEUE) in bindings
    assert (EXCHANGE, FOLD_QUEUE, FOLD_QUEUE) in bindings
    assert (EXCHANGE, FOLD_QUEUE, FINALIZE_QUEUE) not in bindings  # each queue its own key
    assert ("celery_delayed_delivery", EXCHANGE, f"#.{FOLD_QUEUE}") in bindings
    assert ("memory.dead", DEAD_LETTER_QUEUE, "") in bindings


@pytest.fixture
def other_vhost(rabbitmq_url: str) -> Iterator[str]:
    name = f"{vhost_of(rabbitmq_url)}_other"
    yield create_vhost(rabbitmq_url, name)
    drop_vhost(name)


def test_a_fold_the_broker_refuses_is_logged_counted_and_not_lost(
    broker: str, other_vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A `memory.fold` declared otherwise (a classic queue, left from an older deployment):
    the declare fails with PRECONDITION_FAILED. The publish says so (False, a warning, the
    counter); it never vanishes."""
    with Connection(other_vhost) as conn:
        Queue(FOLD_QUEUE, durable=True)(conn.default_channel).declare()  # a classic queue
    before = FOLD_PUBLISH_FAILURES._value.get()
    assert publish_fold(uuid.uuid4(), other_vhost) is False
    assert FOLD_PUBLISH_FAILURES._value.get() == before + 1
    [record] = [r for r in caplog.records if r.getMessage().startswith("memory.fold_publish")]
    assert "PRECONDITION_FAILED" in record.getMessage() or "406" in record.getMessage()
    # Once the queue is right, the same publisher works (no connection or state left broken).
    with Connection(other_vhost) as conn:
        conn.default_channel.queue_delete(FOLD_QUEUE)
    assert publish_fold(uuid.uuid4(), other_vhost) is True
    assert ready(other_vhost, FOLD_QUEUE) == 1


def test_a_refused_fold_is_republished_by_a_later_turn_once_the_queue_is_right(
    broker: str, other_vhost: str, redis_client: redis.Redis
) -> None:
    """The safety net behind a refused publish: the thread row keeps the fold due, and the
    first turn after the republish grace publishes it again."""
    with Connection(other_vhost) as conn:
        Queue(FOLD_QUEUE, durable=True)(conn.default_channel).declare()  # a classic queue
    settings = Settings(celery_broker_url=other_vhost, memory_fold_republish_grace_s=1)
    memory = RedisConversationMemory(redis_client, settings=settings)
    tid = uuid.uuid4()
    outcomes = [
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory) for n in range(1, 22)
    ]
    assert outcomes[-1].status == "saved" and not outcomes[-1].fold_published
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is not None  # the request stays on the row
    with Connection(other_vhost) as conn:
        conn.default_channel.queue_delete(FOLD_QUEUE)
    time.sleep(1.2)  # the grace
    later = save_session_to_thread_safe(make_snapshot(tid, 22), memory=memory)
    assert later.fold_published
    assert ready(other_vhost, FOLD_QUEUE) == 1


def test_a_worker_facing_a_queue_declared_otherwise_exits_with_the_reason(
    broker: str, other_vhost: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    """An older deployment's classic `memory.finalize`: the worker cannot declare its quorum
    queue, says why (PRECONDITION_FAILED, the argument) and exits instead of idling."""
    with Connection(other_vhost) as conn:
        Queue(FINALIZE_QUEUE, durable=True)(conn.default_channel).declare()  # a classic queue
    with pytest.raises(WorkerExited) as exited:
        start_worker(queues=FINALIZE_QUEUE, env={"CELERY_BROKER_URL": other_vhost})
    assert "exited with code 1" in str(exited.value)
    assert "PRECONDITION_FAILED - inequivalent arg" in str(exited.value)


def test_a_publish_the_broker_cannot_route_raises_instead_of_vanishing(
    broker: str, other_vhost: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With publisher confirms a `send_task` that returned is on the broker; without them,
    publishing to an exchange that does not exist returns and the job is gone."""
    monkeypatch.setenv("CELERY_BROKER_URL", other_vhost)  # Celery prefers it to broker=
    app = producer(other_vhost)
    with pytest.raises(Exception, match=r"NOT_FOUND|404"):
        send_finalize(app, make_snapshot(uuid.uuid4(), 1))
    reset_publishers()


def test_a_dead_workers_jobs_come_back_at_once_with_production_settings(
    start_worker: Callable[..., WorkerProcess], agent: Celery, llm: FakeLLMServer
) -> None:
    """No visibility timeout to wait out: RabbitMQ returns unacked deliveries the moment the
    consumer's connection drops (on Redis: ~68 min with production settings)."""
    tid = uuid.uuid4()
    first = start_worker(concurrency=1)
    for n in range(1, 21):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(lambda: count_stored([tid]) == 20, 60, "20 turns", first.log)
    llm.delay_s = 30.0
    llm.set_mode("timeout")  # the fold holds its job until the worker dies
    send_finalize(agent, make_snapshot(tid, 21))
    wait_for(lambda: llm.calls >= 1, 60, "the fold's LLM call", first.log)
    first.kill_hard()
    killed = time.monotonic()
    llm.set_mode("ok")
    second = start_worker(concurrency=1, env={"MEMORY_FOLD_LEASE_S": "3"})
    wait_for(
        lambda: (t := thread_row(tid)) is not None and t.summary_through_seq == 11,
        60,
        "the dead worker's fold",
        second.log,
    )
    landed_s = time.monotonic() - killed
    # The second worker ran it (its log line follows the commit the wait above saw).
    wait_for(lambda: '"memory.folded"' in second.log(), 30, "the fold's log line", second.log)
    print(f"rabbitmq whole-worker kill: the held fold landed {landed_s:.1f} s after the kill")


def test_a_job_its_workers_keep_dying_on_is_dead_lettered_with_an_event(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    llm: FakeLLMServer,
    broker: str,
    *,
    redis_client: redis.Redis,
    events_stream: str,
) -> None:
    """MEMORY_MAX_DELIVERIES=2: the job kills its worker twice (here: the worker is killed
    while it runs it); its third delivery is not run but dead-lettered, with an event."""
    tid = uuid.uuid4()
    env = {"MEMORY_MAX_DELIVERIES": "2", "MEMORY_FOLD_LEASE_S": "1"}
    llm.delay_s = 30.0
    llm.set_mode("timeout")
    workers = []
    for n in range(1, 21):
        send_finalize(agent, make_snapshot(tid, n))
    w = start_worker(concurrency=1, env=env)
    workers.append(w)
    wait_for(lambda: count_stored([tid]) == 20, 60, "20 turns", w.log)
    send_finalize(agent, make_snapshot(tid, 21))  # its fold: the job that keeps dying
    for delivery in (1, 2):

        def running(calls: int = delivery) -> bool:
            return llm.calls >= calls

        wait_for(running, 60, f"delivery {delivery} running", w.log)
        w.kill_hard()
        w = start_worker(concurrency=1, env=env)
        workers.append(w)
    dead = wait_for(
        lambda: [
            e
            for e in drain_events(redis_client, events_stream)
            if e.event == "memory_job_dead_lettered"
        ],
        60,
        "the dead-letter event",
        w.log,
    )
    [event] = dead
    assert (event.thread_id, event.attempt, event.fields["task"]) == (str(tid), 3, FOLD_TASK)
    wait_for(lambda: ready(broker, DEAD_LETTER_QUEUE) == 1, 30, "the job in memory.dead", w.log)
    assert llm.calls == 2, "the third delivery must not run"
    assert ready(broker, FOLD_QUEUE) == 0
