"""The fold sweep (`memory.sweep_folds`, memory_core/fold/sweep.py): a fold whose request is on
the thread row but whose message was lost is published again, once, and nothing else is."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import func, insert, select, update

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.folding import Folder
from memory_core.fold.publisher import FOLD_QUEUE
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.fold.sweep import lost_folds, sweep_lost_folds
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread
from memory_core.settings import Settings, get_settings
from tests.support.snapshots import make_snapshot
from tests.support.state import freshen_other_fold_requests, queued_fold_threads, thread_row

DOWN = "redis://127.0.0.1:1/0"  # nothing listens: every publish fails
T = ConversationThread


@pytest.fixture
def broker() -> Iterator[redis.Redis]:
    """The session's broker database, its fold queue empty before and after."""
    client = redis.Redis.from_url(get_settings().celery_broker_url)
    client.delete(FOLD_QUEUE)
    yield client
    client.delete(FOLD_QUEUE)
    client.close()


def _memory(redis_client: Any, llm: FakeLLMServer | None = None, **extra: Any) -> Any:
    values: dict[str, Any] = {"langfuse_public_key": None, "langfuse_secret_key": None}
    if llm is not None:
        values |= {"openai_base_url": llm.base_url, "openai_api_key": "sk-test"}
    return RedisConversationMemory(
        redis_client, settings=Settings(_env_file=None, **values | extra)
    )


def _at(seconds: float | None) -> datetime | None:
    return None if seconds is None else datetime.now(UTC) + timedelta(seconds=seconds)


def _set(tid: uuid.UUID, **values: Any) -> None:
    with session_scope() as s:
        s.execute(update(T).where(T.id == tid).values(**values))


def _add_row(due_in_s: float | None, lease_in_s: float | None) -> uuid.UUID:
    """A thread row with a fold requested `due_in_s` from now (None: none) and a lease that
    ends `lease_in_s` from now (None: no lease)."""
    tid = uuid.uuid4()
    lease = None if lease_in_s is None else uuid.uuid4()
    with session_scope() as s:
        s.execute(
            insert(T).values(
                id=tid,
                owner_id="sweep-test",
                agent_type="chat",
                title="t",
                fold_due_at=_at(due_in_s),
                fold_lease_token=lease,
                fold_lease_until=_at(lease_in_s),
            )
        )
    return tid


def test_a_fold_lost_on_a_quiet_thread_is_published_again_once(
    redis_client: redis.Redis, broker: redis.Redis, llm: FakeLLMServer
) -> None:
    """Turn 21 asks for the first fold while the broker is down and the thread goes quiet:
    no turn will republish it. A sweep within the grace leaves it (a message may be on its
    way); once the grace has passed, a sweep publishes it, and the fold runs."""
    memory = _memory(redis_client, llm)
    grace = memory.settings.memory_fold_republish_grace_s
    tid = uuid.uuid4()
    for n in range(1, 21):
        save_session_to_thread_safe(make_snapshot(tid, n), memory=memory)
    cut_off = _memory(redis_client, llm, celery_broker_url=DOWN)
    outcome = save_session_to_thread_safe(make_snapshot(tid, 21), memory=cut_off)
    assert (outcome.status, outcome.fold_published) == ("saved", False)
    broker.delete(FOLD_QUEUE)

    sweep_lost_folds(memory)
    assert tid not in map(uuid.UUID, queued_fold_threads(broker))  # within the grace

    _set(tid, fold_due_at=_at(-grace - 5))
    sweep = sweep_lost_folds(memory)
    assert sweep.published >= 1
    assert queued_fold_threads(broker).count(str(tid)) == 1
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is not None
    assert abs((row.fold_due_at - datetime.now(UTC)).total_seconds()) < 60  # stamped: now
    # Stamped due now: the next pass (a minute later in production) leaves it for a grace.
    sweep_lost_folds(memory)
    assert queued_fold_threads(broker).count(str(tid)) == 1

    folded = Folder(memory, ConversationSummarizer(memory.settings)).fold(tid)
    assert (folded.status, folded.through_seq) == ("folded", 11)
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is None  # done: nothing left for a sweep
    broker.delete(FOLD_QUEUE)
    sweep_lost_folds(memory)
    assert str(tid) not in queued_fold_threads(broker)


def test_the_sweep_takes_exactly_the_lost_folds(broker: redis.Redis, redis_client: Any) -> None:
    """Every combination of request age and lease: only a request a grace past its due time
    with no live lease is lost. A live lease is a fold running; a due time in the future is a
    failed fold's retry waiting out its backoff; a recent one may still be in the queue."""
    memory = _memory(redis_client)
    freshen_other_fold_requests()  # earlier tests' long-due folds: older than ours
    grace = memory.settings.memory_fold_republish_grace_s
    dues = {"none": None, "retry later": 60.0, "recent": -10.0, "lost": -grace - 60.0}
    leases = {"none": None, "expired": -10.0, "live": 60.0}
    rows = {
        (due, lease): _add_row(dues[due], leases[lease])
        for due, lease in itertools.product(dues, leases)
    }
    sweep_lost_folds(memory)
    published = set(map(uuid.UUID, queued_fold_threads(broker)))
    taken = {case for case, tid in rows.items() if tid in published}
    assert taken == {("lost", "none"), ("lost", "expired")}


def test_a_sweep_with_the_broker_down_keeps_the_request_for_the_next(
    broker: redis.Redis, redis_client: Any
) -> None:
    memory = _memory(redis_client)
    grace = memory.settings.memory_fold_republish_grace_s
    tid = _add_row(-grace - 60.0, None)
    down = sweep_lost_folds(memory, broker_url=DOWN)
    assert down.found >= 1 and down.published == 0
    row = thread_row(tid)
    assert row is not None and row.fold_due_at is not None  # still requested
    assert tid not in map(uuid.UUID, queued_fold_threads(broker))
    _set(tid, fold_due_at=_at(-grace - 60.0))  # a grace later
    assert sweep_lost_folds(memory).published >= 1
    assert queued_fold_threads(broker).count(str(tid)) == 1


def test_concurrent_sweeps_publish_each_lost_fold_once(
    broker: redis.Redis, redis_client: Any
) -> None:
    """Two fold workers running the sweep at once (two beats, or a late one): SKIP LOCKED and
    the stamp keep them off each other's rows."""
    memory = _memory(redis_client)
    freshen_other_fold_requests()  # earlier tests' long-due folds: older than ours
    grace = memory.settings.memory_fold_republish_grace_s
    tids = {_add_row(-grace - 60.0 - n, None) for n in range(60)}
    with ThreadPoolExecutor(4) as pool:
        taken = list(pool.map(lambda _: lost_folds(memory, limit=20), range(8)))
    every = [tid for batch in taken for tid in batch if tid in tids]
    assert sorted(every) == sorted(tids)  # each once, none left
    with session_scope() as s:
        left = s.scalar(
            select(func.count()).where(
                T.id.in_(tids), T.fold_due_at < func.now() - timedelta(seconds=grace)
            )
        )
    assert left == 0
