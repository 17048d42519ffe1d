"""`agent-memory bench workers`: worker throughput and fold arithmetic beside their raw limits.

1. finalize jobs/s through a real Celery worker subprocess (prefork, -c 2,
   prefetch 1, both memory queues) vs `memory.bench_noop` with the same payloads on the same
   worker and queue (`memory.finalize`). Jobs go round-robin over up to 100 threads preloaded
   with 20 turns at 11 fold phases (folds at the steady-state rate, one per ~11 turns, against a
   local fake LLM that answers at once). Messages are rendered by Celery beforehand and
   enqueued in one batch per round: Redis, pipelined LPUSH; RabbitMQ, basic.publish to the
   exchange `memory` (routing key `memory.finalize`) on one channel with publisher confirms,
   waiting once for the whole batch's confirms. Finalize is timed from the first enqueue to the
   last row in Postgres; the no-op until the broker holds nothing queued or unacked (acks_late)
   and the worker's `stats()` count has every job. Quarters run F N N F F N N F; folds drain
   between rounds.
2. LLM calls for a 100-turn thread, in-process (core, Folder, ConversationSummarizer, fake LLM).
3. Tokens of the messages sent to the LLM at the fold nearest turn 30 vs nearest turn 300.

Brokers (Redis, RabbitMQ) and what the bench does on each: `broker_adapters`. The run itself:
`workers_bench`; what it prints: `workers_report`.

`bench_workers_brokers` runs several brokers (and repeats) in one go, alternating them, and
prints their figures side by side. The worker needs a broker of its own; everything created is
removed at the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from memory_core.bench.broker_adapters import resolve_broker
from memory_core.bench.common import json_logs_to_devnull, machine
from memory_core.bench.fold_bench import FoldBench
from memory_core.bench.workers_report import (
    COMMAND,
    brokers_header,
    command_line,
    early_late,
    enqueue_how,
    invariants,
    report,
    run_line,
    side_by_side,
)

# `memory_core.cli.bench` and the tests import these from here.
__all__ = ["COMMAND", "bench_workers", "bench_workers_brokers", "resolve_broker"]


def _run(
    *, database_url: str, redis_url: str, broker_url: str, jobs: int, fold_arithmetic: bool
) -> tuple[dict[str, float], dict[int, int], dict[str, str]]:
    """One run on one broker: its figures, the folds of the long thread (if measured), and what
    the report names (versions, worker command, broker)."""
    started = time.perf_counter()
    bench = FoldBench(database_url, redis_url, broker_url, jobs)
    try:
        with json_logs_to_devnull():
            calls, folds = bench.fold_arithmetic() if fold_arithmetic else (0, {})
            r = bench.throughput()
        r["broker.left"] = float(bench.stop_worker())
        meta = {"versions": bench.versions(), "worker": bench.worker.command}
        meta |= {"kind": bench.broker.kind, "where": bench.broker.where}
        meta |= {"broker": bench.broker.version(), "threads": str(bench.n_threads)}
    finally:
        bench.close()
    if folds:
        early, late = early_late(folds)
        r |= {
            "llm_calls_100_turns": float(calls),
            "prompt.tokens_early": float(folds[early]),
            "prompt.tokens_late": float(folds[late]),
            "prompt.ratio": folds[late] / folds[early],
        }
    r["wall_s"] = time.perf_counter() - started
    return r, folds, meta


def bench_workers(
    *,
    database_url: str,
    redis_url: str,
    broker_url: str,
    jobs: int = 2000,
    out: Callable[[str], None] = print,
) -> dict[str, float]:
    """Run the worker benchmark once on one broker; print the table and return every figure."""
    if jobs < 4:
        raise ValueError("jobs must be at least 4")
    r, folds, meta = _run(
        database_url=database_url,
        redis_url=redis_url,
        broker_url=broker_url,
        jobs=jobs,
        fold_arithmetic=True,
    )
    for line in report(
        r,
        folds=folds,
        calls=int(r["llm_calls_100_turns"]),
        jobs=jobs,
        broker_url=broker_url,
        n_threads=int(meta["threads"]),
        header=f"{machine()} · {meta['versions']}",
        worker_command=meta["worker"],
    ):
        out(line)
    out(
        f"rounds timed from the worker's first pickup: finalize "
        f"{r['finalize.jobs_s_from_pickup']:,.0f}/s, no-op {r['noop.jobs_s_from_pickup']:,.0f}/s, "
        f"{r['finalize.ratio_from_pickup']:.2f}x"
    )
    out(f"broker: {meta['where']}, {meta['broker']}; {enqueue_how(meta['kind'])}")
    out(invariants(r, jobs))
    return r


def bench_workers_brokers(
    *,
    database_url: str,
    redis_url: str,
    brokers: Sequence[str],
    celery_broker_url: str = "",
    jobs: int = 2000,
    repeat: int = 1,
    out: Callable[[str], None] = print,
) -> dict[str, list[dict[str, float]]]:
    """The worker benchmark on each broker (`redis`, `rabbitmq` or a URL: `resolve_broker`),
    `repeat` runs each, alternating brokers (the order flips every run). Prints a line per run,
    then the brokers side by side; returns each broker's runs (the fold arithmetic, which no
    broker takes part in, only in the first run)."""
    if jobs < 4:
        raise ValueError("jobs must be at least 4")
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    if not brokers or len(set(brokers)) != len(brokers):
        raise ValueError("name each broker once (e.g. --brokers redis,rabbitmq)")
    urls = {
        spec: resolve_broker(spec, redis_url=redis_url, celery_broker_url=celery_broker_url)
        for spec in brokers
    }
    started = time.perf_counter()
    runs, metas, first = _alternating_runs(
        urls, database_url=database_url, redis_url=redis_url, jobs=jobs, repeat=repeat, out=out
    )
    out("")
    wall_s = time.perf_counter() - started
    header = brokers_header(next(iter(metas.values())), jobs=jobs, repeat=repeat, wall_s=wall_s)
    command = command_line(brokers, jobs, repeat)
    for line in side_by_side(runs, metas, first, command=command, header=header):
        out(line)
    return runs


def _alternating_runs(
    urls: dict[str, str],
    *,
    database_url: str,
    redis_url: str,
    jobs: int,
    repeat: int,
    out: Callable[[str], None],
) -> tuple[dict[str, list[dict[str, float]]], dict[str, dict[str, str]], dict[str, float]]:
    """`repeat` runs on each broker of `urls` (spec: URL), the order flipping every run so that
    neither broker always runs first; prints a line per run. Returns each broker's runs, the
    meta of each broker's first run, and the very first run (the only one with the fold
    arithmetic, which no broker takes part in)."""
    brokers = list(urls)
    runs: dict[str, list[dict[str, float]]] = {spec: [] for spec in brokers}
    metas: dict[str, dict[str, str]] = {}
    first: dict[str, float] = {}
    for n in range(repeat):
        for spec in brokers if n % 2 == 0 else list(reversed(brokers)):
            r, _, meta = _run(
                database_url=database_url,
                redis_url=redis_url,
                broker_url=urls[spec],
                jobs=jobs,
                fold_arithmetic=not first,
            )
            first = first or r
            runs[spec].append(r)
            metas.setdefault(spec, meta)
            out(run_line(n, repeat, spec, r, jobs))
    return runs, metas, first
