"""Langfuse traces of deleted threads: purged by the delete, then by the sweeper until settled.

Real Postgres and Redis, the real langfuse client against the fake Langfuse's trace API.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from memory_core import delete_thread, forget_owner, save_session_to_thread_safe
from memory_core.bench.common import snapshot
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.lifecycle.trace_sweep import sweep_trace_purges
from memory_core.settings import Settings, get_settings
from tests.support.fake_langfuse import FakeLangfuseServer

SETTLE_S = 600


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuseServer]:
    with FakeLangfuseServer() as server:
        yield server


def memory_for(langfuse: FakeLangfuseServer | None, redis_client: Any) -> RedisConversationMemory:
    """A memory whose settings point Langfuse at the fake (a fresh key: the SDK shares state
    per public key), with short timeouts."""
    values: dict[str, Any] = {
        "langfuse_prompt_timeout_s": 0.5,
        "langfuse_api_timeout_s": 0.5,
        "memory_trace_purge_settle_s": SETTLE_S,
    }
    if langfuse is not None:
        values |= {
            "langfuse_public_key": f"pk-lf-test-{uuid.uuid4().hex}",
            "langfuse_secret_key": "sk-lf-test",
            "langfuse_base_url": langfuse.base_url,
        }
    settings: Settings = get_settings().model_copy(update=values)
    return RedisConversationMemory(redis_client, settings=settings)


def new_thread(memory: RedisConversationMemory, owner: str, turns: int = 2) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        assert save_session_to_thread_safe(snapshot(tid, n, owner), memory=memory).ok
    return tid


def requests(memory: RedisConversationMemory, tid: uuid.UUID) -> list[Any]:
    with memory.engine.connect() as conn:
        q = text("SELECT attempts, last_error FROM trace_purges WHERE thread_id = :t")
        return list(conn.execute(q, {"t": tid}))


def test_delete_purges_the_threads_traces_and_keeps_the_request_until_settled(
    langfuse: FakeLangfuseServer, redis_client: Any
) -> None:
    memory = memory_for(langfuse, redis_client)
    owner = f"o-{uuid.uuid4()}"
    doomed, kept = new_thread(memory, owner), new_thread(memory, owner)
    for tid in (doomed, kept):
        for _ in range(3):
            langfuse.add_trace(session_id=str(tid))

    report = delete_thread(doomed, owner, memory=memory)

    assert report.traces == 3
    assert langfuse.trace_ids(str(doomed)) == []
    assert len(langfuse.trace_ids(str(kept))) == 3
    # A fold that was mid-call may still send its trace: the request stays until settled.
    assert report.traces_pending == 1
    assert len(requests(memory, doomed)) == 1
    late = langfuse.add_trace(session_id=str(doomed))  # arrives after the delete

    early = sweep_trace_purges(memory=memory)
    assert late not in langfuse.trace_ids(str(doomed))
    assert (early.deleted, early.done, early.pending) == (1, 0, 1)
    assert len(requests(memory, doomed)) == 1

    settled = sweep_trace_purges(memory=memory, now=datetime.now(UTC) + timedelta(seconds=SETTLE_S))
    assert settled.done == 1
    assert requests(memory, doomed) == []
    assert len(langfuse.trace_ids(str(kept))) == 3  # never touched


def test_langfuse_down_keeps_every_request_and_a_later_sweep_finishes(
    langfuse: FakeLangfuseServer, redis_client: Any
) -> None:
    memory = memory_for(langfuse, redis_client)
    owner = f"o-{uuid.uuid4()}"
    threads = [new_thread(memory, owner, turns=1) for _ in range(3)]
    for tid in threads:
        langfuse.add_trace(session_id=str(tid))
    langfuse.set_trace_api_mode("500")

    report = forget_owner(owner, memory=memory, batch_size=1)

    assert report.threads == 3 and report.remaining_threads == 0  # the data went regardless
    assert report.traces == 0 and report.traces_pending == 3
    # After the first failure the run stops calling Langfuse: one failed attempt, not three.
    assert sorted(r.attempts for tid in threads for r in requests(memory, tid)) == [0, 0, 1]
    failed = sweep_trace_purges(memory=memory)
    assert failed.error is not None and "500" in failed.error
    assert all(requests(memory, tid) for tid in threads)

    langfuse.set_trace_api_mode("ok")
    later = datetime.now(UTC) + timedelta(seconds=SETTLE_S)
    done = sweep_trace_purges(memory=memory, now=later)

    assert done.error is None and done.done == 3
    assert all(langfuse.trace_ids(str(tid)) == [] for tid in threads)
    assert all(requests(memory, tid) == [] for tid in threads)


def test_without_langfuse_no_request_is_recorded(redis_client: Any) -> None:
    memory = memory_for(None, redis_client)
    owner = f"o-{uuid.uuid4()}"
    tid = new_thread(memory, owner)

    report = delete_thread(tid, owner, memory=memory)

    assert (report.traces, report.traces_pending) == (0, 0)
    assert requests(memory, tid) == []
    assert sweep_trace_purges(memory=memory).checked == 0
