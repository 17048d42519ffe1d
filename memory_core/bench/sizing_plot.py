"""The plot of `agent-memory bench sizing` (matplotlib, Agg canvas; optional: `pip install
'agent-memory[bench]'`): finalize and no-op jobs/s against worker concurrency, one line per
pool, and fold jobs/s beside it with the ceiling its LLM latency sets."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

from memory_core.bench.bench_worker import POOLS
from memory_core.bench.sizing_points import require_matplotlib
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from memory_core.bench.sizing_points import Point, SizingResult

COLORS = {"prefork": "#1f77b4", "threads": "#ff7f0e", "gevent": "#2ca02c", "solo": "#7f7f7f"}


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
