"""Scenario 2, outages: Postgres stopped, Redis restarted, the LLM failing, Langfuse gone.

Each runs against the suite's private servers (tests/reliability/services.py), under load from
agents that enqueue jobs and agents that save in-process.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable

import pytest
from celery import Celery

from memory_core import RedisConversationMemory
from memory_core.events import EventConsumer, emit_event
from memory_core.redis_client import make_redis
from tests.conftest import make_snapshot
from tests.fakes.langfuse_server import HangingServer, closed_port
from tests.fakes.llm_server import FakeLLMServer
from tests.reliability import figures
from tests.reliability.agents import InProcessAgent, JobLoad
from tests.reliability.conftest import (
    Stack,
    Tally,
    assert_gapless,
    count_stored,
    held_finalize_jobs,
    landed,
    queued_finalize_jobs,
    thread_rows,
    wait_until,
)
from tests.workers.harness import WorkerProcess, send_finalize, send_fold

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

PG_DOWN_S = 10.0


def _copies_match_postgres(tids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Threads whose working copy (as read, without any further save) differs from Postgres."""
    memory = RedisConversationMemory()
    stale = []
    for tid in tids:
        cached = memory.get_context(tid, "user-42")
        memory.invalidate(tid)
        if memory.get_context(tid, "user-42") != cached:
            stale.append(tid)
    return stale


def _folds_caught_up(tids: list[uuid.UUID]) -> bool:
    return all(t.last_seq - t.summary_through_seq <= 20 for t in thread_rows(tids).values())


