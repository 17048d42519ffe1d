"""Benchmarks of two guarantees a host relies on (docs/RELIABILITY.md):

* `bench access`: a stranger is refused as fast as for a thread that does not exist, for a
  small and for a large working copy (the owner is checked inside Redis, nothing ships).
* `bench rss`: a fold worker's memory does not grow with the number of distinct texts it has
  seen: RSS after folding 1 000 distinct long turns against after 100, in a fresh process
  that runs what a fold worker runs (save, fold through an OpenAI-compatible LLM, views).
"""

from __future__ import annotations

import contextlib
import gc
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

from memory_core.bench.common import snapshot
from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.io.db import get_engine
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings
from memory_core.write.session_handler import save_session_to_thread_safe

OWNER = "bench-owner"


def _turn(tid: uuid.UUID, n: int, answer: str, sql: str) -> dict[str, Any]:
    """The benchmarks' turn, with distinct text (no cache may serve it twice)."""
    query = f"Revenue by region for {2000 + n}, excluding returns ({uuid.uuid4()})"
    return snapshot(tid, n, OWNER) | {"user_query": query, "answer": answer, "sql": [sql]}


def _paired_medians_ms(
    a: Callable[[], Any], b: Callable[[], Any], reps: int
) -> tuple[float, float]:
    """Median ms of `a` and of `b`, calls interleaved so that drift hits both alike."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(reps):
        for call, out in ((a, times[0]), (b, times[1])):
            started = time.perf_counter()
            with contextlib.suppress(ThreadNotFound):
                call()
            out.append((time.perf_counter() - started) * 1000)
    return statistics.median(times[0]), statistics.median(times[1])


def bench_access(
    *, settings: Settings, reps: int = 300, out: Callable[[str], None] = print
) -> dict[str, float]:
    """Median time to refuse a stranger vs to answer for an unknown thread, small/large copy."""
    client = make_redis(settings.redis_url)
    memory = RedisConversationMemory(client, settings=settings)
    figures: dict[str, float] = {}
    out("$ agent-memory bench access")
    out(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {reps} reads per figure, medians")
    out("")
    out("| copy | bytes shipped to the owner | stranger refused, ms | unknown thread, ms | ratio |")
    out("|---|--:|--:|--:|--:|")
    try:
        for label, turns, answer in (("small", 3, "EMEA leads."), ("large", 40, "x " * 25_000)):
            tid = uuid.uuid4()
            for n in range(1, turns + 1):
                save_session_to_thread_safe(_turn(tid, n, answer, "SELECT 1"), memory=memory)
            memory.get_context(tid, OWNER)  # cached
            size = sum(map(len, memory.copy.read(tid)[1]))
            unknown_ids = iter([uuid.uuid4() for _ in range(reps)])
            # Another replica's reads: no parsed copy of this thread in its process.
            reader = RedisConversationMemory(client, settings=settings, local_cache_size=0)
            stranger, unknown = _paired_medians_ms(
                partial(reader.get_context, tid, "mallory"),
                partial(_read_next, reader, unknown_ids),
                reps,
            )
            ratio = max(stranger, unknown) / min(stranger, unknown)
            figures |= {f"{label}.stranger_ms": stranger, f"{label}.unknown_ms": unknown}
            figures[f"{label}.ratio"] = ratio
            out(
                f"| {label} ({turns} turns) | {size:,} | {stranger:.2f} | {unknown:.2f} "
                f"| {ratio:.2f}x |"
            )
    finally:
        client.close()
    return figures


def _read_next(memory: RedisConversationMemory, ids: Iterator[uuid.UUID]) -> Any:
    return memory.get_context(next(ids), "mallory")


_CHILD = "memory_core.bench.guest"


def bench_rss(
    *, settings: Settings, turns: int = 1000, out: Callable[[str], None] = print
) -> dict[str, float]:
    """RSS of a fresh fold-worker-like process after 100 and after `turns` distinct turns."""
    env_settings = settings.model_dump_json()
    done = subprocess.run(
        [sys.executable, "-m", _CHILD, env_settings, str(turns)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=True,
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    out("$ agent-memory bench rss")
    out(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · distinct ~6 KB turns, saved and folded")
    out("")
    out("| turns folded | RSS MiB |")
    out("|--:|--:|")
    for key in sorted(figures, key=lambda k: int(k.split("_")[1]) if k.startswith("rss_") else 0):
        if key.startswith("rss_"):
            out(f"| {key.split('_')[1]} | {figures[key]:.1f} |")
    out("")
    growth = figures[f"rss_{turns}"] - figures["rss_100"]
    out(f"growth from 100 to {turns} turns: {growth:+.1f} MiB")
    figures["growth_mib"] = growth
    return figures


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _child(settings_json: str, turns: int) -> None:
    """What a fold worker does, `turns` times, with distinct long texts; prints RSS figures."""
    from memory_core.copy.views import render_conversation_context
    from memory_core.devservices.fake_llm import FakeLLMServer
    from memory_core.fold.folding import Folder
    from memory_core.fold.summarizer import ConversationSummarizer

    llm = FakeLLMServer().start()
    s = Settings.model_validate_json(settings_json).model_copy(
        update={
            "openai_base_url": llm.base_url,
            "openai_api_key": "sk-bench",
            # This process folds itself: a fold job published to a real broker would linger.
            "celery_broker_url": "redis://127.0.0.1:1/0",
        }
    )
    client = make_redis(s.redis_url)
    memory = RedisConversationMemory(client, settings=s, engine=get_engine(s.database_url))
    folder = Folder(memory, ConversationSummarizer(s))
    figures: dict[str, float] = {}
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        text = f"{uuid.uuid4()} " + " ".join(str(uuid.uuid4()) for _ in range(150))
        snap = _turn(tid, n, text, f"SELECT '{uuid.uuid4()}' AS k, region FROM sales")
        save_session_to_thread_safe(snap, memory=memory)
        folder.fold(tid)  # a no-op until the thread is over the threshold
        for focus in ("brief", "sql", "visualizations"):
            render_conversation_context(memory.get_context(tid, OWNER), focus, 2000)
        if n in (100, turns) or n % 250 == 0:
            gc.collect()
            figures[f"rss_{n}"] = _rss_mib()
    print(json.dumps(figures))


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
