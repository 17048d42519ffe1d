"""Scenario: the RabbitMQ node leading `memory.finalize` killed -9 under load, on a 3-node cluster.

The broker is a private three-node cluster (memory_core/devservices/rabbitmq_cluster.py) named
by Celery's failover list, as a deployment names one: the worker, the core's `enqueue_turn`
(and the fold publisher inside the worker), and the README's "enqueue from another service"
producer all get `amqp://n1;amqp://n2;amqp://n3`. REDIS_URL names a private Redis Cluster
(`redis+cluster://` seeds), so every process runs as a deployment past one machine does. First
the demo plays on both clusters; then, half-way through 400 turns, the node leading
`memory.finalize` is killed -9 (the demo goes first: the kill leaves two nodes).

Checked: every turn handed over is stored exactly once (seq 1..n in every thread), whether its
publish was confirmed or it was retried by its caller (the snippet's producer sends again;
`enqueue_turn` saves in-process); the same worker process goes on consuming from the
survivors (turns enqueued after the kill land, with no restart); a survivor leads the queue;
folds catch up. Timed: from the kill until every confirmed job landed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory_core import RedisConversationMemory
from memory_core.devservices.poll import wait_for
from memory_core.devservices.rabbitmq_cluster import (
    RabbitClusterServer,
    start_rabbitmq_cluster,
    stop_rabbitmq_cluster,
)
from memory_core.devservices.redis_cluster import ClusterServer
from memory_core.devservices.workers import WorkerProcess
from memory_core.fold.publisher import reset_publishers
from memory_core.fold.sweep import sweep_lost_folds
from memory_core.io.queues import FINALIZE_QUEUE
from memory_core.io.redis_client import make_redis
from memory_core.settings import get_settings, reset_settings_cache
from tests.support import REPO, figures
from tests.support.agents import EnqueueLoad, JobLoad
from tests.support.state import count_stored, folds_caught_up, landed
from tests.support.tally import Tally, assert_gapless

pytestmark = pytest.mark.timeout(300)

THREADS = 4  # two through enqueue_turn, two through the README's producer
TURNS = 100  # per thread: 400 jobs
INTERVAL_S = 0.05  # between a thread's turns: the load outlasts the kill by seconds


@pytest.fixture(scope="module")
def rabbit_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitClusterServer]:
    # Laid out as `python -m memory_core.devservices` lays it out under a checkout, so that the
    # demo run from that folder finds the cluster and makes its vhost there.
    data_dir = tmp_path_factory.mktemp("rabbit-failover") / ".agent-memory" / "dev-services"
    server = start_rabbitmq_cluster(data_dir)
    yield server
    if server.stop is not None:  # reaps the node processes this one started
        server.stop()
    stop_rabbitmq_cluster(data_dir)


@pytest.fixture
def failover_broker(
    rabbit_cluster: RabbitClusterServer,
    redis_cluster: ClusterServer,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    """CELERY_BROKER_URL = the cluster's failover list and REDIS_URL = the Redis Cluster's
    seeds, for this process and its workers: the shape of a deployment past one machine."""
    url = rabbit_cluster.failover_url
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    monkeypatch.setenv("REDIS_URL", redis_cluster.url)
    # A fold publish that failed in the failover leaves the fold due, for a later turn or the
    # beat's sweep to republish after the grace (300 s in production): 3 s here.
    monkeypatch.setenv("MEMORY_FOLD_REPUBLISH_GRACE_S", "3")
    reset_settings_cache()
    reset_publishers()
    yield url
    monkeypatch.undo()
    reset_settings_cache()
    reset_publishers()


def _cluster_urls() -> dict[str, str]:
    names = ("CELERY_BROKER_URL", "REDIS_URL", "MEMORY_FOLD_REPUBLISH_GRACE_S")
    return {name: os.environ[name] for name in names}


@pytest.mark.slow
def test_the_demo_plays_on_a_redis_cluster_and_a_three_node_failover_broker(
    rabbit_cluster: RabbitClusterServer, failover_broker: str, redis_cluster: ClusterServer
) -> None:
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("MEMORY_SUMMARY_MAX_TOKENS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "memory_core.cli", "demo"],
        cwd=rabbit_cluster.root.parents[2],  # where its .agent-memory/ holds the cluster
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}\n{proc.stderr[-3000:]}"
    assert f"using Redis at {redis_cluster.url}" in out
    vhost = re.search(r"vhost (agent_memory_demo_\w+) on a private 3-node cluster", out)
    assert vhost, out[:3000]
    broker_line = out[out.index("Celery broker:") : out.index("on a private 3-node")]
    assert [f":{port}/{vhost[1]}" in broker_line for port in rabbit_cluster.ports] == [True] * 3
    assert "guest:guest" not in broker_line  # each node's password hidden
    folds = re.findall(r"turn (\d+): fold (\d) folded turns (\d+)-(\d+)", out)
    assert folds == [("21", "1", "1", "11"), ("32", "2", "12", "22"), ("43", "3", "23", "33")]
    assert "rehydrated from Postgres: identical" in out
    assert "no turn was lost: 21/21 rows in thread_messages, 21 turns" in out
    assert f"broker: deleted vhost {vhost[1]}" in out
    assert vhost[1] not in rabbit_cluster.nodes[0].ctl("list_vhosts", "--no-table-headers")


def test_the_finalize_leader_killed_minus_9_loses_and_duplicates_nothing(
    rabbit_cluster: RabbitClusterServer,
    failover_broker: str,
    worker_logs: Path,
    worker_env: dict[str, str],
    request: pytest.FixtureRequest,
) -> None:
    env = {**worker_env, **_cluster_urls(), "MEMORY_FOLD_LEASE_S": "3"}
    worker = WorkerProcess(worker_logs, env=env, cwd=REPO).start()
    request.addfinalizer(lambda: worker.stop(30))  # on a failure too (idempotent)
    nodes = {n.node: n for n in rabbit_cluster.nodes}
    core = EnqueueLoad(THREADS // 2, INTERVAL_S, max_turns=TURNS, broker_url=failover_broker)
    snippet = JobLoad(THREADS // 2, INTERVAL_S, max_turns=TURNS)
    try:
        assert rabbit_cluster.nodes[0].quorum_members()[FINALIZE_QUEUE] == sorted(nodes)
        # Ra elects no other leader without a fault: the victim is known before the load.
        victim = nodes[str(rabbit_cluster.nodes[0].quorum_leader(FINALIZE_QUEUE))]
        survivors = [n for n in rabbit_cluster.nodes if n is not victim]
        time.sleep(1.0)  # quorum queues declared > 0.5 s ago (PrivateRabbitMQ's caveat)
        core.start(), snippet.start()
        total = THREADS * TURNS
        sent = lambda: len(core.tally.sent) + len(snippet.tally.sent)  # noqa: E731
        wait_for(lambda: sent() >= total // 2, 120, "half the turns", worker.log)
        confirmed_before = set(core.enqueued) | set(snippet.tally.sent)
        at_stake = confirmed_before - landed(confirmed_before)
        killed_at = time.monotonic()
        victim.kill()  # SIGKILL to every process of the node, then reaped
        wait_for(lambda: not core.running() and not snippet.running(), 180, "the sends")
        confirmed = set(core.enqueued) | set(snippet.tally.sent)
        wait_for(lambda: landed(confirmed) == confirmed, 120, "every confirmed job", worker.log)
        landed_s = time.monotonic() - killed_at
        new_leader = survivors[0].quorum_leader(FINALIZE_QUEUE)
    finally:
        core.stop()
        snippet.stop()
    tids = core.tids + snippet.tids
    wait_for(lambda: count_stored(tids) == total, 60, "every turn", worker.log)
    settings = get_settings()
    client = make_redis(settings.redis_url)
    request.addfinalizer(client.close)
    memory = RedisConversationMemory(client, settings=settings)

    def caught_up() -> bool:
        # What beat's memory.sweep_folds does: a fold whose publish failed during the
        # failover on a thread's last turns has no later turn to republish it.
        sweep_lost_folds(memory)
        return folds_caught_up(tids)

    wait_for(caught_up, 90, "folds", worker.log, 1.0)
    lost, duplicated, rows = Tally(sent={**core.tally.sent, **snippet.tally.sent}).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert new_leader in {n.node for n in survivors}
    after_kill = {sid for sid, at in core.enqueued.items() if at > killed_at}
    after_kill |= {sid for sid, at in snippet.sent_at.items() if at > killed_at}
    assert after_kill and landed(after_kill) == after_kill, "nothing enqueued after the kill"
    assert worker.alive(), "the worker must consume from the survivors without a restart"
    worker.stop(30)
    raised = len(core.fallbacks) + snippet.send_failures
    figures.record(
        "outage.8.rabbitmq-cluster",
        scenario="the RabbitMQ node leading memory.finalize killed -9 (3-node cluster)",
        jobs=total,
        faults=(
            f"kill -9 half-way, {len(at_stake)} confirmed jobs not landed at the kill; "
            f"{len(core.fallbacks)} enqueue_turn publishes unconfirmed and saved in-process, "
            f"{snippet.send_failures} producer sends raised and were sent again"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=landed_s,
        recover=f"{landed_s:.1f} s from the kill until every confirmed job landed",
        checked=(
            f"{THREADS} threads x {TURNS} turns over Celery's failover list, half through "
            "enqueue_turn, half through the README's producer; every turn stored once, seq 1..n, "
            "folds caught up; the same worker consumed from the survivors; REDIS_URL a "
            "6-node Redis Cluster"
        ),
        send_failures=raised,
        confirmed=len(confirmed),
        after_kill=len(after_kill),
    )