def test_postgres_stopped_for_10_s_under_load(
    stack: Stack, start_worker: Callable[..., WorkerProcess], llm: FakeLLMServer
) -> None:
    w = start_worker(concurrency=2)
    load = JobLoad(threads=8, interval_s=0.2).start()  # ~40 jobs/s through the worker
    agents = InProcessAgent(threads=2, interval_s=0.1).start()  # ~20 saves/s in-process
    wait_until(lambda: llm.calls >= 1, 30, "the first folds", w.log)
    llm.delay_s = 2.0
    llm.set_mode("timeout")  # slow LLM calls for a moment: a fold is in flight at the stop
    calls = llm.calls
    wait_until(lambda: llm.calls > calls, 30, "a slow fold", w.log, 0.05)
    stop_began = time.monotonic()
    stack.pg.stop()  # pg_ctl stop -m fast: sessions terminated, transactions rolled back
    down_at = time.monotonic()
    llm.set_mode("ok")
    time.sleep(PG_DOWN_S - (down_at - stop_began))
    up_began = time.monotonic()
    stack.pg.start()
    up_at = time.monotonic()
    # Everything handed over before Postgres came back: how long until it has all landed,
    # and until no thread is over the fold threshold any more?
    before_up = {**load.tally.sent, **agents.tally.sent}
    every = load.tids + agents.tids
    recover_s = fold_catch_up_s = None
    deadline = up_at + 90
    while (recover_s is None or fold_catch_up_s is None) and time.monotonic() < deadline:
        if recover_s is None and not set(before_up) - landed(before_up):
            recover_s = time.monotonic() - up_began
        if recover_s is not None and fold_catch_up_s is None and _folds_caught_up(every):
            fold_catch_up_s = time.monotonic() - up_began
        time.sleep(0.1)
    assert recover_s is not None and fold_catch_up_s is not None, w.log()[-5000:]
    time.sleep(max(0.0, 3 - (time.monotonic() - up_at)))
    load.stop()
    agents.stop()
    sent = {**load.tally.sent, **agents.tally.sent}
    tally = Tally(sent)
    wait_until(lambda: not set(sent) - landed(sent), 60, "every turn", w.log, 0.25)
    wait_until(lambda: _folds_caught_up(every), 60, "folds to catch up", w.log, 0.25)
    lost, duplicated, rows = tally.check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert not agents.errors, agents.errors[:3]
    during = [o for o in agents.outcomes if o.started >= down_at and o.ended <= up_began]
    assert during and {o.status for o in during} == {"failed"}, "a save 'succeeded' without PG"
    saved = {o.session_id for o in agents.outcomes if o.status == "saved"}
    assert saved <= landed(saved)
    log = w.log()
    retries = log.count('"memory.finalize_retry"')
    fold_retries = log.count('"memory.fold_retry"')
    assert retries, "no finalize job met the outage"
    assert not _copies_match_postgres(load.tids + agents.tids)
    assert w.alive()
    figures.record(
        "outage.1.postgres",
        scenario=f"Postgres stopped for {PG_DOWN_S:.0f} s under load (pg_ctl stop -m fast)",
        jobs=len(sent),
        faults=(
            f"1 x Postgres down {up_began - stop_began:.1f} s with folds in flight; "
            f"{retries} finalize + {fold_retries} fold retries; {len(during)} in-process "
            "saves answered `failed`"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=recover_s,
        recover=(
            f"{recover_s:.1f} s from restart to the backlog landed; every thread folded "
            f"up to date {fold_catch_up_s:.1f} s after restart"
        ),
        checked=(
            f"{len(load.tally.sent)} jobs from 8 agent threads + {len(agents.tally.sent)} "
            "in-process saves from 2; every save during the outage reported `failed` (never "
            "`saved`) and landed on the agent's retry; jobs retried with bounded backoff "
            "and landed once; working copies == Postgres"
        ),
        in_process_failed=len(during),
        job_retries=retries,
        fold_retries=fold_retries,
    )


# Jobs a worker holds when Redis goes away cannot be handed back while it is down; the worker
# hands them back when it reconnects (workers/broker.py). Whatever it cannot account for waits
# in `unacked` for the visibility timeout, lowered here from ~68 min.
REDIS_ENV = {"MEMORY_VISIBILITY_TIMEOUT_S": "10", "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1"}


def test_redis_cache_and_broker_restarted_with_aof(
    stack: Stack,
    start_worker: Callable[..., WorkerProcess],
    llm: FakeLLMServer,
    events_stream: str,
) -> None:
    w = start_worker(concurrency=2, env=REDIS_ENV)
    load = JobLoad(threads=10, interval_s=0.08).start()  # ~125 jobs/s: a backlog builds
    agents = InProcessAgent(threads=2, interval_s=0.1).start()
    time.sleep(3)
    # A thread whose last turns are saved while Redis is down, and never touched again.
    quiet = uuid.uuid4()
    quiet_agent = InProcessAgent(threads=0, interval_s=0)
    memory = RedisConversationMemory()
    for n in (1, 2):
        assert quiet_agent.save(memory, make_snapshot(quiet, n)).status == "saved"
    outage_s: list[float] = []
    recover_s: list[float] = []
    at_risk_total = 0
    for how, down_s, n in ((signal.SIGKILL, 5.0, 3), (signal.SIGTERM, 3.0, 4)):
        client = stack.client()
        marker = emit_event(client, "reliability_probe", stream=events_stream)
        # Jobs queued or held by the worker at the fault: they must survive it (AOF).
        at_risk = held_finalize_jobs(client) | queued_finalize_jobs(client)
        at_risk -= landed(at_risk)
        at_risk_total += len(at_risk)
        client.close()
        t0 = time.monotonic()
        stack.redis.stop(how)
        last = quiet_agent.save(memory, make_snapshot(quiet, n))
        assert (last.status, last.cache) == ("saved", "unavailable"), last
        time.sleep(max(0.0, down_s - (time.monotonic() - t0)))
        stack.redis.start()
        up = time.monotonic()
        outage_s.append(up - t0)
        recover_s.append(
            (up - t0)
            + wait_until(lambda r=at_risk: not r - landed(r), 90, "the jobs at risk", w.log)
        )
        client = stack.client()
        assert client.xrange(events_stream, marker, marker), "an event was lost by the restart"
        client.close()
        time.sleep(max(0.0, 4 - (time.monotonic() - up)))
    load.stop()
    agents.stop()
    sent = {**load.tally.sent, **agents.tally.sent}
    tally = Tally(sent)
    wait_until(lambda: not set(sent) - landed(sent), 90, "every turn", w.log, 0.25)
    lost, duplicated, rows = tally.check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert not agents.errors, agents.errors[:3]
    assert {o.status for o in agents.outcomes} <= {"saved", "duplicate"}
    assert at_risk_total > 0, "no job was queued or held at the faults: the AOF was not tested"
    unavailable = sum(o.cache == "unavailable" for o in agents.outcomes)
    # Read-your-writes across the outage: the copy that survived in the AOF must not hide
    # turns 3 and 4, saved while Redis was down.
    ctx = RedisConversationMemory().get_context(quiet, "user-42")
    assert [e.seq for e in ctx.recent] == [1, 2, 3, 4], "a turn saved during the outage is hidden"
    stale = _copies_match_postgres(load.tids + agents.tids + [quiet])
    assert not stale, f"{len(stale)} working copies differ from Postgres"
    assert w.alive(), "the worker died with the broker connection"
    handed_back = sum(
        json.loads(line)["jobs"]
        for line in w.log().splitlines()
        if '"memory.broker_handed_back"' in line and line.startswith("{")
    )
    assert handed_back >= 1, "the worker held no job at either fault, or did not hand it back"
    figures.record(
        "outage.2.redis",
        scenario="Redis (cache + broker + events) restarted under load, AOF on",
        jobs=len(sent),
        faults=(
            f"kill -9 (down {outage_s[0]:.1f} s) and SIGTERM (down {outage_s[1]:.1f} s) of "
            f"Redis with {at_risk_total} jobs queued or held; {load.send_failures} sends "
            f"refused and retried by agents; {unavailable} in-process saves without cache"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=max(recover_s),
        recover=(
            f"{recover_s[0]:.1f} s / {recover_s[1]:.1f} s from the fault until every job at "
            f"risk landed; {handed_back} held job(s) handed back by the worker on reconnect"
        ),
        checked=(
            "the worker survives both restarts; queued and held jobs and the event stream "
            "survive (AOF); in-process saves during the outage report `saved`; afterwards "
            "every working copy equals Postgres, also for a thread whose last turns were "
            "saved while Redis was down (read-your-writes)"
        ),
        at_risk=at_risk_total,
        handed_back=handed_back,
    )


def _row(tid: uuid.UUID):  # type: ignore[no-untyped-def]
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

    def drain() -> None:
        nonlocal failed_events
        for e in consumer.read(count=100):
            failed_events += e.event == "memory_summarization_failed"
            consumer.ack(e.id)

    tid = uuid.uuid4()
    sent: dict[str, uuid.UUID] = {}

    def turn(n: int) -> None:
        snap = make_snapshot(tid, n)
        sent[snap["session_id"]] = tid
        send_finalize(agent, snap)
        wait_until(lambda: count_stored([tid]) == n, 30, f"turn {n}", w.log, 0.05)

    for n in range(1, 22):
        turn(n)
    wait_until(lambda: _row(tid).summary_through_seq == 11, 30, "the first fold", w.log)
    llm.set_mode("500")
    attempts = 0
    for n in range(22, 72):  # 50 turns while the LLM answers 500
        turn(n)
        if n == 32 or (n > 32 and n % 5 == 0):  # a due retry comes round (sent now, not later)
            if n > 32:
                send_fold(agent, str(tid))
            attempts += 1
            wait_until(lambda a=attempts: _row(tid).fold_attempts >= a, 30, "a fold attempt")
        ctx = RedisConversationMemory().get_context(tid, "user-42")
        assert ctx.summary_through_seq == 11
        assert [e.seq for e in ctx.recent] == list(range(max(12, n - 39), n + 1))  # the cap
    wait_until(lambda: (drain(), failed_events >= attempts)[1], 30, "the failure events")
    row = _row(tid)
    assert failed_events == row.fold_attempts == attempts, (failed_events, row.fold_attempts)
    ok_from = llm.calls
    llm.set_mode("ok")
    recovered_at = time.monotonic()
    send_fold(agent, str(tid))  # the next due retry
    wait_until(lambda: _row(tid).summary_through_seq == 51, 30, "the fold after recovery", w.log)
    recover_s = time.monotonic() - recovered_at
    turn(72)  # over the threshold again: the normal cadence resumes
    wait_until(lambda: _row(tid).summary_through_seq == 62, 30, "the next fold", w.log)
    folded_prompts = "\n".join(llm.prompt_text(i) for i in range(ok_from, llm.calls))
    missing = [n for n in range(12, 63) if f"(turn {n})" not in folded_prompts]
    assert not missing, f"turns {missing} folded but never summarized"
    ctx = RedisConversationMemory().get_context(tid, "user-42")
    assert [e.seq for e in ctx.recent] == list(range(63, 73))
    drain()
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
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
            f"== {row.fold_attempts} attempts on the thread row; while failing the copy kept "
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
        url = hanging.base_url if langfuse == "hanging" else f"http://127.0.0.1:{closed_port()}"
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
        wait_until(
            lambda: [r.summary_through_seq for r in thread_rows(tids).values()] == [11, 11],
            90,
            "both folds",
            w.log,
        )
        elapsed = time.monotonic() - started
        rows = thread_rows(tids)
        assert {r.summary_prompt for r in rows.values()} == {"builtin:v1"}
        assert all(r.summary and "Running summary" in r.summary for r in rows.values())
        lost, duplicated, _ = Tally(sent).check()
        assert (lost, duplicated) == (0, 0)
        assert w.terminate(60) == 0  # shutdown is not held up by the trace exporter
    figures.record(
        f"outage.4.langfuse_{langfuse}",
        scenario=f"Langfuse {langfuse} (prompt fetch and tracing)",
        jobs=len(sent),
        faults="connection refused" if langfuse == "unreachable" else "accepts, never answers",
        lost=lost,
        duplicated=duplicated,
        recover_s=None,
        recover=f"no outage seen by memory: 2 folds in {elapsed:.1f} s",
        checked="both folds succeed with the built-in prompt (summary_prompt builtin:v1)",
    )
