"""`agent-memory bench sizing`: worker throughput per pool type and concurrency, per queue.

Each point of the sweep starts its own bench worker (`workers_bench.WorkersBench`) in the shape
asked for (pool, concurrency, prefetch multiplier) on one queue, as the deployment runs them:

- **finalize points**: a worker on `memory.finalize` alone. The same timed rounds as `bench
  workers` (quarters F N N F F N N F): finalize jobs/s until the last turn is committed, against
  `memory.bench_noop` jobs/s with the same payloads on the same worker and queue. The threads
  are preloaded fully folded, so no turn of the run publishes a fold (nobody would run it).
- **fold points**: a worker on `memory.fold` alone (Redis broker only: the jobs are pushed
  onto `memory.fold` directly). One fold of 11 turns is due in each of `folds` threads; all
  the jobs are pushed at once and timed until every summary is stored. The bench's fake LLM
  holds each request `llm_latency_s` before it answers: a fold worker waits on its LLM, and
  the ceiling of a worker is `concurrency / latency` folds/s until its CPU runs out.

Besides jobs/s, each point reports the CPU the worker's own processes used per job (main and
pool children; not Postgres's or Redis's). It prints a markdown table per queue, with the
command and the date, and draws `docs/bench/sizing-throughput.png` (matplotlib, Agg canvas,
optional: `pip install 'agent-memory[bench]'`).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import median

from memory_core.bench.bench_worker import check_worker_options
from memory_core.bench.broker_adapters import without_credentials
from memory_core.bench.common import json_logs_to_devnull, machine
from memory_core.bench.fold_bench import FoldBench
from memory_core.bench.sizing_plot import draw_plot
from memory_core.bench.sizing_points import (
    INSTALL_HINT,
    Point,
    SizingResult,
    parse_points,
    require_matplotlib,
)
from memory_core.bench.workers_bench import WorkersBench
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE, is_amqp

COMMAND = "agent-memory bench sizing"
DEFAULT_FINALIZE = "prefork:1,2,4,8;threads:4,8,16;gevent:8,32;prefork:4@4"
DEFAULT_FOLD = "prefork:2,4;threads:8,32;gevent:32"
DEFAULT_JOBS, DEFAULT_FOLDS, DEFAULT_LATENCY_S = 800, 48, 0.5
DEFAULT_PLOT = Path("docs/bench/sizing-throughput.png")


def _usable(
    points: list[Point], *, default: bool, redis_only: bool, broker_url: str, what: str
) -> tuple[list[Point], list[str]]:
    """The points this machine and broker can run. From the default sweep, gevent points are
    skipped when gevent is missing and fold points on a RabbitMQ broker, each with a note;
    points asked for explicitly must all run (ValueError / RuntimeError otherwise)."""
    notes: list[str] = []
    if redis_only and points and is_amqp(broker_url):
        if not default:
            raise ValueError(f"{what} points need a Redis broker (redis://)")
        return [], [f"{what}: skipped, fold jobs are pushed onto a Redis broker only"]
    if default and importlib.util.find_spec("gevent") is None:
        if any(p.pool == "gevent" for p in points):
            notes.append(f"{what}: gevent points skipped, gevent is not installed ({INSTALL_HINT})")
        points = [p for p in points if p.pool != "gevent"]
    for p in points:
        check_worker_options(p.pool, p.concurrency, p.prefetch, FINALIZE_QUEUE)
    return points, notes


def _finalize_point(
    p: Point, *, database_url: str, redis_url: str, broker_url: str, jobs: int
) -> tuple[dict[str, float], dict[str, str]]:
    bench = WorkersBench(
        database_url,
        redis_url,
        broker_url,
        jobs,
        pool=p.pool,
        concurrency=p.concurrency,
        prefetch=p.prefetch,
        queues=FINALIZE_QUEUE,
    )
    try:
        with json_logs_to_devnull():
            r = bench.throughput()
        r["broker.left"] = float(bench.stop_worker())
        meta = {"versions": bench.versions(), "worker": bench.worker.command}
        meta["threads"] = str(bench.n_threads)
    finally:
        bench.close()
    return r, meta


def _fold_point(
    p: Point, *, database_url: str, redis_url: str, broker_url: str, folds: int, latency_s: float
) -> tuple[dict[str, float], dict[str, str]]:
    bench = FoldBench(
        database_url,
        redis_url,
        broker_url,
        folds,
        pool=p.pool,
        concurrency=p.concurrency,
        prefetch=p.prefetch,
        queues=FOLD_QUEUE,
    )
    try:
        with json_logs_to_devnull():
            r = bench.fold_throughput(folds, latency_s)
        r["broker.left"] = float(bench.stop_worker())
        meta = {"versions": bench.versions(), "worker": bench.worker.command}
    finally:
        bench.close()
    return r, meta


def command_line(
    broker_url: str,
    *,
    jobs: int,
    folds: int,
    llm_latency_s: float,
    repeat: int,
    finalize: str,
    fold: str,
    plot: Path | None,
) -> str:
    """The command that repeats this sweep, without the broker's credentials."""
    flags = f" --broker-url {without_credentials(broker_url)}"
    flags += f" --jobs {jobs}" if jobs != DEFAULT_JOBS else ""
    flags += f" --folds {folds}" if folds != DEFAULT_FOLDS else ""
    flags += f" --llm-latency {llm_latency_s:g}" if llm_latency_s != DEFAULT_LATENCY_S else ""
    flags += f" --repeat {repeat}" if repeat != 1 else ""
    flags += f" --finalize '{finalize}'" if finalize != DEFAULT_FINALIZE else ""
    flags += f" --fold '{fold}'" if fold != DEFAULT_FOLD else ""
    flags += f" --plot '{plot or ''}'" if plot != DEFAULT_PLOT else ""
    return COMMAND + flags


