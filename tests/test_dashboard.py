"""deploy/grafana/agent-memory.json against the metrics the project exports.

Every query names metrics that exist (the registry of memory_core.metrics and the fold-lag
collector, or RabbitMQ's plugin for queue depth), with labels those metrics have; every metric
the project exports is on some panel, so a new metric cannot be left off the dashboard; and the
panels are laid out without overlap on one Prometheus datasource variable.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support import REPO
from tests.support.metric_names import NAME, exported, query_labels

DASHBOARD = REPO / "deploy" / "grafana" / "agent-memory.json"
# Queue depth comes from RabbitMQ's rabbitmq_prometheus plugin (3.10), scraped per object on
# :15692/metrics/per-object: name -> its labels.
RABBITMQ = {
    "rabbitmq_queue_messages_ready": {"vhost", "queue"},
    "rabbitmq_queue_messages_unacked": {"vhost", "queue"},
}
LEGEND = re.compile(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


def _panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_every_query_names_exported_metrics_with_their_labels() -> None:
    known = exported() | RABBITMQ
    for panel in _panels():
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            labels = query_labels(target["expr"], known, panel["title"])
            for label in LEGEND.findall(target["legendFormat"]):
                assert label in labels, f"{panel['title']}: legend {{{{{label}}}}}"


def test_every_exported_metric_is_on_the_dashboard() -> None:
    on_it = {name for p in _panels() for t in p["targets"] for name, _ in NAME.findall(t["expr"])}
    families = {name.removesuffix("_sum").removesuffix("_count") for name in exported()}
    shown = {n.removesuffix("_bucket") for n in on_it} | on_it
    missing = sorted(
        f for f in families if f not in shown and f.removesuffix("_bucket") not in shown
    )
    assert not missing, f"exported but on no panel: {missing}"
    assert set(RABBITMQ) <= on_it  # the queue depth the issue asks for


def test_panels_do_not_overlap_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "agent-memory"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        cells |= mine
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
