"""Part 2 of `agent-memory bench async`: AGENTS agents at once, each reading its context and
saving a turn on a thread of its own, ROUNDS times.

async: one task per agent on one event loop (`aget_context`, `asave_session_to_thread_safe`),
then the same with `gc.freeze()` after the untimed round (the service advice of
docs/OPERATIONS.md). sync: the same agents on a `ThreadPoolExecutor` of POOL (32) threads and
of AGENTS threads (`get_context`, `save_session_to_thread_safe`). One memory serves every agent
of a run (as one per service); the Postgres pools are the defaults (sync and async alike). Each
run has threads of its own (a summary + 40 unfolded turns, copies warm) and starts with one
untimed round, so the pools are open when the timed rounds start. A sync operation's time
starts when a pool thread runs it; the wait for a free thread shows in when the last agent was
done.

Every run records the cyclic GC's pauses (`gc.callbacks`: start to stop of each collection,
which stops every thread and the event loop) and, on the event loop, its worst lag (a task that
sleeps 5 ms at a time, late by how much).
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
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
    gc_ms: dict[int, list[float]] = field(default_factory=dict)  # generation -> pauses
    lag_ms: float | None = None  # the event loop's worst lag (async runs)

    def figures(self) -> dict[str, float]:
        pauses = [p for ps in self.gc_ms.values() for p in ps]
        f = {
            "read_p50_us": pct(self.reads, 0.50),
            "read_p99_us": pct(self.reads, 0.99),
            "save_p50_us": pct(self.saves, 0.50),
            "save_p99_us": pct(self.saves, 0.99),
            "turns_s": len(self.saves) / (self.wall_ns / 1e9),
            "last_done_s": max(self.done) / 1e9,
            "cpu_ms_per_turn": 1000 * self.cpu_s / len(self.saves),
            "gc_max_ms": max(pauses, default=0.0),
            "gc_ms_per_turn": sum(pauses) / len(self.saves),
        }
        if self.gc_ms.get(2):
            f["gc_gen2_max_ms"] = max(self.gc_ms[2])
        if self.lag_ms is not None:
            f["loop_lag_max_ms"] = self.lag_ms
        return {f"load.{self.key}.{k}": v for k, v in f.items() if v > 0}


@contextmanager
def gc_pauses(run: Load) -> Iterator[None]:
    """Record every collection's pause (ms, by generation) into `run` while the block runs."""
    started: list[int] = []

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter_ns()]
        elif started:
            pause = (time.perf_counter_ns() - started.pop()) / 1e6
            run.gc_ms.setdefault(info["generation"], []).append(pause)

    gc.callbacks.append(watch)
    try:
        yield
    finally:
        gc.callbacks.remove(watch)


async def _lag(stop: asyncio.Event, run: Load, tick_s: float = 0.005) -> None:
    """The event loop's worst lateness: a task that sleeps `tick_s` at a time."""
    worst = 0.0
    while not stop.is_set():
        t = time.perf_counter()
        await asyncio.sleep(tick_s)
        worst = max(worst, (time.perf_counter() - t - tick_s) * 1000)
    run.lag_ms = worst


async def _async_run(
    bench: AsyncBench, tids: list[uuid.UUID], rounds: int, first: int, frozen: bool = False
) -> Load:
    mem, owner = bench.memory, bench.owner
    run = (
        Load("async_frozen", "async, gc.freeze() after the warm-up round")
        if frozen
        else Load("async", "async: one task per agent on one event loop")
    )
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

    stop = asyncio.Event()
    lag = asyncio.create_task(_lag(stop, run))
    await asyncio.gather(*(agent(t) for t in tids))
    run.wall_ns = time.perf_counter_ns() - start
    stop.set()
    await lag
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
    """`workers` 0: the async run, -1 the async run with gc.freeze(); else the sync run on
    that many threads."""
    cpu = time.process_time()
    if workers <= 0:
        run = await _async_run(bench, tids, rounds, first, frozen=workers < 0)
    else:
        run = _sync_run(bench, tids, rounds, first, workers)
    run.cpu_s = time.process_time() - cpu
    return run


async def run_load(bench: AsyncBench, *, agents: int, rounds: int, pool: int) -> list[Load]:
    """The async runs (plain, then frozen after the warm-up), then the sync runs on `pool`
    and on AGENTS threads (each: an untimed round, then the timed rounds), each on threads of
    its own."""
    runs: list[Load] = []
    for workers in (0, -1, *sorted({min(pool, agents), agents})):
        tids = bench.load_threads(agents, HISTORY)
        await _one(bench, workers, tids, 1, HISTORY + 1)
        if workers < 0:  # what a service does once it is warm: the heap so far is permanent
            gc.collect()
            gc.freeze()
        try:
            probe = Load("untimed", "")
            with gc_pauses(probe):
                run = await _one(bench, workers, tids, rounds, HISTORY + 2)
            run.gc_ms = probe.gc_ms
        finally:
            gc.unfreeze()
        runs.append(run)
    return runs


def _pool(pool: Any) -> str:
    size, overflow = pool.size(), getattr(pool, "_max_overflow", "?")
    return f"{type(pool).__name__}({size} + {overflow} overflow)"


def load_report(runs: list[Load], figures: dict[str, float], pools: str = "") -> list[str]:
    """The table of part 2; adds its figures to `figures`."""
    lines = [
        "| run | read p50 ms | read p99 ms | save p50 ms | save p99 ms | turns/s "
        "| last agent done s | CPU ms/turn | longest GC pause ms | longest gen-2 pause ms "
        "| GC ms/turn | event-loop lag max ms |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for run in runs:
        f = {k.rsplit(".", 1)[1]: v for k, v in run.figures().items()}
        figures |= run.figures()
        gen2 = f"{f['gc_gen2_max_ms']:,.1f}" if "gc_gen2_max_ms" in f else "none"
        lag = f"{f['loop_lag_max_ms']:,.1f}" if "loop_lag_max_ms" in f else "-"
        lines.append(
            f"| {run.label} | {f['read_p50_us'] / 1000:,.1f} | {f['read_p99_us'] / 1000:,.1f} "
            f"| {f['save_p50_us'] / 1000:,.1f} | {f['save_p99_us'] / 1000:,.1f} "
            f"| {f['turns_s']:,.0f} | {f['last_done_s']:,.2f} | {f['cpu_ms_per_turn']:,.2f} "
            f"| {f.get('gc_max_ms', 0.0):,.1f} | {gen2} | {f.get('gc_ms_per_turn', 0.0):,.2f} "
            f"| {lag} |"
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
