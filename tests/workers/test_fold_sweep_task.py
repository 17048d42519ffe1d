"""`memory.sweep_folds` through a real worker on both brokers: a fold lost on a quiet thread
(requested on the row, its message never sent) is published again and runs."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import redis
from celery import Celery
from sqlalchemy import update

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.db import session_scope
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.fold_sweep import lost_folds
from memory_core.models import ConversationThread
from memory_core.queues import FOLD_QUEUE, SWEEP_FOLDS_TASK
from memory_core.settings import Settings
from tests.support.brokers import BROKERS, held, ready
from tests.support.snapshots import make_snapshot
from tests.support.state import thread_row
from tests.support.workers import destination

DOWN = "redis://127.0.0.1:1/0"


def _summary_through(tid: uuid.UUID) -> int:
    row = thread_row(tid)
    return row.summary_through_seq if row is not None else -1


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_the_sweep_task_republishes_a_lost_fold_and_the_fold_runs(
    *,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
    redis_client: redis.Redis,
) -> None:
    memory = RedisConversationMemory(redis_client)
    tid = uuid.uuid4()
    for n in range(1, 21):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    down = Settings(_env_file=None, celery_broker_url=DOWN)
    cut_off = RedisConversationMemory(redis_client, settings=down)
    outcome = save_session_to_thread_safe(make_snapshot(tid, 21), memory=cut_off)
    assert (outcome.status, outcome.fold_published) == ("saved", False)
    # Earlier tests' long-due folds would be swept too: stamp them due now (not lost for a
    # grace), then make ours a grace old.
    lost_folds(memory, limit=1_000_000)
    grace = memory.settings.memory_fold_republish_grace_s
    with session_scope() as s:
        old = datetime.now(UTC) - timedelta(seconds=grace + 5)
        s.execute(
            update(ConversationThread).where(ConversationThread.id == tid).values(fold_due_at=old)
        )

    w = start_worker(queues=FOLD_QUEUE)
    assert _summary_through(tid) == 0  # nothing folds it by itself
    agent.send_task(SWEEP_FOLDS_TASK, args=[], **destination(agent, FOLD_QUEUE))
    wait_for(lambda: _summary_through(tid) == 11, 60, "the lost fold run", w.log)
    assert '"found": 1' in w.log() or "'found': 1" in w.log(), w.log()[-3000:]
    wait_for(lambda: (ready(broker, FOLD_QUEUE), held(broker)) == (0, 0), 30, "drained", w.log)
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is None
