"""Smoke tests of `agent-memory bench workers`: it runs end to end, on Redis and on RabbitMQ.

No timing assertions (the figures depend on the machine; docs/BENCHMARKS.md holds real runs).
What is asserted exactly are the bench's invariants: every job it enqueued ran (the finalize
rows landed, the worker counted every no-op), nothing is left on the broker, everything it
created is gone (threads, its RabbitMQ vhost or Redis keys); and one correctness property of the
fold arithmetic: a 100-turn thread costs 8 LLM calls (folds at turns 21, 32, ..., 98).
"""

from __future__ import annotations

import math
import os
import subprocess
import uuid

import pytest
import redis
from sqlalchemy import text

from memory_core.bench.workers import COMMAND, bench_workers, bench_workers_brokers
from memory_core.devservices.rabbitmq import ensure_rabbitmq
from memory_core.io.db import get_engine
from memory_core.settings import get_settings
from tests.support.brokers import RABBITMQCTL

pytestmark = pytest.mark.workers  # the bench starts its own

FIGURES = (
    "finalize.jobs_s",
    "noop.jobs_s",
    "finalize.ratio",
    "finalize.jobs_s_from_pickup",
    "noop.jobs_s_from_pickup",
    "finalize.ratio_from_pickup",
    "finalize.jobs_s_with_folds",
    "finalize.folds",
    "enqueue.jobs_s",
    "pickup_ms.p50",
    "pickup_ms.max",
    "task.finalize_turn_p50_ms",
    "task.fold_thread_p50_ms",
    "task.bench_noop_p50_ms",
    "task.fold_share",
    "wall_s",
)
FOLD_FIGURES = ("llm_calls_100_turns", "prompt.tokens_early", "prompt.tokens_late", "prompt.ratio")
INVARIANTS = ("jobs.finalized", "jobs.noop_done", "broker.left")


