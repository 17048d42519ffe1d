"""`agent-memory bench publish` runs against the real brokers (tiny counts, no timing
assertion): every figure present and positive, the fold queue left empty, a busy broker
refused."""

from __future__ import annotations

import uuid

import pytest

from memory_core.bench.publish import BrokerInUse, bench_publish
from memory_core.fold.publisher import FOLD_QUEUE, publish_fold
from memory_core.io.queues import is_amqp
from tests.support.brokers import BROKERS, ready

pytestmark = pytest.mark.parametrize("broker", BROKERS, indirect=True)


def test_bench_publish_prints_every_figure_and_leaves_the_queue_empty(broker: str) -> None:
    lines: list[str] = []
    figures = bench_publish([broker], publishes=3, out=lines.append)
    kind = "rabbitmq" if is_amqp(broker) else "redis"
    for side in ("kept", "new"):
        for name in ("p50_us", "p99_us", "raw_p50_us", "raw_p99_us", "ratio", "ratio_p99"):
            assert figures[f"{kind}_{side}.{name}"] > 0
    assert sum(line.startswith(f"| {kind}: ") for line in lines) == 2
    assert ready(broker, FOLD_QUEUE) == 0


def test_bench_publish_refuses_a_broker_with_jobs_queued(broker: str) -> None:
    assert publish_fold(uuid.uuid4(), broker)
    with pytest.raises(BrokerInUse):
        bench_publish([broker], publishes=3, out=lambda _: None)
    assert ready(broker, FOLD_QUEUE) == 1  # nothing published, nothing purged
