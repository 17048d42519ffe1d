"""`agent-memory worker --metrics-port`: memory metrics aggregated over prefork children."""

from __future__ import annotations

import re
import sys
import urllib.request
import uuid
from collections.abc import Callable

from celery import Celery

from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.workers import WorkerProcess
from tests.support.snapshots import make_snapshot
from tests.support.workers import send_finalize


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def test_worker_serves_memory_metrics(
    start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "memory_core.cli", "worker", "-c", "2"]
    argv += ["--metrics-port", str(port), "-n", f"m{uuid.uuid4().hex[:6]}@%h"]
    w = start_worker(argv=argv, env={"MEMORY_METRICS_ADDR": "127.0.0.1"})
    tid = uuid.uuid4()
    snaps = [make_snapshot(tid, n) for n in range(1, 4)]
    for snap in snaps:
        send_finalize(agent, snap)
    send_finalize(agent, snaps[0])  # a duplicate
    send_finalize(agent, {"thread_id": "broken"})  # rejected

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    def done() -> str | None:
        # Two children run the five jobs in any order: wait for all of them to be counted.
        text = scrape()
        counted = [
            _metric(text, f'memory_finalize_total{{status="{status}"}}')
            for status in ("rejected", "saved", "duplicate")
        ]
        return text if sum(c or 0 for c in counted) >= 5 else None

    text = wait_for(done, 60, "metrics", w.log)
    assert _metric(text, 'memory_finalize_total{status="saved"}') == 3.0
    assert _metric(text, 'memory_finalize_total{status="duplicate"}') == 1.0
    for gauge in ("memory_fold_lag_threads", "memory_fold_retry_waiting_threads"):
        assert _metric(text, gauge) is not None, gauge
    assert "memory_fold_seconds_bucket" in text or "memory_fold_seconds" in text
