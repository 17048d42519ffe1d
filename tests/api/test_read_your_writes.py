"""Read-your-writes: `get_context(wait_for=...)` / `aget_context(wait_for=...)` after
`enqueue_turn`, with real workers on both brokers (`broker`: redis, rabbitmq) and through both
doors (`api`: sync, async).

The bound is what ends a wait: a turn the worker saves within it is in the context; one it
does not (no worker, a rejected turn) is either raised (`TurnNotReady`, with the context
without it) or flagged (`missing_session_ids`). No test asserts a duration: each asserts what
was returned, in states where only one answer is right.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import update

from memory_core import (
    ConversationContext,
    RedisConversationMemory,
    SaveOutcome,
    ThreadNotFound,
    TurnNotReady,
)
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread
from tests.support.api import OWNER, Api, memory_at, new_thread
from tests.support.brokers import BROKERS
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs

pytestmark = pytest.mark.parametrize("broker", BROKERS, indirect=True)

LONG_S = 120.0  # a bound no healthy worker comes near: the wait ends when the turn lands
SHORT_S = 1.0  # a bound for turns that will not land (no worker runs, or it was rejected)
AT_ONCE_S = 0.0  # look once, never wait: only a turn that is already there is found
# Stopped after their jobs are done: no soft shutdown to sit out at teardown.
QUICK_STOP = {"MEMORY_WORKER_SOFT_SHUTDOWN_S": "0"}


def _enqueued(api: Api, memory: RedisConversationMemory, broker: str, snap: Any) -> SaveOutcome:
    out = api.enqueue(snap, memory=memory, broker_url=broker)
    assert (out.status, out.seq) == ("enqueued", None), out
    return out


def _sessions(ctx: ConversationContext) -> list[str]:
    return [str(e.session_id) for e in ctx.recent]


def _at_the_bound(
    api: Api,
    memory: RedisConversationMemory,
    tid: uuid.UUID,
    owner: str,
    *,
    outcome: SaveOutcome,
    on_timeout: str,
) -> ConversationContext:
    """What a wait for a turn that never lands answers: raised (`TurnNotReady.context`) or
    flagged, as `on_timeout` says."""
    kw: dict[str, Any] = {"wait_for": outcome, "wait_s": SHORT_S, "on_timeout": on_timeout}
    if on_timeout == "flag":
        return api.get_context(memory, tid, owner, **kw)
    with pytest.raises(TurnNotReady) as caught:
        api.get_context(memory, tid, owner, **kw)
    assert str(caught.value.session_id) == outcome.session_id
    return caught.value.context


def _nothing(tid: uuid.UUID, outcome: SaveOutcome) -> ConversationContext:
    """The answer for a thread memory does not know (or not for this owner), at the bound."""
    missing = [uuid.UUID(outcome.session_id or "")]
    return ConversationContext(thread_id=tid, missing_session_ids=missing)


@contextmanager
def _reading(
    api: Api, memory: RedisConversationMemory, tid: uuid.UUID, **kw: Any
) -> Iterator[Future[ConversationContext]]:
    """A read that waits in another thread while the test moves the worker. Should the test
    fail meanwhile, the read is left to end at its bound, unwaited for."""
    pool = ThreadPoolExecutor(1)
    try:
        yield pool.submit(api.get_context, memory, tid, OWNER, **kw)
    except BaseException:
        pool.shutdown(wait=False)
        raise
    pool.shutdown()


@contextmanager
def _paused(worker: WorkerProcess) -> Iterator[None]:
    """SIGSTOP the worker's whole process group: it takes and runs nothing until resumed."""
    os.killpg(worker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(worker.pid, signal.SIGCONT)


def test_a_read_waits_until_a_worker_started_later_saves_the_turn(
    api: Api, broker: str, memory: RedisConversationMemory, start_worker: Callable[..., Any]
) -> None:
    tid = new_thread(api, memory, 1)
    snap = make_snapshot(tid, 2)
    outcome = _enqueued(api, memory, broker, snap)  # no worker runs yet
    with _reading(api, memory, tid, wait_for=outcome, wait_s=LONG_S) as read:
        assert stored_seqs(tid) == [1] and not read.done()
        start_worker(env=QUICK_STOP)
        ctx = read.result()
    assert [e.seq for e in ctx.recent] == [1, 2]
    assert _sessions(ctx)[-1] == snap["session_id"] and ctx.missing_session_ids == []
    # Saved now: the same wait returns at once.
    again = api.get_context(memory, tid, OWNER, wait_for=outcome, wait_s=AT_ONCE_S)
    assert again == ctx


def test_a_read_waits_for_a_turn_behind_a_backlog_on_a_paused_worker(
    api: Api, broker: str, memory: RedisConversationMemory, start_worker: Callable[..., Any]
) -> None:
    worker = start_worker(concurrency=1, env=QUICK_STOP)  # one job at a time, in queue order
    tid = new_thread(api, memory, 1)
    snaps = [make_snapshot(tid, n) for n in range(2, 8)]
    with _paused(worker):
        for snap in snaps:
            _enqueued(api, memory, broker, snap)
        last = snaps[-1]["session_id"]  # waited for by its session id (a str)
        with _reading(api, memory, tid, wait_for=last, wait_s=LONG_S) as read:
            assert not read.done()
            os.killpg(worker.pid, signal.SIGCONT)
            ctx = read.result()
    assert [e.seq for e in ctx.recent] == list(range(1, 8))
    assert _sessions(ctx)[1:] == [s["session_id"] for s in snaps]
    assert ctx.missing_session_ids == []


def test_a_turn_not_saved_within_the_bound_raises_turn_not_ready(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 1)
    outcome = _enqueued(api, memory, broker, make_snapshot(tid, 2))  # no worker: never saved
    for kw in ({"on_timeout": "raise"}, {}):  # "raise" is the default
        with pytest.raises(TurnNotReady) as caught:
            api.get_context(memory, tid, OWNER, wait_for=outcome, wait_s=SHORT_S, **kw)
        assert isinstance(caught.value, TimeoutError)
        assert str(caught.value.session_id) == outcome.session_id
        assert [e.seq for e in caught.value.context.recent] == [1]
        assert outcome.session_id not in _sessions(caught.value.context)
    # A stranger waiting on it learns nothing of it: the answer for a thread that is not there.
    for on_timeout in ("raise", "flag"):
        ctx = _at_the_bound(api, memory, tid, "mallory", outcome=outcome, on_timeout=on_timeout)
        assert ctx == _nothing(tid, outcome)
    assert stored_seqs(tid) == [1]


def test_a_turn_not_saved_within_the_bound_is_flagged(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 1)
    outcome = _enqueued(api, memory, broker, make_snapshot(tid, 2))  # no worker: never saved
    ctx = api.get_context(memory, tid, OWNER, wait_for=outcome, wait_s=SHORT_S, on_timeout="flag")
    assert ctx.missing_session_ids == [uuid.UUID(outcome.session_id or "")]
    assert [e.seq for e in ctx.recent] == [1]
    # The flag belongs to that read only.
    assert api.get_context(memory, tid, OWNER).missing_session_ids == []


def test_a_turn_already_saved_returns_at_once(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = new_thread(api, memory, 2)
    snap = make_snapshot(tid, 3)
    saved = api.save(snap, memory=memory)
    duplicate = api.save(snap, memory=memory)
    assert (saved.status, duplicate.status) == ("saved", "duplicate")
    sid = snap["session_id"]
    expected = api.get_context(memory, tid, OWNER)
    for wait in (saved, duplicate, sid, uuid.UUID(sid)):
        for on_timeout in ("raise", "flag"):
            ctx = api.get_context(
                memory, tid, OWNER, wait_for=wait, wait_s=AT_ONCE_S, on_timeout=on_timeout
            )
            assert ctx == expected and ctx.missing_session_ids == []
    assert _sessions(expected)[-1] == sid


def test_a_turn_folded_into_the_summary_counts_as_present(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n) for n in range(1, 5)]
    for snap in snaps:
        assert api.save(snap, memory=memory).status == "saved"
    with session_scope() as s:  # a fold of turns 1..2 (tests/test_memory.py does the same)
        s.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(summary="folded 1..2", summary_through_seq=2)
        )
    memory.invalidate(tid)
    for snap in snaps[:2]:
        ctx = api.get_context(
            memory, tid, OWNER, wait_for=snap["session_id"], wait_s=AT_ONCE_S, on_timeout="raise"
        )
        assert (ctx.summary, ctx.summary_through_seq) == ("folded 1..2", 2)
        assert [e.seq for e in ctx.recent] == [3, 4]
        assert snap["session_id"] not in _sessions(ctx) and ctx.missing_session_ids == []


