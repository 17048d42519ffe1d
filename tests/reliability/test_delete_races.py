"""Scenario: deleting a thread while work on it is in flight. Nothing comes back.

`delete_thread` (memory_core/lifecycle/threads.py, memory_core/lifecycle/purge.py) racing:

1. a finalize blocked on the thread's row lock behind the delete (in-process), and a stream
   of finalize jobs on a real worker while the delete runs (both brokers);
2. a fold whose LLM call the fake LLM holds while the thread is deleted;
3. a fold that failed and waits for its retry (60 s countdown: in RabbitMQ's delay queues, in
   the worker on Redis) when the thread is deleted; the retry, run in this process with the
   job's own task id (so its own lease token), as the worker would run it;
4. a finalize job delivered again after the delete (the same snapshot, same session id).

After each: no thread row, no turn, a tombstone, no Redis working copy (only the `gone`
marker), no LangGraph checkpoint, `ThreadNotFound` (or nothing) through every entry point,
no event naming the thread after its `memory_thread_deleted`, and the other threads (two other
owners' and another of the same owner's) exactly as they were, counted before and after.

Without the tombstone trigger (migration 3d9a6c1e5b27) scenarios 1 and 4 fail: the finalize
is `saved` as seq 1 of a re-created thread (checked by disabling the trigger).

On RabbitMQ the refused finalize of a deleted thread is acked, not rejected: a rejected job
would be dead-lettered, snapshot and all, to `memory.dead` (found by this suite).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

import pytest
import redis
from celery import Celery
from kombu import Connection
from sqlalchemy import Table, func, select, text

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    archive_thread,
    delete_thread,
    list_threads,
    save_session_to_thread_safe,
)
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import (
    MEMORY_FINALIZE_REJECTED,
    MEMORY_SUMMARIZATION_FAILED,
    MEMORY_SUMMARIZED,
    MEMORY_THREAD_DELETED,
    routine_stream,
)
from memory_core.io.db import get_engine, session_scope
from memory_core.io.queues import DEAD_LETTER_QUEUE, FINALIZE_QUEUE, FOLD_QUEUE, is_amqp
from memory_core.langgraph import (
    checkpoint_runs,
    langgraph_available,
    load_conversation_context,
    postgres_checkpointer,
    run_config,
    setup_checkpointer,
)
from memory_core.models import ConversationThread, ThreadMessage, ThreadTombstone
from memory_core.settings import get_settings, reset_settings_cache
from memory_core.write.session_handler import REASON_DELETED
from tests.support.brokers import BROKERS, DELAY_QUEUES, held, ready, scheduled
from tests.support.commands import run_module
from tests.support.faults import RowLock
from tests.support.jobs import configure, run_job
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs, thread_row
from tests.support.workers import send_finalize
from workers import tasks

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(180)]

OWNER = "owner-del"
# Workers here stop at once: nothing they run at the end of a test is waited for.
QUICK_STOP = {"MEMORY_WORKER_SOFT_SHUTDOWN_S": "0"}
THREADS = cast(Table, ConversationThread.__table__)
TURNS = cast(Table, ThreadMessage.__table__)


# ---------------------------------------------------------------- fixtures and setup


@pytest.fixture(scope="module")
def checkpoints(stack: Stack) -> bool:
    """The LangGraph checkpointer's tables in the suite's database (with the extra installed):
    every thread here gets a run with checkpoints, which must go with the thread."""
    if not langgraph_available():  # pragma: no cover - the dev install has the extra
        return False
    setup_checkpointer(stack.database_url)
    return True


@pytest.fixture(autouse=True)
def _fresh_task_caches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tests point this process's settings at the workers' (events_here, the events
    stream) and the in-process task runs (scenario 3) build memory objects on the task class.
    Afterwards: the environment restored, and the settings cache and task caches emptied
    *after* that. The cache kept this test's settings (a fake LLM and an event stream that
    are gone) for every later test, which broke the LLM-outage scenario that followed."""
    yield
    monkeypatch.undo()
    reset_settings_cache()
    tasks.MemoryTask._memory = None
    tasks.MemoryTask._folder = None


