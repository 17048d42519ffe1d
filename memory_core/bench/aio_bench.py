"""`AsyncBench`: the fixtures and single measurements of `agent-memory bench async` (aio.py).

The threads it warms, the calls it times one at a time (a hit, a save, their raw limits), and
the clean-up; aio_load.py and aio_peers.py drive it too.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import redis.asyncio as aredis
from sqlalchemy.engine import make_url

from memory_core import asave_session_to_thread_safe
from memory_core.bench.aio_common import (
    Versus,
    check_saved,
    interleaved,
)
from memory_core.bench.common import snapshot
from memory_core.bench.core import KEY_PREFIX, UNFOLDED, WARM_TURNS, _Bench
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.working_copy import _WRITE
from memory_core.io.aio import get_async_engine
from memory_core.io.fast_write import render
from memory_core.write.claim import finalize_statement

THREADS = 50


class AsyncBench(_Bench):
    """`agent-memory bench core`'s set-up (owner, memory, raw clients, captured SQL), plus the
    asyncio raw clients; `aclose` closes those, `close` removes every row and key."""

    def __init__(self, database_url: str, redis_url: str, iterations: int) -> None:
        super().__init__(database_url, redis_url, iterations)
        self.aplain = aredis.Redis.from_url(redis_url)
        self.apg: psycopg.AsyncConnection[Any] | None = None
        self.seen_bytes = 0
        # A process that has not parsed the copy yet (another replica): parses every hit.
        self.cold = RedisConversationMemory(
            self.memory.redis,
            settings=self.settings,
            engine=self.memory.engine,
            key_prefix=KEY_PREFIX,
            ttl_hours=1,
            local_cache_size=0,
        )

    def dsn(self) -> str:
        url = make_url(self.settings.database_url).set(drivername="postgresql")
        return url.render_as_string(hide_password=False)

    async def aclose(self) -> None:
        try:
            await self.memory.aclose()
            await self.aplain.aclose()
        finally:
            if self.apg is not None:
                await self.apg.close()

    def load_threads(self, count: int, turns: int) -> list[uuid.UUID]:
        """Threads of a summary and `turns` turns (40 unfolded), never folded, copies warm."""
        tids = [self._load_thread(turns) for _ in range(count)]
        for tid in tids:
            self.memory.get_context(tid, self.owner)
        return tids

    # -- hit -----------------------------------------------------------------------------

    async def hit(self, tid: uuid.UUID) -> list[Versus]:
        """Hits on a full copy, parsed context reused and parsed anew, beside a GET of its
        bytes: async and sync interleaved."""
        mem, cold, owner = self.memory, self.cold, self.owner
        ctx = await mem.aget_context(tid, owner)
        meta, members = mem.copy.read(tid)
        if not meta or len(ctx.recent) != UNFOLDED or await cold.aget_context(tid, owner) != ctx:
            raise RuntimeError("the hit bench needs a full working copy")
        payload = b"".join([*(k + v for k, v in meta.items()), *members])
        self.seen_bytes = len(payload)
        self.plain.set(self.scratch, payload, px=3_600_000)
        cpu: list[int] = []
        a, s, araw, sraw = await interleaved(
            self.n,
            self.warmup,
            [
                lambda _: mem.aget_context(tid, owner),
                lambda _: mem.get_context(tid, owner),
                lambda _: self.aplain.get(self.scratch),
                lambda _: self.plain.get(self.scratch),
            ],
            cpu,
        )
        cold_cpu: list[int] = []
        acold, scold = await interleaved(
            self.n,
            self.warmup,
            [lambda _: cold.aget_context(tid, owner), lambda _: cold.get_context(tid, owner)],
            cold_cpu,
        )
        label = f"`aget_context` hit (summary + {UNFOLDED} turns"
        get = f"redis.asyncio GET of the same {len(payload):,} bytes (raw limit)"
        return [
            Versus(
                "hit",
                f"{label}; parsed context reused)",
                "`get_context` hit, sync",
                a,
                s,
                (cpu[0], cpu[1]),
            ),
            Versus(
                "hit_cold",
                f"{label}; parsed anew each call)",
                "the same, sync",
                acold,
                scold,
                (cold_cpu[0], cold_cpu[1]),
            ),
            Versus(
                "get", get, "redis-py GET of the same bytes, sync", araw, sraw, (cpu[2], cpu[3])
            ),
        ]

    # -- save ----------------------------------------------------------------------------

    async def _araw_save(self, job: tuple[Any, ...]) -> None:
        """The raw save on psycopg 3's AsyncConnection and redis.asyncio."""
        seq, params, (meta, turns, gone), args = job
        assert self.apg is not None  # noqa: S101  (opened by `warm_save_threads`)
        async with self.apg.cursor() as cur:  # autocommit: one statement, as the product's
            await cur.execute(self.asave_sql, params)
            row = await cur.fetchone()
            if row is None or row[0] != seq:
                raise RuntimeError("raw async save: unexpected seq")
        await self.aplain.evalsha(self.sha, 3, meta, turns, gone, *args)

    async def _asave(self, snap: dict[str, Any]) -> None:
        out = await asave_session_to_thread_safe(snap, memory=self.memory)
        check_saved(out, "bench async save")
        if out.cache != "ok":
            raise RuntimeError(f"bench async save did not take the fast path: {out}")

    async def _capture_async_sql(self, first: dict[str, Any]) -> None:
        """Run one async save and keep the statement it sends as it sends it (psycopg's dialect
        adds casts to every bound parameter); the parameters are the same as the sync one's."""
        await self._asave(first)
        dialect = get_async_engine(self.settings.database_url).sync_engine.dialect
        self.asave_sql = render(finalize_statement(), dialect).sql
        if not self.asave_sql.startswith("WITH claim AS"):
            raise RuntimeError("async save did not render the expected SQL")

    async def warm_save_threads(self) -> dict[str, list[uuid.UUID]]:
        """50 threads per side, a few turns each (all four sides' clients warm), then no fold."""
        sides = {k: [self._new_thread() for _ in range(THREADS)] for k in ("a", "s", "ar", "sr")}
        self._capture_save_sql(snapshot(sides["s"][0], 1, self.owner))
        await self._capture_async_sql(snapshot(sides["a"][0], 1, self.owner))
        self.sha = self.plain.script_load(_WRITE)
        self.raw_seqs: dict[uuid.UUID, int] = {}
        self.cur = self.pg.cursor()
        self.apg = await psycopg.AsyncConnection.connect(self.dsn(), autocommit=True)
        for n in range(1, WARM_TURNS + 1):
            for i in range(THREADS):
                if (i, n) != (0, 1):  # (the captured saves)
                    await self._asave(snapshot(sides["a"][i], n, self.owner))
                    self._core_save(snapshot(sides["s"][i], n, self.owner))
                await self._araw_save(self._raw_job(sides["ar"][i], n))
                self._raw_save(self._raw_job(sides["sr"][i], n))
        self._sql(
            "UPDATE conversation_threads SET fold_due_at = 'infinity' WHERE owner_id = %(owner)s"
        )
        return sides

    async def asave_pair(self) -> tuple[Versus, Versus]:
        sides = await self.warm_save_threads()
        total = self.warmup + self.n
        turn = [WARM_TURNS + 1 + i // THREADS for i in range(total)]
        jobs = {
            k: [snapshot(tids[i % THREADS], turn[i], self.owner) for i in range(total)]
            for k, tids in sides.items()
            if k in ("a", "s")
        }
        raw = {
            k: [self._raw_job(sides[k][i % THREADS], turn[i]) for i in range(total)]
            for k in ("ar", "sr")
        }
        cpu: list[int] = []
        a, s, araw, sraw = await interleaved(
            self.n,
            self.warmup,
            [
                lambda i: self._asave(jobs["a"][i]),
                lambda i: self._core_save(jobs["s"][i]),
                lambda i: self._araw_save(raw["ar"][i]),
                lambda i: self._raw_save(raw["sr"][i]),
            ],
            cpu,
        )
        self.cur.close()
        label = f"`asave_session_to_thread_safe` ({THREADS} warm threads)"
        rawl = "its 1 SQL statement (autocommit) + 1 EVALSHA: psycopg 3 async + redis.asyncio"
        return (
            Versus("save", label, "`save_session_to_thread_safe`, sync", a, s, (cpu[0], cpu[1])),
            Versus(
                "raw_save",
                f"{rawl} (raw limit)",
                "the sync save's via psycopg2 + redis-py",
                araw,
                sraw,
                (cpu[2], cpu[3]),
            ),
        )
