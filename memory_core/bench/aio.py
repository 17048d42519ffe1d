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
import sqlalchemy

from memory_core import aclose_connections
from memory_core.bench.aio_bench import AsyncBench
from memory_core.bench.aio_common import (
    DEFAULTS,
    PEERS_SKIPPED,
    all_figures,
    command_line,
    cpu_line,
    overheads,
    peer_sdk_version,
    versus_table,
)
from memory_core.bench.aio_load import load_report, pools_line, run_load
from memory_core.bench.aio_peers import run_peers
from memory_core.bench.aio_ryw import ReadYourWrites, run_ryw
from memory_core.bench.common import json_logs_to_devnull, machine
from memory_core.io.aio import get_async_engine


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
