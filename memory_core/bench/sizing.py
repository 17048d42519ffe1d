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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

from memory_core.bench.bench_worker import POOLS, check_worker_options
from memory_core.bench.broker_adapters import without_credentials
from memory_core.bench.common import json_logs_to_devnull, machine
from memory_core.bench.fold_bench import FoldBench
from memory_core.bench.workers_bench import WorkersBench
from memory_core.queues import FINALIZE_QUEUE, FOLD_QUEUE, is_amqp

if TYPE_CHECKING:
    from matplotlib.axes import Axes

COMMAND = "agent-memory bench sizing"
DEFAULT_FINALIZE = "prefork:1,2,4,8;threads:4,8,16;gevent:8,32;prefork:4@4"
DEFAULT_FOLD = "prefork:2,4;threads:8,32;gevent:32"
DEFAULT_JOBS, DEFAULT_FOLDS, DEFAULT_LATENCY_S = 800, 48, 0.5
DEFAULT_PLOT = Path("docs/bench/sizing-throughput.png")
INSTALL_HINT = "pip install 'agent-memory[bench]'"
COLORS = {"prefork": "#1f77b4", "threads": "#ff7f0e", "gevent": "#2ca02c", "solo": "#7f7f7f"}


@dataclass(frozen=True)
class Point:
    """One worker shape of the sweep."""

    pool: str
    concurrency: int
    prefetch: int = 1

    @property
    def label(self) -> str:
        return f"{self.pool} -c {self.concurrency} prefetch {self.prefetch}"


def parse_points(spec: str) -> list[Point]:
    """`prefork:1,2,4;threads:8@4`: groups `pool:concurrency,...` separated by `;`, each
    concurrency optionally `@prefetch` (default 1). Empty: no point. ValueError if malformed."""
    points: list[Point] = []
    for group in (g.strip() for g in spec.split(";")):
        if not group:
            continue
        pool, sep, values = group.partition(":")
        if not sep or not values.strip():
            raise ValueError(f"bad sizing points {group!r}: expected pool:c1,c2 (e.g. threads:4,8)")
        for item in (v.strip() for v in values.split(",") if v.strip()):
            c, _, p = item.partition("@")
            try:
                point = Point(pool.strip(), int(c), int(p) if p else 1)
            except ValueError:
                raise ValueError(f"bad sizing point {pool}:{item!r}: integers expected") from None
            if point in points:
                raise ValueError(f"sizing point {point.label} named twice")
            points.append(point)
    return points


@dataclass
class SizingResult:
    """Every run of every point (several with `repeat`), and what was printed."""

    finalize: dict[Point, list[dict[str, float]]] = field(default_factory=dict)
    fold: dict[Point, list[dict[str, float]]] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    plot: Path | None = None


def require_matplotlib() -> None:
    if importlib.util.find_spec("matplotlib") is None:
        raise RuntimeError(f"the sizing plot needs matplotlib: {INSTALL_HINT} (or --plot '')")


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
    started = time.perf_counter()
    result = SizingResult()
    plan = [("finalize", p) for p in fin] + [("fold", p) for p in fol]
    metas: dict[str, dict[str, str]] = {}
    urls = {"database_url": database_url, "redis_url": redis_url, "broker_url": broker_url}
    for n in range(repeat):
        for i, (queue, p) in enumerate(plan if n % 2 == 0 else list(reversed(plan))):
            if queue == "finalize":
                r, meta = _finalize_point(p, jobs=jobs, **urls)
                result.finalize.setdefault(p, []).append(r)
                got = f"finalize {r['finalize.jobs_s']:,.0f}/s, no-op {r['noop.jobs_s']:,.0f}/s"
            else:
                r, meta = _fold_point(p, folds=folds, latency_s=llm_latency_s, **urls)
                result.fold.setdefault(p, []).append(r)
                got = f"{r['fold.jobs_s']:,.1f} folds/s"
            metas.setdefault(queue, meta)
            out(f"pass {n + 1}/{repeat}, point {i + 1}/{len(plan)}: {queue} {p.label}: {got}")
    # Tables in the order the points were named, whatever order the last pass ran them in.
    result.finalize = {p: result.finalize[p] for p in fin}
    result.fold = {p: result.fold[p] for p in fol}
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
        *fin_notes,
        *fold_notes,
    ]
    if fin:
        meta = metas["finalize"]
        lines += [
            "",
            f"finalize workers: a worker on {FINALIZE_QUEUE} alone, e.g. `{meta['worker']}`; "
            f"jobs={jobs} per point over {meta['threads']} threads (no turn folds), "
            "rounds F N N F F N N F",
            "",
            *finalize_table(result.finalize, jobs),
        ]
    if fol:
        meta = metas["fold"]
        lines += [
            "",
            f"fold workers: a worker on {FOLD_QUEUE} alone, e.g. `{meta['worker']}`; "
            f"folds={folds} per point (11 turns each, one job per thread, pushed at once); the "
            f"fake LLM answers each request after {llm_latency_s:g} s",
            "",
            *fold_table(result.fold, folds, llm_latency_s),
        ]
    if plot is not None:
        title = f"{COMMAND} · {lines[1]}\n{machine()}"
        result.plot = draw_plot(result, plot, title=title, latency_s=llm_latency_s)
        lines += ["", f"plot: {plot}"]
    for line in lines:
        out(line)
    return result


