"""Prometheus metrics of the memory itself (queues are covered by Flower's /metrics).

In-process users get them on prometheus_client's default registry. Workers run with
`agent-memory worker --metrics-port N`: prefork children write to PROMETHEUS_MULTIPROC_DIR
and the worker's main process serves the aggregate, plus the fold-lag gauge, on port N.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text

from memory_core.io.db import get_engine

FINALIZE = Counter(
    "memory_finalize_total", "Finalize outcomes", ["status"]
)  # saved / duplicate / rejected / failed
CACHE_READS = Counter(
    "memory_cache_reads_total", "get_context reads by result", ["result"]
)  # hit / miss / unavailable
REHYDRATIONS = Counter("memory_rehydrations_total", "Working copies rebuilt from Postgres")
FOLDS = Counter("memory_folds_total", "Fold attempts by outcome", ["status"])
FOLD_SECONDS = Histogram(
    "memory_fold_seconds",
    "Wall time of folds that called the summarizer",
    buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 60, 120),
)
LLM_TOKENS = Counter("memory_llm_tokens_total", "Summarizer LLM tokens", ["kind"])
EVENTS_CONSUMER_LAG = Gauge(
    "memory_events_consumer_lag",
    "Entries of an event stream a consumer group has not read yet (as last checked)",
    ["stream", "group"],
    multiprocess_mode="max",
)
EVENTS_LOST = Counter(
    "memory_events_lost_total",
    "Event entries trimmed from the stream before a consumer group handled them",
    ["stream", "group"],
)
SETTINGS_DISAGREEMENTS = Gauge(
    "memory_settings_disagreements",
    "Other memory settings fingerprints recorded in the last two hours"
    " (memory_core/copy/settings_check.py)",
    multiprocess_mode="max",
)
PROMPT_REFUSED = Counter(
    "memory_prompt_refused_total",
    "Managed (Langfuse) summarizer prompts refused for their variables: missing or unknown",
    ["reason"],
)
TASK_UNEXPECTED = Counter(
    "memory_task_unexpected_errors_total",
    "Task runs ended by an error nothing else handled (retried with backoff)",
    ["task"],
)
JOBS_DEAD_LETTERED = Counter(
    "memory_jobs_dead_lettered_total",
    "Jobs delivered MEMORY_MAX_DELIVERIES times (workers kept dying on them), dead-lettered to "
    "memory.dead (RabbitMQ)",
    ["task"],
)
JOBS_REFUSED = Counter(
    "memory_jobs_refused_total",
    "Jobs refused and acked without running: an unknown task name, a message that is no task "
    "of ours (another serializer, an undecodable body), or wrong arguments; never dead-lettered",
    ["task", "reason"],  # task: one of ours or "other"; reason: a fixed code
)
FOLD_PUBLISH_FAILURES = Counter(
    "memory_fold_publish_failures_total",
    "Fold jobs that could not be published (broker down or refusing); the thread row keeps the "
    "fold due; a later turn or the memory.sweep_folds beat task republishes it after the grace",
)
FOLDS_REPUBLISHED = Counter(
    "memory_folds_republished_total",
    "Lost fold requests (due longer than the republish grace, no fold running) that the "
    "memory.sweep_folds beat task published again",
)
FOLD_FALLBACKS = Counter(
    "memory_fold_fallbacks_total",
    "Folds that used the LLM-free summary because the LLM kept failing or could not succeed",
)
INSTRUCTIONS = Counter(
    "memory_fold_instructions_total",
    "Standing instructions corrected by code after an LLM fold: `restored` (the model dropped "
    "one still in force), `superseded_dropped` (it kept one the conversation superseded)",
    ["action"],
)

THREADS_DELETED = Counter(
    "memory_threads_deleted_total",
    "Threads deleted (rows, turns, working copy, checkpoints), by why",
    ["reason"],  # delete, forget, retention
)
RETENTION_RUNS = Counter(
    "memory_retention_runs_total", "Retention runs (MEMORY_RETENTION_DAYS), by outcome", ["status"]
)
TRACE_PURGES = Counter(
    "memory_trace_purges_total",
    "Langfuse trace purges of deleted threads, by outcome (done, pending, failed)",
    ["status"],
)


class FoldLagCollector(Collector):
    """Threads with a fold due (requested and not yet done, running late, or waiting for a
    retry), how many of them failed their last attempt, the oldest due time, and the folds
    waiting for a retry (a failed fold's row holds its retry's due time in `fold_due_at`): how
    many, and when the next one is due. On either broker, whatever it shows or hides of ETAs.

    One query on the partial index `ix_conversation_threads_fold_due` per `ttl_s` (30 s):
    its cost follows the number of threads with a fold due, not the size of the table.
    """

    def __init__(self, database_url: str, threshold: int, ttl_s: float = 30.0) -> None:
        self.database_url = database_url
        self.threshold = threshold
        self.ttl_s = ttl_s
        self._cached: tuple[float, ...] | None = None

    def _measure(self) -> tuple[float, ...]:
        sql = text(
            "SELECT count(*), count(*) FILTER (WHERE fold_attempts > 0), "
            "COALESCE(EXTRACT(EPOCH FROM now() - min(fold_due_at)), 0), "
            "count(*) FILTER (WHERE fold_due_at > now()), "
            "COALESCE(EXTRACT(EPOCH FROM min(fold_due_at) FILTER (WHERE fold_due_at > now())), 0) "
            "FROM conversation_threads WHERE fold_due_at IS NOT NULL"
        )
        with get_engine(self.database_url).connect() as conn:
            due, failing, oldest, waiting, next_due = conn.execute(sql).one()
        return float(due), float(failing), max(float(oldest), 0.0), float(waiting), float(next_due)

    def collect(self) -> Iterator[Any]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > self.ttl_s:
            try:
                self._cached = (now, *self._measure())
            except Exception:  # a scrape must not fail because Postgres is down
                return
        _, due, failing, oldest, waiting, next_due = self._cached
        yield GaugeMetricFamily(
            "memory_fold_lag_threads",
            "Threads with a fold due (over the compression threshold, not yet folded)",
            value=due,
        )
        yield GaugeMetricFamily(
            "memory_fold_failing_threads", "Threads whose last fold attempt failed", value=failing
        )
        yield GaugeMetricFamily(
            "memory_fold_oldest_due_seconds",
            "How long the longest-waiting due fold has been due (0 when none is)",
            value=oldest,
        )
        yield GaugeMetricFamily(
            "memory_fold_retry_waiting_threads",
            "Threads whose fold failed and waits for its retry (due time still ahead)",
            value=waiting,
        )
        yield GaugeMetricFamily(
            "memory_fold_retry_next_due_timestamp_seconds",
            "When the next waiting fold retry is due, Unix time (0 when none waits)",
            value=next_due,
        )


def serve_worker_metrics(port: int, database_url: str, threshold: int) -> None:
    """Serve the multiprocess aggregate + fold lag from the worker's main process."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(FoldLagCollector(database_url, threshold))
    addr = os.environ.get("MEMORY_METRICS_ADDR", "0.0.0.0")  # noqa: S104 - scraped by Prometheus
    start_http_server(port, addr=addr, registry=registry)