def test_waiting_on_a_rejected_turn_ends_at_the_bound(
    api: Api, broker: str, memory: RedisConversationMemory, start_worker: Callable[..., Any]
) -> None:
    worker = start_worker(env=QUICK_STOP)
    tid = new_thread(api, memory, 1)
    # Valid input, so it is sent; the worker refuses it: the thread is not mallory's.
    outcome = _enqueued(api, memory, broker, make_snapshot(tid, 2, owner_id="mallory"))
    wait_for(lambda: "memory.finalize_rejected" in worker.log(), 60, "the rejection", worker.log)
    ctx = api.get_context(memory, tid, OWNER, wait_for=outcome, wait_s=SHORT_S, on_timeout="flag")
    assert ctx.missing_session_ids == [uuid.UUID(outcome.session_id or "")]
    assert [e.seq for e in ctx.recent] == [1]
    with pytest.raises(TurnNotReady) as caught:
        api.get_context(memory, tid, OWNER, wait_for=outcome, wait_s=SHORT_S)
    assert [e.seq for e in caught.value.context.recent] == [1]
    assert stored_seqs(tid) == [1]


def test_a_read_waits_for_the_first_turn_of_a_thread_that_does_not_exist_yet(
    api: Api, broker: str, memory: RedisConversationMemory, start_worker: Callable[..., Any]
) -> None:
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1)
    outcome = _enqueued(api, memory, broker, snap)
    with _reading(api, memory, tid, wait_for=outcome, wait_s=LONG_S) as read:
        assert not read.done()
        start_worker(env=QUICK_STOP)
        ctx = read.result()
    assert [e.seq for e in ctx.recent] == [1] and _sessions(ctx) == [snap["session_id"]]


