"""The asyncio API never blocks the event loop (issue 14), shown without measuring time.

Every call runs against the real Redis and PostgreSQL through pausable TCP proxies
(tests/support/tcp_proxy.py), stepped one held round trip at a time while a heartbeat task
counts ticks (tests/support/loop_watch.py): each time the call's bytes are stuck on a proxy
the heartbeat must tick 20 times with the call still pending, or the test fails. The memory's
blocking clients lead nowhere (ports where nothing listens), so an async path that fell back
on them would fail or degrade, which each test checks (outcomes, cache-read counters).

The control test shows the method can fail: the blocking `get_context`, called on the loop
with Redis held, lets the heartbeat tick exactly 0 times, and `step_through` reports it.
Then a service shaped like a FastAPI app (one memory per process, closed by its lifespan)
under 50 concurrent requests, and 200 agents on one loop: every turn stored, in order, with
the connections counted by the proxies.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine

from memory_core import (
    RedisConversationMemory,
    aenqueue_turn,
    asave_session_to_thread_safe,
)
from memory_core.devservices.ports import free_port
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.aio import make_async_engine, make_async_redis
from memory_core.io.db import make_engine
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE
from memory_core.io.redis_client import make_redis
from memory_core.io.redis_kinds import SyncRedis
from memory_core.settings import Settings
from tests.support.async_service import (
    Answer,
    check_answers,
    join_settings_checks,
    memory_service,
    read_then_save,
    reads,
    seed,
    until,
)
from tests.support.brokers import ready
from tests.support.loop_watch import Heartbeat, step_through
from tests.support.mini_http import MiniApp, post_json
from tests.support.snapshots import make_snapshot
from tests.support.state import stored, stored_seqs
from tests.support.tcp_proxy import TcpProxy

OWNER = "user-42"
# The asyncio engine's pool (memory_core/io/aio.py: pool_size 5 + max_overflow 10). The pool closes
# an overflow connection it gets back while another request may already open a new one: the
# proxy, which sees a close only when its FIN arrives, may count up to all 10 overflow ones
# twice under load (21 seen once). A connection per call would be hundreds.
PG_POOL, CLOSING_SLACK = 15, 15


@dataclass
class Proxies:
    redis: TcpProxy
    pg: TcpProxy
    settings: Settings  # the session's, with REDIS_URL and DATABASE_URL through the proxies

    @property
    def both(self) -> list[TcpProxy]:
        return [self.redis, self.pg]


@pytest.fixture
def proxies(settings: Settings) -> Iterator[Proxies]:
    with (
        TcpProxy.in_front_of(settings.redis_url) as r,
        TcpProxy.in_front_of(settings.database_url) as pg,
    ):
        urls = {"redis_url": r.url, "database_url": pg.url}
        yield Proxies(r, pg, settings.model_copy(update=urls))


@pytest.fixture
def nowhere() -> Iterator[tuple[SyncRedis, Engine]]:
    """Blocking clients for ports where nothing listens: the async paths must not use them."""
    client = make_redis(f"redis://127.0.0.1:{free_port()}/0")
    engine = make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere")
    yield client, engine
    client.close()
    engine.dispose()


def through_proxies(
    nowhere: tuple[SyncRedis, Engine], settings: Settings, **kw: Any
) -> RedisConversationMemory:
    """A memory whose asyncio clients go through the proxies of `settings` and whose blocking
    ones lead nowhere: the async paths must not use them (given blocking clients, a memory's
    asyncio side would follow them, so the asyncio clients are given too)."""
    client, engine = nowhere
    return RedisConversationMemory(
        client,
        engine=engine,
        settings=settings,
        async_redis=make_async_redis(settings.redis_url),
        async_engine=make_async_engine(settings.database_url),
        **kw,
    )


@pytest.fixture
def amemory(proxies: Proxies, nowhere: tuple[SyncRedis, Engine]) -> RedisConversationMemory:
    """A memory whose asyncio clients go through the proxies (blocking ones lead nowhere)."""
    return through_proxies(nowhere, proxies.settings)


def stepped(call: Callable[[], Any], proxies: list[TcpProxy], **kw: Any) -> Any:
    """Run `call()` on a fresh loop, stepped through `proxies` (tests/support/loop_watch.py)."""

    async def scenario() -> Any:
        async with Heartbeat() as hb:
            return await step_through(call(), proxies, hb, **kw)

    return asyncio.run(scenario())


# -- every round trip of each async call is awaited ----------------------------------------


def test_hit_waits_for_redis_without_blocking_the_loop(
    memory: RedisConversationMemory, amemory: RedisConversationMemory, proxies: Proxies
) -> None:
    tid = seed(memory, 3)
    hits, unavailable = reads("hit"), reads("unavailable")

    async def read() -> Any:
        async with amemory:
            return await amemory.aget_context(tid, OWNER)

    seen = stepped(read, proxies.both)
    assert [t.seq for t in seen.result.recent] == [1, 2, 3]
    assert seen.by_proxy.get(proxies.redis.port, 0) >= 1
    assert proxies.pg.port not in seen.by_proxy  # a hit never asks Postgres
    assert (reads("hit"), reads("unavailable")) == (hits + 1, unavailable)


def test_miss_rehydrates_from_postgres_without_blocking_the_loop(
    memory: RedisConversationMemory, amemory: RedisConversationMemory, proxies: Proxies
) -> None:
    tid = seed(memory, 2)
    memory.invalidate(tid)
    misses, unavailable = reads("miss"), reads("unavailable")

    async def read() -> Any:
        async with amemory:
            return await amemory.aget_context(tid, OWNER)

    seen = stepped(read, proxies.both)
    assert [t.seq for t in seen.result.recent] == [1, 2]
    assert seen.by_proxy.get(proxies.pg.port, 0) >= 1
    assert seen.by_proxy.get(proxies.redis.port, 0) >= 2  # the read, then the rebuilt copy
    assert (reads("miss"), reads("unavailable")) == (misses + 1, unavailable)
    hits = reads("hit")
    assert [t.seq for t in memory.get_context(tid, OWNER).recent] == [1, 2]
    assert reads("hit") == hits + 1  # the copy was rebuilt


def test_save_waits_for_postgres_without_blocking_the_loop(
    memory: RedisConversationMemory, amemory: RedisConversationMemory, proxies: Proxies
) -> None:
    tid = seed(memory, 1)
    snap = make_snapshot(tid, 2)

    async def save() -> Any:
        async with amemory:
            return await asave_session_to_thread_safe(snap, memory=amemory)

    seen = stepped(save, proxies.both)
    outcome = seen.result
    assert (outcome.status, outcome.seq, outcome.cache) == ("saved", 2, "ok"), outcome
    assert seen.by_proxy.get(proxies.pg.port, 0) >= 3  # begin+claim, insert, commit
    assert seen.by_proxy.get(proxies.redis.port, 0) >= 1
    rows = stored([tid])[tid]
    assert ([seq for seq, _ in rows], rows[-1][1]) == ([1, 2], snap["session_id"])
    assert [t.seq for t in memory.get_context(tid, OWNER).recent] == [1, 2]


def test_enqueue_waits_for_the_broker_without_blocking_the_loop(
    amemory: RedisConversationMemory, proxies: Proxies, broker: str
) -> None:
    snap = make_snapshot(uuid.uuid4(), 1)

    async def enqueue() -> Any:
        async with amemory:
            return await aenqueue_turn(
                snap, memory=amemory, broker_url=proxies.redis.rewrite(broker)
            )

    seen = stepped(enqueue, [proxies.redis])
    assert (seen.result.status, seen.result.session_id) == ("enqueued", snap["session_id"])
    assert seen.result.task_id
    assert seen.round_trips >= 1
    assert ready(broker, FINALIZE_QUEUE) == 1


def test_fold_request_publishes_off_the_loop(
    memory: RedisConversationMemory,
    proxies: Proxies,
    nowhere: tuple[SyncRedis, Engine],
    broker: str,
) -> None:
    """The save that takes a thread over the threshold publishes the fold (kombu, blocking)
    on a worker thread: the loop ticks while the broker holds the publish."""
    tid = seed(memory, 2)
    via_proxy = proxies.settings.model_copy(
        update={"celery_broker_url": proxies.redis.rewrite(broker)}
    )
    folding = through_proxies(nowhere, via_proxy, compression_threshold=2, max_recent_messages=1)

    async def save() -> Any:
        async with folding:
            return await asave_session_to_thread_safe(make_snapshot(tid, 3), memory=folding)

    seen = stepped(save, proxies.both)
    assert (seen.result.status, seen.result.seq, seen.result.fold_published) == ("saved", 3, True)
    assert ready(broker, FOLD_QUEUE) == 1


def test_read_your_writes_wait_keeps_the_loop_free(
    memory: RedisConversationMemory,
    amemory: RedisConversationMemory,
    proxies: Proxies,
    broker: str,
    start_worker: Callable[..., WorkerProcess],
) -> None:
    """The read waits for a turn no worker has saved yet; the loop ticks meanwhile, the
    worker starts (from a thread), saves it, and the read answers with it."""
    tid = seed(memory, 1)
    snap = make_snapshot(tid, 2)

    async def read_after_enqueue(hb: Heartbeat) -> Any:
        async with amemory:
            outcome = await aenqueue_turn(snap, memory=amemory, broker_url=broker)
            assert outcome.status == "enqueued", outcome
            read = asyncio.ensure_future(
                amemory.aget_context(tid, OWNER, wait_for=outcome, wait_s=120)
            )
            # No worker yet: the read must wait, and the loop tick meanwhile.
            assert await hb.until(hb.ticks + 200, while_pending=read)
            before = hb.ticks
            await asyncio.to_thread(start_worker, queues=FINALIZE_QUEUE, concurrency=1)
            ctx = await read
            return ctx, before, hb.ticks

    async def scenario() -> Any:
        async with Heartbeat() as hb:
            return await step_through(read_after_enqueue(hb), proxies.both, hb)

    seen = asyncio.run(scenario())
    ctx, before, after = seen.result
    assert [t.seq for t in ctx.recent] == [1, 2]
    assert ctx.missing_session_ids == []
    assert after > before  # ticking while the worker started and the read waited
    assert stored_seqs(tid) == [1, 2]


# -- the control: a blocking call on the loop stops the heartbeat --------------------------


def test_blocking_get_context_on_the_loop_stops_the_heartbeat(
    memory: RedisConversationMemory, proxies: Proxies
) -> None:
    tid = seed(memory, 2)
    client, engine = make_redis(proxies.redis.url), make_engine(proxies.pg.url)
    blocking = RedisConversationMemory(client, engine=engine, settings=proxies.settings)
    hits = reads("hit")

    async def scenario() -> tuple[int, Any]:
        async with Heartbeat() as hb:
            await hb.until(hb.ticks + 5)
            proxies.redis.pause()
            resumer = proxies.redis.resume_after(0.3)
            start = hb.ticks
            ctx = blocking.get_context(tid, OWNER)  # holds the loop until Redis answers
            ticks = hb.ticks - start
            await asyncio.to_thread(resumer.join)
            return ticks, ctx

    try:
        ticks, ctx = asyncio.run(scenario())
        assert ticks == 0
        assert proxies.redis.holds >= 1  # it did wait on the held Redis...
        assert reads("hit") == hits + 1  # ...and was answered by it, not by a fallback
        assert [t.seq for t in ctx.recent] == [1, 2]

        async def on_the_loop() -> Any:
            return blocking.get_context(tid, OWNER)

        with pytest.raises(AssertionError, match="blocked"):
            stepped(on_the_loop, proxies.both, guard_s=0.5)
    finally:
        client.close()
        engine.dispose()


# -- a service: one memory per process, bounded connections, all closed at shutdown -------


async def _post(app: MiniApp, snap: dict[str, Any]) -> Answer:
    status, body = await post_json(app.port, "/turn", {"snapshot": snap})
    assert status == 200, body
    tid = uuid.UUID(snap["thread_id"])
    return Answer(tid, snap["session_id"], body["seen"], body["status"], body["seq"])


def test_service_bounds_its_connections_and_closes_them_at_shutdown(proxies: Proxies) -> None:
    """50 concurrent requests (5 threads shared by 6 requests each, 20 threads of their own),
    then two more turns per shared thread, one after the other."""
    shared = [uuid.uuid4() for _ in range(5)]
    burst = [make_snapshot(t, n) for t in shared for n in range(1, 7)]
    burst += [make_snapshot(uuid.uuid4(), 1) for _ in range(20)]
    app = memory_service(proxies.settings)

    async def scenario() -> tuple[list[Answer], list[Answer], dict[str, int]]:
        async with app:
            # The blocking engine's settings fingerprint (memory_core/copy/settings_check.py) is the
            # only blocking connection; counted apart from the service's asyncio ones.
            await asyncio.to_thread(join_settings_checks)
            answers = list(await asyncio.gather(*(_post(app, s) for s in burst)))
            later: list[Answer] = []
            for n in (7, 8):
                later += await asyncio.gather(*(_post(app, make_snapshot(t, n)) for t in shared))
            assert app.errors == []
        blocking = app.state.memory.engine.pool
        left = blocking.checkedin() + blocking.checkedout()
        await until(
            lambda: (proxies.redis.open_connections, proxies.pg.open_connections) == (0, left),
            "the service's asyncio connections to close",
        )
        counts = {
            "redis_peak": proxies.redis.peak_connections,
            "pg_peak": proxies.pg.peak_connections - left,
            "redis_opened": proxies.redis.total_connections,
            "pg_opened": proxies.pg.total_connections - left,
        }
        return answers, later, counts

    try:
        answers, later, counts = asyncio.run(scenario())
    finally:
        if hasattr(app.state, "memory"):
            app.state.memory.engine.dispose()
            app.state.memory.redis.close()
    rows = stored({a.thread_id for a in answers})
    check_answers(answers + later, rows)
    assert len(answers) == 50
    for k, tid in enumerate(shared):  # the sequential turns landed in the order sent
        assert [sid for _, sid in rows[tid][6:]] == [later[k].session_id, later[5 + k].session_id]
    assert counts["pg_peak"] <= PG_POOL + CLOSING_SLACK
    assert counts["redis_peak"] <= 50  # never more than the requests in flight
    # Pooled, not one connection per call (60 requests, each reading and saving).
    assert counts["redis_opened"] <= 50
    assert counts["pg_opened"] < 30


# -- 200 agents on one loop ---------------------------------------------------------------


def test_200_async_agents_on_one_loop_lose_no_turn(
    memory: RedisConversationMemory, proxies: Proxies, nowhere: tuple[SyncRedis, Engine]
) -> None:
    """Each agent reads and saves a turn on a thread of its own, then on one of 4 shared
    threads: no lost turn, seqs 1..N per thread without gaps or duplicates."""
    shared = [seed(memory, 1) for _ in range(4)]
    own = [uuid.uuid4() for _ in range(200)]
    client, engine = nowhere

    async def agent(k: int, mem: RedisConversationMemory) -> list[Answer]:
        out = []
        for tid in (own[k], shared[k % 4]):
            snap = make_snapshot(tid, k)
            seen, outcome = await read_then_save(mem, snap)
            out.append(Answer(tid, snap["session_id"], seen, outcome.status, outcome.seq))
        return out

    async def scenario() -> list[Answer]:
        async with through_proxies(
            (client, engine), proxies.settings, compression_threshold=500
        ) as mem:
            done = await asyncio.gather(*(agent(k, mem) for k in range(200)))
        await until(
            lambda: proxies.redis.open_connections + proxies.pg.open_connections == 0,
            "aclose to close every connection",
        )
        return [a for answers in done for a in answers]

    answers = asyncio.run(scenario())
    rows = stored(own + shared)
    check_answers(answers, rows)
    assert all(len(rows[tid]) == 1 for tid in own)
    assert [len(rows[tid]) for tid in shared] == [51] * 4
    assert proxies.pg.peak_connections <= PG_POOL + CLOSING_SLACK  # whatever the load