def events_here(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """This process runs with the workers' settings: its `memory_thread_deleted` lands on the
    same event stream as the workers' events, in one order."""
    configure(monkeypatch, **env)


def save_turns(memory: RedisConversationMemory, tid: uuid.UUID, owner: str, turns: int) -> None:
    for n in range(1, turns + 1):
        out = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
        assert out.status == "saved", out


def add_runs(threads: list[tuple[uuid.UUID, str]], enabled: bool) -> None:
    """One LangGraph run with a checkpoint per thread, recording its conversation as
    `run_config` makes every checkpoint of a run do."""
    if not enabled:  # pragma: no cover
        return
    from langgraph.checkpoint.base import empty_checkpoint

    with postgres_checkpointer(max_size=1) as saver:
        for tid, owner in threads:
            config = run_config(uuid.uuid4(), thread_id=tid, owner_id=owner)
            config["configurable"]["checkpoint_ns"] = ""
            saver.put(cast(Any, config), empty_checkpoint(), {"source": "input", "step": -1}, {})


def runs_of(tid: uuid.UUID) -> int:
    with get_engine().connect() as conn:
        return checkpoint_runs(conn, thread_ids=[tid])


@dataclass(frozen=True)
class Others:
    """The threads a delete must leave alone: two of one other owner, one of another, and
    another thread of the deleted thread's own owner."""

    threads: list[tuple[uuid.UUID, str]]

    @classmethod
    def create(cls, memory: RedisConversationMemory) -> Others:
        suffix = uuid.uuid4().hex[:8]
        alice, bob = f"alice-{suffix}", f"bob-{suffix}"
        threads = [(uuid.uuid4(), o) for o in (alice, alice, bob, OWNER)]
        for tid, owner in threads:
            save_turns(memory, tid, owner, 3)
        return cls(threads)

    def state(self, deleted: uuid.UUID) -> dict[str, Any]:
        """Everything of theirs: rows and turns as stored, working copies as stored and as
        read, checkpoint runs, and how many threads each owner has besides `deleted`."""
        ids = [tid for tid, _ in self.threads]
        memory = RedisConversationMemory()
        with get_engine().connect() as conn:
            rows = conn.execute(select(THREADS).where(THREADS.c.id.in_(ids)).order_by("id"))
            turns = conn.execute(
                select(TURNS).where(TURNS.c.thread_id.in_(ids)).order_by("thread_id", "seq")
            )
            stored = ([tuple(r) for r in rows], [tuple(t) for t in turns])
        copies = {tid: memory.copy.read(tid) for tid in ids}  # before a read could rebuild one
        return {
            "stored": stored,
            "copies": copies,
            "contexts": {tid: memory.get_context(tid, owner) for tid, owner in self.threads},
            "runs": {tid: runs_of(tid) for tid in ids},
            "counts": {
                owner: sum(t.id != deleted for t in list_threads(owner, include_archived=True))
                for owner in sorted({o for _, o in self.threads})
            },
        }


def total_threads() -> int:
    with get_engine().connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(THREADS)) or 0)


# ---------------------------------------------------------------- what "gone" means


