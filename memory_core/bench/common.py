"""What every benchmark shares: the turns it writes, how it times pairs, how it prints them."""

from __future__ import annotations

import gc
import logging
import math
import os
import platform
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from memory_core.copy.context import Exchange
from memory_core.write.artifacts import derive_artifacts
from memory_core.write.snapshot import TurnSnapshot

BASE_TIME = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
# A raw Redash config: the core must reduce it to a compact descriptor.
VIZ_OPTIONS = {
    "globalSeriesType": "column",
    "columnMapping": {"region": "x", "revenue": "y"},
    "legend": {"enabled": True},
    "seriesOptions": {"revenue": {"color": "#ff0000"}},
}

# The same content make-believe as `snapshot`, generated server-side in one statement.
LOAD_TURNS = """
INSERT INTO thread_messages
  (thread_id, session_id, seq, user_query, answer, artifacts, response_payload, completed_at)
SELECT %(id)s, gen_random_uuid(), g,
  'Revenue by region for ' || (2000 + g) || ', excluding returns (turn ' || g || ')',
  'Turn ' || g || ': EMEA leads with 41%% of revenue.',
  jsonb_build_array(
    jsonb_build_object('kind', 'sql', 'sql', 'SELECT region, SUM(revenue) AS revenue FROM sales '
      || 'WHERE year = ' || (2000 + g) || ' AND NOT is_return GROUP BY region'),
    jsonb_build_object('kind', 'visualization', 'id', 100 + g, 'type', 'CHART',
      'name', 'Revenue by region ' || g, 'chart', 'column', 'x', jsonb_build_array('region'),
      'y', jsonb_build_array('revenue'), 'series', '[]'::jsonb),
    jsonb_build_object('kind', 'dashboard', 'id', 3, 'name', 'Sales', 'widget_count', 1,
      'visualization_ids', jsonb_build_array(100 + g))),
  jsonb_build_object('blocks', jsonb_build_array(
    jsonb_build_object('type', 'text', 'text', 'answer ' || g))),
  %(base)s::timestamptz + g * interval '1 minute'
FROM generate_series(1, %(n)s) AS g
"""


@dataclass(frozen=True)
class Pair:
    """One figure and its raw limit, both in nanoseconds per call."""

    key: str
    label: str
    raw_label: str
    goal: float
    core: list[int]
    raw: list[int]
    # A lower bound, not a figure of ours: its ratio shows what the goal leaves to our code.
    bound: bool = False

    def figures(self) -> dict[str, float]:
        p50, p99 = pct(self.core, 0.50), pct(self.core, 0.99)
        r50, r99 = pct(self.raw, 0.50), pct(self.raw, 0.99)
        f = {"p50_us": p50, "p99_us": p99, "raw_p50_us": r50, "raw_p99_us": r99}
        f |= {"ratio": p50 / r50, "ratio_p99": p99 / r99}
        return {f"{self.key}.{k}": v for k, v in f.items()}


def pct(samples: list[int], q: float) -> float:
    """Nearest-rank percentile, in microseconds."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))] / 1000.0


Step = Callable[[int], object]


def paired(
    n: int, warmup: int, core: Step, raw: Step, prep: Callable[[int, int], object] | None = None
) -> tuple[list[int], list[int]]:
    """Time core(i) and raw(i) interleaved, alternating which goes first; prep is untimed."""
    out: tuple[list[int], list[int]] = ([], [])
    gc.collect()
    for i in range(warmup + n):
        for side in (0, 1) if i % 2 else (1, 0):
            if prep is not None:
                prep(side, i)
            fn = raw if side else core
            t0 = time.perf_counter_ns()
            fn(i)
            elapsed = time.perf_counter_ns() - t0
            if i >= warmup:
                out[side].append(elapsed)
    return out


def snapshot(thread_id: uuid.UUID, n: int, owner_id: str) -> dict[str, Any]:
    """The n-th turn of an analytics conversation, as an agent sends it (JSON dict)."""
    viz = {"id": 100 + n, "type": "CHART", "name": f"Revenue by region {n}", "options": VIZ_OPTIONS}
    return {
        "session_id": str(uuid.uuid4()),
        "thread_id": str(thread_id),
        "owner_id": owner_id,
        "agent_type": "chat",
        "user_query": f"Revenue by region for {2000 + n}, excluding returns (turn {n})",
        "answer": f"Turn {n}: EMEA leads with 41% of revenue.",
        "sql": [
            f"SELECT region, SUM(revenue) AS revenue FROM sales WHERE year = {2000 + n} "
            "AND NOT is_return GROUP BY region"
        ],
        "visualizations": [viz],
        "dashboards": [{"id": 3, "name": "Sales", "widgets": [{"visualization_id": 100 + n}]}],
        "response_payload": {"blocks": [{"type": "text", "text": f"answer {n}"}]},
        "completed_at": (BASE_TIME + timedelta(minutes=n)).isoformat(),
    }


def exchange(snap: dict[str, Any], seq: int) -> Exchange:
    """The turn as memory stores it (what the core derives at finalize)."""
    s = TurnSnapshot.model_validate(snap)
    viz, dash = [v.model_dump() for v in s.visualizations], [d.model_dump() for d in s.dashboards]
    art = derive_artifacts(s.sql, viz, dash)
    fields = s.model_dump(include={"session_id", "user_query", "answer", "completed_at"})
    return Exchange(seq=seq, artifacts=art, **fields)


@contextmanager
def json_logs_to_devnull() -> Iterator[None]:
    """Production-like logging (JSON lines at INFO, as the workers run), written to /dev/null.

    The root logger's handlers and level are restored afterwards.
    """
    from memory_core.logs import configure_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    with open(os.devnull, "w") as devnull:
        configure_logging(logging.INFO, stream=devnull)
        try:
            yield
        finally:
            root.handlers[:] = handlers
            root.setLevel(level)


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    py = platform.python_version()
    return f"{os.cpu_count()} cores ({model}), {platform.system()}, Python {py}"


def format_table(pairs: list[Pair], header: list[str]) -> list[str]:
    lines = [
        *header,
        "",
        "| figure | p50 µs | p99 µs | raw limit (same run) | p50 µs | p99 µs "
        "| ratio p50 | ratio p99 | goal (p50) | verdict |",
        "|---|--:|--:|---|--:|--:|--:|--:|--:|---|",
    ]
    for p in pairs:
        f = {k.split(".", 1)[1]: v for k, v in p.figures().items()}
        verdict = "PASS" if f["ratio"] <= p.goal else "MISS"
        verdict = f"lower bound ({verdict})" if p.bound else verdict
        lines.append(
            f"| {p.label} | {f['p50_us']:,.1f} | {f['p99_us']:,.1f} | {p.raw_label} "
            f"| {f['raw_p50_us']:,.1f} | {f['raw_p99_us']:,.1f} | {f['ratio']:.2f}x "
            f"| {f['ratio_p99']:.2f}x | <= {p.goal}x | {verdict} |"
        )
    return lines
