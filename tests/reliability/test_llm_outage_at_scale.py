"""Scenario: the LLM is down while 2 000 threads need a fold, on each broker.

Every fold fails once and waits RETRY_S for its retry (MEMORY_FOLD_BACKOFF_BASE_S; production
waits 60 s). Where does that wait live? On Redis, in the fold worker: 2 000 ETA tasks it holds
in memory (and in the broker's `unacked` hash), invisible to Flower. On RabbitMQ, in the
broker's native delayed-delivery queues: the worker holds nothing. Measured while all 2 000
wait: the worker's RSS (main process + pool), the tasks it holds (`celery inspect
scheduled`), the messages in the delay queues. Then the LLM comes back and every thread
folds when its retry is due.

The threads are written straight into Postgres (21 turns each, a fold due), as 2 000 agents'
finalize jobs would have left them, so that the scenario spends its time on the folds.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import func, select, text

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.fold.publisher import FOLD_QUEUE, publish_fold
from memory_core.io.db import session_scope
from memory_core.io.queues import is_amqp
from memory_core.models import ConversationThread
from tests.support import figures
from tests.support.brokers import BROKERS, delayed, held, scheduled

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.parametrize("broker", BROKERS, indirect=True),
]

THREADS = 2000
TURNS = 21  # one over the threshold: one fold each, through turn 11
# The first retry's wait (production: 60 s). Failing 2 000 folds took 30-47 s beside two other
# xdist workers on 2 cores; 90 s leaves a moment with every retry waiting after that first wave.
# A wave that outlasts it still passes, later: its first retries fail again and wait 2 x 90 s,
# and the moment comes after the second wave. Each second of it is a second of the suite.
RETRY_S = 90


def _seed(threads: int) -> list[uuid.UUID]:
    """`threads` threads of TURNS turns each, a fold due, in two statements."""
    tids = [uuid.uuid4() for _ in range(threads)]
    with session_scope() as s:
        s.execute(
            text(
                "INSERT INTO conversation_threads (id, owner_id, agent_type, title, last_seq,"
                " fold_due_at) SELECT t, 'user-42', 'chat', 'revenue', :turns, now()"
                " FROM unnest(CAST(:ids AS uuid[])) AS t"
            ),
            {"ids": [str(t) for t in tids], "turns": TURNS},
        )
        s.execute(
            text(
                "INSERT INTO thread_messages (thread_id, session_id, seq, user_query, answer,"
                " completed_at) SELECT t, gen_random_uuid(), n,"
                " 'Revenue by region, turn ' || n, 'Here it is.', now()"
                " FROM unnest(CAST(:ids AS uuid[])) AS t, generate_series(1, :turns) AS n"
            ),
            {"ids": [str(t) for t in tids], "turns": TURNS},
        )
    return tids


def _count(tids: list[uuid.UUID], condition: object) -> int:
    t = ConversationThread
    with session_scope() as s:
        stmt = select(func.count()).select_from(t).where(t.id.in_(tids), condition)  # type: ignore[arg-type]
        return int(s.scalar(stmt) or 0)


def _rss_mib(worker: WorkerProcess, *, pool: bool = True) -> float:
    """Resident memory of the worker's main process (where ETA tasks wait) and its pool."""
    total_kib = 0
    for pid in [worker.pid, *(worker.children() if pool else [])]:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total_kib += int(line.split()[1])
        except FileNotFoundError:
            continue
    return total_kib / 1024


def test_two_thousand_folds_wait_out_an_llm_outage_in_the_broker_not_the_worker(
    start_worker: Callable[..., WorkerProcess], llm: FakeLLMServer, broker: str
) -> None:
    amqp = is_amqp(broker)
    tids = _seed(THREADS)
    llm.set_mode("500")
    w = start_worker(
        queues=FOLD_QUEUE, concurrency=4, env={"MEMORY_FOLD_BACKOFF_BASE_S": str(RETRY_S)}
    )
    rss_idle, main_idle = _rss_mib(w), _rss_mib(w, pool=False)
    for tid in tids:  # what the finalize of each thread's turn 21 published
        assert publish_fold(tid, broker)
    t = ConversationThread
    published_at = time.monotonic()
    # At least once: were failing 2 000 folds to outlast the first backoff, the first threads
    # would be on their second attempt before the last failed their first.
    wait_for(lambda: _count(tids, t.fold_attempts >= 1) == THREADS, 300, "2000 failed folds", w.log)
    failed_at = time.monotonic()
    wave_s = failed_at - published_at
    # Every retry is waiting (RETRY_S): where?
    waiting = {"scheduled": 0, "delayed": 0, "held": 0}

    def settled() -> bool:
        waiting.update(scheduled=scheduled(broker), held=held(broker))
        waiting["delayed"] = delayed(broker) if amqp else 0
        if amqp:  # the last failed attempts' acks follow their confirmed retries
            return waiting["delayed"] == THREADS and waiting["held"] == 0
        return waiting["scheduled"] == waiting["held"] == THREADS

    # Every thread has exactly one retry waiting; the moment none is running comes after the
    # first wave, or between two waves if the first outlasted RETRY_S.
    wait_for(settled, 2 * RETRY_S, f"2000 waiting retries ({waiting})", w.log, 1.0)
    rss_waiting, main_waiting = _rss_mib(w), _rss_mib(w, pool=False)
    if amqp:
        assert (waiting["scheduled"], waiting["held"]) == (0, 0), waiting
    else:
        assert waiting["held"] == THREADS, waiting
    llm.set_mode("ok")
    wait_for(
        lambda: _count(tids, t.summary_through_seq == 11) == THREADS,
        wave_s + 4 * RETRY_S,  # the second-wave case: its retries are due 2 x RETRY_S later
        "every thread folded after the LLM came back",
        w.log,
        1.0,
    )
    all_folded_s = time.monotonic() - failed_at
    assert _count(tids, t.fold_due_at.is_(None)) == THREADS
    assert llm.calls >= 2 * THREADS
    name = "RabbitMQ" if amqp else "Redis"
    figures.record(
        f"outage.5.llm_{THREADS}.{name.lower()}",
        scenario=f"the LLM down while {THREADS} threads need a fold ({name} broker)",
        jobs=THREADS,
        faults=f"{THREADS} folds fail (HTTP 500) and wait {RETRY_S} s for their retry",
        lost=0,
        duplicated=0,
        recover_s=all_folded_s,
        recover=f"all {THREADS} folded {all_folded_s:.0f} s after the last failure",
        checked=(
            f"failing the first attempts took {wave_s:.0f} s; "
            f"while the retries waited: worker RSS {rss_waiting:.0f} MiB (idle {rss_idle:.0f}), "
            f"of which the main process {main_waiting:.0f} MiB (idle {main_idle:.0f}), "
            f"tasks held by the worker (inspect scheduled) {waiting['scheduled']}, unacked "
            f"{waiting['held']}, in the broker's delay queues {waiting['delayed']}"
        ),
        first_wave_s=round(wave_s, 1),
        rss_idle_mib=round(rss_idle, 1),
        rss_waiting_mib=round(rss_waiting, 1),
        main_rss_idle_mib=round(main_idle, 1),
        main_rss_waiting_mib=round(main_waiting, 1),
        **waiting,
    )
