"""The bench's Celery worker: its shape (pool, concurrency, prefetch, queues), checked before
anything starts, and what its log says about the time spent inside each task.

`agent-memory bench workers` runs the defaults (prefork, -c 2, prefetch 1, both queues);
`agent-memory bench sizing` sweeps the shape."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from memory_core.devservices.workers import QUEUES, WorkerProcess
from memory_core.io.queues import FINALIZE_QUEUE, FINALIZE_TASK, FOLD_QUEUE, FOLD_TASK

NOOP_TASK = "memory.bench_noop"
POOLS = ("prefork", "threads", "gevent", "solo")
_SUCCEEDED = re.compile(r"Task (\S+)\[[^\]]+\] succeeded in ([0-9.e-]+)s")
_RECEIVED = re.compile(r"^Task \S+\[[^\]]+\] received$")


def check_worker_options(pool: str, concurrency: int, prefetch: int, queues: str) -> None:
    """Refuse a bench worker shape Celery would not run as asked (ValueError), or a pool whose
    library is not installed (RuntimeError)."""
    if pool not in POOLS:
        raise ValueError(f"unknown pool {pool!r}: one of {', '.join(POOLS)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if pool == "solo" and concurrency != 1:
        raise ValueError("the solo pool runs one job at a time: concurrency must be 1")
    if prefetch < 1:
        raise ValueError(
            f"prefetch multiplier must be at least 1 (0 means no limit), got {prefetch}"
        )
    wanted = [q for q in queues.split(",") if q]
    if not wanted or set(wanted) - {FINALIZE_QUEUE, FOLD_QUEUE}:
        raise ValueError(f"queues must be among {QUEUES}, got {queues!r}")
    if pool == "gevent" and importlib.util.find_spec("gevent") is None:
        raise RuntimeError("the gevent pool needs gevent: pip install 'agent-memory[bench]'")


def bench_worker(
    log_dir: Path,
    *,
    name: str,
    env: dict[str, str],
    pool: str = "prefork",
    concurrency: int = 2,
    prefetch: int = 1,
    queues: str = QUEUES,
) -> WorkerProcess:
    """The bench's worker (not started): `WorkerProcess` with the bench tasks loaded and the
    pool, concurrency, prefetch multiplier and queues asked for."""
    check_worker_options(pool, concurrency, prefetch, queues)
    worker = WorkerProcess(
        log_dir,
        name=name,
        queues=queues,
        concurrency=concurrency,
        pool=pool,
        extra_args=["-I", "memory_core.bench.tasks"],
        env=env,
    )
    if prefetch != 1:  # WorkerProcess passes `--prefetch-multiplier 1`: replace its value
        for args in (worker.options, worker.argv):
            args[args.index("--prefetch-multiplier") + 1] = str(prefetch)
    return worker


def task_times_ms(log: str) -> dict[str, list[float]]:
    """Time inside each task (ms) by task name, from the worker's `succeeded in` lines."""
    times: dict[str, list[float]] = {FINALIZE_TASK: [], FOLD_TASK: [], NOOP_TASK: []}
    for m in _SUCCEEDED.finditer(log):
        times.setdefault(m.group(1), []).append(1000 * float(m.group(2)))
    return times


def pickups_ms(log: str, pushed_at: Sequence[float], log_path: Path) -> list[float]:
    """For each timed round (the wall-clock time of its first push): until the worker logged
    receiving a job (the first `Task ... received` after it). The worker is idle when a round
    starts. `log` is the worker's JSON log; `log_path` names it in the error."""
    received = []
    for line in log.splitlines():
        if '] received"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if _RECEIVED.match(str(entry.get("event", ""))) and "timestamp" in entry:
            received.append(datetime.fromisoformat(entry["timestamp"]).timestamp())
    received.sort()
    pickups = []
    for wall in pushed_at:
        after = [t for t in received if t >= wall]
        if not after:
            raise RuntimeError(f"no `received` line after a round's enqueue in {log_path}")
        pickups.append(1000 * (after[0] - wall))
    return pickups
