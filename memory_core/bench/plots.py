"""PNG plots of a benchmark's latency distributions: each figure beside its raw limit.

`write_latency_plots` draws, for each `Pair`, the distribution of the product call and of its
raw limit on one log-scaled µs axis (histogram above, ECDF below), with each side's p50 and p99
and the goal (goal x raw p50) as vertical lines. A table gives two numbers per side; the plot
shows the shape between them (a second mode, a long tail, a shift of the whole curve).

Matplotlib is optional (`pip install 'agent-memory[bench]'`) and imported only here, when a
plot is drawn. No pyplot: figures are plain `matplotlib.figure.Figure` objects rendered by the
Agg canvas, so nothing opens a window or touches a global figure registry.
"""

from __future__ import annotations

import importlib
import math
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memory_core.bench.common import Pair, pct

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

INSTALL_HINT = "pip install 'agent-memory[bench]'"
PREFIX = "core"
OVERVIEW = f"{PREFIX}-overview.png"
DPI = 110
CORE_COLOR, RAW_COLOR, GOAL_COLOR = "#1f77b4", "#7f7f7f", "#d62728"
_KEY = re.compile(r"[A-Za-z0-9_.-]+")


def require_matplotlib() -> None:
    """Raise a RuntimeError naming the extra to install if matplotlib cannot be imported."""
    try:
        # The top-level package first: when it is hidden (None in sys.modules), this fails
        # even if its submodules were imported before.
        for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
            importlib.import_module(name)
    except ImportError as exc:
        raise RuntimeError(
            f"plots need matplotlib, which is not installed: {INSTALL_HINT} ({exc})"
        ) from exc


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no pyplot, no screen)."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig: Figure, path: Path) -> Path:
    """Write fig as a PNG at path (parent folders created); return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI, metadata={"Software": None})
    return path


def write_latency_plots(pairs: Sequence[Pair], out_dir: Path, *, title_note: str) -> list[Path]:
    """One PNG per pair, `<out_dir>/core-<key>.png`, then `core-overview.png` of them all.

    title_note (e.g. the command, date and machine) is printed at the foot of every figure.
    Returns the files written, in that order.
    """
    require_matplotlib()
    if not pairs:
        raise ValueError("no pairs to plot")
    keys = [p.key for p in pairs]
    for p in pairs:
        if not _KEY.fullmatch(p.key):
            raise ValueError(f"pair key {p.key!r} is not usable in a file name")
        if not p.core or not p.raw:
            raise ValueError(f"pair {p.key!r} has no samples")
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate pair keys: {keys}")
    written = []
    for p in pairs:
        fig = _pair_figure(p, title_note)
        written.append(save_figure(fig, out_dir / f"{PREFIX}-{p.key}.png"))
    written.append(save_figure(_overview_figure(pairs, title_note), out_dir / OVERVIEW))
    return written


# -- drawing ------------------------------------------------------------------------------


class _Side:
    """One side of a pair in µs, with the table's own (nearest-rank) percentiles."""

    def __init__(self, samples_ns: list[int]) -> None:
        self.us = sorted(max(v, 1) / 1000.0 for v in samples_ns)  # log axis: no zeros
        self.p50, self.p99 = pct(samples_ns, 0.50), pct(samples_ns, 0.99)


def _sides(p: Pair) -> tuple[_Side, _Side, float]:
    core, raw = _Side(p.core), _Side(p.raw)
    return core, raw, p.goal * raw.p50


def _verdict(p: Pair, core: _Side, raw: _Side) -> str:
    ratio = core.p50 / raw.p50
    verdict = "PASS" if ratio <= p.goal else "MISS"
    if p.bound:  # not a figure of ours: what the goal leaves to any implementation
        return f"lower bound: ratio p50 {ratio:.2f}x, against a goal of <= {p.goal}x: {verdict}"
    return f"ratio p50 {ratio:.2f}x (goal <= {p.goal}x): {verdict}"


def _side_name(p: Pair, *, short: bool = False) -> str:
    if short:
        return "bound" if p.bound else "core"
    return "lower bound (not a product call)" if p.bound else "core (the product call)"