def assert_gone(tid: uuid.UUID, owner: str, r: redis.Redis, *, cli: bool = False) -> None:
    """No row, no turn, a tombstone, no copy (the `gone` marker only), no checkpoint, and
    nothing through any entry point: reads, history, transcript, LangGraph, writes; with
    `cli`, the command line's `context` too (a subprocess: seconds, so not every time)."""
    with session_scope() as s:
        assert s.get(ConversationThread, tid) is None, "the thread row came back"
        assert stored_seqs(tid) == [], "turns of the deleted thread are stored"
        assert s.get(ThreadTombstone, tid) is not None, "no tombstone"
        assert ThreadMessage.transcript(s, tid, owner) == []
    prefix = get_settings().memory_key_prefix
    gone = f"{prefix}:{{{tid}}}:gone"
    keys = sorted(k.decode() for k in r.scan_iter(match=f"*{tid}*", count=1000))
    assert keys == [gone], f"Redis keys of the deleted thread: {keys}"
    assert runs_of(tid) == 0, "checkpoints of the deleted thread's runs are left"
    memory = RedisConversationMemory()  # a fresh process view: no locally parsed copy
    for read in (memory.get_context, memory.rehydrate, archive_thread, delete_thread):
        with pytest.raises(ThreadNotFound):
            read(tid, owner)
    assert tid not in {t.id for t in list_threads(owner, include_archived=True, limit=100)}
    state = load_conversation_context({"thread_id": str(tid), "owner_id": owner}, memory)
    assert state["conversation_context"]["recent"] == []
    assert state["conversation_context"]["summary"] is None
    if cli:
        out = run_module("memory_core.cli", "context", str(tid), "--owner", owner, "--json")
        assert (out.returncode, out.stdout) == (1, ""), out
        assert out.stderr == f"error: thread {tid} not found\n", out.stderr
    # The reads above wrote nothing back.
    assert sorted(k.decode() for k in r.scan_iter(match=f"*{tid}*", count=1000)) == [gone]


@dataclass(frozen=True)
class Entry:
    id: tuple[int, int]
    stream: str
    fields: dict[str, str]

    @property
    def event(self) -> str:
        return self.fields.get("event", "")


def entries(r: redis.Redis, stream: str) -> list[Entry]:
    """Every entry of the stream and its routine stream, in the order Redis appended them
    (one server clock: the ids of both streams compare)."""
    out = []
    for name in (stream, routine_stream(stream)):
        for eid, raw in cast(list[tuple[bytes, dict[bytes, bytes]]], r.xrange(name)):
            ms, seq = eid.decode().split("-")
            fields = {k.decode(): v.decode() for k, v in raw.items()}
            out.append(Entry((int(ms), int(seq)), name, fields))
    return sorted(out, key=lambda e: e.id)


def stream_mark(r: redis.Redis, stream: str) -> tuple[int, int]:
    """The id of the last entry of the stream and its routine stream so far ((0, 0): none)."""
    return max((e.id for e in entries(r, stream)), default=(0, 0))


def after_the_delete(
    r: redis.Redis,
    stream: str,
    tid: uuid.UUID,
    owner: str,
    *,
    since: tuple[int, int] | None = None,
) -> list[Entry]:
    """The events after the thread's one `memory_thread_deleted`, checked to name neither the
    thread nor its owner; returned for the test's own checks.

    With `since` (a `stream_mark` taken before the delete began): every event after the mark
    but the deletion itself. A worker's finalize queued behind the delete on the row wakes at
    the delete's COMMIT and may emit its refusal before the deleting process, back from that
    COMMIT, appends `memory_thread_deleted`: Redis's order between the two is not the
    product's to keep, so such a test counts from the mark."""
    every = entries(r, stream)
    deleted = [e for e in every if e.event == MEMORY_THREAD_DELETED]
    assert [e.fields["thread_id"] for e in deleted] == [str(tid)], deleted
    assert deleted[0].fields["reason"] == "delete"
    start = deleted[0].id if since is None else since
    later = [e for e in every if e.id > start and e is not deleted[0]]
    for e in [*later, deleted[0]]:
        assert owner not in str(e.fields.values()), e  # owner ids never reach events
    for e in later:
        assert str(tid) not in str(e.fields.values()), f"an event about the thread after: {e}"
    return later


def untouched(others: Others, before: dict[str, Any], tid: uuid.UUID, total: int) -> None:
    assert others.state(tid) == before, "another thread changed"
    assert total_threads() == total - 1, "other threads than the deleted one went"


