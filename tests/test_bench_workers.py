"""Smoke test of `agent-memory bench workers`: it runs end to end and reports every figure.

No timing assertions (the figures depend on the machine; docs/BENCHMARKS.md holds a real run).
The one exact assertion is a correctness property of the fold arithmetic: a 100-turn thread
costs 8 LLM calls (folds at turns 21, 32, ..., 98).
"""

from __future__ import annotations

import math

import redis
from sqlalchemy import text

from memory_core.bench.workers import COMMAND, bench_workers
from memory_core.db import get_engine
from memory_core.settings import get_settings

FIGURES = (
    "finalize.jobs_s",
    "noop.jobs_s",
    "finalize.ratio",
    "finalize.jobs_s_with_folds",
    "finalize.folds",
    "task.finalize_turn_p50_ms",
    "task.fold_thread_p50_ms",
    "task.bench_noop_p50_ms",
    "task.fold_share",
    "llm_calls_100_turns",
    "prompt.tokens_early",
    "prompt.tokens_late",
    "prompt.ratio",
    "wall_s",
)


def test_bench_workers_reports_every_figure_and_8_llm_calls_per_100_turns() -> None:
    settings = get_settings()
    # The bench worker needs the broker to itself: this session's own broker database, which
    # in-process tests may have left fold jobs in (nothing consumes them).
    broker = redis.Redis.from_url(settings.celery_broker_url)
    broker.flushdb()
    broker.close()
    lines: list[str] = []
    results = bench_workers(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        broker_url=settings.celery_broker_url,
        jobs=40,
        out=lines.append,
    )
    assert set(FIGURES) <= results.keys()
    for key, value in results.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert results["llm_calls_100_turns"] == 8
    assert lines[0].startswith(f"$ {COMMAND} --jobs 40 --broker-url redis://")
    verdicts = [line for line in lines if line.endswith(("| PASS |", "| MISS |"))]
    assert len(verdicts) == 3
    assert (
        "| LLM calls for a 100-turn thread (folds at turns 21, 32, 43, 54, 65, 76, 87, 98)"
        in (verdicts[1])
    )
    with get_engine(settings.database_url).connect() as conn:  # everything it made is gone
        left = conn.scalar(
            text("SELECT count(*) FROM conversation_threads WHERE owner_id LIKE 'benchw-%'")
        )
    assert left == 0
