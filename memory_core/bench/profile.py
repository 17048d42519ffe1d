"""`agent-memory bench profile`: where each microsecond of the hot path goes, by pyinstrument.

Profiles, in this process, on the servers of `agent-memory bench core` and with its data:
1. save: `save_session_to_thread_safe` of distinct turns over 50 warm threads (fast path);
2. first read: `get_context` of a full copy (summary + 40 turns) by a memory that has not
   parsed it (local parsed cache off), as another replica's first read.

For each it prints µs per call (wall, under the profiler's own small overhead) and the top
functions by self time, grouped as the docs name them (our code, SQLAlchemy, psycopg2,
redis-py, pydantic, logging, the wait on the socket), and writes the full call trees as text
files beside the plots. The worker side of a finalize job is profiled with py-spy on a real
worker (docs/BENCHMARKS.md, "Where the time goes").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memory_core.bench.common import json_logs_to_devnull, machine, snapshot
from memory_core.bench.core import SHORT_TURNS, THREADS, WARM_TURNS, _Bench
from memory_core.conversation_memory import RedisConversationMemory

COMMAND = "agent-memory bench profile"
INTERVAL_S = 0.0005  # finer sampling costs more than the calls it measures
# Where a frame's file lives -> the group the docs name (first match wins).
GROUPS = (
    ("memory_core", "our code"),
    ("sqlalchemy", "SQLAlchemy"),
    ("psycopg2", "psycopg2 (client side)"),
    ("redis", "redis-py"),
    ("hiredis", "redis-py"),
    ("pydantic", "pydantic"),
    ("logging", "logging"),
    ("structlog", "logging"),
    ("json", "json"),
)


def _require_pyinstrument() -> Any:
    try:
        import pyinstrument
    except ImportError:
        raise RuntimeError(
            "bench profile needs pyinstrument: pip install 'agent-memory[bench]'"
        ) from None
    return pyinstrument


def _group(file_path: str, function: str) -> str:
    if function.rsplit(".", 1)[-1] in ("recv", "recv_into", "poll", "select", "read"):
        return "socket wait (server + network)"
    if function == "execute_autocommit":
        # psycopg2's cursor.execute is C that pyinstrument does not see as a frame: the self
        # time of its caller is the statement's round trip, execution and commit.
        return "Postgres statement (psycopg2 execute: round trip + commit)"
    for needle, name in GROUPS:
        if f"/{needle}/" in file_path or file_path.startswith(needle):
            return name
    if "<built-in>" in file_path or not file_path:
        return "built-ins"
    return "other"


def _self_times(session: Any) -> tuple[dict[str, float], dict[str, float]]:
    """Self time per function and per group, in seconds, over the whole session."""
    funcs: dict[str, float] = {}
    groups: dict[str, float] = {}
    root = session.root_frame()
    stack = [root] if root is not None else []
    while stack:
        frame = stack.pop()
        if frame.is_synthetic:  # pyinstrument's "[self]" leaves: counted with their parent
            continue
        stack.extend(frame.children)
        own = frame.time - sum(c.time for c in frame.children if not c.is_synthetic)
        if own <= 0:
            continue
        path = frame.file_path or ""
        name = f"{frame.function} ({_where(path) if path else 'built-in'})"
        funcs[name] = funcs.get(name, 0.0) + own
        group = _group(path, frame.function or "")
        groups[group] = groups.get(group, 0.0) + own
    return funcs, groups


def _where(path: str) -> str:
    """A frame's file as a reader finds it: from the repository root for ours, from
    site-packages for a library's, the last two parts for the standard library's."""
    for marker in ("/site-packages/", "/memory_core/"):
        if marker in path:
            found = path.rsplit(marker, 1)[1]
            return "memory_core/" + found if marker == "/memory_core/" else found
    return "/".join(path.rsplit("/", 2)[-2:])


def _profile(
    label: str, calls: int, step: Callable[[int], object], out_dir: Path | None, key: str
) -> list[str]:
    pyinstrument = _require_pyinstrument()
    profiler = pyinstrument.Profiler(interval=INTERVAL_S)
    started = time.perf_counter()
    profiler.start()
    for i in range(calls):
        step(i)
    profiler.stop()
    per_call_us = (time.perf_counter() - started) / calls * 1e6
    session = profiler.last_session
    funcs, groups = _self_times(session)
    total = sum(groups.values()) or 1.0
    lines = [f"### {label}: {per_call_us:,.0f} µs per call ({calls} calls, under the profiler)"]
    lines += ["", "| where (self time) | share | µs per call |", "|---|--:|--:|"]
    for name, sec in sorted(groups.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {sec / total:.0%} | {sec / calls * 1e6:,.0f} |")
    lines += ["", "| top functions (self time) | share | µs per call |", "|---|--:|--:|"]
    for name, sec in sorted(funcs.items(), key=lambda kv: -kv[1])[:12]:
        lines.append(f"| `{name}` | {sec / total:.0%} | {sec / calls * 1e6:,.0f} |")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        tree = profiler.output_text(unicode=False, color=False, time="percent_of_total")
        (out_dir / f"profile-{key}.txt").write_text(tree)
    return lines


def bench_profile(
    *,
    database_url: str,
    redis_url: str,
    calls: int = 2000,
    out_dir: Path | None = None,
    out: Callable[[str], None] = print,
) -> None:
    """Profile the save and the first read; print the tables, write the call trees."""
    if calls < 10:
        raise ValueError("calls must be at least 10")
    _require_pyinstrument()
    bench = _Bench(database_url, redis_url, calls)
    try:
        with json_logs_to_devnull():
            tids = [bench._new_thread() for _ in range(THREADS)]
            for n in range(1, WARM_TURNS + 1):
                for t in tids:
                    bench._core_save(snapshot(t, n, bench.owner))
            bench._sql(
                "UPDATE conversation_threads SET fold_due_at = 'infinity' "
                "WHERE owner_id = %(owner)s"
            )
            jobs = [
                snapshot(tids[i % THREADS], WARM_TURNS + 1 + i // THREADS, bench.owner)
                for i in range(calls)
            ]
            save = _profile(
                "sync save", calls, lambda i: bench._core_save(jobs[i]), out_dir, "save"
            )
            short = bench._load_thread(SHORT_TURNS)
            fresh = RedisConversationMemory(
                bench.memory.redis,
                settings=bench.memory.settings,
                engine=bench.memory.engine,
                local_cache_size=0,
            )
            fresh.get_context(short, bench.owner)  # builds the copy from Postgres
            read = _profile(
                "first read (get_context, parsed anew)",
                calls,
                lambda _: fresh.get_context(short, bench.owner),
                out_dir,
                "read",
            )
    finally:
        bench.close()
    out(f"$ {COMMAND} --calls {calls}")
    out(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {machine()}")
    for line in ["", *save, "", *read]:
        out(line)
    if out_dir is not None:
        out(f"call trees: {out_dir}/profile-save.txt, {out_dir}/profile-read.txt")