def delayed_jobs(url: str) -> int:
    """RabbitMQ: jobs waiting out a retry countdown in the delay queues (passive declares: no
    consumer holds those, so what they hold is ready; `rabbitmqctl` would take seconds)."""
    return sum(ready(url, queue) for queue in DELAY_QUEUES)


def finalize_log_counts(w: WorkerProcess) -> dict[str, int]:
    """Outcomes in the worker's log: the core logs duplicates and refusals at INFO; a save is
    counted from Celery's success line (the core's `memory.finalize_saved` is DEBUG)."""
    log = w.log()
    counts = {k: log.count(f'"memory.finalize_{k}"') for k in ("duplicate", "rejected")}
    return {"saved": log.count("'status': 'saved'"), **counts}


# ---------------------------------------------------------------- 1. finalize vs delete


def _waiting(query_like: str) -> int:
    """Sessions of the suite's database waiting for a lock in a statement like this."""
    with get_engine().connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query LIKE :q"
                ),
                {"q": query_like},
            )
            or 0
        )


@pytest.mark.parametrize("late", ["a new turn", "turn 1 redelivered"])
def test_a_finalize_queued_behind_the_delete_is_rejected_and_recreates_nothing(
    *,
    late: str,
    row_lock: RowLock,
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: bool,
) -> None:
    """The delete locks the row; a finalize of the thread queues behind it on the same row;
    the delete commits (turns, row, tombstone), and the finalize's `INSERT ... ON CONFLICT`,
    finding the conflicting row gone, inserts the thread afresh. Only the tombstone trigger
    stops that insert: without it this finalize would be `saved` as seq 1 of a new thread.

    The order is made, not hoped for: another transaction holds the row first (`row_lock`);
    the delete queues for it, then the finalize (both seen waiting in pg_stat_activity).
    Postgres grants a row to its waiters in turn, so the delete goes first.
    """
    monkeypatch.setenv("MEMORY_EVENTS_STREAM", events_stream)
    reset_settings_cache()
    memory = RedisConversationMemory()
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n, owner_id=OWNER) for n in (1, 2, 3)]
    for snap in snaps:
        assert save_session_to_thread_safe(snap, memory=memory).status == "saved"
    others = Others.create(memory)
    add_runs([(tid, OWNER), *others.threads], checkpoints)
    before, total = others.state(tid), total_threads()
    snapshot = make_snapshot(tid, 4, owner_id=OWNER) if late == "a new turn" else snaps[0]

    assert row_lock.hold(tid)
    with ThreadPoolExecutor(2) as pool:
        try:
            deleting = pool.submit(delete_thread, tid, OWNER)
            wait_for(lambda: _waiting("%FOR UPDATE%") == 1, 15, "the delete waiting for the row")
            finalizing = pool.submit(save_session_to_thread_safe, snapshot, memory=memory)
            wait_for(
                lambda: _waiting("WITH claim AS%") == 1,
                15,
                "the finalize queued behind the delete",
            )
        finally:
            row_lock.release()  # also when a wait failed: the pool's threads must not hang
        report = deleting.result(timeout=30)
        outcome = finalizing.result(timeout=30)

    assert (report.threads, report.turns, report.copies) == (1, 3, 1)
    assert report.checkpoints == (1 if checkpoints else 0)
    assert (outcome.status, outcome.reason) == ("rejected", REASON_DELETED), outcome
    assert (outcome.seq, outcome.retryable) == (None, False)
    assert_gone(tid, OWNER, redis_client, cli=True)
    untouched(others, before, tid, total)
    assert after_the_delete(redis_client, events_stream, tid, OWNER) == []


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_finalize_jobs_on_a_worker_queued_behind_the_delete_leave_nothing(
    *,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
    worker_env: dict[str, str],
    row_lock: RowLock,
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: bool,
) -> None:
    """24 finalize jobs for one thread on a worker of 4 processes: 4 land before the delete;
    18 (12 new turns, the 6 stored ones again) are sent while `delete_thread` runs, 4 of them
    seen blocked on the row behind it; 2 come after it. 6 turns stored, so no fold.

    Made, not hoped for, as in-process: another transaction holds the row, the delete queues
    for it, then the worker's finalizes; the row is then released."""
    events_here(monkeypatch, worker_env)
    memory = RedisConversationMemory()
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n, owner_id=OWNER) for n in range(1, 20)]
    for snap in snaps[:2]:
        assert save_session_to_thread_safe(snap, memory=memory).status == "saved"
    others = Others.create(memory)
    add_runs([(tid, OWNER), *others.threads], checkpoints)
    before, total = others.state(tid), total_threads()
    w = start_worker(concurrency=4, env=QUICK_STOP)
    for snap in snaps[2:6]:
        send_finalize(agent, snap)
    wait_for(lambda: stored_seqs(tid) == [1, 2, 3, 4, 5, 6], 30, "turns 3-6 landing", w.log)

    during = snaps[6:18] + snaps[:6]
    mark = stream_mark(redis_client, events_stream)
    assert row_lock.hold(tid)
    with ThreadPoolExecutor(1) as pool:
        try:
            deleting = pool.submit(delete_thread, tid, OWNER)
            wait_for(lambda: _waiting("%FOR UPDATE%") == 1, 15, "the delete waiting for the row")
            for snap in during:
                send_finalize(agent, snap)
            wait_for(
                lambda: _waiting("WITH claim AS%") == 4,
                30,
                "the worker's 4 finalizes queued behind the delete",
                w.log,
            )
        finally:
            row_lock.release()  # also when a wait failed: the pool's thread must not hang
        report = deleting.result(timeout=30)
    after = [snaps[18], snaps[2]]  # a new turn, a stored one
    for snap in after:
        send_finalize(agent, snap)
    jobs = 4 + len(during) + len(after)

    wait_for(lambda: sum(finalize_log_counts(w).values()) >= jobs, 60, "every job", w.log)
    url = str(agent.conf.broker_url)
    wait_for(lambda: (ready(url, FINALIZE_QUEUE), held(url)) == (0, 0), 30, "no job left", w.log)
    # Nothing saved after the delete (it would be a resurrected thread), nothing retried.
    assert finalize_log_counts(w) == {"saved": 4, "duplicate": 0, "rejected": jobs - 4}
    assert '"memory.finalize_retry"' not in w.log()
    assert (report.threads, report.turns, report.copies) == (1, 6, 1)
    assert report.checkpoints == (1 if checkpoints else 0)
    assert_gone(tid, OWNER, redis_client)
    untouched(others, before, tid, total)
    # The core logs a refusal before the task emits its event: wait for the last event.
    rejected_events = jobs - 4
    wait_for(
        lambda: (
            len(after_the_delete(redis_client, events_stream, tid, OWNER, since=mark))
            >= rejected_events
        ),
        30,
        "every refusal's event",
        w.log,
    )
    later = after_the_delete(redis_client, events_stream, tid, OWNER, since=mark)
    assert [e.event for e in later] == [MEMORY_FINALIZE_REJECTED] * rejected_events
    for e in later:  # nothing said about the thread: no thread id, no session id
        assert (e.fields["thread_id"], e.fields["session_id"]) == ("", "")
        assert e.fields["error"] == REASON_DELETED
    assert w.alive()


