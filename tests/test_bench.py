"""Smoke test of `agent-memory bench core`: it runs end to end and reports every figure.

No timing assertions: the figures depend on the machine; docs/BENCHMARKS.md holds a real run.
"""

from __future__ import annotations

import math

from memory_core.bench.core import COMMAND, bench_core
from memory_core.settings import get_settings

FIGURES = ("save", "get_context", "get_context_cold", "rehydrate", "render_warm", "render_cold")
MEASURES = ("p50_us", "p99_us", "raw_p50_us", "raw_p99_us", "ratio", "ratio_p99")


def test_bench_core_reports_every_figure_as_a_positive_number() -> None:
    settings = get_settings()
    lines: list[str] = []
    results = bench_core(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        iterations=30,
        out=lines.append,
    )
    expected = {f"{fig}.{m}" for fig in FIGURES for m in MEASURES}
    assert expected <= results.keys()
    for key, value in results.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert lines[0] == f"$ {COMMAND}"
    verdicts = [line for line in lines if line.endswith(("| PASS |", "| MISS |"))]
    assert len(verdicts) == len(FIGURES)
