"""The metric samples the project exports, by name, with their labels: what a dashboard query
or an alert rule may name (tests/test_dashboard.py, tests/test_alerts.py)."""

from __future__ import annotations

import re
import time

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from memory_core import metrics

# A metric name of ours, or of RabbitMQ's plugin, with its label matchers if it has any.
NAME = re.compile(r"\b((?:memory|rabbitmq)_[a-z0-9_]+)\b(\{[^}]*\})?")
MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def query_labels(expr: str, known: dict[str, set[str]], where: str) -> set[str]:
    """Assert that PromQL `expr` names metrics of `known` (sample name -> labels), each
    matcher and `by (...)` label one they have; return the labels of the metrics it names."""
    used = NAME.findall(expr)
    assert used, f"{where}: {expr} names no metric"
    labels: set[str] = set()
    for name, matchers in used:
        assert name in known, f"{where}: {name} is not exported"
        labels |= known[name]
        for label in MATCHER.findall(matchers):
            assert label in known[name], f"{where}: {name} has no {label}"
    for group in BY.findall(expr):
        for label in filter(None, (g.strip() for g in group.split(","))):
            assert label in labels, f"{where}: by ({label}) in {expr}"
    return labels


def exported() -> dict[str, set[str]]:
    """Sample name -> its labels, for every metric the project exports."""
    out: dict[str, set[str]] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        name, labels = value._name, set(value._labelnames)
        if isinstance(value, Counter):
            out[f"{name}_total"] = labels
        elif isinstance(value, Histogram):
            for suffix in ("_bucket", "_sum", "_count"):
                out[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            assert isinstance(value, Gauge), value
            out[name] = labels
    lag = metrics.FoldLagCollector("postgresql://unused", threshold=20)
    lag._cached = (time.monotonic(), 1.0, 0.0, 0.0, 0.0, 0.0)  # what a scrape would measure
    for family in lag.collect():
        out[family.name] = set()
    return out
