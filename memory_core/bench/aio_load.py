"""Part 2 of `agent-memory bench async`: AGENTS agents at once, each reading its context and
saving a turn on a thread of its own, ROUNDS times.

async: one task per agent on one event loop (`aget_context`, `asave_session_to_thread_safe`).
sync: the same agents on a `ThreadPoolExecutor` of POOL (32) threads and of AGENTS threads
(`get_context`, `save_session_to_thread_safe`). One memory serves every agent of a run (as one
per service); the Postgres pools are the defaults (sync and async alike). Each run has threads
of its own (a summary + 40 unfolded turns, copies warm) and starts with one untimed round, so
the pools are open when the timed rounds start. A sync operation's time starts when a pool
thread runs it; the wait for a free thread shows in when the last agent was done.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memory_core import asave_session_to_thread_safe, save_session_to_thread_safe
from memory_core.bench.aio_common import check_saved
from memory_core.bench.common import pct, snapshot
from memory_core.io.aio import ASYNC_REDIS_MAX_CONNECTIONS

if TYPE_CHECKING:
    from memory_core.bench.aio_bench import AsyncBench

HISTORY = 60  # turns per agent thread before the run (40 unfolded)


@dataclass
class Load:
    """One run: per-operation times and, per agent, when it was done (ns from the start)."""

    key: str
    label: str
    reads: list[int] = field(default_factory=list)
    saves: list[int] = field(default_factory=list)
    done: list[int] = field(default_factory=list)
    wall_ns: int = 0
    cpu_s: float = 0.0  # this process's CPU time (every thread) during the run

    def figures(self) -> dict[str, float]:
        f = {
            "read_p50_us": pct(self.reads, 0.50),
            "read_p99_us": pct(self.reads, 0.99),
            "save_p50_us": pct(self.saves, 0.50),
            "save_p99_us": pct(self.saves, 0.99),
            "turns_s": len(self.saves) / (self.wall_ns / 1e9),
            "last_done_s": max(self.done) / 1e9,
            "cpu_ms_per_turn": 1000 * self.cpu_s / len(self.saves),
        }
        return {f"load.{self.key}.{k}": v for k, v in f.items()}


async def _async_run(bench: AsyncBench, tids: list[uuid.UUID], rounds: int, first: int) -> Load:
    mem, owner = bench.memory, bench.owner
    run = Load("async", "async: one task per agent on one event loop")
    start = time.perf_counter_ns()

    async def agent(tid: uuid.UUID) -> None:
        for r in range(rounds):
            snap = snapshot(tid, first + r, owner)
            t0 = time.perf_counter_ns()
            await mem.aget_context(tid, owner)
            t1 = time.perf_counter_ns()
            out = await asave_session_to_thread_safe(snap, memory=mem)
            t2 = time.perf_counter_ns()
            check_saved(out, "an async agent's turn")
            run.reads.append(t1 - t0)
            run.saves.append(t2 - t1)
        run.done.append(time.perf_counter_ns() - start)

    await asyncio.gather(*(agent(t) for t in tids))
    run.wall_ns = time.perf_counter_ns() - start
    return run


def _sync_run(
    bench: AsyncBench, tids: list[uuid.UUID], rounds: int, first: int, workers: int
) -> Load:
    mem, owner = bench.memory, bench.owner
    run = Load(f"sync_{workers}", f"sync: ThreadPoolExecutor(max_workers={workers})")
    start = time.perf_counter_ns()

    def agent(tid: uuid.UUID) -> None:
        for r in range(rounds):
            snap = snapshot(tid, first + r, owner)
            t0 = time.perf_counter_ns()
            mem.get_context(tid, owner)
            t1 = time.perf_counter_ns()
            out = save_session_to_thread_safe(snap, memory=mem)
            t2 = time.perf_counter_ns()
            check_saved(out, "a sync agent's turn")
            run.reads.append(t1 - t0)  # list.append is atomic
            run.saves.append(t2 - t1)
        run.done.append(time.perf_counter_ns() - start)

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench-agent") as pool:
        for f in [pool.submit(agent, t) for t in tids]:
            f.result()
    run.wall_ns = time.perf_counter_ns() - start
    return run


async def _one(
    bench: AsyncBench, workers: int, tids: list[uuid.UUID], rounds: int, first: int
) -> Load:
    """`workers` 0: the async run; else the sync run on that many threads."""
    cpu = time.process_time()
    if workers == 0:
        run = await _async_run(bench, tids, rounds, first)
    else:
        run = _sync_run(bench, tids, rounds, first, workers)
    run.cpu_s = time.process_time() - cpu
    return run


async def run_load(bench: AsyncBench, *, agents: int, rounds: int, pool: int) -> list[Load]:
    """The async run, then the sync runs on `pool` and on AGENTS threads (each: an untimed
    round, then the timed rounds), each on threads of its own."""
    runs: list[Load] = []
    for workers in (0, *sorted({min(pool, agents), agents})):
        tids = bench.load_threads(agents, HISTORY)
        await _one(bench, workers, tids, 1, HISTORY + 1)
        runs.append(await _one(bench, workers, tids, rounds, HISTORY + 2))
    return runs


def _pool(pool: Any) -> str:
    size, overflow = pool.size(), getattr(pool, "_max_overflow", "?")
    return f"{type(pool).__name__}({size} + {overflow} overflow)"


def load_report(runs: list[Load], figures: dict[str, float], pools: str = "") -> list[str]:
    """The table of part 2; adds its figures to `figures`."""
    lines = [
        "| run | read p50 ms | read p99 ms | save p50 ms | save p99 ms | turns/s "
        "| last agent done s | CPU ms/turn |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        f = {k.rsplit(".", 1)[1]: v for k, v in run.figures().items()}
        figures |= run.figures()
        lines.append(
            f"| {run.label} | {f['read_p50_us'] / 1000:,.1f} | {f['read_p99_us'] / 1000:,.1f} "
            f"| {f['save_p50_us'] / 1000:,.1f} | {f['save_p99_us'] / 1000:,.1f} "
            f"| {f['turns_s']:,.0f} | {f['last_done_s']:,.2f} | {f['cpu_ms_per_turn']:,.2f} |"
        )
    if pools:
        lines += ["", pools]
    return lines


def pools_line(bench: AsyncBench, async_pool: Any) -> str:
    """The connection pools the runs used."""
    return (
        f"Postgres pools: sync {_pool(bench.memory.engine.pool)}, async {_pool(async_pool)}; "
        f"Redis: sync pool unbounded, async pool blocking at {ASYNC_REDIS_MAX_CONNECTIONS}. "
        "Sync operation times start when a pool thread runs "
        "the call (waiting for a free thread shows in 'last agent done'). CPU: this process's "
        "(every thread), not the servers'."
    )