def _x_axis(ax: Axes, points: Sequence[Point]) -> None:
    ticks = sorted({p.concurrency for p in points})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("worker concurrency (-c)")
    ax.grid(True, alpha=0.3)


def _lines_per_pool(
    ax: Axes, runs: dict[Point, list[dict[str, float]]], key: str, what: str, *, hollow: bool
) -> None:
    """One line per pool (prefetch 1), the other prefetch settings as single stars; `hollow`:
    dashed, with hollow markers (the no-op beside finalize)."""
    face = "white" if hollow else None  # None: the line's color
    for pool in POOLS:
        pts = [p for p in runs if p.pool == pool and p.prefetch == 1]
        pts.sort(key=lambda p: p.concurrency)
        if pts:
            ys = [median(r[key] for r in runs[p]) for p in pts]
            xs = [p.concurrency for p in pts]
            style = "--" if hollow else "-"
            label = f"{what}, {pool}"
            ax.plot(xs, ys, style, color=COLORS[pool], marker="o", label=label, mfc=face)
    for p, rs in runs.items():
        if p.prefetch != 1:
            y = median(r[key] for r in rs)
            label = f"{what}, {p.pool} -c {p.concurrency} prefetch {p.prefetch}"
            ax.plot([p.concurrency], [y], "*", color=COLORS[p.pool], ms=13, label=label, mfc=face)


def draw_plot(result: SizingResult, path: Path, *, title: str, latency_s: float) -> Path:
    """finalize and no-op jobs/s vs concurrency, one line per pool; fold jobs/s beside it."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [q for q, runs in (("finalize", result.finalize), ("fold", result.fold)) if runs]
    fig = Figure(figsize=(6.2 * len(panels), 5.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, queue in zip(axes, panels, strict=True):
        if queue == "finalize":
            _lines_per_pool(ax, result.finalize, "finalize.jobs_s", "finalize", hollow=False)
            _lines_per_pool(ax, result.finalize, "noop.jobs_s", "no-op", hollow=True)
            ax.set_title(f"{FINALIZE_QUEUE}: jobs/s through one worker")
            _x_axis(ax, list(result.finalize))
        else:
            _lines_per_pool(ax, result.fold, "fold.jobs_s", "folds", hollow=False)
            if latency_s > 0:
                cs = sorted({p.concurrency for p in result.fold})
                ceiling = [c / latency_s for c in cs]
                ax.plot(cs, ceiling, ":", color="#7f7f7f", label=f"ceiling c / {latency_s:g} s")
                top = max(median(r["fold.jobs_s"] for r in rs) for rs in result.fold.values())
                ax.set_ylim(0, top * 1.6)  # the ceiling runs off the top: the measured matter
            ax.set_title(f"{FOLD_QUEUE}: folds/s, LLM answering after {latency_s:g} s")
            _x_axis(ax, list(result.fold))
        ax.set_ylim(bottom=0)
        ax.set_ylabel("jobs/s")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fig.suptitle(title, fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
