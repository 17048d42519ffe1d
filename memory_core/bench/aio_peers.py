"""Part 3 of `agent-memory bench async`: the OpenAI Agents SDK's sessions (`openai-agents`,
installed only in the benchmark's own environment: `make bench-env`), on the same servers.

save: `asave_session_to_thread_safe` of one turn over 50 warm threads vs the SDK's
`SQLAlchemySession.add_items` of the same turn as two items (the user message; the assistant
message: the answer and the turn's artifacts as JSON) over 50 warm sessions, in tables of its
own in the same database. The SDK's engine is `create_async_engine(url)` as its `from_url`
makes it, with the driver its docs name (`postgresql+asyncpg`) and with ours (psycopg 3). The
SDK's session writes Postgres only; ours also updates the Redis working copy.
hit: `aget_context` (summary + 40 turns) vs `RedisSession.get_items()` of the same conversation
(the summary as a system item, then each turn's two items) on the same Redis.
"""

from __future__ import annotations

import importlib
import json
import uuid
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from memory_core import asave_session_to_thread_safe
from memory_core.bench.aio_common import Versus, check_saved, interleaved
from memory_core.bench.common import exchange, snapshot
from memory_core.bench.core import WARM_TURNS
from memory_core.copy.context import Exchange

if TYPE_CHECKING:
    from memory_core.bench.aio_bench import AsyncBench

SESSIONS = 50
DRIVERS = {"asyncpg": "asyncpg, as the SDK documents", "psycopg": "psycopg 3, our driver"}


def _items(user_query: str, turn: Exchange) -> list[dict[str, Any]]:
    """One turn as the SDK's input items."""
    artifacts = json.dumps([a.model_dump(mode="json") for a in turn.artifacts])
    return [
        {"role": "user", "content": user_query},
        {"role": "assistant", "content": f"{turn.answer}\n{artifacts}"},
    ]


class Peers:
    """The SDK's sessions; `close` drops their tables and keys and disposes their engines."""

    def __init__(self, bench: AsyncBench) -> None:
        sdk = importlib.import_module("agents.extensions.memory")
        self.sql_session, self.redis_session = sdk.SQLAlchemySession, sdk.RedisSession
        self.bench = bench
        tag = uuid.uuid4().hex[:10]
        self.tables = {"sessions_table": f"bench_sessions_{tag}"}
        self.tables["messages_table"] = f"bench_messages_{tag}"
        self.prefix = f"bench:agents:{tag}"
        self.redis = aredis.Redis.from_url(bench.settings.redis_url)
        url = make_url(bench.settings.database_url)
        self.engines: dict[str, AsyncEngine] = {
            d: create_async_engine(url.set(drivername=f"postgresql+{d}")) for d in DRIVERS
        }

    async def close(self) -> None:
        try:
            for engine in self.engines.values():
                await engine.dispose()
            keys = [k async for k in self.redis.scan_iter(match=f"{self.prefix}:*")]
            if keys:
                await self.redis.delete(*keys)
            await self.redis.aclose()
        finally:
            for table in (self.tables["messages_table"], self.tables["sessions_table"]):
                self.bench._sql(f'DROP TABLE IF EXISTS "{table}"')

    def _session(self, driver: str, i: int) -> Any:
        return self.sql_session(
            f"bench-{driver}-{i}", engine=self.engines[driver], create_tables=True, **self.tables
        )

    async def _ours(self, snap: dict[str, Any]) -> None:
        check_saved(
            await asave_session_to_thread_safe(snap, memory=self.bench.memory), "bench save"
        )

    async def save(self) -> list[Versus]:
        b = self.bench
        tids = [b._new_thread() for _ in range(SESSIONS)]
        sessions = {d: [self._session(d, i) for i in range(SESSIONS)] for d in DRIVERS}
        for n in range(1, WARM_TURNS + 1):
            for i, tid in enumerate(tids):
                snap = snapshot(tid, n, b.owner)
                await self._ours(snap)
                for d in DRIVERS:
                    await sessions[d][i].add_items(_items(snap["user_query"], exchange(snap, n)))
        b._sql(
            "UPDATE conversation_threads SET fold_due_at = 'infinity' WHERE owner_id = %(owner)s"
        )
        total = b.warmup + b.n
        turn = [WARM_TURNS + 1 + i // SESSIONS for i in range(total)]
        snaps = [snapshot(tids[i % SESSIONS], turn[i], b.owner) for i in range(total)]
        items = [_items(s["user_query"], exchange(s, turn[i])) for i, s in enumerate(snaps)]
        ours, *theirs = await interleaved(
            b.n,
            b.warmup,
            [
                lambda i: self._ours(snaps[i]),
                *(lambda i, d=d: sessions[d][i % SESSIONS].add_items(items[i]) for d in DRIVERS),
            ],
        )
        label = f"`asave_session_to_thread_safe` ({SESSIONS} warm threads; Postgres + Redis)"
        return [
            Versus(
                f"peer_save_{d}",
                label,
                f"`SQLAlchemySession.add_items`, same turn as 2 items, {how}; Postgres only",
                ours,
                t,
            )
            for (d, how), t in zip(DRIVERS.items(), theirs, strict=True)
        ]

    async def hit(self, tid: uuid.UUID) -> list[Versus]:
        b = self.bench
        ctx = await b.memory.aget_context(tid, b.owner)
        items: list[dict[str, Any]] = [{"role": "system", "content": ctx.summary or ""}]
        for turn in ctx.recent:
            items += _items(turn.user_query, turn)
        session = self.redis_session("bench-hit", redis_client=self.redis, key_prefix=self.prefix)
        await session.add_items(items)
        stored = await self.redis.lrange(f"{self.prefix}:bench-hit:messages", 0, -1)
        if len(await session.get_items()) != len(items) or len(stored) != len(items):
            raise RuntimeError("the SDK's session did not store every item")
        warm, cold, theirs = await interleaved(
            b.n,
            b.warmup,
            [
                lambda _: b.memory.aget_context(tid, b.owner),
                lambda _: b.cold.aget_context(tid, b.owner),
                lambda _: session.get_items(),
            ],
        )
        label = f"`aget_context` hit (summary + {len(ctx.recent)} turns, {b.seen_bytes:,} bytes"
        size = sum(map(len, stored))
        peer = f"`RedisSession.get_items()`, the same as {len(items)} items ({size:,} bytes)"
        return [
            Versus("peer_hit", f"{label}; parsed context reused)", peer, warm, theirs),
            Versus("peer_hit_cold", f"{label}; parsed anew each call)", peer, cold, theirs),
        ]


async def run_peers(bench: AsyncBench, hit_tid: uuid.UUID) -> list[Versus]:
    """The peer rows: save (one per SDK driver), then the hit."""
    peers = Peers(bench)
    try:
        return [*await peers.save(), *await peers.hit(hit_tid)]
    finally:
        await peers.close()
