"""One run of `agent-memory bench workers` on one broker: a Celery worker subprocess, the
threads it works on, the timed rounds of finalize and no-op jobs, and the in-process fold
arithmetic. `close` removes everything the run created.

The bench worker's shape is an option (`agent-memory bench sizing` sweeps it): pool, concurrency,
prefetch multiplier and queues. The defaults are the worker `bench workers` always ran
(prefork, -c 2, prefetch 1, both queues). A worker on `memory.finalize` alone gets threads that
fold no turn of the run (no fold job is published for a worker nobody runs); a worker on
`memory.fold` alone is timed by `FoldBench.fold_throughput` (fold_bench.py); the worker's
shape is checked by bench_worker.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import celery
import psycopg2
from sqlalchemy.engine import make_url

from memory_core.bench.bench_worker import (
    NOOP_TASK,
    bench_worker,
    check_worker_options,
    pickups_ms,
    task_times_ms,
)
from memory_core.bench.broker_adapters import open_broker, render_envelopes
from memory_core.bench.common import BASE_TIME, LOAD_TURNS, snapshot
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import QUEUES
from memory_core.io.queues import FINALIZE_QUEUE, FINALIZE_TASK, FOLD_QUEUE, FOLD_TASK
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings

MAX_THREADS, PRELOAD, TURNS_PER_THREAD = 100, 20, 20
THRESHOLD, RECENT = 20, 10  # the documented fold arithmetic, fixed for the bench
LONG_THREAD = 300
POLL_S = 0.02
# Finalize (F) and no-op (N) rounds: quarter i // 2 of the jobs runs both, alternating which first.
ROUNDS = "FNNFFNNF"
_THREAD = """INSERT INTO conversation_threads
  (id, owner_id, agent_type, title, summary, summary_through_seq, last_seq)
VALUES (%(id)s, %(owner)s, 'chat', 'bench', %(summary)s, %(through)s, %(n)s)"""


def _threads_for(jobs: int, *, folds: bool) -> int:
    """Threads the run spreads `jobs` over. On a worker that does not fold, no thread may reach
    a fold: TURNS_PER_THREAD turns each at most (ValueError past MAX_THREADS of them)."""
    if folds:
        return max(1, min(MAX_THREADS, jobs // TURNS_PER_THREAD))
    if jobs > MAX_THREADS * TURNS_PER_THREAD:
        raise ValueError(
            f"a worker on {FINALIZE_QUEUE} alone takes at most "
            f"{MAX_THREADS * TURNS_PER_THREAD} jobs (no turn of the run may fold)"
        )
    return max(1, -(-jobs // TURNS_PER_THREAD))


def _bench_memory(settings: Settings) -> RedisConversationMemory:
    """The memory of the bench's own saves: the documented fold arithmetic, a 1-hour copy."""
    return RedisConversationMemory(
        make_redis(settings.redis_url),
        settings=settings,
        ttl_hours=1,
        compression_threshold=THRESHOLD,
        max_recent_messages=RECENT,
    )


