"""Every exit of a job, on a real worker: a turn lands, is rejected for bad input, or stays in
the broker. Nothing is acked that was not processed.

* a finalize that waits on a row lock past its soft time limit still lands once;
* a worker whose settings cannot work refuses to start and takes no job;
* a fold through a managed prompt that lacks `{{previous_summary}}` keeps the running summary.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread
from memory_core.settings import get_settings
from tests.support.commands import run_module
from tests.support.fake_langfuse import FakeLangfuseServer
from tests.support.faults import RowLock, postgres_role
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events, stored_seqs
from tests.support.workers import send_finalize, send_fold

# The finalize time limits, set small (production: 30 s soft, 60 s hard): the lock is held
# past the soft limit and released before the hard one, as a 45 s lock would be in production.
SOFT_LIMIT_S = 4


@pytest.mark.timeout(240)
def test_a_finalize_held_past_its_soft_time_limit_by_a_row_lock_still_lands_once(
    start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    w = start_worker(env={"MEMORY_FINALIZE_SOFT_LIMIT_S": str(SOFT_LIMIT_S)})
    tid = uuid.uuid4()
    send_finalize(agent, make_snapshot(tid, 1))
    wait_for(lambda: stored_seqs(tid) == [1], 30, "turn 1", w.log)
    lock = RowLock(get_settings().database_url)
    try:
        assert lock.hold(tid)  # a long transaction, a blocked migration, a pooler pause
        send_finalize(agent, make_snapshot(tid, 2))
        wait_for(lambda: w.log().count("] received") >= 2, 30, "turn 2 taken", w.log)
        time.sleep(1.5 * SOFT_LIMIT_S)  # past the soft time limit, before the hard one
        assert stored_seqs(tid) == [1]
    finally:
        lock.close()
    wait_for(lambda: stored_seqs(tid) == [1, 2], 90, "turn 2 after the lock", w.log)
    time.sleep(2)
    assert stored_seqs(tid) == [1, 2]
    assert w.alive()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"MEMORY_MAX_RECENT_MESSAGES": "20"}, "MEMORY_MAX_RECENT_MESSAGES"),
        ({"MEMORY_TTL_HOURS": "inf"}, "MEMORY_TTL_HOURS"),
        ({"MEMORY_COMPRESSION_THRESHOLD": "1"}, "MEMORY_COMPRESSION_THRESHOLD"),
        ({"REDIS_URL": "http://127.0.0.1:6379/0"}, "REDIS_URL"),
    ],
    ids=["recent-not-below-threshold", "infinite-ttl", "threshold-1", "redis-url"],
)
def test_a_worker_with_impossible_settings_refuses_to_start(
    agent: Celery, env: dict[str, str], named: str
) -> None:
    broker = redis.Redis.from_url(agent.conf.broker_url)
    broker.delete("memory.finalize")
    send_finalize(agent, make_snapshot(uuid.uuid4(), 1))
    done = run_module("celery", "-A", "workers.app", "worker", "-c", "1", "-P", "solo", env=env)
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        len(lines) == 1 and lines[0].startswith("error: invalid settings: ") and named in lines[0]
    )
    assert broker.llen("memory.finalize") == 1, "the job must stay in the broker"
    broker.delete("memory.finalize")
    cli = run_module("memory_core.cli", "worker", env=env)
    assert cli.returncode == 1 and cli.stderr.strip().startswith("error: invalid settings:")
    assert named in cli.stderr


@pytest.mark.timeout(240)
def test_a_prompt_without_previous_summary_never_erases_the_summary(
    start_worker: Callable[..., WorkerProcess], agent: Celery, llm: FakeLLMServer
) -> None:
    with FakeLangfuseServer(prompt_type="text") as lf:
        lf.serve_text_prompt("Summarize these turns:\n{{conversation}}", version=5)
        w = start_worker(
            env={
                "LANGFUSE_PUBLIC_KEY": f"pk-lf-{uuid.uuid4().hex[:8]}",
                "LANGFUSE_SECRET_KEY": "sk-lf-test",
                "LANGFUSE_BASE_URL": lf.base_url,
            }
        )
        tid = uuid.uuid4()

        def folded_through(seq: int) -> bool:
            with session_scope() as s:
                t = s.get(ConversationThread, tid)
                return t is not None and t.summary_through_seq == seq

        for n in range(1, 22):
            send_finalize(agent, make_snapshot(tid, n))
        wait_for(lambda: folded_through(11), 60, "the first fold", w.log)
        for n in range(22, 33):
            send_finalize(agent, make_snapshot(tid, n))
        wait_for(lambda: folded_through(22), 60, "the second fold", w.log)
    assert "langfuse prompt conversation_summarizer v5 refused" in w.log()
    with session_scope() as s:
        thread = s.get(ConversationThread, tid)
        assert thread is not None and thread.summary_prompt == "builtin:v2"
    # The second fold was given the first fold's summary: nothing folded before is lost.
    assert llm.calls == 2
    previous = (
        llm.prompt_text(1).split("<previous_summary>\n", 1)[1].split("</previous_summary>")[0]
    )
    assert "Running summary of the analysis." in previous


@pytest.fixture
def read_only_role() -> Iterator[tuple[str, Callable[[], None]]]:
    """A role that can read memory's tables but write nothing until `grant()` is called."""
    reads = ["SELECT ON conversation_threads, thread_messages"]
    with postgres_role(get_settings().database_url, reads) as (url, grant):

        def grant_writes() -> None:
            grant("INSERT, UPDATE ON conversation_threads")
            grant("INSERT ON thread_messages")
            grant("INSERT, UPDATE ON memory_settings_seen")

        yield url, grant_writes


@pytest.mark.timeout(240)
def test_a_worker_that_cannot_write_never_acks_a_job(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
    read_only_role: Any,
) -> None:
    url, grant = read_only_role
    tid = uuid.uuid4()
    w = start_worker(env={"DATABASE_URL": url})
    snap = make_snapshot(tid, 1)
    send_finalize(agent, snap)
    send_fold(agent, str(tid))
    # Neither job can do its work: both are retried, the fold with a failure event.
    wait_for(lambda: w.log().count('"memory.finalize_retry"') >= 2, 60, "finalize retries", w.log)
    events = wait_for(lambda: drain_events(redis_client, events_stream), 60, "a fold event", w.log)
    assert events[0].event == "memory_summarization_failed"
    assert events[0].error.startswith("ProgrammingError")
    assert stored_seqs(tid) == []
    grant()
    wait_for(lambda: stored_seqs(tid) == [1], 60, "the turn once writes are allowed", w.log)
    assert w.alive()
