"""Every exit of `memory.fold_thread`, run in this process: fast, no worker.

Helpers and the exits both tasks share (wrong arguments, an error in the task's own code, a
retry the broker cannot take) are in test_task_branches.py. The fold's LLM is either none
(the LLM-free fold) or an OpenAI base URL on a closed port: connection refused, a retryable
LLM failure. On real workers: tests/workers/test_jobs.py (folds, fold failures, malformed fold
jobs) and tests/workers/test_exits.py (a worker that cannot write).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from sqlalchemy import func, update

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.ports import free_port
from memory_core.events import Event
from memory_core.fold.folding import Folder, backoff_delay
from memory_core.fold.publisher import FOLD_QUEUE
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread
from memory_core.settings import get_settings
from memory_core.write.session_handler import save_session_to_thread_safe
from tests.support.faults import RowLock, engine_with_lock_timeout, postgres_role
from tests.support.jobs import (
    DEAD_POSTGRES,
    configure,
    discarded,
    private_events,
    retried,
    run_job,
    take_jobs,
)
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events, thread_row
from workers import tasks

FOLD = tasks.fold_thread
LLM_DOWN = "SummarizationError: LLM unreachable: APIConnectionError"


@pytest.fixture(autouse=True)
def events(monkeypatch: pytest.MonkeyPatch, redis_client: redis.Redis) -> Iterator[str]:
    yield from private_events(monkeypatch, redis_client)


def thread_with(turns: int) -> uuid.UUID:
    """A thread of `turns` saved turns; the fold finalize asked for is taken off the queue."""
    tid = uuid.uuid4()
    memory = RedisConversationMemory()
    for n in range(1, turns + 1):
        assert save_session_to_thread_safe(make_snapshot(tid, n), memory=memory).ok
    take_jobs(FOLD_QUEUE, thread_id=str(tid))
    return tid


def set_row(tid: uuid.UUID, **values: Any) -> None:
    with session_scope() as s:
        s.execute(update(ConversationThread).where(ConversationThread.id == tid).values(**values))


def stream_events(r: redis.Redis, stream: str) -> tuple[list[Event], list[Event]]:
    """(failure events, routine events) emitted since the last call."""
    return drain_events(r, stream), drain_events(r, f"{stream}:routine")


@pytest.fixture
def llm_down(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    configure(monkeypatch, OPENAI_BASE_URL=url, OPENAI_API_KEY="sk-test")


# ---------------------------------------------------------------- rejected, done


# A UUID one character short: fixed, so that every xdist worker collects the same test ids.
@pytest.mark.parametrize(
    "thread_id", [12345, "not-a-uuid", None, "2cc8a719-1eac-4157-968c-934aa70287b"]
)
def test_a_fold_job_without_a_uuid_is_rejected_for_good(
    thread_id: Any, events: str, redis_client: redis.Redis
) -> None:
    assert discarded(FOLD, thread_id).reason == "thread_id is not a UUID string"
    [refused], routine = stream_events(redis_client, events)
    assert routine == []
    assert (refused.event, refused.thread_id, refused.fields["reason"]) == (
        "memory_job_refused",
        "",  # never the argument itself: it may be anything
        "invalid_argument",
    )
    assert refused.fields["task"] == FOLD.name


def test_a_fold_of_an_unknown_thread_is_done_as_missing(
    events: str, redis_client: redis.Redis
) -> None:
    tid = str(uuid.uuid4())
    assert run_job(FOLD, tid) == {"status": "missing", "through_seq": None}
    assert stream_events(redis_client, events) == ([], [])
    assert take_jobs(FOLD_QUEUE, thread_id=tid) == []


def test_a_thread_at_the_threshold_has_nothing_to_fold(
    events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(20)  # MEMORY_COMPRESSION_THRESHOLD: a fold needs more unfolded turns
    assert run_job(FOLD, str(tid)) == {"status": "noop", "through_seq": 0}
    row = thread_row(tid)
    assert row is not None and (row.fold_lease_token, row.summary) == (None, None)
    assert stream_events(redis_client, events) == ([], [])


def test_a_fold_writes_the_summary_and_emits_memory_summarized(
    events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    assert run_job(FOLD, str(tid)) == {"status": "folded", "through_seq": 11}
    row = thread_row(tid)
    assert row is not None and row.summary and row.summary_through_seq == 11
    assert (row.summary_prompt, row.fold_lease_token, row.fold_due_at) == (
        "llm-free:v2",
        None,
        None,
    )
    failures, [done] = stream_events(redis_client, events)
    assert failures == [] and (done.event, done.thread_id) == ("memory_summarized", str(tid))
    assert (done.fields["through_seq"], done.fields["prompt"]) == ("11", "llm-free:v2")
    assert "fallback" not in done.fields and done.session_id
    # The LLM-free fold writes the instructions itself: nothing for code to correct.
    assert (done.fields["instructions_restored"], done.fields["superseded_dropped"]) == ("0", "0")
    assert take_jobs(FOLD_QUEUE, thread_id=str(tid)) == []  # nothing more to fold


def test_a_backlog_beyond_one_prompt_publishes_the_next_fold() -> None:
    tid = thread_with(71)  # 61 foldable turns; one prompt takes at most 40
    assert run_job(FOLD, str(tid)) == {"status": "folded", "through_seq": 40}
    [(headers, args)] = take_jobs(FOLD_QUEUE, thread_id=str(tid))
    assert (headers["task"], args, headers["retries"]) == (FOLD.name, [str(tid)], 0)


def test_a_noop_fold_that_finds_a_new_turn_over_the_threshold_publishes_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Turn 21 lands while the fold (which saw 20 turns) runs: the fold asks for the next."""
    tid = thread_with(20)
    with session_scope() as s:  # a fold pending: turn 21's finalize publishes none
        s.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(fold_due_at=func.now())
        )
    upto = Folder._fold_upto

    def interleaved(self: Folder, through: int, last_seq: int) -> int | None:
        out = save_session_to_thread_safe(make_snapshot(tid, 21), memory=self.memory)
        assert not out.fold_published
        return upto(self, through, last_seq)

    monkeypatch.setattr(Folder, "_fold_upto", interleaved)
    assert run_job(FOLD, str(tid)) == {"status": "noop", "through_seq": 0}
    [(headers, args)] = take_jobs(FOLD_QUEUE, thread_id=str(tid))
    assert (headers["task"], args) == (FOLD.name, [str(tid)])


