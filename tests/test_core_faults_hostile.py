"""Faults the core model lacks: an asyncio call cancelled at any await, and a Redis that
accepts connections and never answers (SIGSTOP). Hypothesis draws the calls, where the
cancellation cuts and how long Redis hangs; the invariants are checked after every call.

Cancellation (`cut_at`: the task is cancelled at its n-th suspension, so every await that
really waits is reached, whatever the timing):
* a cut call ends in `CancelledError`, an uncut one returns: a cancellation is never swallowed
  and never turns into another error;
* Postgres holds the thread's turns as seq 1..n, no hole; a cut save either is among them or
  is saved by its retry (the next seq), and a retry of a stored one is a `duplicate`;
* the copy in Redis, which any other process would serve, is absent or holds every stored
  turn; this process's next read (asyncio and blocking) serves every stored turn;
* no connection is left checked out: the loop's Postgres pool and both Redis pools.

A Redis that never answers (the private server SIGSTOPped for a drawn time, SIGCONT always):
* no save raises, and each is `saved`; no read fails;
* each call returns within its Redis round trips' timeouts (`REDIS_CALLS` x the socket
  timeout, tried once) plus `SLACK_S` for Postgres: the bound the socket timeout
  promises (docs/OPERATIONS.md), measured against the timeout configured here;
* coverage: every read serves every stored turn (from Postgres while Redis hangs), and once
  Redis is back one call of this process drops every copy it could not update, so the copy
  holds every stored turn again.

The short run is deterministic; the long run:
`CORE_FAULTS_EXAMPLES=300 make test PYTEST_ARGS="tests/test_core_faults_hostile.py"`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memory_core import (
    RedisConversationMemory,
    ThreadNotFound,
    aclose_connections,
    aenqueue_turn,
    asave_session_to_thread_safe,
    save_session_to_thread_safe,
)
from memory_core.devservices.ports import free_port
from memory_core.io.aio import (
    get_async_engine,
    get_async_redis,
    get_async_waits_redis,
    make_async_redis,
)
from memory_core.io.redis_client import make_redis
from memory_core.settings import get_settings
from tests.support.cancel_points import cut_at
from tests.support.faults import FaultyRedis
from tests.support.snapshots import make_snapshot
from tests.support.state import stored

EXAMPLES = int(os.environ.get("CORE_FAULTS_EXAMPLES", "0")) or None
OWNER = "user-42"
# Turns stay unfolded (no fold is ever due), so every stored turn is in every answer.
MEMORY_ARGS: dict[str, Any] = {"compression_threshold": 50, "fold_token_trigger": 0}


def _settings(examples: int) -> Any:
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        derandomize=EXAMPLES is None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


# -- cancellation at every await ---------------------------------------------------------------

CALLS = ("save", "retry", "enqueue", "read", "read_wait", "expire")
CUTS = st.one_of(st.none(), st.integers(1, 12))


@dataclass
class Thread:
    memory: RedisConversationMemory
    tid: uuid.UUID = field(default_factory=uuid.uuid4)
    turns: int = 0
    last: dict[str, Any] | None = None  # the last snapshot sent (a retry resends it)
    dead_broker: str = field(default_factory=lambda: f"redis://127.0.0.1:{free_port()}/0")

    def stored(self) -> list[tuple[int, str]]:
        return stored([self.tid])[self.tid]

    def next_snapshot(self) -> dict[str, Any]:
        self.turns += 1
        self.last = make_snapshot(self.tid, self.turns)
        return self.last


def _call(thread: Thread, kind: str) -> Any:
    """The coroutine of one drawn call (None: nothing to call)."""
    memory = thread.memory
    if kind == "save":
        return asave_session_to_thread_safe(thread.next_snapshot(), memory=memory)
    if kind == "retry" and thread.last is not None:
        return asave_session_to_thread_safe(thread.last, memory=memory)
    if kind == "enqueue":  # a broker that refuses: the in-process save, from aenqueue_turn
        snap = thread.next_snapshot()
        return aenqueue_turn(snap, memory=memory, broker_url=thread.dead_broker)
    if kind == "read_wait" and thread.stored():
        last_session = thread.stored()[-1][1]
        return memory.aget_context(
            thread.tid, OWNER, wait_for=last_session, wait_s=0.5, on_timeout="flag"
        )
    if kind in ("read", "read_wait"):
        return memory.aget_context(thread.tid, OWNER)
    if kind == "expire":
        memory.invalidate(thread.tid)
    return None


async def _cut_call(thread: Thread, kind: str, cut: int | None) -> None:
    before = {sid for _, sid in thread.stored()}
    coro = _call(thread, kind)
    if coro is None:
        return
    try:
        result, seen, cancelled = await cut_at(coro, cut)
    except ThreadNotFound:
        assert not before and kind in ("read", "read_wait"), kind
        return
    reached = cut is not None and seen >= cut
    assert cancelled == reached, f"{kind} cut at {cut}: cancelled={cancelled}, {seen} awaits"
    if cancelled or kind not in ("save", "retry", "enqueue"):
        return
    assert result is not None and thread.last is not None
    resent = kind == "retry" and thread.last["session_id"] in before
    assert result.status == ("duplicate" if resent else "saved"), result


async def _check(thread: Thread) -> None:
    rows = thread.stored()
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), rows
    meta, members = thread.memory.copy.read(thread.tid)  # what any other process would serve
    if meta:
        assert [json.loads(m)["seq"] for m in members] == [seq for seq, _ in rows]
    sessions = [sid for _, sid in rows]
    for read in (thread.memory.aget_context, _blocking_read(thread.memory)):
        try:
            ctx = await read(thread.tid, OWNER)
        except ThreadNotFound:
            assert not rows
            continue
        assert [str(t.session_id) for t in ctx.recent] == sessions
    _assert_nothing_checked_out()


def _blocking_read(memory: RedisConversationMemory) -> Any:
    async def read(tid: uuid.UUID, owner: str) -> Any:
        return memory.get_context(tid, owner)

    return read


def _assert_nothing_checked_out() -> None:
    s = get_settings()
    assert get_async_engine(s.database_url).pool.checkedout() == 0  # type: ignore[attr-defined]
    for client in (get_async_redis(s.redis_url), get_async_waits_redis(s.redis_url)):
        assert isinstance(client, aredis.Redis)  # this suite runs on one server
        assert not client.connection_pool._in_use_connections


@_settings(25)
@given(calls=st.lists(st.tuples(st.sampled_from(CALLS), CUTS), min_size=1, max_size=8))
def test_a_call_cancelled_at_any_await_loses_no_turn_and_returns_every_connection(
    calls: list[tuple[str, int | None]],
) -> None:
    async def example() -> None:
        thread = Thread(RedisConversationMemory(**MEMORY_ARGS))
        try:
            for kind, cut in calls:
                await _cut_call(thread, kind, cut)
                await _check(thread)
            if thread.last is not None and thread.last["session_id"] not in dict(
                (sid, seq) for seq, sid in thread.stored()
            ):
                out = await asave_session_to_thread_safe(thread.last, memory=thread.memory)
                assert out.status == "saved" and out.seq == len(thread.stored())
                await _check(thread)
        finally:
            await aclose_connections()

    asyncio.run(example())


# -- a Redis that never answers ---------------------------------------------------------------

SOCKET_TIMEOUT_S = 0.5  # the clients' socket timeout here (production: 2 s)
# A timed-out command is not tried again (memory_core/io/redis_client.py, memory_core/io/aio.py).
TRIES = 1
REDIS_CALLS = 2  # at most two Redis round trips fail per call: drop copies behind, then its own
SLACK_S = 0.75  # Postgres round trips and scheduling on a shared 2-core machine
BOUND_S = REDIS_CALLS * TRIES * SOCKET_TIMEOUT_S + SLACK_S
STOPPED_CALLS = ("save", "asave", "read", "aread")


@contextmanager
def stopped(server: FaultyRedis, for_s: float) -> Iterator[None]:
    """`server` SIGSTOPped (it accepts connections, never answers) for `for_s` seconds."""
    assert server.proc is not None
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(for_s, os.kill, (pid, signal.SIGCONT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        os.kill(pid, signal.SIGCONT)


async def _timed_call(memory: RedisConversationMemory, tid: uuid.UUID, kind: str, n: int) -> float:
    start = time.monotonic()
    if kind in ("save", "asave"):
        snap = make_snapshot(tid, n)
        try:
            if kind == "save":
                out = save_session_to_thread_safe(snap, memory=memory)
            else:
                out = await asave_session_to_thread_safe(snap, memory=memory)
        except BaseException as exc:  # the promise is that it never raises
            pytest.fail(f"{kind} raised {type(exc).__name__}")
        assert out.status == "saved", out
    else:
        seqs = [seq for seq, _ in stored([tid])[tid]]
        try:
            if kind == "read":
                ctx = memory.get_context(tid, OWNER)
            else:
                ctx = await memory.aget_context(tid, OWNER)
        except ThreadNotFound:
            assert not seqs, "a stored thread read as unknown"
        else:
            assert [t.seq for t in ctx.recent] == seqs
    return time.monotonic() - start


@pytest.fixture(scope="module")
def hanging(faulty_redis: FaultyRedis) -> Iterator[FaultyRedis]:
    faulty_redis.up()
    yield faulty_redis
    if faulty_redis.proc is not None:
        os.kill(faulty_redis.proc.pid, signal.SIGCONT)


@_settings(6)
@given(
    before=st.integers(0, 2),
    calls=st.lists(st.sampled_from(STOPPED_CALLS), min_size=1, max_size=5),
    for_s=st.floats(0.05, 3.0),
)
@example(before=0, calls=["save"], for_s=2.0)  # the long run's find: 4 timeouts for one save
def test_a_redis_that_never_answers_costs_bounded_time_and_hides_no_turn(
    hanging: FaultyRedis, before: int, calls: list[str], for_s: float
) -> None:
    async def example() -> list[tuple[str, float]]:
        sync = make_redis(hanging.url, socket_timeout=SOCKET_TIMEOUT_S)
        aio = make_async_redis(hanging.url, socket_timeout=SOCKET_TIMEOUT_S)
        memory = RedisConversationMemory(sync, async_redis=aio, **MEMORY_ARGS)
        tid, times = uuid.uuid4(), []
        try:
            for n in range(1, before + 1):
                await _timed_call(memory, tid, "asave", n)
            with stopped(hanging, for_s):
                for i, kind in enumerate(calls):
                    n = before + i + 1
                    times.append((kind, await _timed_call(memory, tid, kind, n)))
            for kind in STOPPED_CALLS[2:]:  # back: coverage, and the copy put right
                await _timed_call(memory, tid, kind, 0)
            meta, members = memory.copy.read(tid)
            if meta:
                assert [json.loads(m)["seq"] for m in members] == list(
                    range(1, before + sum(k in ("save", "asave") for k in calls) + 1)
                )
        finally:
            await aio.aclose()
            sync.close()
            await aclose_connections()
        return times

    times = asyncio.run(example())
    slow = [(kind, round(s, 2)) for kind, s in times if s > BOUND_S]
    assert not slow, f"over {BOUND_S:.2f} s with Redis hanging: {slow}"
