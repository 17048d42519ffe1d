"""Scenario 1, crashes: 2 000 finalize jobs while workers are killed with -9 and SIGTERM'd,
on each broker (the suite's Redis; RabbitMQ, a vhost of the session's on the machine's node).

One run of load (20 conversation threads x 100 turns, sent by 20 agent threads), three kinds
of fault:
* worker children killed with -9 over and over (the OOM killer, a segfault): the parent sees
  the child die and requeues its job (`task_reject_on_worker_lost`) once Celery's
  `worker_lost_wait` (10 s) has passed without a result from it;
* a whole worker killed with -9 (a host that vanishes): nothing is handed back. On Redis the
  jobs it held come back after the broker's visibility timeout, lowered here to 5 s with a 1 s
  sweep (production: ~68 min, docs/OPERATIONS.md); on RabbitMQ, with production settings, as
  soon as the broker sees the worker's connection close;
* a whole worker SIGTERM'd (a deploy): soft shutdown, everything it held is handed back.

Checked afterwards: every turn stored once (0 lost, 0 duplicated), seq 1..100 in every thread,
the working copy equal to Postgres, and coverage: every turn a summary claims to cover reached
the summarizer, and every later turn is verbatim in the copy.

"Time to recover" of a fault: from the fault until every finalize job that was in flight
(unacked in the broker, and not already at stake in an earlier fault) has landed in Postgres.
"""

from __future__ import annotations

import re
import statistics
import time
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import select

from memory_core import ConversationContext, RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.io.queues import FINALIZE_QUEUE, is_amqp
from memory_core.models import ThreadMessage
from tests.support import figures
from tests.support.agents import JobLoad
from tests.support.brokers import BROKERS, held, ready
from tests.support.chaos import Chaos
from tests.support.services import Stack
from tests.support.state import (
    count_stored,
    folds_behind,
    folds_caught_up,
    landed,
    thread_rows,
)
from tests.support.tally import assert_gapless

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.timeout(300),
    pytest.mark.parametrize("broker", BROKERS, indirect=True),
]

THREADS = 20
TURNS = 100
JOBS = THREADS * TURNS
SEND_INTERVAL_S = 0.15  # per agent thread: ~130 jobs/s in all, for ~15 s: a backlog builds
VISIBILITY_S = 5
# Redis only: RabbitMQ needs no visibility timeout (it runs with production settings).
REDIS_ENV = {
    "MEMORY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
    "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1",
}
CRASH_ENV = {
    # A fold whose process was killed holds its lease this long before a retry may take over.
    "MEMORY_FOLD_LEASE_S": "3",
    "MEMORY_WORKER_SOFT_SHUTDOWN_S": "3",
    # A fold message lost with a killed worker is re-published by the next finalize after this.
    "MEMORY_FOLD_REPUBLISH_GRACE_S": "3",
}


def _query(k: int, n: int) -> str:
    return f"Revenue by region for {2000 + n}, excluding returns (thread {k} turn {n})"


def _queries_through(tid: uuid.UUID, through: int) -> list[str]:
    with session_scope() as s:
        return list(
            s.scalars(
                select(ThreadMessage.user_query).where(
                    ThreadMessage.thread_id == tid, ThreadMessage.seq <= through
                )
            )
        )


def _diagnostics(broker: str, chaos: Chaos, load: JobLoad, started: float) -> str:
    """What a timeout shows: worker logs, the missing turns, where they are, the faults."""
    missing = sorted(set(load.tally.sent) - landed(load.tally.sent))
    held_now = chaos.held()
    lines = [
        f"{w.log_path.name}: {line[:200]}"
        for w in chaos.workers
        for line in w.log().splitlines()
        if any(m in line for m in missing[:5])
    ]
    sent_at = [f"{load.sent_at[m] - started:.2f}" for m in missing[:5]]
    return "\n".join(
        [
            chaos.logs()[-3000:],
            *lines[:30],
            f"queue {ready(broker, FINALIZE_QUEUE)}, unacked {held(broker)}",
            f"{len(missing)} missing; held {len(held_now & set(missing))}",
            f"first missing: {missing[:5]}",
            "sent at (s): " + ", ".join(sent_at),
            "faults: " + "; ".join(f"{t - started:.2f} {what}" for t, what in chaos.timeline),
        ]
    )