# ---------------------------------------------------------------- 2. a fold mid-LLM-call


def test_a_fold_whose_llm_call_outlives_the_thread_writes_nothing(
    *,
    start_worker: Callable[..., WorkerProcess],
    llm: FakeLLMServer,
    broker: str,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: bool,
) -> None:
    events_here(monkeypatch, worker_env)
    llm.delay_s = 120.0
    llm.set_mode("timeout")  # every call is held until `stopping` releases it
    memory = RedisConversationMemory()
    others = Others.create(memory)
    tid = uuid.uuid4()
    add_runs([(tid, OWNER), *others.threads], checkpoints)
    w = start_worker(concurrency=1, env=QUICK_STOP)
    save_turns(memory, tid, OWNER, 21)  # turn 21 takes it over the threshold: a fold job
    before, total = others.state(tid), total_threads()

    wait_for(lambda: llm.calls == 1, 30, "the fold's LLM call", w.log)
    row = thread_row(tid)
    assert row is not None and row.fold_lease_token is not None and row.summary is None
    report = delete_thread(tid, OWNER)
    assert (report.threads, report.turns) == (1, 21)
    llm.stopping.set()  # release the held call: the summary of turns 1-11 comes back now
    wait_for(lambda: "{'status': 'lost'" in w.log(), 30, "the fold's end", w.log)

    assert llm.calls == 1
    assert '"memory.folded"' not in w.log()
    # Acked (just after its log line), neither retried nor republished.
    wait_for(lambda: (ready(broker, FOLD_QUEUE), held(broker)) == (0, 0), 30, "acked", w.log)
    assert_gone(tid, OWNER, redis_client)
    untouched(others, before, tid, total)
    assert after_the_delete(redis_client, events_stream, tid, OWNER) == []
    summarized = [e for e in entries(redis_client, events_stream) if e.event == MEMORY_SUMMARIZED]
    assert summarized == [], "a memory_summarized event for the deleted thread"