# ---------------------------------------------------------------- the LLM fails


@pytest.mark.parametrize(("failed_before", "countdown"), [(0, 60), (1, 120), (5, 1920), (6, 3600)])
def test_an_llm_failure_is_a_counted_attempt_retried_with_the_fold_backoff(
    failed_before: int, countdown: int, llm_down: None, events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    set_row(tid, fold_attempts=failed_before)
    attempt = failed_before + 1
    when, _ = retried(FOLD, str(tid), retries=failed_before)
    assert when == countdown == backoff_delay(attempt)  # 60 s x 2^(attempt-1), at most 1 h
    [failed], routine = stream_events(redis_client, events)
    assert routine == [] and (failed.event, failed.thread_id) == (
        "memory_summarization_failed",
        str(tid),
    )
    assert (failed.attempt, failed.retry_in_s, failed.error) == (attempt, countdown, LLM_DOWN)
    assert failed.session_id  # the newest turn the fold would have covered
    row = thread_row(tid)
    assert row is not None and (row.fold_attempts, row.summary_through_seq) == (attempt, 0)
    assert row.fold_lease_token is None and row.fold_due_at is not None


def test_the_last_llm_attempt_folds_llm_free_and_says_so(
    llm_down: None, events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    last = get_settings().memory_fold_max_llm_attempts
    set_row(tid, fold_attempts=last - 1)
    assert run_job(FOLD, str(tid), retries=last - 1) == {"status": "folded", "through_seq": 11}
    failures, [done] = stream_events(redis_client, events)
    assert failures == [] and done.fields["prompt"] == "llm-free:v2"
    assert done.fields["fallback"] == f"{last} failed attempts, last: {LLM_DOWN}"
    row = thread_row(tid)
    assert row is not None and (row.summary_through_seq, row.fold_attempts) == (11, 0)


# ---------------------------------------------------------------- busy, Postgres trouble


def test_a_thread_another_fold_holds_is_retried_once_its_lease_can_lapse(
    events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    other = uuid.uuid4()
    until = func.now() + func.make_interval(0, 0, 0, 0, 0, 0, 300)
    set_row(tid, fold_lease_token=other, fold_lease_until=until)
    when, _ = retried(FOLD, str(tid))
    assert when == get_settings().memory_fold_lease_s + 1
    row = thread_row(tid)
    assert row is not None and (row.fold_lease_token, row.summary_through_seq) == (other, 0)
    assert stream_events(redis_client, events) == ([], [])  # busy is no failure


def test_a_fold_without_postgres_is_retried_with_the_finalize_backoff(
    monkeypatch: pytest.MonkeyPatch, events: str, redis_client: redis.Redis
) -> None:
    configure(monkeypatch, DATABASE_URL=DEAD_POSTGRES)
    when, reason = retried(FOLD, str(uuid.uuid4()), retries=2)
    assert 4 <= when <= 5  # min(2^retries, MEMORY_FINALIZE_RETRY_CAP_S) + jitter
    assert reason.startswith("OperationalError")
    assert stream_events(redis_client, events) == ([], [])  # no summarizer attempt counted


def test_a_fold_of_a_locked_thread_is_retried_with_the_finalize_backoff(
    row_lock: RowLock, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    assert row_lock.hold(tid)
    # In a worker the wait ends at the fold's soft time limit; a lock timeout ends it sooner.
    engine = engine_with_lock_timeout(get_settings().database_url, "am-branches", 200)
    try:
        tasks.MemoryTask._memory = RedisConversationMemory(redis_client, engine=engine)
        when, reason = retried(FOLD, str(tid), retries=1)
    finally:
        engine.dispose()
    assert 2 <= when <= 3  # a lock timeout counts as Postgres unavailable (POSTGRES_DOWN)
    assert reason.startswith("LockNotAvailable SQLSTATE 55P03")
    row_lock.release()
    row = thread_row(tid)
    assert row is not None and (row.summary_through_seq, row.fold_attempts) == (0, 0)


@pytest.fixture
def read_only_url() -> Iterator[str]:
    """A role that may read memory's tables and write nothing: a revoked grant."""
    reads = ["SELECT ON conversation_threads, thread_messages"]
    with postgres_role(get_settings().database_url, reads) as (url, _):
        yield url


def test_a_fold_that_cannot_take_its_lease_is_a_failed_attempt_retried(
    read_only_url: str, monkeypatch: pytest.MonkeyPatch, events: str, redis_client: redis.Redis
) -> None:
    tid = thread_with(21)
    configure(monkeypatch, DATABASE_URL=read_only_url)
    when, _ = retried(FOLD, str(tid), retries=2)
    assert when == backoff_delay(3) == 240  # the fold backoff, counted from the job's retries
    [failed], routine = stream_events(redis_client, events)
    assert routine == [] and failed.event == "memory_summarization_failed"
    assert (failed.thread_id, failed.attempt, failed.retry_in_s) == (str(tid), 3, 240)
    assert failed.error.startswith("ProgrammingError")
    row = thread_row(tid)
    assert row is not None and (row.fold_attempts, row.summary_through_seq) == (0, 0)
