"""Workers killed with -9 or SIGTERM mid-work: every job still lands exactly once."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Callable

import redis
from celery import Celery

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from tests.support.snapshots import make_snapshot
from tests.support.state import count_stored, stored, thread_row
from tests.support.workers import send_finalize, send_fold


def _assert_exactly_once(
    tids: list[uuid.UUID], per_thread: int, sent: dict[uuid.UUID, set[str]]
) -> None:
    rows = stored(tids)
    for tid in tids:
        seqs = [seq for seq, _ in rows[tid]]
        assert seqs == list(range(1, per_thread + 1)), f"gap or duplicate in {tid}"
    assert {sid for per in rows.values() for _, sid in per} == set().union(*sent.values())


def _send_load(
    agent: Celery, threads: int, per_thread: int
) -> tuple[list[uuid.UUID], dict[uuid.UUID, set[str]]]:
    tids = [uuid.uuid4() for _ in range(threads)]
    sent: dict[uuid.UUID, set[str]] = {t: set() for t in tids}
    for n in range(1, per_thread + 1):
        for tid in tids:
            snap = make_snapshot(tid, n)
            sent[tid].add(snap["session_id"])
            send_finalize(agent, snap)
    return tids, sent


def test_children_killed_repeatedly_lose_and_duplicate_nothing(
    start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    w = start_worker(concurrency=2)
    tids, sent = _send_load(agent, threads=5, per_thread=60)
    kills = 0

    def landed_while_killing_children() -> bool:
        nonlocal kills
        if count_stored(tids) == 300:
            return True
        children = w.children()
        if children and kills < 12:
            try:
                os.kill(random.choice(children), signal.SIGKILL)
            except ProcessLookupError:  # it died since pgrep saw it (a kill before, replaced)
                return False
            kills += 1
        return False

    wait_for(landed_while_killing_children, 240, "all 300 turns", w.log, interval_s=0.25)
    assert kills >= 5 and w.alive()
    assert "WorkerLostError" in w.log() or "exited with 'signal 9" in w.log()
    _assert_exactly_once(tids, 60, sent)


def test_child_killed_mid_fold_the_fold_is_redelivered_and_lands_once(
    start_worker: Callable[..., WorkerProcess], agent: Celery, llm: FakeLLMServer
) -> None:
    w = start_worker(concurrency=1, env={"MEMORY_FOLD_LEASE_S": "3"})
    tid = uuid.uuid4()
    for n in range(1, 21):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(lambda: count_stored([tid]) == 20, 60, "20 turns", w.log)
    llm.delay_s = 8.0
    llm.set_mode("timeout")  # the LLM hangs: the fold is mid-call when we kill its process
    send_finalize(agent, make_snapshot(tid, 21))
    wait_for(lambda: llm.calls >= 1, 60, "the fold's LLM call", w.log)
    (child,) = w.children()
    os.kill(child, signal.SIGKILL)
    llm.set_mode("ok")
    wait_for(lambda: _thread_through(tid) == 11, 90, "the redelivered fold", w.log)
    assert w.alive() and llm.calls >= 2
    t = thread_row(tid)
    assert t is not None and t.summary
    assert t.summary.count("Running summary of the analysis") == 1


def _thread_through(tid: uuid.UUID) -> int | None:
    row = thread_row(tid)
    return None if row is None else row.summary_through_seq


def test_whole_worker_killed_jobs_redelivered_after_visibility_timeout(
    start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    # Lowered from the production ~70 min so the bound can be observed in a test.
    env = {"MEMORY_VISIBILITY_TIMEOUT_S": "5", "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1"}
    tids, sent = _send_load(agent, threads=4, per_thread=50)
    broker = redis.Redis.from_url(agent.conf.broker_url)
    kills = 0
    for _ in range(3):  # a kill between two jobs takes nothing down: kill another
        first = start_worker(concurrency=2, env=env)
        progress = count_stored(tids) + 20

        def progressed(p: int = progress) -> bool:
            return count_stored(tids) >= p

        wait_for(progressed, 60, "some progress", first.log)
        first.kill_hard()  # main process and children: nothing is handed back
        kills += 1
        landed_at_kill = count_stored(tids)
        held = broker.hlen("unacked")
        if held:
            break
    assert held >= 1, f"none of {kills} kills caught the worker holding a job"
    assert landed_at_kill < 200
    killed_at = time.monotonic()
    second = start_worker(concurrency=2, env=env)
    wait_for(lambda: count_stored(tids) == 200, 120, "all 200 turns after the crash", second.log)
    wait_for(lambda: broker.hlen("unacked") == 0, 60, "held jobs redelivered", second.log)
    recovered_in = time.monotonic() - killed_at
    _assert_exactly_once(tids, 50, sent)
    # The held jobs could not come back before the visibility timeout had passed.
    assert recovered_in >= 5
    print(
        f"whole-worker kill: {held} held jobs redelivered, all {200 - landed_at_kill} "
        f"outstanding landed within {recovered_in:.1f}s (visibility_timeout 5 s)"
    )


def test_sigterm_hands_back_what_the_worker_holds(
    start_worker: Callable[..., WorkerProcess], agent: Celery, llm: FakeLLMServer
) -> None:
    first = start_worker(concurrency=2)
    tids, sent = _send_load(agent, threads=4, per_thread=40)
    wait_for(lambda: count_stored(tids) >= 10, 60, "some progress", first.log)
    assert first.stop(60) == 0  # a clean warm/soft shutdown
    second = start_worker(concurrency=2)
    wait_for(lambda: count_stored(tids) == 160, 120, "all 160 turns after SIGTERM", second.log)
    _assert_exactly_once(tids, 40, sent)
    # A fold retry waiting on its countdown is handed back too, not lost.
    tid = uuid.uuid4()
    llm.set_mode("500")
    for n in range(1, 22):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(lambda: "memory.fold_failed" in second.log(), 60, "a failed fold", second.log)
    assert second.stop(60) == 0
    llm.set_mode("ok")
    send_fold(agent, str(tid))  # not needed for durability: just speeds the test up
    third = start_worker(concurrency=1)
    wait_for(lambda: _thread_through(tid) == 11, 60, "the fold after restart", third.log)


def test_sigterm_during_a_slow_fold_hands_the_fold_back(
    start_worker: Callable[..., WorkerProcess], agent: Celery, llm: FakeLLMServer
) -> None:
    first = start_worker(
        concurrency=1, env={"MEMORY_WORKER_SOFT_SHUTDOWN_S": "2", "MEMORY_FOLD_LEASE_S": "3"}
    )
    tid = uuid.uuid4()
    for n in range(1, 21):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(lambda: count_stored([tid]) == 20, 60, "20 turns", first.log)
    llm.delay_s = 9.0
    llm.set_mode("timeout")  # a fold that will not finish within the soft shutdown
    send_finalize(agent, make_snapshot(tid, 21))
    wait_for(lambda: llm.calls >= 1, 60, "the fold's LLM call", first.log)
    started = time.monotonic()
    first.stop(60)
    # Exited after the 2 s soft shutdown instead of waiting for the 9 s LLM call.
    assert time.monotonic() - started < 8
    broker = redis.Redis.from_url(agent.conf.broker_url)
    assert broker.hlen("unacked") == 0, "the fold must be back in the queue, not held"
    llm.set_mode("ok")
    second = start_worker(concurrency=1, env={"MEMORY_FOLD_LEASE_S": "3"})
    wait_for(lambda: _thread_through(tid) == 11, 60, "the handed-back fold", second.log)
