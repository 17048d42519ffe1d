"""`agent-memory bench workers`: worker throughput and fold arithmetic beside their raw limits.

1. finalize jobs/s through a real Celery worker subprocess (prefork, -c 2,
   prefetch 1, both memory queues) vs `memory.bench_noop` with the same payloads on the same
   worker and queue. Jobs go round-robin over up to 100 threads preloaded with 20 turns at 11
   fold phases (folds at the steady-state rate, one per ~11 turns, against a local fake LLM that
   answers at once). Messages are rendered by Celery beforehand and enqueued by pipelined LPUSH.
   Finalize is timed from the first enqueue to the last row in Postgres; the no-op until the
   broker holds nothing queued or unacked (acks_late) and the worker's `stats()` count has every
   job. Quarters run F N N F F N N F; folds drain between rounds.
2. LLM calls for a 100-turn thread, in-process (core, Folder, ConversationSummarizer, fake LLM).
3. Tokens of the messages sent to the LLM at the fold nearest turn 30 vs nearest turn 300.

The worker needs a broker database of its own; everything created is removed at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any
from unittest.mock import patch

import celery
import psycopg2
import redis
from kombu.transport.memory import Channel as MemoryChannel
from sqlalchemy.engine import make_url

from memory_core.bench.common import (
    BASE_TIME,
    LOAD_TURNS,
    json_logs_to_devnull,
    machine,
    snapshot,
)
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.fold_publisher import (
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    FOLD_QUEUE,
    FOLD_TASK,
)
from memory_core.folding import Folder
from memory_core.redis_client import make_redis
from memory_core.session_handler import save_session_to_thread_safe
from memory_core.settings import Settings
from memory_core.summarizer import ConversationSummarizer
from memory_core.tokens import count_tokens

COMMAND = "agent-memory bench workers"
NOOP_TASK = "memory.bench_noop"
MAX_THREADS, PRELOAD, TURNS_PER_THREAD = 100, 20, 20
THRESHOLD, RECENT = 20, 10  # the documented fold arithmetic, fixed for the bench
LONG_THREAD, EARLY, LATE, LANGCHAIN_CALLS = 300, 30, 300, 80
POLL_S = 0.02
_THREAD = """INSERT INTO conversation_threads
  (id, owner_id, agent_type, title, summary, summary_through_seq, last_seq)
