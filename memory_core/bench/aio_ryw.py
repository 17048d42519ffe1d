"""Part 4 of `agent-memory bench async`: read-your-writes through a real worker.

A Celery worker subprocess as `agent-memory bench workers` starts it (prefork, -c 2, prefetch
1, both memory queues, a fake LLM that answers at once for its folds) on a broker of its own.
Each sample: with the worker idle for a random 0-1 s (an idle worker waits on one queue at a
time, up to 0.5 s each, so when a job arrives matters: workers/broker.py), BACKLOG finalize
jobs (turns of 20 other threads) are pushed (or none), then the clock starts: `aenqueue_turn`
of a probe turn, then `aget_context(wait_for=outcome)` until it returns the context holding
the turn. Raw limit, interleaved with it: the same enqueue, then the turn's row polled in
Postgres every 2 ms (when the turn became readable at all, give or take a poll). Before the
next sample the broker drains (folds included).
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from sqlalchemy.engine import make_url

from memory_core import aenqueue_turn
from memory_core.bench.aio_common import Versus
from memory_core.bench.broker_adapters import without_credentials
from memory_core.bench.common import snapshot
from memory_core.bench.workers_bench import PRELOAD, WorkersBench
from memory_core.io.queues import FINALIZE_TASK
from memory_core.settings import Settings

POLL_S = 0.002
IDLE_S = 1.0  # the worker idles a random 0..IDLE_S before each sample
AHEAD_THREADS = 20
_ROW = "SELECT 1 FROM thread_messages WHERE session_id = %s"


@dataclass(frozen=True)
class Ryw:
    rows: list[Versus]
    notes: list[str]


class ReadYourWrites:
    """The worker, its threads and a Postgres connection to poll; `close` removes them all."""

    def __init__(self, settings: Settings, broker_url: str, backlog: int) -> None:
        self.wb = WorkersBench(settings.database_url, settings.redis_url, broker_url, 4)
        self.backlog = backlog
        self.wait_s = 60 + backlog / 5
        self.turns: dict[uuid.UUID, int] = {}
        self.apg: psycopg.AsyncConnection[Any] | None = None
        self.rng = random.Random(14)  # noqa: S311  (idle times, the same every run)

    async def start(self) -> None:
        wb = self.wb
        wb._start_worker()
        self.ahead = wb._preload(min(AHEAD_THREADS, self.backlog), phased=True)
        self.probe = wb._preload(1, phased=True)[0]
        self.turns = {t: PRELOAD + 1 for t in [*self.ahead, self.probe]}
        dsn = make_url(wb.settings.database_url).set(drivername="postgresql")
        self.apg = await psycopg.AsyncConnection.connect(
            dsn.render_as_string(hide_password=False), autocommit=True
        )
        wb._enqueue(FINALIZE_TASK, self._next(self.ahead, len(self.ahead)))  # warm the worker
        self._drain()
        for api in (True, False):
            await self._sample(0, api=api)

    async def close(self) -> None:
        try:
            await self.wb.memory.aclose()
            if self.apg is not None:
                await self.apg.close()
        finally:
            self.wb.close()

    def _next(self, tids: list[uuid.UUID], count: int) -> list[dict[str, Any]]:
        """The next `count` turns, round-robin over `tids`."""
        snaps = []
        for i in range(count):
            tid = tids[i % len(tids)]
            snaps.append(snapshot(tid, self.turns[tid], self.wb.owner))
            self.turns[tid] += 1
        return snaps

    def _drain(self) -> None:
        self.wb.wait(self.wb._drained, self.wait_s, "the bench worker to drain its queues")

    async def _landed(self, session_id: str) -> bool:
        assert self.apg is not None  # noqa: S101  (opened by `start`)
        deadline = time.monotonic() + self.wait_s
        async with self.apg.cursor() as cur:
            while time.monotonic() < deadline:
                await cur.execute(_ROW, [session_id])
                if await cur.fetchone() is not None:
                    return True
                await asyncio.sleep(POLL_S)
        return False

    async def _sample(self, backlog: int, *, api: bool) -> int:
        """ns from `aenqueue_turn` until the turn is readable (api: through `aget_context`)."""
        wb = self.wb
        await asyncio.sleep(self.rng.uniform(0, IDLE_S))
        if backlog:
            wb._enqueue(FINALIZE_TASK, self._next(self.ahead, backlog))
        snap = self._next([self.probe], 1)[0]
        t0 = time.perf_counter_ns()
        out = await aenqueue_turn(snap, memory=wb.memory, broker_url=wb.broker.url)
        if out.status != "enqueued":
            raise RuntimeError(f"the probe turn was not enqueued: {out}")
        if api:
            ctx = await wb.memory.aget_context(
                self.probe, wb.owner, wait_for=out, wait_s=self.wait_s
            )
            found = any(str(t.session_id) == snap["session_id"] for t in ctx.recent)
        else:
            found = await self._landed(snap["session_id"])
        elapsed = time.perf_counter_ns() - t0
        if not found:
            raise RuntimeError("the probe turn did not become readable")
        self._drain()
        return elapsed

    async def run(self, samples: int) -> list[Versus]:
        """`samples` of each of the four cases, their order rotating every sample."""
        cases = [(0, True), (0, False), (self.backlog, True), (self.backlog, False)]
        times: dict[tuple[int, bool], list[int]] = {c: [] for c in cases}
        for s in range(samples):
            for j in range(len(cases)):
                backlog, api = cases[(s + j) % len(cases)]
                times[backlog, api].append(await self._sample(backlog, api=api))
        label = "`aenqueue_turn` until `aget_context(wait_for=outcome)` returns the turn"
        raw = f"the same enqueue, then its row polled in Postgres every {POLL_S * 1000:g} ms"
        n = self.backlog
        return [
            Versus("ryw_idle", f"{label}; queue empty", raw, times[0, True], times[0, False]),
            Versus(
                "ryw_backlog",
                f"{label}; {n} finalize jobs queued ahead",
                raw,
                times[n, True],
                times[n, False],
            ),
        ]

    def notes(self, samples: int) -> list[str]:
        wb = self.wb
        return [
            f"{samples} samples per row; backlog turns go to {len(self.ahead)} other threads; "
            f"the broker drains (folds included) and the worker idles a random 0-{IDLE_S:g} s "
            "before each sample (an idle worker waits on memory.finalize, its first queue, "
            "and sees a finalize at once: workers/broker.py)",
            f"worker: {wb.worker.command}",
            f"broker: {without_credentials(wb.broker.where)}, {wb.broker.version()}; "
            "folds call a local fake OpenAI-compatible LLM that answers at once",
        ]


async def run_ryw(ryw: ReadYourWrites, samples: int) -> Ryw:
    """Start the worker, take the samples, stop it (`ryw.close` removes the rest)."""
    await ryw.start()
    rows = await ryw.run(samples)
    ryw.wb.worker.stop(30)
    return Ryw(rows, ryw.notes(samples))