# ---------------------------------------------------------------- 3. a fold waiting to retry

_FOLD_JOB = re.compile(r"memory\.fold_thread\[([0-9a-f-]{36})\]")


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_fold_waiting_for_its_retry_finds_the_thread_gone_and_writes_nothing(
    *,
    start_worker: Callable[..., WorkerProcess],
    llm: FakeLLMServer,
    broker: str,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: bool,
) -> None:
    """The retry's countdown is 60 s (no setting shortens it): it is run here, as the worker
    would run it then, with the job's task id (so the job's own lease token) and retries=1."""
    events_here(monkeypatch, worker_env)
    llm.set_mode("500")
    memory = RedisConversationMemory()
    others = Others.create(memory)
    tid = uuid.uuid4()
    add_runs([(tid, OWNER), *others.threads], checkpoints)
    w = start_worker(concurrency=1, env=QUICK_STOP)
    save_turns(memory, tid, OWNER, 21)
    before, total = others.state(tid), total_threads()

    def failed() -> list[Entry]:
        return [e for e in entries(redis_client, events_stream) if e.event != MEMORY_SUMMARIZED]

    [failure] = wait_for(failed, 60, "the failed fold attempt", w.log)
    assert (failure.event, failure.fields["thread_id"]) == (MEMORY_SUMMARIZATION_FAILED, str(tid))
    assert (failure.fields["attempt"], failure.fields["retry_in_s"]) == ("1", "60")
    url = str(broker)
    if is_amqp(url):
        wait_for(lambda: (delayed_jobs(url), held(url)) == (1, 0), 30, "the retry delayed", w.log)
    else:
        wait_for(lambda: (held(url), scheduled(url)) == (1, 1), 30, "the retry held", w.log)
    fold_jobs = set(_FOLD_JOB.findall(w.log()))
    assert len(fold_jobs) == 1, fold_jobs
    task_id = fold_jobs.pop()

    report = delete_thread(tid, OWNER)
    assert (report.threads, report.turns) == (1, 21)
    llm.set_mode("ok")  # the LLM is back: a retry that found the thread would fold it now
    result = run_job(tasks.fold_thread, str(tid), retries=1, task_id=task_id)

    assert result == {"status": "missing", "through_seq": None}
    assert llm.calls == 1, "the retry called the LLM"
    assert ready(url, FOLD_QUEUE) == 0, "the retry published another fold"
    assert_gone(tid, OWNER, redis_client)
    untouched(others, before, tid, total)
    assert after_the_delete(redis_client, events_stream, tid, OWNER) == []
    assert all(e.event != MEMORY_SUMMARIZED for e in entries(redis_client, events_stream))