def test_two_thousand_jobs_through_kill_9_and_sigterm(
    stack: Stack, start_worker: Callable[..., WorkerProcess], llm: FakeLLMServer, broker: str
) -> None:
    amqp = is_amqp(broker)
    load = JobLoad(THREADS, SEND_INTERVAL_S, max_turns=TURNS, query=_query)
    chaos = Chaos(
        None if amqp else stack.client(),
        start_worker,
        CRASH_ENV if amqp else CRASH_ENV | REDIS_ENV,
        whole_kill_at_s=3.5,
        sigterm_at_s=10.0,
        task_sessions=load.task_sessions,
    )
    tids = load.tids
    started = time.monotonic()
    load.start()
    try:
        while load.running() and time.monotonic() - started < 120:
            chaos.step(time.monotonic() - started)
            time.sleep(0.4)
        assert chaos.sigterm_held >= 0, "the load ended before every fault was injected"
        chaos.join()
        assert chaos.sigterm_code == 0, "the SIGTERM'd worker did not shut down cleanly"

        def diagnostics() -> str:
            return _diagnostics(broker, chaos, load, started)

        # Everything lands: a job is never only in a killed worker's memory (workers/broker.py
        # takes a message and records it as unacked in one step), so the dead worker's jobs
        # come back after the visibility timeout.
        wait_for(
            lambda: count_stored(tids) == JOBS, 3 * VISIBILITY_S + 30, "all turns", diagnostics
        )
        all_landed_s = time.monotonic() - started
        wait_for(chaos.recovery.poll, 60, "in-flight jobs of every fault", diagnostics)
        # Folds catch up: no thread keeps more than the threshold unfolded.
        settling = time.monotonic()
        wait_for(
            lambda: folds_caught_up(tids),
            90,
            "folds",
            lambda: chaos.logs()[-4000:] + "\n" + folds_behind(tids),
            0.5,
        )
        settle_s = time.monotonic() - settling
        # The last fold refreshes its thread's copy a moment after the commit this saw (by
        # design: until then the copy serves the older summary with every later turn).
        time.sleep(1.0)
    finally:
        load.stop()

    lost, duplicated, rows = load.tally.check()
    assert len(load.tally.sent) >= JOBS
    assert lost == 0 and duplicated == 0
    assert_gapless(rows)
    assert chaos.child_kills >= 10
    assert chaos.whole_kill_held >= 1, "no whole-worker kill took a job down with it"
    lost_with_child = sum(w.log().count("WorkerLostError('Worker exited") for w in chaos.workers)
    assert lost_with_child >= 1, "no child died mid-job"
    _check_coverage(tids, llm)
    for w in chaos.workers:
        if w.alive():
            assert w.stop(60) == 0
    timing = f"all landed {all_landed_s:.0f} s after the first send, folds caught up "
    timing += f"{settle_s:.0f} s later"
    suffix = ".rabbitmq" if amqp else ""
    _record_children(
        chaos, llm, duplicated=duplicated, mid_job=lost_with_child, timing=timing, suffix=suffix
    )
    _record_whole_kill_and_sigterm(chaos, lost=lost, duplicated=duplicated, suffix=suffix)


def _record_children(
    chaos: Chaos,
    llm: FakeLLMServer,
    *,
    duplicated: int,
    mid_job: int,
    timing: str,
    suffix: str,
) -> None:
    child = chaos.recovery.done.get("child", [0.0])
    figures.record(
        "crash.1.children" + suffix,
        scenario="worker children killed with -9, repeatedly, under load"
        + (" (RabbitMQ)" if suffix else ""),
        faults=f"{chaos.child_kills} x kill -9 of a pool child, {mid_job} mid-job",
        recover_s=max(child),
        recover=f"max {max(child):.1f} s (median {statistics.median(child):.1f} s)",
        checked=(
            f"{THREADS} threads x {TURNS} turns from {THREADS} agent threads (~130 jobs/s); "
            f"seq 1..{TURNS} in every thread; working copy == Postgres; every folded turn "
            f"reached the summarizer; {timing}. Recovery: of the jobs in flight at each "
            "kill; the one lost with its child is requeued once Celery's worker_lost_wait "
            "(10 s) has passed"
        ),
        child_kills=chaos.child_kills,
        recover_child_s=[round(x, 2) for x in child],
        llm_calls=llm.calls,
        lost=0,
        jobs=JOBS,
        duplicated=duplicated,
    )


