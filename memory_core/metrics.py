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

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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


class FoldLagCollector(Collector):
    """Threads whose unfolded turns exceed the threshold (folds falling behind or failing).

    One indexed-free count over conversation_threads per scrape, cached for `ttl_s`.
    """

    def __init__(self, database_url: str, threshold: int, ttl_s: float = 30.0) -> None:
        self.database_url = database_url
        self.threshold = threshold
        self.ttl_s = ttl_s
        self._cached: tuple[float, float, float] | None = None

    def _measure(self) -> tuple[float, float]:
        from sqlalchemy import text

        from memory_core.db import get_engine

        sql = text(
            "SELECT count(*) FILTER (WHERE last_seq - summary_through_seq > :t), "
            "count(*) FILTER (WHERE fold_attempts > 0) FROM conversation_threads"
        )
        with get_engine(self.database_url).connect() as conn:
            lagging, failing = conn.execute(sql, {"t": self.threshold}).one()
        return float(lagging), float(failing)

    def collect(self) -> Iterator[Any]:
        now = time.monotonic()
        if self._cached is None or now - self._cached[0] > self.ttl_s:
            try:
                self._cached = (now, *self._measure())
            except Exception:  # a scrape must not fail because Postgres is down
                return
        _, lagging, failing = self._cached
        yield GaugeMetricFamily(
            "memory_fold_lag_threads",
            "Threads with more unfolded turns than the compression threshold",
            value=lagging,
        )
        yield GaugeMetricFamily(
            "memory_fold_failing_threads", "Threads whose last fold attempt failed", value=failing
        )


def serve_worker_metrics(port: int, database_url: str, threshold: int) -> None:
    """Serve the multiprocess aggregate + fold lag from the worker's main process."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(FoldLagCollector(database_url, threshold))
    addr = os.environ.get("MEMORY_METRICS_ADDR", "0.0.0.0")  # noqa: S104 - scraped by Prometheus
    start_http_server(port, addr=addr, registry=registry)