def _cell(runs: list[dict[str, float]], key: str, fmt: str) -> str:
    values = [r[key] for r in runs]
    cell = fmt.format(median(values))
    if len(values) > 1:
        cell += " (" + ", ".join(fmt.format(v) for v in values) + ")"
    return cell


def finalize_table(runs: dict[Point, list[dict[str, float]]], jobs: int) -> list[str]:
    n = len(next(iter(runs.values()))) if runs else 0
    which = f"median of {n} runs; each run" if n > 1 else "one run"
    lines = [
        f"| pool | -c | prefetch | finalize jobs/s ({which}) | no-op jobs/s | finalize / no-op "
        "| worker CPU ms per finalize | per no-op | finalize p50 in task (ms) | landed, left |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for p, rs in runs.items():
        landed = all(r["jobs.finalized"] == jobs and r["jobs.noop_done"] == jobs for r in rs)
        left = sum(r["broker.left"] for r in rs)
        lines.append(
            f"| {p.pool} | {p.concurrency} | {p.prefetch} "
            f"| {_cell(rs, 'finalize.jobs_s', '{:,.0f}')} | {_cell(rs, 'noop.jobs_s', '{:,.0f}')} "
            f"| {_cell(rs, 'finalize.ratio', '{:.2f}x')} "
            f"| {_cell(rs, 'cpu_ms.finalize_per_job', '{:.1f}')} "
            f"| {_cell(rs, 'cpu_ms.noop_per_job', '{:.1f}')} "
            f"| {_cell(rs, 'task.finalize_turn_p50_ms', '{:.1f}')} "
            f"| {'all ' + str(jobs) + ' + ' + str(jobs) if landed else 'MISSING JOBS'}, "
            f"{left:.0f} left |"
        )
    return lines


def fold_table(
    runs: dict[Point, list[dict[str, float]]], folds: int, latency_s: float
) -> list[str]:
    n = len(next(iter(runs.values()))) if runs else 0
    which = f"median of {n} runs; each run" if n > 1 else "one run"
    lines = [
        f"| pool | -c | folds/s ({which}) | ceiling: c / LLM latency | worker CPU ms per fold "
        "| fold p50 in task (ms) | folded, left |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for p, rs in runs.items():
        ceiling = f"{p.concurrency / latency_s:,.1f}" if latency_s > 0 else "-"
        folded = all(r["fold.folded"] == folds for r in rs)
        left = sum(r["broker.left"] for r in rs)
        lines.append(
            f"| {p.pool} | {p.concurrency} | {_cell(rs, 'fold.jobs_s', '{:,.1f}')} | {ceiling} "
            f"| {_cell(rs, 'cpu_ms.fold_per_job', '{:.0f}')} "
            f"| {_cell(rs, 'task.fold_thread_p50_ms', '{:.0f}')} "
            f"| {'all ' + str(folds) if folded else 'MISSING FOLDS'}, {left:.0f} left |"
        )
    return lines


def _points(
    finalize: str, fold: str, broker_url: str
) -> tuple[list[Point], list[Point], list[str]]:
    """The finalize and fold points the broker can run, and notes on those it cannot."""
    fin, fin_notes = _usable(
        parse_points(finalize),
        default=finalize == DEFAULT_FINALIZE,
        redis_only=False,
        broker_url=broker_url,
        what="finalize",
    )
    fol, fold_notes = _usable(
        parse_points(fold),
        default=fold == DEFAULT_FOLD,
        redis_only=True,
        broker_url=broker_url,
        what="fold",
    )
    if not fin and not fol:
        raise ValueError("no point to measure: --finalize and --fold are both empty")
    return fin, fol, fin_notes + fold_notes


def bench_sizing(
    *,
    database_url: str,
    redis_url: str,
    broker_url: str,
    jobs: int = DEFAULT_JOBS,
    folds: int = DEFAULT_FOLDS,
    llm_latency_s: float = DEFAULT_LATENCY_S,
    repeat: int = 1,
    finalize: str = DEFAULT_FINALIZE,
    fold: str = DEFAULT_FOLD,
    plot: Path | None = DEFAULT_PLOT,
    out: Callable[[str], None] = print,
) -> SizingResult:
    """Run the sweep (`repeat` passes, the order of the points reversed every other pass),
    print a line per point as it ends, then the tables; draw the plot unless `plot` is None."""
    if jobs < 4 or folds < 1 or repeat < 1 or llm_latency_s < 0:
        raise ValueError("jobs must be >= 4, folds >= 1, repeat >= 1, the LLM latency >= 0")
    if plot is not None:
        require_matplotlib()  # before minutes of measuring
    fin, fol, notes = _points(finalize, fold, broker_url)
    started = time.perf_counter()
    urls = {"database_url": database_url, "redis_url": redis_url, "broker_url": broker_url}
    sweep = _Sweep(urls, jobs=jobs, folds=folds, latency_s=llm_latency_s, out=out)
    result, metas = sweep.run(fin, fol, repeat)
    wall_s = time.perf_counter() - started
    lines = result.lines
    command = command_line(
        broker_url,
        jobs=jobs,
        folds=folds,
        llm_latency_s=llm_latency_s,
        repeat=repeat,
        finalize=finalize,
        fold=fold,
        plot=plot,
    )
    any_meta = next(iter(metas.values()))
    lines += [
        f"$ {command}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {repeat} pass(es) · wall {wall_s:.0f} s",
        f"{machine()} · {any_meta['versions']}",
        *notes,
    ]
    lines += _tables(result, metas, jobs=jobs, folds=folds, latency_s=llm_latency_s)
    if plot is not None:
        title = f"{COMMAND} · {lines[1]}\n{machine()}"
        result.plot = draw_plot(result, plot, title=title, latency_s=llm_latency_s)
        lines += ["", f"plot: {plot}"]
    for line in lines:
        out(line)
    return result


@dataclass
class _Sweep:
    """The points run `repeat` times, the order reversed every other pass (drift on the host
    falls on every point alike); a line per point as it ends."""

    urls: dict[str, str]
    jobs: int
    folds: int
    latency_s: float
    out: Callable[[str], None]

    def run(
        self, fin: list[Point], fol: list[Point], repeat: int
    ) -> tuple[SizingResult, dict[str, dict[str, str]]]:
        result = SizingResult()
        plan = [("finalize", p) for p in fin] + [("fold", p) for p in fol]
        metas: dict[str, dict[str, str]] = {}
        for n in range(repeat):
            for i, (queue, p) in enumerate(plan if n % 2 == 0 else list(reversed(plan))):
                got, meta = self._point(result, queue, p)
                metas.setdefault(queue, meta)
                self.out(
                    f"pass {n + 1}/{repeat}, point {i + 1}/{len(plan)}: {queue} {p.label}: {got}"
                )
        # Tables in the order the points were named, whatever order the last pass ran them in.
        result.finalize = {p: result.finalize[p] for p in fin}
        result.fold = {p: result.fold[p] for p in fol}
        return result, metas

    def _point(self, result: SizingResult, queue: str, p: Point) -> tuple[str, dict[str, str]]:
        if queue == "finalize":
            r, meta = _finalize_point(p, jobs=self.jobs, **self.urls)
            result.finalize.setdefault(p, []).append(r)
            return f"finalize {r['finalize.jobs_s']:,.0f}/s, no-op {r['noop.jobs_s']:,.0f}/s", meta
        r, meta = _fold_point(p, folds=self.folds, latency_s=self.latency_s, **self.urls)
        result.fold.setdefault(p, []).append(r)
        return f"{r['fold.jobs_s']:,.1f} folds/s", meta


def _tables(
    result: SizingResult,
    metas: dict[str, dict[str, str]],
    *,
    jobs: int,
    folds: int,
    latency_s: float,
) -> list[str]:
    """The table of each queue measured, with the worker it ran and what a point is."""
    lines: list[str] = []
    if result.finalize:
        meta = metas["finalize"]
        lines += [
            "",
            f"finalize workers: a worker on {FINALIZE_QUEUE} alone, e.g. `{meta['worker']}`; "
            f"jobs={jobs} per point over {meta['threads']} threads (no turn folds), "
            "rounds F N N F F N N F",
            "",
            *finalize_table(result.finalize, jobs),
        ]
    if result.fold:
        meta = metas["fold"]
        lines += [
            "",
            f"fold workers: a worker on {FOLD_QUEUE} alone, e.g. `{meta['worker']}`; "
            f"folds={folds} per point (11 turns each, one job per thread, pushed at once); the "
            f"fake LLM answers each request after {latency_s:g} s",
            "",
            *fold_table(result.fold, folds, latency_s),
        ]
    return lines
