"""What the async benchmark's parts share: interleaved timing of coroutines beside blocking
calls, a comparison row (two sides of one figure), and how its tables print."""

from __future__ import annotations

import gc
import importlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memory_core.bench.broker_adapters import without_credentials
from memory_core.bench.common import pct

COMMAND = "agent-memory bench async"
DEFAULTS = {
    "iterations": 2000,
    "agents": 200,
    "pool": 32,
    "rounds": 5,
    "samples": 20,
    "backlog": 50,
}
PEERS_SKIPPED = (
    "peer rows skipped: run `make bench-env` and `.venv-bench/bin/agent-memory bench async`"
)

# One call per iteration: a coroutine function (awaited) or a blocking function (called on the
# event loop's thread; nothing else runs on the loop meanwhile).
Side = Callable[[int], Any]


async def interleaved(
    n: int, warmup: int, sides: Sequence[Side], cpu: list[int] | None = None
) -> list[list[int]]:
    """Time each side once per iteration, the order rotating every iteration (so no side
    always goes first); nanoseconds per call after `warmup` iterations, one list per side.
    `cpu`, if given, gets each side's total CPU time of this process (ns, timed calls)."""
    out: list[list[int]] = [[] for _ in sides]
    k = len(sides)
    spent = [0] * k
    gc.collect()
    for i in range(warmup + n):
        for j in range(k):
            s = (i + j) % k
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            result = sides[s](i)
            if inspect.isawaitable(result):
                await result
            elapsed, used = time.perf_counter_ns() - t0, time.process_time_ns() - c0
            if i >= warmup:
                out[s].append(elapsed)
                spent[s] += used
    if cpu is not None:
        cpu[:] = spent
    return out


@dataclass(frozen=True)
class Versus:
    """One figure beside what it is compared with, both timed in the same run (ns per call)."""

    key: str
    label: str
    other_label: str
    ns: list[int]
    other_ns: list[int]
    cpu_ns: tuple[int, int] | None = None  # total CPU of this process per side, if measured

    def figures(self) -> dict[str, float]:
        p50, p99 = pct(self.ns, 0.50), pct(self.ns, 0.99)
        o50, o99 = pct(self.other_ns, 0.50), pct(self.other_ns, 0.99)
        f = {"p50_us": p50, "p99_us": p99, "other_p50_us": o50, "other_p99_us": o99}
        f |= {"ratio": p50 / o50, "ratio_p99": p99 / o99}
        if self.cpu_ns is not None:
            f["cpu_us"] = self.cpu_ns[0] / len(self.ns) / 1000
            f["other_cpu_us"] = self.cpu_ns[1] / len(self.other_ns) / 1000
        return {f"{self.key}.{k}": v for k, v in f.items()}


def cpu_line(rows: Sequence[Versus], sides: str = "left vs right") -> str:
    """Mean CPU per call of this process, each side, for the rows that measured it."""
    parts = []
    for r in rows:
        f = r.figures()
        if f"{r.key}.cpu_us" in f:
            parts.append(
                f"{r.key} {f[f'{r.key}.cpu_us']:,.0f} vs {f[f'{r.key}.other_cpu_us']:,.0f}"
            )
    return f"CPU µs per call of this process (mean), {sides}: " + "; ".join(parts)


def versus_table(
    rows: Sequence[Versus], *, unit: str = "µs", other: str = "compared with"
) -> list[str]:
    """A markdown table: each figure, what it is compared with (same run), p50/p99, ratios."""
    scale = 1000.0 if unit == "ms" else 1.0
    lines = [
        f"| figure | p50 {unit} | p99 {unit} | {other} (same run) | p50 {unit} | p99 {unit} "
        "| ratio p50 | ratio p99 |",
        "|---|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r in rows:
        f = {k.split(".", 1)[1]: v for k, v in r.figures().items()}
        lines.append(
            f"| {r.label} | {f['p50_us'] / scale:,.1f} | {f['p99_us'] / scale:,.1f} "
            f"| {r.other_label} | {f['other_p50_us'] / scale:,.1f} "
            f"| {f['other_p99_us'] / scale:,.1f} | {f['ratio']:.2f}x | {f['ratio_p99']:.2f}x |"
        )
    return lines


def peer_sdk_version() -> str | None:
    """The installed OpenAI Agents SDK's version, or None (the peer rows are then skipped)."""
    try:
        sdk = importlib.import_module("agents")
        importlib.import_module("agents.extensions.memory")
    except ImportError:
        return None
    return str(getattr(sdk, "__version__", "?"))


def check_saved(out: Any, what: str) -> None:
    if out.status != "saved":
        raise RuntimeError(f"{what} did not save: {out}")


def command_line(options: dict[str, Any], broker_url: str | None) -> str:
    """The command that repeats this run (options that differ from the defaults)."""
    flags = "".join(f" --{k} {v}" for k, v in options.items() if k in DEFAULTS and v != DEFAULTS[k])
    if broker_url:
        flags += f" --broker-url {without_credentials(broker_url)}"
    return COMMAND + flags


def overheads(hit: Versus, get: Versus, save: Versus, raw_save: Versus) -> str:
    """Each API's p50 over its own side's raw limit."""
    f = hit.figures() | get.figures() | save.figures() | raw_save.figures()
    return (
        f"over the raw limit (p50): hit async {f['hit.p50_us'] / f['get.p50_us']:.2f}x, "
        f"sync {f['hit.other_p50_us'] / f['get.other_p50_us']:.2f}x; "
        f"save async {f['save.p50_us'] / f['raw_save.p50_us']:.2f}x, "
        f"sync {f['save.other_p50_us'] / f['raw_save.other_p50_us']:.2f}x"
    )


def all_figures(rows: list[Versus]) -> dict[str, float]:
    figures: dict[str, float] = {}
    for v in rows:
        figures |= v.figures()
    return figures
