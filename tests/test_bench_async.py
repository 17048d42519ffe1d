"""Smoke test of `agent-memory bench async`: it runs end to end with tiny counts against the
session's services (a real worker for read-your-writes) and prints every row, every number
parsable. No timing assertions: docs/BENCHMARKS.md holds a real run.

The peer rows (OpenAI Agents SDK) run only where the SDK is installed (`make bench-env`); the
project's own environment prints the line that says how to get them.
"""

from __future__ import annotations

import gc
import math
import re

import pytest
import redis
from sqlalchemy import text

from memory_core.bench.aio import bench_async
from memory_core.bench.aio_common import COMMAND, PEERS_SKIPPED, peer_sdk_version
from memory_core.io.db import get_engine
from memory_core.settings import get_settings

PART1 = (
    "| `aget_context` hit (summary + 40 turns; parsed context reused) |",
    "| `aget_context` hit (summary + 40 turns; parsed anew each call) |",
    "| redis.asyncio GET of the same ",
    "| `asave_session_to_thread_safe` (50 warm threads) |",
    "| its 1 SQL statement (autocommit) + 1 EVALSHA: psycopg 3 async + redis.asyncio ",
)
PART2_ASYNC = (
    "| async: one task per agent on one event loop |",
    "| async, gc.freeze() after the warm-up round |",
)
PART2_SYNC = (
    "| sync: ThreadPoolExecutor(max_workers=3) |",
    "| sync: ThreadPoolExecutor(max_workers=5) |",
)
PART3 = (
    "| `asave_session_to_thread_safe` (50 warm threads; Postgres + Redis) | ",
    "| `aget_context` hit (summary + 40 turns, ",
)
PART4 = (
    "| `aenqueue_turn` until `aget_context(wait_for=outcome)` returns the turn; queue empty |",
    "| `aenqueue_turn` until `aget_context(wait_for=outcome)` returns the turn; 3 finalize ",
)
NUMBER = re.compile(r"^[0-9][0-9,]*(\.[0-9]+)?x?$")


def _numbers(row: str) -> list[float]:
    """The row's numeric cells (e.g. `1,234.5`, `1.07x`); every other cell is a label."""
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    return [float(c.rstrip("x").replace(",", "")) for c in cells if NUMBER.match(c)]


def _rows(lines: list[str], prefix: str, count: int, numbers: int) -> None:
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == count, (prefix, found)
    for row in found:
        values = _numbers(row)
        assert len(values) == numbers, row
        assert all(math.isfinite(v) and v >= 0 for v in values), row


def _load_row(lines: list[str], prefix: str, spare: tuple[str, ...]) -> None:
    """One row of part 2: 11 cells after its label, each a number or a placeholder `spare`
    allows."""
    found = [line for line in lines if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    values = [c.strip() for c in found[0].strip().strip("|").split("|")][1:]
    assert len(values) == 11, found[0]
    assert all(NUMBER.match(c) or c in spare for c in values), found[0]


def _bench_threads(database_url: str) -> int:
    with get_engine(database_url).connect() as conn:
        return int(
            conn.scalar(
                text(
                    "SELECT count(*) FROM conversation_threads "
                    "WHERE owner_id LIKE 'bench-%' OR owner_id LIKE 'benchw-%'"
                )
            )
        )


@pytest.mark.workers  # the read-your-writes row runs one
def test_bench_async_prints_every_row_with_numbers() -> None:
    settings = get_settings()
    broker = redis.Redis.from_url(settings.celery_broker_url)
    broker.flushdb()  # the read-your-writes worker needs the broker to itself
    before = _bench_threads(settings.database_url)  # other benches' tests may leave theirs
    lines: list[str] = []
    results = bench_async(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        broker_url=settings.celery_broker_url,
        iterations=8,
        agents=5,
        pool=3,
        rounds=2,
        samples=1,
        backlog=3,
        out=lines.append,
    )
    assert lines[0] == (
        f"$ {COMMAND} --iterations 8 --agents 5 --pool 3 --rounds 2 --samples 1 --backlog 3"
    )
    for prefix in (*PART1, *PART4):
        _rows(lines, prefix, 1, 6)  # p50, p99 on each side, two ratios
    # read, save p50/p99, turns/s, last agent done, CPU/turn, longest GC pause, longest gen-2
    # pause ("none" when no gen-2 collection ran), GC ms/turn, event-loop lag ("-": no loop)
    for prefix in PART2_ASYNC:
        _load_row(lines, prefix, spare=("none",))
    for prefix in PART2_SYNC:
        _load_row(lines, prefix, spare=("none", "-"))
    assert gc.get_freeze_count() == 0  # the frozen run unfreezes after itself
    cpu = next(line for line in lines if line.startswith("CPU µs per call"))
    assert [k.split()[0] for k in cpu.split(": ", 1)[1].split("; ")] == [
        "hit",
        "hit_cold",
        "get",
        "save",
        "raw_save",
    ]
    if peer_sdk_version() is None:
        assert PEERS_SKIPPED in lines
    else:
        _rows(lines, PART3[0], 2, 6)  # one per SDK driver
        _rows(lines, PART3[1], 2, 6)  # parsed context reused, parsed anew
    for key, value in results.items():
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert broker.dbsize() == 0  # the keys the bench created on its broker are deleted
    broker.close()
    assert _bench_threads(settings.database_url) == before  # this bench's threads are gone