VALUES (%(id)s, %(owner)s, 'chat', 'bench', %(summary)s, %(through)s, %(n)s)"""
_SUCCEEDED = re.compile(r"Task (\S+)\[[^\]]+\] succeeded in ([0-9.e-]+)s")


class _WorkersBench:
    def __init__(self, database_url: str, redis_url: str, broker_url: str, jobs: int) -> None:
        self.urls, self.jobs = (database_url, redis_url, broker_url), jobs
        self.n_threads = max(1, min(MAX_THREADS, jobs // TURNS_PER_THREAD))
        tag = uuid.uuid4().hex[:12]
        self.owner, self.stream = f"benchw-{tag}", f"memory:events:benchw:{tag}"
        self.settings = Settings(
            database_url=database_url,
            redis_url=redis_url,
            celery_broker_url="memory://",
            memory_key_prefix=f"chat_conversation:benchw:{tag}",
            langfuse_public_key=None,
            langfuse_secret_key=None,
        )
        self.memory = RedisConversationMemory(
            make_redis(redis_url),
            settings=self.settings,
            ttl_hours=1,
            compression_threshold=THRESHOLD,
            max_recent_messages=RECENT,
        )
        self.threads: list[uuid.UUID] = []  # every thread, for the cleanup
        self.loaded: list[uuid.UUID] = []  # the worker's threads, whose rows are counted
        dsn = make_url(self.settings.database_url).set(drivername="postgresql")
        self.pg = psycopg2.connect(dsn.render_as_string(hide_password=False))
        self.pg.autocommit = True
        self.broker = redis.Redis.from_url(broker_url)
        # For control messages. CELERY_BROKER_URL in the environment would win over `broker=`,
        # but not over the read/write URLs.
        self.app = celery.Celery("agent-memory-bench", set_as_current=False)
        self.app.conf.update(broker_read_url=broker_url, broker_write_url=broker_url)
        self.tmp = Path(tempfile.mkdtemp(prefix="agent-memory-benchw-"))
        self.llm = FakeLLMServer().start()
        self.worker = WorkerProcess(
            self.tmp,
            name=f"benchw{tag[:6]}",
            extra_args=["-I", "memory_core.bench.tasks"],
            env=self._worker_env(),
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

    def close(self) -> None:
        try:
            self.worker.stop(30)
        finally:
            self.llm.stop()
            self._sql("DELETE FROM conversation_threads WHERE owner_id = %s", [self.owner])
            self.pg.close()
            keys = [k for t in self.threads for k in self.memory.copy.keys(t)]
            keys += [self.stream, f"{self.stream}:dead"]
            for i in range(0, len(keys), 500):
                self.memory.redis.delete(*keys[i : i + 500])
            self.memory.redis.close()
            self.broker.close()
            self.app.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def versions(self) -> str:
        pg = self.pg.server_version
        rv = self.memory.redis.info("server").get("redis_version", "?")
        return f"PostgreSQL {pg // 10000}.{pg % 10000}, Redis {rv}, Celery {celery.__version__}"

    def fold_arithmetic(self) -> tuple[int, dict[int, int]]:
        """In-process: LLM calls after 100 turns, and each fold's prompt tokens by its turn.

        Fold requests go to an in-memory broker and the fold runs inline. (The publisher is a
        Celery app: CELERY_BROKER_URL in the environment wins over its broker argument.)
        """
        update = {"openai_base_url": self.llm.base_url, "openai_api_key": "sk-bench"}
        summarizer = ConversationSummarizer(self.settings.model_copy(update=update))
        folder, requests = Folder(self.memory, summarizer), self.llm.requests
        tid, calls_100, folds = uuid.uuid4(), 0, dict[int, int]()
        self.threads.append(tid)
        for n in range(1, LONG_THREAD + 1):
            with patch.dict(os.environ, CELERY_BROKER_URL="memory://"):
                out = save_session_to_thread_safe(snapshot(tid, n, self.owner), memory=self.memory)
            if out.status != "saved":
                raise RuntimeError(f"in-process save of turn {n} failed: {out}")
            if out.fold_published:
                before = len(requests)
                if (fold := folder.fold(tid)).status != "folded":
                    raise RuntimeError(f"fold at turn {n} did not fold: {fold}")
                messages = [m for body in requests[before:] for m in body["messages"]]
                folds[n] = sum(count_tokens(str(m.get("content") or "")) for m in messages)
            calls_100 = len(requests) if n == 100 else calls_100
        return calls_100, folds

    def _backlog(self) -> int:
        """Messages queued or delivered-but-unacked on the broker (kombu's Redis layout)."""
        pipe = self.broker.pipeline(transaction=False)
        for q in (FINALIZE_QUEUE, FOLD_QUEUE):
            for key in (q, *(f"{q}\x06\x16{p}" for p in (3, 6, 9))):  # kombu priority lists
                pipe.llen(key)
        pipe.hlen("unacked")
        return int(sum(pipe.execute()))

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
                "the bench worker needs a broker of its own (e.g. a throwaway `redis-server "
                "--port 6391`): this one has workers or queued jobs"
            )
        self.worker.start()

    def _preload(self, count: int, *, phased: bool) -> list[uuid.UUID]:
        """Threads of PRELOAD turns (bulk insert, warm copies) with 10 + phase unfolded turns:
        phases 0..10 spread the folds evenly; unphased threads fold on their next turn."""
        tids = [uuid.uuid4() for _ in range(count)]
        self.threads += tids
        self.loaded += tids
        for i, tid in enumerate(tids):
            through = RECENT - i % (THRESHOLD - RECENT + 1) if phased else 0
            summary = "Running summary of the analysis." if through else None
            params = {"id": str(tid), "owner": self.owner, "n": PRELOAD, "through": through}
            self._sql(_THREAD, params | {"summary": summary})
            self._sql(LOAD_TURNS, params | {"base": BASE_TIME})
            self.memory.get_context(tid, self.owner)
        return tids

    def _enqueue(self, task: str, payloads: list[dict[str, Any]]) -> float:
        """Render the messages `send_task` would write (kombu's memory transport, untimed), then
        enqueue them with pipelined LPUSH; returns the time of the first push."""
        app = celery.Celery("agent-memory-bench", set_as_current=False)
        with app.connection_for_write("memory://") as conn:  # explicit: CELERY_BROKER_URL wins
            producer = app.amqp.Producer(conn)
            for payload in payloads:
                app.send_task(task, args=[payload], queue=FINALIZE_QUEUE, producer=producer)
            box = MemoryChannel.queues[FINALIZE_QUEUE]
            messages = [json.dumps(box.get_nowait()).encode() for _ in payloads]
        t0, pipe = time.perf_counter(), self.broker.pipeline(transaction=False)
        for i in range(0, len(messages), 100):
            pipe.lpush(FINALIZE_QUEUE, *messages[i : i + 100])  # BRPOP: first in, first out
        pipe.execute()
        return t0

    def throughput(self) -> dict[str, float]:
        self._start_worker()
        tids = self._preload(self.n_threads, phased=True)
        warm = self._preload(4, phased=False)  # each folds at once: every child warms its LLM path
        n = len(tids)
        snaps = [snapshot(tids[i % n], PRELOAD + 1 + i // n, self.owner) for i in range(self.jobs)]
        warm_snaps = [snapshot(t, PRELOAD + k, self.owner) for k in (1, 2, 3) for t in warm]
        self._enqueue(NOOP_TASK, warm_snaps)
        self._enqueue(FINALIZE_TASK, warm_snaps)
        rows = PRELOAD * (n + len(warm)) + len(warm_snaps)

        def drained() -> bool:
            return self._backlog() == 0

        def landed(want: int) -> Callable[[], bool]:
            return lambda: self._rows() >= want

        self.wait(lambda: landed(rows)() and drained(), 120, "warm-up jobs")
        log_from, llm_from = self.worker.log_path.stat().st_size, len(self.llm.requests)
        cut = [self.jobs * q // 4 for q in range(5)]
        spent = {"finalize": 0.0, "noop": 0.0, "drain": 0.0}
        limit = 60 + self.jobs / 20
        for i, side in enumerate("FNNFFNNF"):  # quarter i // 2, alternating which side first
            batch = snaps[cut[i // 2] : cut[i // 2 + 1]]
            if side == "F":
                rows += len(batch)
                t0 = self._enqueue(FINALIZE_TASK, batch)
                t1 = self.wait(landed(rows), limit, "finalize rows")
                spent["drain"] += self.wait(drained, limit, "folds to drain") - t0
            else:
                seen = [0.0]
                done = self._noops_done(self._noop_total() + len(batch), seen)
                t0 = self._enqueue(NOOP_TASK, batch)
                self.wait(done, limit, "no-op jobs")
                t1 = seen[0]
            spent["finalize" if side == "F" else "noop"] += t1 - t0
        times: dict[str, list[float]] = {FINALIZE_TASK: [], FOLD_TASK: [], NOOP_TASK: []}
        with self.worker.log_path.open("rb") as f:
            f.seek(log_from)
            for m in _SUCCEEDED.finditer(f.read().decode(errors="replace")):
                times.setdefault(m.group(1), []).append(1000 * float(m.group(2)))
        fold_ms, finalize_ms = sum(times[FOLD_TASK]), sum(times[FINALIZE_TASK])
        return {
            "finalize.jobs_s": self.jobs / spent["finalize"],
            "noop.jobs_s": self.jobs / spent["noop"],
            "finalize.ratio": spent["noop"] / spent["finalize"],
            "finalize.jobs_s_with_folds": self.jobs / spent["drain"],
            "finalize.folds": float(len(self.llm.requests) - llm_from),
            **{f"task.{k.split('.')[-1]}_p50_ms": median(v or [0]) for k, v in times.items()},
            "task.fold_share": fold_ms / (fold_ms + finalize_ms),
        }


def bench_workers(
    *,
    database_url: str,
    redis_url: str,
    broker_url: str,
    jobs: int = 2000,
    out: Callable[[str], None] = print,
) -> dict[str, float]:
    """Run the worker benchmark once; print the table and return every figure."""
    if jobs < 4:
        raise ValueError("jobs must be at least 4")
    started = time.perf_counter()
    bench = _WorkersBench(database_url, redis_url, broker_url, jobs)
    try:
        with json_logs_to_devnull():
            calls, folds = bench.fold_arithmetic()
            r = bench.throughput()
        versions, worker_command = bench.versions(), bench.worker.command
    finally:
        bench.close()
    early = min(folds, key=lambda t: (abs(t - EARLY), t))
    late = min(folds, key=lambda t: (abs(t - LATE), t))
    r |= {
        "llm_calls_100_turns": float(calls),
        "prompt.tokens_early": float(folds[early]),
        "prompt.tokens_late": float(folds[late]),
        "prompt.ratio": folds[late] / folds[early],
        "wall_s": time.perf_counter() - started,
    }
    for line in _report(
        r,
        folds=folds,
        calls=calls,
        jobs=jobs,
        broker_url=broker_url,
        n_threads=bench.n_threads,
        header=f"{machine()} · {versions}",
        worker_command=worker_command,
    ):
        out(line)
    return r


def _report(
    r: dict[str, float],
    *,
    folds: dict[int, int],
    calls: int,
    jobs: int,
    broker_url: str,
    n_threads: int,
    header: str,
    worker_command: str,
) -> list[str]:
    """The table `agent-memory bench workers` prints, verdicts included."""
    early = min(folds, key=lambda t: (abs(t - EARLY), t))
    late = min(folds, key=lambda t: (abs(t - LATE), t))
    fold_turns = ", ".join(str(t) for t in sorted(folds) if t <= 100)
    fin, prm = r["finalize.ratio"], r["prompt.ratio"]
    flag = "" if jobs == 2000 else f" --jobs {jobs}"
    flag += f" --broker-url {re.sub(r'//[^/@]*@', '//', broker_url)}"  # without credentials
    lines = [
        f"$ {COMMAND}{flag}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · jobs={jobs} over {n_threads} threads "
        f"· wall {r['wall_s']:.1f} s",
        header,
        f"worker: {worker_command}; folds call a local fake OpenAI-compatible LLM that "
        "answers at once",
        "",
        "| figure | value | raw limit / reference (same run) | value | ratio | goal | verdict |",
        "|---|--:|---|--:|--:|---|---|",
        f"| finalize jobs through the worker ({r['finalize.folds']:.0f} folds ran) "
        f"| {r['finalize.jobs_s']:,.0f}/s | `{NOOP_TASK}`: same payloads, worker and queue "
        f"| {r['noop.jobs_s']:,.0f}/s | {fin:.2f}x | >= 0.60x "
        f"| {'PASS' if fin >= 0.6 else 'MISS'} |",
        f"| LLM calls for a 100-turn thread (folds at turns {fold_turns}) | {calls} "
        f"| LangChain ConversationSummaryBufferMemory (reference, not run) | {LANGCHAIN_CALLS} "
        f"| {calls / LANGCHAIN_CALLS:.2f}x | 8 | {'PASS' if calls == 8 else 'MISS'} |",
        f"| fold prompt tokens, fold at turn {late} | {folds[late]:,} | the same thread's fold "
        f"at turn {early} | {folds[early]:,} | {prm:.2f}x | flat (<= 1.10x) "
        f"| {'PASS' if prm <= 1.1 else 'MISS'} |",
        "",
        f"finalize until the fold backlog also drained: {r['finalize.jobs_s_with_folds']:,.0f}/s",
        f"time inside the task (worker log, p50): finalize {r['task.finalize_turn_p50_ms']:.1f} "
        f"ms, fold {r['task.fold_thread_p50_ms']:.1f} ms, no-op {r['task.bench_noop_p50_ms']:.2f} "
        f"ms; folds took {100 * r['task.fold_share']:.0f}% of the finalize side's task time",
    ]
    return lines