class WorkersBench:
    """The bench on one broker; `close` removes what it created, the worker included."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        broker_url: str,
        jobs: int,
        *,
        pool: str = "prefork",
        concurrency: int = 2,
        prefetch: int = 1,
        queues: str = QUEUES,
    ) -> None:
        check_worker_options(pool, concurrency, prefetch, queues)  # before anything is opened
        self.jobs, self.pool, self.concurrency, self.prefetch = jobs, pool, concurrency, prefetch
        served = set(queues.split(","))
        self.serves_finalize, self.serves_fold = FINALIZE_QUEUE in served, FOLD_QUEUE in served
        self.n_threads = _threads_for(jobs, folds=self.serves_fold)
        tag = uuid.uuid4().hex[:12]
        # Postgres first: the first thing the command's options name, and the first to fail.
        dsn = make_url(database_url).set(drivername="postgresql")
        self.pg = psycopg2.connect(dsn.render_as_string(hide_password=False))
        self.pg.autocommit = True
        self.broker = open_broker(broker_url, redis_url, tag)
        self.urls = (database_url, redis_url, self.broker.url)
        self.owner, self.stream = f"benchw-{tag}", f"memory:events:benchw:{tag}"
        self.settings = Settings(
            database_url=database_url,
            redis_url=redis_url,
            celery_broker_url="memory://",
            memory_key_prefix=f"chat_conversation:benchw:{tag}",
            langfuse_public_key=None,
            langfuse_secret_key=None,
        )
        self.memory = _bench_memory(self.settings)
        self.threads: list[uuid.UUID] = []  # every thread, for the cleanup
        self.loaded: list[uuid.UUID] = []  # the worker's threads, whose rows are counted
        # For control messages. CELERY_BROKER_URL in the environment would win over `broker=`,
        # but not over the read/write URLs.
        self.app = celery.Celery("agent-memory-bench", set_as_current=False)
        url = self.broker.url
        self.app.conf.update(broker_read_url=url, broker_write_url=url)
        # The timed rounds: (jobs, seconds to enqueue them, wall-clock time of the first push).
        self.enqueued: list[tuple[int, float, float]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="agent-memory-benchw-"))
        self.llm = FakeLLMServer().start()
        self.worker = bench_worker(
            self.tmp,
            name=f"benchw{tag[:6]}",
            env=self._worker_env(),
            pool=pool,
            concurrency=concurrency,
            prefetch=prefetch,
            queues=queues,
        )

    def _worker_env(self) -> dict[str, str]:
        database_url, redis_url, broker_url = self.urls
        env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url}
        env |= {"CELERY_BROKER_URL": broker_url, "MEMORY_EVENTS_STREAM": self.stream}
        env |= {"OPENAI_BASE_URL": self.llm.base_url, "OPENAI_API_KEY": "sk-bench"}
        env |= {"LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
        env |= {"MEMORY_KEY_PREFIX": self.settings.memory_key_prefix, "MEMORY_TTL_HOURS": "1"}
        env |= {"MEMORY_COMPRESSION_THRESHOLD": str(THRESHOLD)}
        env |= {"MEMORY_MAX_RECENT_MESSAGES": str(RECENT), "MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"}
        return env

    def _sql(self, sql: str, params: Any = None) -> Any:
        with self.pg.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone() if cur.description else None

    def stop_worker(self) -> int:
        """Stop the worker; then the jobs left on the broker (queued or unacked: none, if every
        job ran)."""
        self.worker.stop(30)
        return self.broker.left()

    def close(self) -> None:
        try:
            self.worker.stop(30)
        finally:
            self.llm.stop()
            self._sql("DELETE FROM conversation_threads WHERE owner_id = %s", [self.owner])
            # The settings fingerprint this run's key prefix left
            # (memory_core/copy/settings_check.py): another process would warn about it for two
            # hours.
            prefix = f"key_prefix={self.settings.memory_key_prefix} "
            self._sql(
                "DELETE FROM memory_settings_seen WHERE starts_with(fingerprint, %s)", [prefix]
            )
            self.pg.close()
            keys = [k for t in self.threads for k in self.memory.copy.keys(t)]
            keys += [self.stream, f"{self.stream}:dead"]
            for i in range(0, len(keys), 500):
                self.memory.redis.delete(*keys[i : i + 500])
            self.memory.redis.close()
            self.app.close()
            try:
                self.broker.close()
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)

    def versions(self) -> str:
        pg = self.pg.server_version
        rv = self.memory.redis.info("server").get("redis_version", "?")
        return (
            f"PostgreSQL {pg // 10000}.{pg % 10000}, Redis {rv}, Celery {celery.__version__}; "
            f"broker {self.broker.version()}"
        )

    def _backlog(self) -> int:
        """Jobs queued or delivered-but-unacked: exact on Redis; on RabbitMQ the ready ones, or
        when none is, the jobs the worker holds."""
        return self.broker.backlog(self._held)

    def _held(self) -> int:
        """Jobs the worker took and has not acked yet: running or prefetched (no ETAs here).
        A job is out of `active` before its ack is written (acks_late), both in the worker's
        main thread, which answers this only afterwards."""
        if not self.worker.alive():
            return 0
        inspect = self.app.control.inspect([self.worker.hostname], 5.0, limit=1)
        held = 0
        for replies in (inspect.active(), inspect.reserved()):
            if not replies:
                raise RuntimeError(f"the bench worker {self.worker.hostname} did not answer")
            held += sum(len(tasks) for tasks in replies.values())
        return held

    def _rows(self) -> int:
        """Committed turns: last_seq counts them (bumped in the turn's own transaction); by
        primary key, as a count(*) over thread_messages would cost the database more."""
        sql = "SELECT sum(last_seq) FROM conversation_threads WHERE id = ANY(%s::uuid[])"
        return int(self._sql(sql, [[str(t) for t in self.loaded]])[0])

    def _noop_total(self) -> int:
        hostname = self.worker.hostname
        stats = self.app.control.inspect([hostname], 5.0, limit=1).stats() or {}
        return int(stats.get(hostname, {}).get("total", {}).get(NOOP_TASK, 0))

    def _noops_done(self, expected: int, seen: list[float]) -> Callable[[], bool]:
        """Nothing queued or unacked (acks_late: acked after it ran) and the worker's count has
        every no-op job; seen[0] is when the check that succeeded started."""

        def done() -> bool:
            seen[0] = time.perf_counter()
            return self._backlog() == 0 and self._noop_total() >= expected

        return done

    def wait(self, pred: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Poll until pred() holds; the perf_counter time it was seen to hold."""

        def held() -> bool:
            self.worker.check()  # a worker that died fails the bench at once
            return pred()

        what += " (lost jobs? a flushed broker database?)"
        wait_for(held, timeout_s, what, lambda: self.worker.log()[-4000:], interval_s=POLL_S)
        return time.perf_counter()

    def _start_worker(self) -> None:
        if self.app.control.ping(timeout=0.5) or self._backlog():
            raise RuntimeError(
                "the bench worker needs a broker of its own (e.g. a Redis database nothing "
                f"uses, or RabbitMQ's local node): {self.broker.where} has workers or queued jobs"
            )
        self.worker.start()

    def _preload(
        self, count: int, *, phased: bool = False, folded: bool = False, turns: int = PRELOAD
    ) -> list[uuid.UUID]:
        """Threads of `turns` turns (bulk insert, warm copies). Phased: 10 + phase unfolded
        turns, phases 0..10 spreading the folds evenly; folded: every turn folded, so the next
        TURNS_PER_THREAD turns fold nothing; else none folded (PRELOAD turns: they fold on
        their next turn; PRELOAD + 1: a fold is due now)."""
        tids = [uuid.uuid4() for _ in range(count)]
        self.threads += tids
        self.loaded += tids
        for i, tid in enumerate(tids):
            through = RECENT - i % (THRESHOLD - RECENT + 1) if phased else 0
            through = turns if folded else through
            summary = "Running summary of the analysis." if through else None
            params = {"id": str(tid), "owner": self.owner, "n": turns, "through": through}
            self._sql(_THREAD, params | {"summary": summary})
            self._sql(LOAD_TURNS, params | {"base": BASE_TIME})
            self.memory.get_context(tid, self.owner)
        return tids

    def _enqueue(self, task: str, payloads: list[dict[str, Any]], *, timed: bool = False) -> float:
        """Render the messages `send_task` would write (untimed), then enqueue them in one batch
        (Redis: pipelined LPUSH; RabbitMQ: publishes, then one wait for every confirm); returns
        the time of the first push."""
        messages = self.broker.render(render_envelopes(task, payloads))
        wall, t0 = time.time(), time.perf_counter()
        self.broker.publish(messages)
        if timed:
            self.enqueued.append((len(messages), time.perf_counter() - t0, wall))
        return t0

    def _drained(self) -> bool:
        return self._backlog() == 0

    def _landed(self, want: int) -> Callable[[], bool]:
        return lambda: self._rows() >= want

    def _warm_up(self) -> tuple[list[dict[str, Any]], int]:
        """Start the worker and put a few jobs of both tasks through it. Returns the timed
        rounds' turns (round-robin over the phased threads) and the rows landed so far."""
        self._start_worker()
        # A worker on memory.finalize alone: threads whose turns of the run fold nothing.
        folded = not self.serves_fold
        tids = self._preload(self.n_threads, phased=not folded, folded=folded)
        # Each folds at once (on a worker that folds): every child warms its LLM path.
        warm = self._preload(4, folded=folded)
        n = len(tids)
        snaps = [snapshot(tids[i % n], PRELOAD + 1 + i // n, self.owner) for i in range(self.jobs)]
        warm_snaps = [snapshot(t, PRELOAD + k, self.owner) for k in (1, 2, 3) for t in warm]
        self._enqueue(NOOP_TASK, warm_snaps)
        self._enqueue(FINALIZE_TASK, warm_snaps)
        rows = PRELOAD * (n + len(warm)) + len(warm_snaps)
        self.wait(lambda: self._landed(rows)() and self._drained(), 120, "warm-up jobs")
        return snaps, rows

    def _timed_rounds(self, snaps: list[dict[str, Any]], rows: int) -> dict[str, float]:
        """Seconds per side: finalize until its rows landed ("drain": until its folds also
        drained), the no-op until the broker and the worker's count say every job ran."""
        cut = [self.jobs * q // 4 for q in range(5)]
        spent = {"finalize": 0.0, "noop": 0.0, "drain": 0.0, "cpu_F": 0.0, "cpu_N": 0.0}
        limit = 60 + self.jobs / 20
        for i, side in enumerate(ROUNDS):
            batch = snaps[cut[i // 2] : cut[i // 2 + 1]]
            cpu = self._cpu_s()
            if side == "F":
                rows += len(batch)
                t0 = self._enqueue(FINALIZE_TASK, batch, timed=True)
                t1 = self.wait(self._landed(rows), limit, "finalize rows")
                spent["drain"] += self.wait(self._drained, limit, "folds to drain") - t0
            else:
                seen = [0.0]
                done = self._noops_done(self._noop_total() + len(batch), seen)
                t0 = self._enqueue(NOOP_TASK, batch, timed=True)
                self.wait(done, limit, "no-op jobs")
                t1 = seen[0]
            spent["finalize" if side == "F" else "noop"] += t1 - t0
            spent[f"cpu_{side}"] += self._cpu_s() - cpu
        return spent

    def _cpu_s(self) -> float:
        """CPU seconds (user + system) the worker's processes used so far: the main process
        and its pool children (Linux /proc; 0 where it cannot be read)."""
        total = 0
        for pid in (self.worker.pid, *self.worker.children()):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:  # a child that just exited, or no /proc
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after the command name: state is 3rd
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        return total / os.sysconf("SC_CLK_TCK")

    def throughput(self) -> dict[str, float]:
        """Finalize vs no-op jobs/s through the worker, also timed from each round's first
        pickup, with the time inside each task from the worker's log."""
        if not self.serves_finalize:
            raise ValueError(f"finalize throughput needs a worker on {FINALIZE_QUEUE}")
        snaps, rows = self._warm_up()
        log_from, llm_from = self.worker.log_path.stat().st_size, len(self.llm.requests)
        rows_from, noops_from = self._rows(), self._noop_total()
        spent = self._timed_rounds(snaps, rows)
        with self.worker.log_path.open("rb") as f:
            f.seek(log_from)
            log = f.read().decode(errors="replace")
        times = task_times_ms(log)
        fold_ms, finalize_ms = sum(times[FOLD_TASK]), sum(times[FINALIZE_TASK])
        enqueued = sum(n for n, _, _ in self.enqueued)
        walls = [wall for _, _, wall in self.enqueued]
        pickups = pickups_ms(log, walls, self.worker.log_path)  # per round, in ROUNDS order
        idle = {"F": 0.0, "N": 0.0}  # seconds from the first push to the first pickup, per side
        for ms, side in zip(pickups, ROUNDS, strict=True):
            idle[side] += ms / 1000
        return {
            "jobs.finalized": float(self._rows() - rows_from),
            "jobs.noop_done": float(self._noop_total() - noops_from),
            "enqueue.jobs_s": enqueued / sum(s for _, s, _ in self.enqueued),
            "pickup_ms.p50": median(pickups),
            "pickup_ms.max": max(pickups),
            "finalize.jobs_s": self.jobs / spent["finalize"],
            "noop.jobs_s": self.jobs / spent["noop"],
            "finalize.ratio": spent["noop"] / spent["finalize"],
            # The same, each round timed from the worker's receipt of its first job.
            "finalize.jobs_s_from_pickup": self.jobs / (spent["finalize"] - idle["F"]),
            "noop.jobs_s_from_pickup": self.jobs / (spent["noop"] - idle["N"]),
            "finalize.ratio_from_pickup": (spent["noop"] - idle["N"])
            / (spent["finalize"] - idle["F"]),
            "finalize.jobs_s_with_folds": self.jobs / spent["drain"],
            "finalize.folds": float(len(self.llm.requests) - llm_from),
            **{f"task.{k.split('.')[-1]}_p50_ms": median(v or [0]) for k, v in times.items()},
            "task.fold_share": fold_ms / (fold_ms + finalize_ms),
            # The worker's own CPU (not Postgres's or Redis's), folds included on the F side.
            "cpu_ms.finalize_per_job": 1000 * spent["cpu_F"] / self.jobs,
            "cpu_ms.noop_per_job": 1000 * spent["cpu_N"] / self.jobs,
        }