def _record_whole_kill_and_sigterm(
    chaos: Chaos, *, lost: int, duplicated: int, suffix: str
) -> None:
    done = chaos.recovery.done
    common = {"jobs": JOBS, "duplicated": duplicated}
    figures.record(
        "crash.2.whole_kill" + suffix,
        scenario=(
            "a whole worker killed with -9 (RabbitMQ, production settings)"
            if suffix
            else f"a whole worker killed with -9 (visibility timeout {VISIBILITY_S} s, sweep 1 s)"
        ),
        faults=(
            f"{chaos.whole_kills} x kill -9 of a worker (and its children) caught holding a "
            f"job; {chaos.whole_kill_held} unacked job(s) went down with it"
        ),
        recover_s=done["whole kill"][0] if "whole kill" in done else None,
        recover=f"{done['whole kill'][0]:.1f} s" if "whole kill" in done else "n/a (none held)",
        checked=(
            "same run as crash.1: the dead worker's unacked jobs come back when RabbitMQ sees "
            "its connection close, and land exactly once"
            if suffix
            else "same run as crash.1: the dead worker's unacked jobs come back only after the "
            "visibility timeout, then land exactly once (production timeout ~68 min); "
            "none is lost in the take (workers/broker.py)"
        ),
        held=chaos.whole_kill_held,
        lost=lost,
        **common,
    )
    figures.record(
        "crash.3.sigterm" + suffix,
        scenario="a whole worker SIGTERM'd (soft shutdown 3 s) under load"
        + (" (RabbitMQ)" if suffix else ""),
        faults=(
            f"1 x SIGTERM, {chaos.sigterm_held} jobs in flight; "
            f"exited (code 0) in {chaos.sigterm_exit_s:.1f} s"
        ),
        recover_s=done["sigterm"][0] if "sigterm" in done else None,
        recover=f"{done['sigterm'][0]:.1f} s" if "sigterm" in done else "n/a (nothing held)",
        checked="same run as crash.1: running jobs finish, held jobs are handed back at once",
        held=chaos.sigterm_held,
        exit_s=round(chaos.sigterm_exit_s, 2),
        lost=0,
        **common,
    )


def _check_coverage(tids: list[uuid.UUID], llm: FakeLLMServer) -> None:
    """Summary + working copy account for every turn; the copy equals Postgres."""
    memory = RedisConversationMemory()
    seen: dict[int, set[int]] = {}
    for i in range(llm.calls):
        for k, n in re.findall(r"\(thread (\d+) turn (\d+)\)", llm.prompt_text(i)):
            seen.setdefault(int(k), set()).add(int(n))
    heads = thread_rows(tids)
    for k, tid in enumerate(tids):
        ctx = memory.get_context(tid, "user-42")
        memory.invalidate(tid)
        rebuilt = memory.get_context(tid, "user-42")
        assert rebuilt == ctx, f"thread {k}: working copy differs from Postgres\n" + _differ(
            ctx, rebuilt, tid
        )
        through = heads[tid].summary_through_seq
        last = heads[tid].last_seq
        assert through >= last - 20 and ctx.summary
        assert [e.seq for e in ctx.recent] == list(range(through + 1, last + 1))
        folded = {int(q.rsplit(" ", 1)[1].rstrip(")")) for q in _queries_through(tid, through)}
        missing = folded - seen.get(k, set())
        assert not missing, f"thread {k}: turns {sorted(missing)} folded but never summarized"


def _differ(cached: ConversationContext, rebuilt: ConversationContext, tid: uuid.UUID) -> str:
    """What a copy that differs from Postgres holds, beside the rebuilt one and the row."""

    def brief(c: ConversationContext) -> str:
        fields = {k: v for k, v in c.model_dump().items() if k not in ("summary", "recent")}
        seqs = [e.seq for e in c.recent]
        return f"through {c.summary_through_seq}, recent {seqs}, other fields {fields}"

    same = [e.seq for e, f in zip(cached.recent, rebuilt.recent, strict=False) if e != f]
    row = thread_rows([tid])[tid]
    return (
        f"copy:    {brief(cached)}\nrebuilt: {brief(rebuilt)}\n"
        f"summary equal: {cached.summary == rebuilt.summary}; turns that differ: {same}\n"
        f"row: last {row.last_seq}, through {row.summary_through_seq}, due {row.fold_due_at}"
    )