def _pair_figure(p: Pair, title_note: str) -> Figure:
    core, raw, goal = _sides(p)
    fig = new_figure(9.0, 6.6)
    hist_ax, cdf_ax = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    lo = min(core.us[0], raw.us[0], goal)
    hi = max(core.us[-1], raw.us[-1], goal)
    # About 2 sqrt(n) bins (20 to 70): fine enough to show modes, coarse enough not to be noise.
    bins = _log_bins(lo, hi, round(min(70, max(20, 2 * math.sqrt(len(core.us))))))
    ours = _side_name(p, short=True)
    for side, color, name in ((raw, RAW_COLOR, "raw limit"), (core, CORE_COLOR, ours)):
        weights = [1.0 / len(side.us)] * len(side.us)
        hist_ax.hist(
            side.us, bins=bins, weights=weights, histtype="stepfilled", alpha=0.35, color=color
        )
        hist_ax.hist(side.us, bins=bins, weights=weights, histtype="step", color=color, lw=1.2)
        for ax in (hist_ax, cdf_ax):
            ax.axvline(side.p50, color=color, lw=1.6, ls="-")
            ax.axvline(side.p99, color=color, lw=1.3, ls=":")
        _ecdf(cdf_ax, side, color, f"{name}: p50 {side.p50:,.1f} µs · p99 {side.p99:,.1f} µs")
    for ax in (hist_ax, cdf_ax):
        ax.axvline(goal, color=GOAL_COLOR, lw=1.4, ls="--")
        ax.grid(True, which="major", alpha=0.3)
    hist_ax.set_ylabel("share of calls per bin")
    cdf_ax.set_ylabel("share of calls ≤ x")
    cdf_ax.set_ylim(0, 1.01)
    cdf_ax.set_xlabel("µs per call (log scale)")
    _log_x(cdf_ax, lo, hi)
    _legend(hist_ax, p, core, raw, goal)
    fig.suptitle(_wrap(p.label, 90), fontsize=12, fontweight="bold")
    hist_ax.set_title(
        _wrap(f"raw limit (same run): {p.raw_label}", 110) + f"\n{_verdict(p, core, raw)}",
        fontsize=9,
    )
    _note(fig, title_note)
    return fig


def _overview_figure(pairs: Sequence[Pair], title_note: str) -> Figure:
    cols = 2 if len(pairs) > 1 else 1
    rows = math.ceil(len(pairs) / cols)
    fig = new_figure(6.0 * cols, 3.2 * rows + 0.9)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, p in zip(axes, pairs, strict=False):
        core, raw, goal = _sides(p)
        _ecdf(ax, raw, RAW_COLOR, f"raw p50 {raw.p50:,.1f} · p99 {raw.p99:,.1f} µs")
        ours = _side_name(p, short=True)
        _ecdf(ax, core, CORE_COLOR, f"{ours} p50 {core.p50:,.1f} · p99 {core.p99:,.1f} µs")
        for side, color in ((raw, RAW_COLOR), (core, CORE_COLOR)):
            ax.axvline(side.p50, color=color, lw=1.2)
            ax.axvline(side.p99, color=color, lw=1.0, ls=":")
        ax.axvline(goal, color=GOAL_COLOR, lw=1.2, ls="--", label=f"goal {goal:,.1f} µs")
        _log_x(ax, min(core.us[0], raw.us[0], goal), max(core.us[-1], raw.us[-1], goal))
        ax.set_ylim(0, 1.01)
        ax.grid(True, which="major", alpha=0.3)
        ax.set_title(f"{p.key}: {_verdict(p, core, raw)}", fontsize=9)
        ax.legend(loc="best", fontsize=7)
        ax.tick_params(labelsize=8)
    for ax in axes[len(pairs) :]:
        ax.set_visible(False)
    fig.suptitle(
        "core figures: ECDF of µs per call (log x), core vs raw limit; "
        "solid p50, dotted p99, dashed goal",
        fontsize=11,
    )
    _note(fig, title_note)
    return fig


def _ecdf(ax: Axes, side: _Side, color: str, label: str) -> None:
    n = len(side.us)
    shares = [(i + 1) / n for i in range(n)]
    ax.step(side.us, shares, where="post", color=color, lw=1.5, label=label)


def _legend(ax: Axes, p: Pair, core: _Side, raw: _Side, goal: float) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ours = _side_name(p, short=True)
    handles = [
        Patch(facecolor=CORE_COLOR, alpha=0.5, label=_side_name(p)),
        Line2D([], [], color=CORE_COLOR, lw=1.6, label=f"{ours} p50 {core.p50:,.1f} µs"),
        Line2D([], [], color=CORE_COLOR, lw=1.3, ls=":", label=f"{ours} p99 {core.p99:,.1f} µs"),
        Patch(facecolor=RAW_COLOR, alpha=0.5, label="raw limit"),
        Line2D([], [], color=RAW_COLOR, lw=1.6, label=f"raw p50 {raw.p50:,.1f} µs"),
        Line2D([], [], color=RAW_COLOR, lw=1.3, ls=":", label=f"raw p99 {raw.p99:,.1f} µs"),
        Line2D([], [], color=GOAL_COLOR, lw=1.4, ls="--", label=f"goal {p.goal}x raw p50"),
        Line2D([], [], lw=0, label=f"  = {goal:,.1f} µs"),
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=8, framealpha=0.9)


def _log_bins(lo: float, hi: float, n: int) -> list[float]:
    lo, hi = lo / 1.02, hi * 1.02
    step = (math.log10(hi) - math.log10(lo)) / n
    return [10 ** (math.log10(lo) + i * step) for i in range(n + 1)]


def _log_x(ax: Axes, lo: float, hi: float) -> None:
    """Log x axis with plain-number ticks at 1-2-5 steps (a span under a decade still reads)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_xlim(lo / 1.1, hi * 1.1)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(_tick))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _tick(value: float, _pos: Any) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def _wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _note(fig: Figure, title_note: str) -> None:
    """The command, date and machine at the foot (constrained layout keeps room for it)."""
    fig.supxlabel(title_note, fontsize=7, color="#555555", ha="left", x=0.01)
