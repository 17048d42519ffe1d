"""`agent-memory bench async`: the async API beside the sync one, its peers and its raw limits.

1. One call at a time, interleaved in one process on one event loop (the blocking calls run
   on the loop's thread; nothing else runs meanwhile): `aget_context` hit vs `get_context`
   hit (summary + 40 turns; the parsed context reused, and parsed anew on every call as by a
   process that has not seen this copy version), and `asave_session_to_thread_safe` vs
   `save_session_to_thread_safe` over 50 warm threads each. Raw limits, interleaved with them:
   a GET of the copy's bytes (redis.asyncio and redis-py), and each save's one SQL statement
   (as it sends it, in autocommit, as `agent-memory bench core` does) plus one EVALSHA:
   psycopg 3 AsyncConnection + redis.asyncio, and psycopg2 + redis-py.
2. `aio_load`: AGENTS concurrent agents, each reading its context and saving a turn on its own
   thread, ROUNDS times: async on one event loop vs the sync API on thread pools of POOL (32)
   and of AGENTS threads.
3. `aio_peers`: the OpenAI Agents SDK's sessions on the same Postgres and Redis (only where the
   SDK is installed: `make bench-env`).
4. `aio_ryw`: read-your-writes, from `aenqueue_turn` until `aget_context(wait_for=outcome)`
   returns the turn, through a real worker, with no backlog and with BACKLOG finalize jobs
   queued ahead.

Threads of parts 1-3 get `fold_due_at = 'infinity'` (no fold is published); part 4 runs its
own worker on a broker of its own, folds included. Logs go through a JSON renderer to
/dev/null. Everything created is removed at the end.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis
import redis.asyncio as aredis
import sqlalchemy
from sqlalchemy.engine import make_url

from memory_core import aclose_connections, asave_session_to_thread_safe
from memory_core.aio import get_async_engine
from memory_core.bench.aio_common import (
    DEFAULTS,
    PEERS_SKIPPED,
    Versus,
    all_figures,
    check_saved,
    command_line,
    cpu_line,
    interleaved,
    overheads,
    peer_sdk_version,
    versus_table,
)
from memory_core.bench.aio_ryw import ReadYourWrites, run_ryw
from memory_core.bench.common import json_logs_to_devnull, machine, snapshot
from memory_core.bench.core import KEY_PREFIX, UNFOLDED, WARM_TURNS, _Bench
from memory_core.claim import finalize_statement
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.fast_write import render
from memory_core.working_copy import _WRITE

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


async def _part1(bench: AsyncBench, hit_tid: uuid.UUID) -> tuple[list[str], dict[str, float]]:
    hit, hit_cold, get = await bench.hit(hit_tid)
    save, raw_save = await bench.asave_pair()
    rows = [hit, hit_cold, get, save, raw_save]
    lines = ["", "1. one call at a time, async vs sync (interleaved, one process)", ""]
    lines += [*versus_table(rows, other="sync"), ""]
    lines += [overheads(hit, get, save, raw_save), cpu_line(rows, "async vs sync")]
    return lines, all_figures(rows)


async def _measure(
    bench: AsyncBench, ryw: ReadYourWrites, opts: dict[str, Any]
) -> tuple[list[str], dict[str, float]]:
    """Every part in turn; the report's lines (after the header) and every figure."""
    from memory_core.bench.aio_load import load_report, pools_line, run_load
    from memory_core.bench.aio_peers import run_peers

    hit_tid = bench.load_threads(1, 60)[0]
    part1, figures = await _part1(bench, hit_tid)
    peers = await run_peers(bench, hit_tid) if peer_sdk_version() else None
    part3 = ["", "3. peers: OpenAI Agents SDK sessions, same Postgres and Redis (async)", ""]
    if peers is None:
        part3.append(PEERS_SKIPPED)
    else:
        part3 += versus_table(peers, other="peer")
        figures |= all_figures(peers)
    load = await run_load(bench, agents=opts["agents"], rounds=opts["rounds"], pool=opts["pool"])
    part2 = [
        "",
        f"2. {opts['agents']} concurrent agents, each reading its context and saving a "
        f"turn, {opts['rounds']} times",
        "",
    ]
    async_pool = get_async_engine(bench.settings.database_url).pool
    part2 += load_report(load, figures, pools_line(bench, async_pool))
    ryw_result = await run_ryw(ryw, opts["samples"])
    part4 = ["", "4. read-your-writes through a real worker", ""]
    part4 += [*versus_table(ryw_result.rows, unit="ms", other="raw limit"), ""]
    part4 += ryw_result.notes
    figures |= all_figures(ryw_result.rows)
    return part1 + part2 + part3 + part4, figures


async def _close(bench: AsyncBench, ryw: ReadYourWrites) -> None:
    try:
        await ryw.close()
    finally:
        try:
            await bench.aclose()
            await aclose_connections()
        finally:
            bench.close()


def _header(opts: dict[str, Any], wall_s: float, versions: str) -> list[str]:
    sdk = peer_sdk_version()
    clients = f"psycopg {psycopg.__version__}, redis-py {redis.__version__}, "
    clients += f"SQLAlchemy {sqlalchemy.__version__}" + (f", openai-agents {sdk}" if sdk else "")
    settings = ", ".join(f"{k}={opts[k]}" for k in DEFAULTS)
    return [
        f"$ {command_line(opts, opts.get('broker_flag'))}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {settings} · wall {wall_s:.1f} s",
        f"{machine()} · {versions}",
        clients,
    ]


async def _run(
    database_url: str, redis_url: str, broker_url: str, opts: dict[str, Any], out: Any
) -> dict[str, float]:
    started = time.perf_counter()
    with json_logs_to_devnull():  # (a memory announces its settings as it is made)
        bench = AsyncBench(database_url, redis_url, opts["iterations"])
        try:
            # The broker and worker set-up first: an unreachable broker fails at once.
            ryw = ReadYourWrites(bench.settings, broker_url, opts["backlog"])
        except BaseException:
            bench.close()
            raise
        try:
            lines, figures = await _measure(bench, ryw, opts)
            versions = bench.versions()
        finally:
            await _close(bench, ryw)
    figures["wall_s"] = time.perf_counter() - started
    for line in _header(opts, figures["wall_s"], versions) + lines:
        out(line)
    return figures


def bench_async(
    *,
    database_url: str,
    redis_url: str,
    broker_url: str,
    broker_flag: str | None = None,
    iterations: int = 2000,
    agents: int = 200,
    pool: int = 32,
    rounds: int = 5,
    samples: int = 20,
    backlog: int = 50,
    out: Callable[[str], None] = print,
) -> dict[str, float]:
    """Run the async benchmark once; print its tables and return every figure (µs, ratios).

    `broker_url`: a broker for the read-your-writes worker alone; `broker_flag` is how the
    command line named it (None: the default, database 2 of REDIS_URL's server)."""
    opts: dict[str, Any] = {"iterations": iterations, "agents": agents, "pool": pool}
    opts["rounds"] = rounds
    opts |= {"samples": samples, "backlog": backlog, "broker_flag": broker_flag}
    if min(iterations, agents, pool, rounds, samples, backlog) < 1:
        raise ValueError("iterations, agents, pool, rounds, samples and backlog must be positive")
    return asyncio.run(_run(database_url, redis_url, broker_url, opts, out))
