"""memory.finalize_turn and memory.fold_thread through a real worker, on both brokers."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery

from memory_core import RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import routine_stream
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE, is_amqp
from tests.support.brokers import BROKERS, delayed, held, ready, scheduled
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events, stored_seqs, thread_row
from tests.support.workers import send_finalize, send_fold

pytestmark = pytest.mark.parametrize("broker", BROKERS, indirect=True)


def test_finalize_jobs_land_once_in_order_with_duplicates(
    start_worker: Callable[..., WorkerProcess], agent: Celery, redis_client: redis.Redis
) -> None:
    w = start_worker()
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n) for n in range(1, 16)]
    for snap in snaps:
        send_finalize(agent, snap)
        send_finalize(agent, snap)  # at-least-once delivery: every job twice
    wait_for(lambda: len(stored_seqs(tid)) == 15, 60, "15 turns", w.log)
    wait_for(
        lambda: (
            "memory.finalize_duplicate" in w.log()
            and w.log().count("memory.finalize_duplicate") == 15
        ),
        30,
        "15 duplicates",
        w.log,
    )
    assert stored_seqs(tid) == list(range(1, 16))
    ctx = RedisConversationMemory(redis_client).get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == list(range(1, 16))
    assert '"task_id"' in w.log() and f'"thread_id": "{tid}"' in w.log()


def test_invalid_jobs_are_rejected_with_an_event_and_never_retried(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
) -> None:
    w = start_worker()
    bad_tid = str(uuid.uuid4())
    send_finalize(agent, {**make_snapshot(bad_tid, 1), "agent_type": "robot"})
    send_finalize(agent, "not a snapshot")
    send_finalize(agent, {**make_snapshot(bad_tid, 2), "session_id": "nope"})
    events: list[Any] = []

    def three_drained() -> bool:
        events.extend(drain_events(redis_client, events_stream))
        return len(events) >= 3

    wait_for(three_drained, 60, "3 rejection events", w.log)
    assert [e.event for e in events] == ["memory_finalize_rejected"] * 3
    by_error = {e.error.split(": ", 1)[1].split(":")[0]: e for e in events}
    assert set(by_error) == {"agent_type", "session_id", "expected a JSON object, got str"}
    assert by_error["agent_type"].thread_id == bad_tid
    # Acked, not retried: the worker moves on and the queue drains.
    good = uuid.uuid4()
    send_finalize(agent, make_snapshot(good, 1))
    wait_for(lambda: stored_seqs(good) == [1], 30, "a valid job after the rejects", w.log)
    assert thread_row(uuid.UUID(bad_tid)) is None and w.alive()
    assert ready(agent.conf.broker_url, FINALIZE_QUEUE) == 0
    assert w.log().count('"memory.finalize_rejected"') == 3


def test_folds_run_on_the_worker_and_emit_summarized(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
    llm: FakeLLMServer,
) -> None:
    w = start_worker()
    tid = uuid.uuid4()
    for n in range(1, 22):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(
        lambda: (t := thread_row(tid)) is not None and t.summary_through_seq == 11,
        60,
        "the fold at turn 21",
        w.log,
    )
    for n in range(22, 33):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(
        lambda: (t := thread_row(tid)) is not None and t.summary_through_seq == 22,
        60,
        "the fold at turn 32",
        w.log,
    )
    t = thread_row(tid)
    assert t is not None and t.summary_prompt == "builtin:v2"
    assert llm.calls == 2
    # Successful folds are routine events: on the routine stream, never crowding out failures.
    assert drain_events(redis_client, events_stream) == []
    events = drain_events(redis_client, routine_stream(events_stream))
    assert [e.event for e in events] == ["memory_summarized"] * 2
    assert [e.fields["through_seq"] for e in events] == ["11", "22"]


def test_fold_failure_emits_event_persists_attempt_and_retries(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
    llm: FakeLLMServer,
) -> None:
    llm.set_mode("500")
    w = start_worker()
    tid = uuid.uuid4()
    for n in range(1, 22):
        send_finalize(agent, make_snapshot(tid, n))
    events = wait_for(
        lambda: drain_events(redis_client, events_stream), 60, "a failure event", w.log
    )
    (failed,) = events
    assert failed.event == "memory_summarization_failed"
    assert (failed.thread_id, failed.attempt, failed.retry_in_s) == (str(tid), 1, 60)
    assert "500" in failed.error and failed.session_id
    assert set(failed.fields) >= {
        "event",
        "thread_id",
        "session_id",
        "attempt",
        "error",
        "retry_in_s",
        "at",
    }
    t = thread_row(tid)
    assert t is not None and t.fold_attempts == 1 and t.summary_through_seq == 0
    # Nothing is lost or hidden: all 21 turns are in Postgres and in the working copy.
    ctx = RedisConversationMemory(redis_client).get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == list(range(1, 22))
    # The retry's countdown (60 s) waits in RabbitMQ's delay queues, not in the worker; on
    # Redis the worker holds it (unacked, an ETA task).
    url = str(agent.conf.broker_url)
    if is_amqp(url):
        wait_for(lambda: delayed(url) == 1, 30, "the retry in a delay queue", w.log)
        # The failed attempt's own delivery is acked just after its retry is confirmed.
        wait_for(lambda: held(url) == 0, 30, "the failed attempt's ack", w.log)
        assert (delayed(url), scheduled(url)) == (1, 0)
    else:
        wait_for(lambda: (held(url), scheduled(url)) == (1, 1), 30, "the held retry", w.log)
    # An operator-published fold after recovery folds right away and the waiting retry later
    # finds nothing to do.
    llm.set_mode("ok")
    send_fold(agent, str(tid))
    wait_for(
        lambda: (t := thread_row(tid)) is not None and t.summary_through_seq == 11,
        60,
        "the fold after recovery",
        w.log,
    )
    t = thread_row(tid)
    assert t is not None and t.fold_attempts == 0


def test_malformed_fold_jobs_are_rejected(
    start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    w = start_worker()
    send_fold(agent, 12345)
    send_fold(agent, "not-a-uuid")
    send_fold(agent, str(uuid.uuid4()))  # well-formed, unknown: a no-op
    wait_for(
        lambda: w.log().count('"memory.fold_rejected"') == 2, 30, "two rejected fold jobs", w.log
    )
    assert '"reason": "thread_id is not a UUID string"' in w.log()
    url = str(agent.conf.broker_url)
    wait_for(lambda: ready(url, FOLD_QUEUE) == 0, 30, "fold queue drained", w.log)
    wait_for(lambda: "{'status': 'missing'" in w.log(), 30, "the unknown thread's no-op", w.log)
    assert w.alive()


MARKER = "ZQXWORKERMARKER"


def test_no_job_content_reaches_the_worker_log_or_thedrain_events(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
    llm: FakeLLMServer,
) -> None:
    """A marker in every field, through a rejection, saves, a fold failure that the LLM
    answers by quoting the user, and the fallback fold after it."""
    llm.set_mode("refusal_echo")
    w = start_worker(env={"MEMORY_FOLD_MAX_LLM_ATTEMPTS": "2"})
    tid = uuid.uuid4()
    for n in range(1, 22):
        snap = make_snapshot(
            tid,
            n,
            owner_id=f"owner-{MARKER}",
            user_query=f"q{n} {MARKER}",
            answer=MARKER,
            sql=[f"SELECT '{MARKER}'"],
        )
        snap["visualizations"][0]["name"] = MARKER
        send_finalize(agent, snap)
    bad = make_snapshot(tid, 99, user_query=f"{MARKER}\x00", owner_id=MARKER)
    send_finalize(agent, bad)
    failures = wait_for(
        lambda: [e for e in drain_events(redis_client, events_stream, "m") if e.attempt],
        60,
        "a failed fold attempt",
        w.log,
    )
    send_fold(agent, str(tid))  # the second attempt: the LLM-free fallback
    wait_for(
        lambda: (t := thread_row(tid)) is not None and t.summary_through_seq == 11,
        60,
        "the fallback fold",
        w.log,
    )
    events = [*failures, *drain_events(redis_client, events_stream, "m2")]
    events += drain_events(redis_client, routine_stream(events_stream))
    assert {e.event for e in events} >= {"memory_summarization_failed", "memory_summarized"}
    for e in events:
        assert MARKER not in str(e.fields), e.fields
    assert MARKER not in w.log()
