"""The worker shapes `agent-memory bench sizing` sweeps (`Point`), their parser, and the result
the table and the plot (sizing_plot.py) are drawn from."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_HINT = "pip install 'agent-memory[bench]'"


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