# ---------------------------------------------------------------- 4. a redelivered finalize


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_a_finalize_redelivered_after_the_delete_is_rejected_and_leaves_the_queue(
    *,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: bool,
) -> None:
    """The last turn's job and the first's (which would create the thread) delivered again,
    with the same session ids, after the thread was deleted."""
    events_here(monkeypatch, worker_env)
    memory = RedisConversationMemory()
    others = Others.create(memory)
    tid = uuid.uuid4()
    add_runs([(tid, OWNER), *others.threads], checkpoints)
    w = start_worker(concurrency=1, env=QUICK_STOP)
    snaps = [make_snapshot(tid, n, owner_id=OWNER) for n in (1, 2, 3)]
    for snap in snaps:
        send_finalize(agent, snap)
    wait_for(lambda: stored_seqs(tid) == [1, 2, 3], 30, "3 turns", w.log)
    before, total = others.state(tid), total_threads()
    report = delete_thread(tid, OWNER)
    assert (report.threads, report.turns) == (1, 3)

    for snap in (snaps[2], snaps[0]):
        send_finalize(agent, snap)
    url = str(agent.conf.broker_url)

    def rejected() -> list[Entry]:
        later = after_the_delete(redis_client, events_stream, tid, OWNER)
        return later if len(later) >= 2 else []

    later = wait_for(rejected, 30, "2 rejections", w.log)
    assert [e.event for e in later] == [MEMORY_FINALIZE_REJECTED] * 2
    for e in later:
        assert (e.fields["thread_id"], e.fields["session_id"]) == ("", "")
        assert e.fields["error"] == REASON_DELETED
        assert not {s["session_id"] for s in snaps} & set(e.fields.values())
    # Acked for good: not on the queue, not held, no retry waiting anywhere.
    wait_for(lambda: (ready(url, FINALIZE_QUEUE), held(url)) == (0, 0), 30, "acked", w.log)
    if is_amqp(url):  # (on Redis a worker holding a retry holds it in `unacked`: held)
        assert delayed_jobs(url) == 0, "a retry waits in a delay queue"
    assert finalize_log_counts(w) == {"saved": 3, "duplicate": 0, "rejected": 2}
    assert '"memory.finalize_retry"' not in w.log()
    assert_gone(tid, OWNER, redis_client)
    untouched(others, before, tid, total)
    assert after_the_delete(redis_client, events_stream, tid, OWNER) == later


def dead_lettered(url: str) -> list[str]:
    """The bodies of the jobs in RabbitMQ's `memory.dead`, read and handed back (unacked)."""
    bodies: list[str] = []
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            while (message := channel.basic_get(DEAD_LETTER_QUEUE, no_ack=False)) is not None:
                body = message.body
                bodies.append(body.decode() if isinstance(body, bytes) else str(body))
        finally:
            channel.close()
    return bodies


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_finalize_rejected_for_a_deleted_thread_keeps_no_copy_of_it_on_the_broker(
    *,
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
    worker_env: dict[str, str],
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events_here(monkeypatch, worker_env)
    w = start_worker(concurrency=1, env=QUICK_STOP)
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1, owner_id=OWNER, user_query="ZQX deleted thread's question")
    send_finalize(agent, snap)
    wait_for(lambda: stored_seqs(tid) == [1], 30, "the turn", w.log)
    delete_thread(tid, OWNER)
    send_finalize(agent, snap)  # delivered again after the delete
    wait_for(lambda: after_the_delete(redis_client, events_stream, tid, OWNER), 30, "the reject")
    wait_for(lambda: (ready(broker, FINALIZE_QUEUE), held(broker)) == (0, 0), 30, "acked")
    kept = [b for b in dead_lettered(broker) if snap["session_id"] in b or "ZQX" in b]
    assert kept == [], f"{len(kept)} job(s) of the deleted thread kept in {DEAD_LETTER_QUEUE}"
