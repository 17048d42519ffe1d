"""Scenario 1, crashes: 2 000 finalize jobs while workers are killed with -9 and SIGTERM'd.

One run of load (20 conversation threads x 100 turns, sent by 20 agent threads), three kinds
of fault:
* worker children killed with -9 over and over (the OOM killer, a segfault): the parent sees
  the child die and requeues its job (`task_reject_on_worker_lost`) once Celery's
  `worker_lost_wait` (10 s) has passed without a result from it;
* a whole worker killed with -9 (a host that vanishes): nothing is handed back; the jobs it
  held come back after the broker's visibility timeout, lowered here to 5 s with a 1 s sweep
  (production: ~68 min, docs/OPERATIONS.md);
* a whole worker SIGTERM'd (a deploy): soft shutdown, everything it held is handed back.

Checked afterwards: every turn stored once (0 lost, 0 duplicated), seq 1..100 in every thread,
the working copy equal to Postgres, and coverage: every turn a summary claims to cover reached
the summarizer, and every later turn is verbatim in the copy.

"Time to recover" of a fault: from the fault until every finalize job that was in flight
(unacked in the broker, and not already at stake in an earlier fault) has landed in Postgres.
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import threading
import time
import uuid
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import select

from memory_core import RedisConversationMemory
from memory_core.db import session_scope
from memory_core.fold_publisher import FINALIZE_QUEUE, FINALIZE_TASK
from memory_core.models import ThreadMessage
from tests.conftest import make_snapshot
from tests.fakes.llm_server import FakeLLMServer
from tests.reliability import figures
from tests.reliability.conftest import (
    Stack,
    Tally,
    assert_gapless,
    count_stored,
    held_finalize_jobs,
    landed,
    thread_rows,
    wait_until,
)
from tests.workers.harness import WorkerProcess, producer

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

THREADS = 20
TURNS = 100
JOBS = THREADS * TURNS
SEND_INTERVAL_S = 0.15  # per agent thread: ~130 jobs/s in all, for ~15 s: a backlog builds
WHOLE_KILL_AT_S = 3.5
SIGTERM_AT_S = 10.0
TASK_LINE = re.compile(
    r"Task memory\.finalize_turn\[([0-9a-f-]+)\] (received|succeeded|retry|raised)"
)
VISIBILITY_S = 5
CRASH_ENV = {
    "MEMORY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S),
    "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1",
    # A fold whose process was killed holds its lease this long before a retry may take over.
    "MEMORY_FOLD_LEASE_S": "3",
    "MEMORY_WORKER_SOFT_SHUTDOWN_S": "3",
    # A fold message lost with a killed worker is re-published by the next finalize after this.
    "MEMORY_FOLD_REPUBLISH_GRACE_S": "3",
}


def _query(k: int, n: int) -> str:
    return f"Revenue by region for {2000 + n}, excluding returns (thread {k} turn {n})"


class Recovery:
    """Times how long the finalize jobs at stake in a fault take to land."""

    def __init__(self) -> None:
        self.pending: list[tuple[str, float, set[str]]] = []
        self.done: dict[str, list[float]] = {}

    def at_stake(self, in_flight: set[str]) -> set[str]:
        """In-flight jobs not already being timed for an earlier fault."""
        earlier = set().union(*(sids for _, _, sids in self.pending))
        return in_flight - earlier

    def fault(self, kind: str, at_stake: set[str], at: float) -> None:
        self.pending.append((kind, at, set(at_stake)))
        self.poll()

    def poll(self) -> bool:
        """Move faults whose jobs all landed to `done`; True when nothing is pending."""
        still = []
        for kind, at, sids in self.pending:
            left = sids - landed(sids)
            if left:
                still.append((kind, at, left))
            else:
                self.done.setdefault(kind, []).append(time.monotonic() - at)
        self.pending = still
        return not still


class Chaos:
    """The fault injector: kills children, one whole worker, SIGTERMs another."""

    def __init__(self, broker: redis.Redis, start_worker: Callable[..., WorkerProcess]) -> None:
        self.broker = broker
        self.start_worker = start_worker
        self.workers = [start_worker(concurrency=2, env=CRASH_ENV) for _ in range(2)]
        self.recovery = Recovery()
        self.rng = random.Random(5)
        self.child_kills = 0
        self.whole_kill_held = -1
        self.whole_kills = 0
        self.sigterm_held = -1
        self.sigterm_exit_s = 0.0
        self.timeline: list[tuple[float, str]] = []
        self.threads: list[threading.Thread] = []
        self.sigterm_code: int | None = None

    def live(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def logs(self) -> str:
        return "\n".join(f"--- {w.log_path}\n{w.log()[-2500:]}" for w in self.workers)

    def step(self, elapsed_s: float) -> None:
        self.recovery.poll()
        victim = self._holding_worker() if self._whole_kill_due(elapsed_s) else None
        if victim is not None:
            self.kill_whole_worker(victim)
            return
        if self._sigterm_due(elapsed_s):
            # A worker caught holding a job, else (after 5 s of trying) any worker.
            victim = self._holding_worker()
            if victim is not None or elapsed_s > SIGTERM_AT_S + 5:
                self.sigterm_worker(victim or self.live()[0])
                return
        self.kill_a_child()

    def _sigterm_due(self, elapsed_s: float) -> bool:
        return (
            self.sigterm_held < 0
            and self.whole_kills > 0
            and not self._whole_kill_due(elapsed_s)
            and elapsed_s >= SIGTERM_AT_S
        )

    def _whole_kill_due(self, elapsed_s: float) -> bool:
        """Until a whole kill took jobs down with it (3 tries), one is due every 2 s."""
        return (
            self.whole_kill_held <= 0
            and self.whole_kills < 3
            and elapsed_s >= WHOLE_KILL_AT_S + 2 * self.whole_kills
        )

    def _holding_worker(self) -> WorkerProcess | None:
        """A live worker whose log shows a finalize job received and not yet finished."""
        for worker in self.live():
            received: set[str] = set()
            finished: set[str] = set()
            for task_id, what in TASK_LINE.findall(worker.log()):
                (received if what == "received" else finished).add(task_id)
            if received - finished:
                return worker
        return None

    def _in_background(self, work: Callable[[], None]) -> None:
        """Faults that take seconds (a worker starting, a soft shutdown) must not pause the
        others: run them beside the fault loop, as an orchestrator would."""
        thread = threading.Thread(target=work, daemon=True)
        thread.start()
        self.threads.append(thread)

    def _replace(self) -> None:
        self._in_background(
            lambda: self.workers.append(self.start_worker(concurrency=2, env=CRASH_ENV))
        )

    def kill_a_child(self) -> None:
        children = [c for w in self.live() for c in w.children()]
        if not children:
            return
        child = self.rng.choice(children)
        in_flight = self.recovery.at_stake(held_finalize_jobs(self.broker))
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            return
        self.child_kills += 1
        if in_flight:  # else nothing was at stake: nothing to time
            self.recovery.fault("child", in_flight, time.monotonic())

    def kill_whole_worker(self, victim: WorkerProcess) -> None:
        victim.kill_hard()  # main process and children: nothing is handed back
        killed_at = time.monotonic()
        self.timeline.append((killed_at, f"whole kill -9 of {victim.log_path.name}"))
        self._replace()
        # What live workers hold is done within a moment; what stays is the dead worker's.
        first = held_finalize_jobs(self.broker)
        time.sleep(1.0)
        held = (first & held_finalize_jobs(self.broker)) - landed(first)
        self.whole_kills += 1
        self.whole_kill_held = len(held)
        if held:
            self.recovery.fault("whole kill", held, killed_at)

    def sigterm_worker(self, victim: WorkerProcess) -> None:
        held = self.recovery.at_stake(held_finalize_jobs(self.broker))
        t0 = time.monotonic()
        self.timeline.append((t0, f"SIGTERM of {victim.log_path.name}"))
        self.sigterm_held = len(held)
        if held:
            self.recovery.fault("sigterm", held, t0)

        def stop() -> None:
            self.sigterm_code = victim.terminate(60)  # soft shutdown, then it hands back
            self.sigterm_exit_s = time.monotonic() - t0
            self.timeline.append((time.monotonic(), "SIGTERM'd worker exited"))

        self._in_background(stop)
        self._replace()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(90)


def _folds_caught_up(tids: list[uuid.UUID]) -> bool:
    return all(t.last_seq - t.summary_through_seq <= 20 for t in thread_rows(tids).values())


def _queries_through(tid: uuid.UUID, through: int) -> list[str]:
    with session_scope() as s:
        return list(
            s.scalars(
                select(ThreadMessage.user_query).where(
                    ThreadMessage.thread_id == tid, ThreadMessage.seq <= through
                )
            )
        )


def test_two_thousand_jobs_through_kill_9_and_sigterm(
    stack: Stack, start_worker: Callable[..., WorkerProcess], llm: FakeLLMServer
) -> None:
    broker = stack.client()
    chaos = Chaos(broker, start_worker)
    tids = [uuid.uuid4() for _ in range(THREADS)]
    tally = Tally(sent={})
    sent_at: dict[str, float] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def produce(k: int, tid: uuid.UUID) -> None:
        app = producer()  # one broker connection per agent thread
        for n in range(1, TURNS + 1):
            snap = make_snapshot(tid, n, user_query=_query(k, n))
            with lock:
                tally.sent[snap["session_id"]] = tid
                sent_at[snap["session_id"]] = time.monotonic()
            app.send_task(FINALIZE_TASK, args=[snap], queue=FINALIZE_QUEUE)
            if stop.wait(SEND_INTERVAL_S):
                return

    def diagnostics() -> str:
        missing = sorted(set(tally.sent) - landed(tally.sent))
        queued = {
            m for m in missing if any(m in str(x) for x in broker.lrange("memory.finalize", 0, -1))
        }
        held = held_finalize_jobs(broker)
        lines = [
            f"{w.log_path.name}: {line[:200]}"
            for w in chaos.workers
            for line in w.log().splitlines()
            if any(m in line for m in missing[:5])
        ]
        return "\n".join(
            [
                chaos.logs()[-3000:],
                *lines[:30],
                f"queue {broker.llen('memory.finalize')}, unacked {broker.hlen('unacked')}",
                f"{len(missing)} missing; queued {len(queued)}; held {len(held & set(missing))}",
                f"first missing: {missing[:5]}",
                "sent at (s): " + ", ".join(f"{sent_at[m] - started:.2f}" for m in missing[:5]),
                "faults: " + "; ".join(f"{t - started:.2f} {what}" for t, what in chaos.timeline),
            ]
        )

    producers = [
        threading.Thread(target=produce, args=(k, tid), daemon=True) for k, tid in enumerate(tids)
    ]
    started = time.monotonic()
    for p in producers:
        p.start()
    try:
        while any(p.is_alive() for p in producers) and time.monotonic() - started < 120:
            chaos.step(time.monotonic() - started)
            time.sleep(0.4)
        assert chaos.sigterm_held >= 0, "the load ended before every fault was injected"
        chaos.join()
        assert chaos.sigterm_code == 0, "the SIGTERM'd worker did not shut down cleanly"
        # Everything lands: a job is never only in a killed worker's memory (workers/broker.py
        # takes a message and records it as unacked in one step), so the dead worker's jobs
        # come back after the visibility timeout.
        wait_until(
            lambda: count_stored(tids) == JOBS, 3 * VISIBILITY_S + 30, "all turns", diagnostics
        )
        all_landed_s = time.monotonic() - started
        wait_until(chaos.recovery.poll, 60, "in-flight jobs of every fault", diagnostics)
        # Folds catch up: no thread keeps more than the threshold unfolded.
        settle_s = wait_until(lambda: _folds_caught_up(tids), 90, "folds", chaos.logs, 0.5)
    finally:
        stop.set()

    lost, duplicated, rows = tally.check()
    assert len(tally.sent) >= JOBS
    assert lost == 0 and duplicated == 0
    assert_gapless(rows)
    assert chaos.child_kills >= 10
    assert chaos.whole_kill_held >= 1, "no whole-worker kill took a job down with it"
    jobs_lost_with_child = sum(
        w.log().count("WorkerLostError('Worker exited") for w in chaos.workers
    )
    assert jobs_lost_with_child >= 1, "no child died mid-job"
    _check_coverage(tids, llm)

    for w in chaos.workers:
        if w.alive():
            assert w.terminate(60) == 0
    done = chaos.recovery.done
    child = done.get("child", [0.0])
    common = {"jobs": JOBS, "duplicated": duplicated}
    figures.record(
        "crash.1.children",
        scenario="worker children killed with -9, repeatedly, under load",
        faults=f"{chaos.child_kills} x kill -9 of a pool child, {jobs_lost_with_child} mid-job",
        recover_s=max(child),
        recover=f"max {max(child):.1f} s (median {statistics.median(child):.1f} s)",
        checked=(
            f"{THREADS} threads x {TURNS} turns from {THREADS} agent threads (~130 jobs/s); "
            f"seq 1..{TURNS} in every thread; working copy == Postgres; every folded turn "
            f"reached the summarizer; all landed {all_landed_s:.0f} s after the first send, "
            f"folds caught up {settle_s:.0f} s later. Recovery: of the jobs in flight at each "
            "kill; the one lost with its child is requeued once Celery's worker_lost_wait "
            "(10 s) has passed"
        ),
        child_kills=chaos.child_kills,
        recover_child_s=[round(x, 2) for x in child],
        llm_calls=llm.calls,
        lost=0,
        **common,
    )
    figures.record(
        "crash.2.whole_kill",
        scenario=f"a whole worker killed with -9 (visibility timeout {VISIBILITY_S} s, sweep 1 s)",
        faults=(
            f"{chaos.whole_kills} x kill -9 of a worker (and its children) caught holding a "
            f"job; {chaos.whole_kill_held} unacked job(s) went down with it"
        ),
        recover_s=done["whole kill"][0] if "whole kill" in done else None,
        recover=f"{done['whole kill'][0]:.1f} s" if "whole kill" in done else "n/a (none held)",
        checked=(
            "same run as crash.1: the dead worker's unacked jobs come back only after the "
            "visibility timeout, then land exactly once (production timeout ~68 min); "
            "none is lost in the take (workers/broker.py)"
        ),
        held=chaos.whole_kill_held,
        lost=lost,
        **common,
    )
    figures.record(
        "crash.3.sigterm",
        scenario="a whole worker SIGTERM'd (soft shutdown 3 s) under load",
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
        assert memory.get_context(tid, "user-42") == ctx, "working copy differs from Postgres"
        through = heads[tid].summary_through_seq
        last = heads[tid].last_seq
        assert through >= last - 20 and ctx.summary
        assert [e.seq for e in ctx.recent] == list(range(through + 1, last + 1))
        folded = {int(q.rsplit(" ", 1)[1].rstrip(")")) for q in _queries_through(tid, through)}
        missing = folded - seen.get(k, set())
        assert not missing, f"thread {k}: turns {sorted(missing)} folded but never summarized"
