"""Scenario 2, outages of third-party services: the LLM failing, Langfuse gone.

Against the suite's private servers (`stack`, tests/support/services.py) and real subprocess
workers; the LLM is the local fake (memory_core/devservices/fake_llm.py), Langfuse a closed
port or a server that never answers. Postgres and Redis outages: test_outages.py.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from functools import partial

import pytest
from celery import Celery

from memory_core import ConversationContext, RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import EventConsumer
from memory_core.io.redis_client import make_redis
from memory_core.models import ConversationThread
from tests.support import figures
from tests.support.fake_langfuse import HangingServer
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import count_stored, thread_rows
from tests.support.tally import Tally, assert_gapless
from tests.support.workers import send_finalize, send_fold

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]


def _row(tid: uuid.UUID) -> ConversationThread:
    return thread_rows([tid])[tid]


def test_llm_failing_for_50_turns_then_recovering(
    stack: Stack,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    llm: FakeLLMServer,
    events_stream: str,
) -> None:
    # Nine failed attempts in a row: this scenario is about recovering, not about the
    # LLM-free fallback after MEMORY_FOLD_MAX_LLM_ATTEMPTS (tests/test_folding.py).
    w = start_worker(concurrency=1, env={"MEMORY_FOLD_MAX_LLM_ATTEMPTS": "100"})
    redis = make_redis(stack.redis_url)
    consumer = EventConsumer(redis, "alerting", "alerting-1", stream=events_stream)
    consumer.ensure_group()
    failed_events = 0

    def drain() -> int:
        """Read and ack what is there; the failure events seen so far."""
        nonlocal failed_events
        for e in consumer.read(count=100):
            failed_events += e.event == "memory_summarization_failed"
            consumer.ack(e.id)
        return failed_events

    tid = uuid.uuid4()
    sent: dict[str, uuid.UUID] = {}

    def turn(n: int) -> None:
        snap = make_snapshot(tid, n)
        sent[snap["session_id"]] = tid
        send_finalize(agent, snap)
        wait_for(lambda: count_stored([tid]) == n, 30, f"turn {n}", w.log, 0.05)

    for n in range(1, 22):
        turn(n)
    wait_for(lambda: _row(tid).summary_through_seq == 11, 30, "the first fold", w.log)
    llm.set_mode("500")
    attempts = _fifty_turns_while_folds_fail(tid, turn, agent)
    wait_for(lambda: drain() >= attempts, 30, "the failure events")
    row = _row(tid)
    assert failed_events == row.fold_attempts == attempts, (failed_events, row.fold_attempts)
    ok_from = llm.calls
    llm.set_mode("ok")
    recovered_at = time.monotonic()
    send_fold(agent, str(tid))  # the next due retry
    wait_for(lambda: _row(tid).summary_through_seq == 51, 30, "the fold after recovery", w.log)
    recover_s = time.monotonic() - recovered_at
    turn(72)  # over the threshold again: the normal cadence resumes
    wait_for(lambda: _row(tid).summary_through_seq == 62, 30, "the next fold", w.log)
    folded_prompts = "\n".join(llm.prompt_text(i) for i in range(ok_from, llm.calls))
    missing = [n for n in range(12, 63) if f"(turn {n})" not in folded_prompts]
    assert not missing, f"turns {missing} folded but never summarized"
    ctx = RedisConversationMemory().get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == list(range(63, 73))
    drain()
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    _record_llm(attempts, failed_events, lost=lost, duplicated=duplicated, recover_s=recover_s)


def _copy_through(tid: uuid.UUID, seq: int) -> ConversationContext | None:
    ctx = RedisConversationMemory().get_context(tid, "user-42")
    return ctx if ctx.recent and ctx.recent[-1].seq >= seq else None


def _fifty_turns_while_folds_fail(
    tid: uuid.UUID, turn: Callable[[int], None], agent: Celery
) -> int:
    """Turns 22..71 while every fold fails; the fold attempts made. The copy keeps the newest
    40 turns (the cap) and the summary through turn 11 all along."""
    attempts = 0
    for n in range(22, 72):
        turn(n)
        if n == 32 or (n > 32 and n % 5 == 0):  # a due retry comes round (sent now, not later)
            if n > 32:
                send_fold(agent, str(tid))
            attempts += 1

            def attempted(a: int = attempts) -> bool:
                return _row(tid).fold_attempts >= a

            wait_for(attempted, 30, "a fold attempt")
        # The worker writes the copy just after its COMMIT, which `turn` waited for: a read in
        # between is served the copy without turn n (read-your-writes is `wait_for`'s job).
        ctx = wait_for(partial(_copy_through, tid, n), 10, f"turn {n} in the copy")
        assert ctx.summary_through_seq == 11
        assert [e.seq for e in ctx.recent] == list(range(max(12, n - 39), n + 1))  # the cap
    return attempts


def _record_llm(
    attempts: int, failed_events: int, *, lost: int, duplicated: int, recover_s: float
) -> None:
    figures.record(
        "outage.3.llm",
        scenario="the LLM answers HTTP 500 for 50 turns, then recovers",
        jobs=72,
        faults=f"{attempts} failed fold attempts ({attempts} LLM 500s)",
        lost=lost,
        duplicated=duplicated,
        recover_s=recover_s,
        recover=(
            f"{recover_s:.1f} s from the first retry after recovery to a summary through "
            "turn 51 (in production the retry is due 60 s x 2^(n-1) <= 1 h after failure n)"
        ),
        checked=(
            f"{failed_events} `memory_summarization_failed` events read by a consumer group "
            f"== {attempts} attempts on the thread row; while failing the copy kept "
            "the newest 40 turns (the cap); after recovery every folded turn (12..62) reached "
            "the summarizer and 63..72 are verbatim"
        ),
        events=failed_events,
        attempts_on_row=attempts,
    )


@pytest.mark.parametrize("langfuse", ["unreachable", "hanging"])
def test_langfuse_down_folds_use_the_builtin_prompt(
    stack: Stack,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    llm: FakeLLMServer,
    langfuse: str,
) -> None:
    with HangingServer() as hanging:
        url = hanging.base_url if langfuse == "hanging" else f"http://127.0.0.1:{free_port()}"
        env = {
            "LANGFUSE_PUBLIC_KEY": "pk-lf-test",
            "LANGFUSE_SECRET_KEY": "sk-lf-test",
            "LANGFUSE_BASE_URL": url,
        }
        w = start_worker(concurrency=1, env=env)
        tids = [uuid.uuid4() for _ in range(2)]
        sent: dict[str, uuid.UUID] = {}
        for tid in tids:
            for n in range(1, 22):
                snap = make_snapshot(tid, n)
                sent[snap["session_id"]] = tid
                send_finalize(agent, snap)
        started = time.monotonic()
        wait_for(
            lambda: [r.summary_through_seq for r in thread_rows(tids).values()] == [11, 11],
            90,
            "both folds",
            w.log,
        )
        elapsed = time.monotonic() - started
        rows = thread_rows(tids)
        assert {r.summary_prompt for r in rows.values()} == {"builtin:v2"}
        assert all(r.summary and "Running summary" in r.summary for r in rows.values())
        lost, duplicated, _ = Tally(sent).check()
        assert (lost, duplicated) == (0, 0)
        assert w.stop(60) == 0  # shutdown is not held up by the trace exporter
    figures.record(
        f"outage.4.langfuse_{langfuse}",
        scenario=f"Langfuse {langfuse} (prompt fetch and tracing)",
        jobs=len(sent),
        faults="connection refused" if langfuse == "unreachable" else "accepts, never answers",
        lost=lost,
        duplicated=duplicated,
        recover_s=None,
        recover=f"no outage seen by memory: 2 folds in {elapsed:.1f} s",
        checked="both folds succeed with the built-in prompt (summary_prompt builtin:v2)",
    )