@pytest.mark.parametrize("on_timeout", ["raise", "flag"])
def test_a_new_thread_whose_first_turn_never_lands_is_empty_at_the_bound(
    api: Api, broker: str, memory: RedisConversationMemory, on_timeout: str
) -> None:
    tid = uuid.uuid4()
    outcome = _enqueued(api, memory, broker, make_snapshot(tid, 1))  # no worker: never saved
    nothing = _nothing(tid, outcome)
    for owner in (OWNER, "mallory"):  # a stranger waiting on it gets the very same answer
        got = _at_the_bound(api, memory, tid, owner, outcome=outcome, on_timeout=on_timeout)
        assert got == nothing, owner
    # Without a wait, the thread is unknown as ever.
    with pytest.raises(ThreadNotFound):
        api.get_context(memory, tid, OWNER)


def test_a_read_with_redis_down_still_sees_the_turn_once_saved(
    api: Api,
    broker: str,
    memory: RedisConversationMemory,
    offline: RedisConversationMemory,
    start_worker: Callable[..., Any],
) -> None:
    """No Redis for the reader, so no notifications: it re-checks Postgres until the turn is
    there (the worker's Redis is up)."""
    tid = new_thread(api, memory, 1)
    snap = make_snapshot(tid, 2)
    outcome = _enqueued(api, memory, broker, snap)
    with _reading(api, offline, tid, wait_for=outcome, wait_s=LONG_S) as read:
        assert not read.done()
        start_worker(env=QUICK_STOP)
        ctx = read.result()
    assert [e.seq for e in ctx.recent] == [1, 2] and _sessions(ctx)[-1] == snap["session_id"]
    assert ctx.missing_session_ids == []


def test_without_wait_s_the_bound_is_the_memorys_setting(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    short = memory_at(settings={"memory_read_wait_s": SHORT_S})
    tid = new_thread(api, short, 1)
    outcome = _enqueued(api, short, broker, make_snapshot(tid, 2))  # no worker: never saved
    with pytest.raises(TurnNotReady) as caught:
        api.get_context(short, tid, OWNER, wait_for=outcome)
    assert [e.seq for e in caught.value.context.recent] == [1]
    ctx = api.get_context(short, tid, OWNER, wait_for=outcome, on_timeout="flag")
    assert ctx.missing_session_ids == [uuid.UUID(outcome.session_id or "")]


def test_a_waiting_read_holds_up_no_other_call_and_ends_when_the_turn_lands(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    """On the async door every call shares one event loop: a wait must leave it free."""
    tid, other = new_thread(api, memory, 1), new_thread(api, memory, 2)
    snap = make_snapshot(tid, 2)
    outcome = _enqueued(api, memory, broker, snap)  # no worker
    with _reading(api, memory, tid, wait_for=outcome, wait_s=LONG_S) as read:
        for n in (3, 4, 5):  # other calls go through meanwhile, on the same loop
            assert api.save(make_snapshot(other, n), memory=memory).seq == n
            assert [e.seq for e in api.get_context(memory, other, OWNER).recent][-1] == n
        assert not read.done()
        # The enqueued turn lands (here saved in-process, as a fallback would): the wait ends.
        assert api.save(snap, memory=memory).status == "saved"
        ctx = read.result()
    assert [e.seq for e in ctx.recent] == [1, 2] and _sessions(ctx)[-1] == snap["session_id"]
