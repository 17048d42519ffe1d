"""`memory.sweep_folds` through a real worker on both brokers: a fold lost on a quiet thread
(requested on the row, its message never sent) is published again and runs."""

from __future__ import annotations

import ast
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import redis
from celery import Celery
from sqlalchemy import update

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.io.queues import FOLD_QUEUE, SWEEP_FOLDS_TASK
from memory_core.models import ConversationThread
from memory_core.settings import Settings
from tests.support.brokers import BROKERS, held, ready
from tests.support.snapshots import make_snapshot
from tests.support.state import freshen_other_fold_requests, thread_row
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
    # Earlier tests' long-due folds would be swept (and run) too: make them due now, then
    # make ours a grace old.
    freshen_other_fold_requests(keep=[tid])
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
    done = rf"Task {re.escape(SWEEP_FOLDS_TASK)}\[[0-9a-f-]+\] succeeded in [0-9.]+s: (\{{.*?\}})"
    wait_for(lambda: re.search(done, w.log()), 30, "the sweep's result", w.log)
    match = re.search(done, w.log())
    assert match is not None
    assert ast.literal_eval(match.group(1)) == {"found": 1, "published": 1}
    wait_for(lambda: (ready(broker, FOLD_QUEUE), held(broker)) == (0, 0), 30, "drained", w.log)
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is None