def _assert_invariants(results: dict[str, float], jobs: int) -> None:
    assert set(FIGURES) <= results.keys()
    for key in FIGURES:
        value = results[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    assert results["jobs.finalized"] == jobs  # every finalize job committed its turn, once
    assert results["jobs.noop_done"] == jobs  # the worker ran every no-op job
    assert results["broker.left"] == 0  # nothing queued, unacked or dead-lettered


def _assert_nothing_left(settings_database_url: str) -> None:
    with get_engine(settings_database_url).connect() as conn:  # everything it made is gone
        left = conn.scalar(
            text("SELECT count(*) FROM conversation_threads WHERE owner_id LIKE 'benchw-%'")
        )
        seen = conn.scalar(
            text(
                "SELECT count(*) FROM memory_settings_seen "
                "WHERE fingerprint LIKE 'key_prefix=chat_conversation:benchw:%'"
            )
        )
    assert (left, seen) == (0, 0)


def _bench_vhosts() -> list[str]:
    out = subprocess.run(
        [RABBITMQCTL, "-q", "list_vhosts", "--no-table-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [v for v in out.split() if v.startswith("agent_memory_benchw_")]


def test_bench_workers_reports_every_figure_and_8_llm_calls_per_100_turns() -> None:
    settings = get_settings()
    # The bench worker needs the broker to itself: this session's own broker database, which
    # in-process tests may have left fold jobs in (nothing consumes them).
    broker = redis.Redis.from_url(settings.celery_broker_url)
    broker.flushdb()
    lines: list[str] = []
    results = bench_workers(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        broker_url=settings.celery_broker_url,
        jobs=40,
        out=lines.append,
    )
    _assert_invariants(results, 40)
    for key in FOLD_FIGURES:
        assert math.isfinite(results[key]) and results[key] > 0, key
    assert results["llm_calls_100_turns"] == 8
    assert lines[0].startswith(f"$ {COMMAND} --jobs 40 --broker-url redis://")
    verdicts = [line for line in lines if line.endswith(("| PASS |", "| MISS |"))]
    assert len(verdicts) == 3
    assert (
        "| LLM calls for a 100-turn thread (folds at turns 21, 32, 43, 54, 65, 76, 87, 98)"
        in (verdicts[1])
    )
    assert any("landed: finalize 40/40, no-op 40/40" in line for line in lines)
    assert broker.dbsize() == 0  # the keys the bench created on its broker are deleted
    broker.close()
    _assert_nothing_left(settings.database_url)


def test_bench_workers_on_rabbitmq_beside_redis() -> None:
    """Both brokers in one run, side by side: RabbitMQ in a throwaway vhost (quorum queues on
    the exchange `memory`, publisher confirms), dropped at the end."""
    if not os.path.exists(RABBITMQCTL):
        pytest.skip("rabbitmqctl not found: the bench's throwaway vhost needs the local node")
    settings = get_settings()
    rabbitmq = ensure_rabbitmq(os.environ.get("MEMORY_TEST_RABBITMQ_URL"))
    broker = redis.Redis.from_url(settings.celery_broker_url)
    broker.flushdb()
    vhosts_before = _bench_vhosts()
    lines: list[str] = []
    runs = bench_workers_brokers(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        brokers=[rabbitmq, settings.celery_broker_url],
        jobs=24,  # turns 21-44 of one thread: two folds among them
        out=lines.append,
    )
    assert list(runs) == [rabbitmq, settings.celery_broker_url]
    for spec, [results] in runs.items():
        _assert_invariants(results, 24)
        assert math.isfinite(results["finalize.ratio"]), spec
    assert runs[rabbitmq][0]["llm_calls_100_turns"] == 8  # measured once, in the first run
    assert "llm_calls_100_turns" not in runs[settings.celery_broker_url][0]
    header = next(i for i, line in enumerate(lines) if line.startswith("$ "))
    assert lines[header].startswith(f"$ {COMMAND} --jobs 24 --broker-url amqp://")
    assert "guest:guest" not in "\n".join(lines)  # no credentials printed
    assert any("RabbitMQ 3." in line and "(throwaway vhost)" in line for line in lines)
    table = [line for line in lines if line.startswith("| ")]
    assert table[0].count("|") == 4  # figure, then one column per broker
    assert any(
        line.startswith("| jobs left on the broker after the run | 0 | 0 |") for line in table
    )
    assert _bench_vhosts() == vhosts_before  # its vhost is gone
    assert broker.dbsize() == 0
    broker.close()
    _assert_nothing_left(settings.database_url)


def test_a_failover_list_as_broker_runs_on_its_vhost_on_every_node_and_is_purged() -> None:
    """`--broker-url 'amqp://n1/v;amqp://n2/v'` (a cluster's failover list, as deployed): no
    throwaway vhost (rabbitmqctl here manages the machine's node only), the URL's own vhost,
    no credentials shown, its queues emptied at the end. Both entries name the machine's node,
    so the list is one a kombu client fails over within."""
    if not os.path.exists(RABBITMQCTL):
        pytest.skip("rabbitmqctl not found: the test makes a vhost on the local node")
    from memory_core.bench.broker_adapters import RabbitBroker, render_envelopes
    from memory_core.devservices.rabbitmq import drop_vhost, test_vhost
    from memory_core.io.queues import FINALIZE_TASK

    name = f"agent_memory_test_failover_{uuid.uuid4().hex[:8]}"
    node = test_vhost(ensure_rabbitmq(os.environ.get("MEMORY_TEST_RABBITMQ_URL")), name)
    try:
        broker = RabbitBroker(f"{node};{node}", "t")
        try:
            assert broker.vhost is None  # no throwaway vhost for a list
            assert "guest:guest" not in broker.where and broker.where.count(name) == 2
            broker.publish(broker.render(render_envelopes(FINALIZE_TASK, [{"n": 1}, {"n": 2}])))
            assert broker.ready() == 2
        finally:
            broker.close()
        again = RabbitBroker(f"{node};{node}", "t")
        try:
            assert again.ready() == 0  # purged by close()
        finally:
            again.close()
    finally:
        drop_vhost(name)
