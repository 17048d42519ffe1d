"""The fold side of `agent-memory bench workers` and `bench sizing`: the in-process fold
arithmetic (LLM calls per 100 turns, prompt tokens early vs late) and the fold jobs/s of a
worker on `memory.fold` alone. A `WorkersBench` with these two measurements added."""

from __future__ import annotations

import json
import os
import time
import uuid
from statistics import median
from unittest.mock import patch

import celery
from kombu.transport.memory import Channel as MemoryChannel

from memory_core.bench.bench_worker import task_times_ms
from memory_core.bench.broker_adapters import RedisBroker
from memory_core.bench.common import snapshot
from memory_core.bench.workers_bench import LONG_THREAD, PRELOAD, WorkersBench
from memory_core.fold.folding import Folder
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.queues import FOLD_QUEUE, FOLD_TASK
from memory_core.tokens import count_tokens
from memory_core.write.session_handler import save_session_to_thread_safe

_FOLDED = """SELECT count(*) FROM conversation_threads
WHERE id = ANY(%s::uuid[]) AND summary_through_seq > 0"""


def render_fold_jobs(tids: list[uuid.UUID]) -> list[bytes]:
    """One `memory.fold_thread` message per thread, as `send_task` writes it to a Redis list.

    Rendered on kombu's in-process memory broker. Whatever an earlier publish of this process
    left on its `memory.fold` queue is dropped first: the fold arithmetic publishes its folds
    there, and a sweep run after it took those (other threads', deleted since) for its own."""
    app = celery.Celery("agent-memory-bench", set_as_current=False)
    with app.connection_for_write("memory://") as conn:  # explicit: CELERY_BROKER_URL wins
        MemoryChannel.queues.pop(FOLD_QUEUE, None)
        producer = app.amqp.Producer(conn)
        for tid in tids:
            app.send_task(FOLD_TASK, args=[str(tid)], queue=FOLD_QUEUE, producer=producer)
        box = MemoryChannel.queues[FOLD_QUEUE]
        return [json.dumps(box.get_nowait()).encode() for _ in tids]


class FoldBench(WorkersBench):
    """`WorkersBench` plus the fold measurements; `close` removes what it created."""

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

    def _folded(self, tids: list[uuid.UUID]) -> int:
        return int(self._sql(_FOLDED, [[str(t) for t in tids]])[0])

    def _push_folds(self, tids: list[uuid.UUID]) -> float:
        """One `memory.fold_thread` job per thread, rendered as `send_task` writes it (untimed),
        then pushed onto `memory.fold` in one LPUSH; returns the time of the push."""
        if not isinstance(self.broker, RedisBroker):
            raise ValueError("fold throughput is measured on a Redis broker (redis://)")
        messages = render_fold_jobs(tids)
        t0 = time.perf_counter()
        self.broker.client.lpush(FOLD_QUEUE, *messages)
        return t0

    def fold_throughput(self, folds: int, llm_latency_s: float) -> dict[str, float]:
        """Fold jobs/s through a worker on `memory.fold` alone (Redis broker): `folds` threads of
        PRELOAD + 1 turns, none folded (a fold of 11 turns due in each), one fold job each,
        pushed at once. The fake LLM holds every request `llm_latency_s` before it answers.
        Timed from the push until every thread's summary is stored and the broker is empty.
        Untimed before: one fold per worker slot (at most 8), at the same latency."""
        if self.serves_finalize or not self.serves_fold:
            raise ValueError(f"fold throughput needs a worker on {FOLD_QUEUE} alone")
        if folds < 1 or llm_latency_s < 0:
            raise ValueError("folds must be at least 1 and the LLM latency at least 0")
        if llm_latency_s > 0:
            self.llm.delay_s = llm_latency_s
            self.llm.set_mode("timeout")  # holds each request delay_s, then answers as "ok"
        limit = 60 + folds * (llm_latency_s + 0.1)  # one fold at a time, and then some
        self._start_worker()
        warm = self._preload(min(self.concurrency, 8), turns=PRELOAD + 1)
        self._push_folds(warm)
        self.wait(lambda: self._folded(warm) == len(warm) and self._drained(), limit, "warm-up")
        tids = self._preload(folds, turns=PRELOAD + 1)
        log_from, llm_from = self.worker.log_path.stat().st_size, len(self.llm.requests)
        cpu = self._cpu_s()
        t0 = self._push_folds(tids)
        t1 = self.wait(lambda: self._folded(tids) == folds and self._drained(), limit, "folds")
        cpu = self._cpu_s() - cpu
        with self.worker.log_path.open("rb") as f:
            f.seek(log_from)
            times = task_times_ms(f.read().decode(errors="replace"))
        return {
            "fold.jobs_s": folds / (t1 - t0),
            "fold.folded": float(self._folded(tids)),
            "fold.llm_calls": float(len(self.llm.requests) - llm_from),
            "task.fold_thread_p50_ms": median(times[FOLD_TASK] or [0]),
            "cpu_ms.fold_per_job": 1000 * cpu / folds,
        }
