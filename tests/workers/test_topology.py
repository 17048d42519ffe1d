"""The Redis broker's topology: each queue its own exchange, and the stale binding of workers
before 0.2 removed (RabbitMQ's topology: test_rabbitmq.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import redis
from celery import Celery

from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE, task_queues
from tests.support.brokers import ready
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs
from tests.support.workers import send_finalize

SEP = "\x06\x16"
# What `Queue("memory.fold")` in a worker before 0.2 declared: memory.fold bound to the
# default exchange (memory.finalize) with the default key (memory.finalize).
STALE = SEP.join([FINALIZE_QUEUE, "", FOLD_QUEUE])


def test_each_redis_queue_has_an_exchange_and_key_of_its_own() -> None:
    queues = {q.name: q for q in task_queues("redis://127.0.0.1:6379/0")}
    for name in (FINALIZE_QUEUE, FOLD_QUEUE):
        assert (queues[name].exchange.name, queues[name].routing_key) == (name, name)
        assert queues[name].exchange.type == "direct"


def test_a_worker_removes_the_binding_that_copied_finalize_jobs_into_the_fold_queue(
    start_worker: Callable[..., WorkerProcess], agent: Celery, broker: str
) -> None:
    client = redis.Redis.from_url(broker)
    for key in ("_kombu.binding.", "_kombu.binding_permanent."):
        client.sadd(key + FINALIZE_QUEUE, STALE)
    w = start_worker(queues=FINALIZE_QUEUE)
    assert not client.sismember("_kombu.binding." + FINALIZE_QUEUE, STALE)
    assert not client.sismember("_kombu.binding_permanent." + FINALIZE_QUEUE, STALE)
    tid = uuid.uuid4()
    send_finalize(agent, make_snapshot(tid, 1))
    wait_for(lambda: stored_seqs(tid) == [1], 30, "the turn", w.log)
    assert ready(broker, FOLD_QUEUE) == 0, "the finalize job was copied into the fold queue"
    client.close()
