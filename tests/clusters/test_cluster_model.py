"""The model-based test on a Redis Cluster, with the cluster's faults as its Redis rules
(tests/support/cluster_model.py): a primary killed -9 and its failover, a slot half migrated
(ASK, TRYAGAIN), recovery; interleaved with saves, redeliveries, crashes after COMMIT, folds,
copy expiry, Postgres faults and strangers. After every step the invariants of
tests/test_model.py hold: every turn once and in order, the owner reads every turn, strangers
get nothing, no save or fold raises, summaries within their bound.

`make test` runs a short deterministic run (6 examples of 30 steps); the long run:

    MEMORY_MODEL_EXAMPLES=100 MEMORY_MODEL_STEPS=60 make test \\
        PYTEST_ARGS="tests/clusters/test_cluster_model.py -o timeout=3600"
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from memory_core.devservices.redis_cluster import ClusterServer
from tests.support.cluster_faults import FaultyCluster
from tests.support.cluster_model import ClusterMemoryMachine
from tests.support.memory_model import World
from tests.support.model_world import model_world
from tests.support.replay import Drawn, Step, replay, step


@pytest.fixture(scope="module")
def cluster_world(redis_cluster: ClusterServer) -> Iterator[World]:
    faulty = FaultyCluster(redis_cluster)
    with model_world(faulty) as world:
        yield world
    faulty.up()
    faulty.close()


def _faults(world: World) -> FaultyCluster:
    assert isinstance(world.redis, FaultyCluster)
    return world.redis


def test_memory_guarantees_hold_on_a_cluster_under_its_faults(cluster_world: World) -> None:
    examples = int(os.environ.get("MEMORY_MODEL_EXAMPLES", "6"))
    steps = int(os.environ.get("MEMORY_MODEL_STEPS", "30"))
    run_state_machine_as_test(
        lambda: ClusterMemoryMachine(cluster_world),  # type: ignore[arg-type]
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            derandomize="MEMORY_MODEL_EXAMPLES" not in os.environ,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    faults = _faults(cluster_world)
    print(f"\ncluster model: {faults.kills} primaries killed, {faults.migrations} slots moved")


def _saves(n: int, i: int = 0) -> list[Step]:
    return [step("save", i=i, text=None, big_sql=False)] * n


# Each cluster fault under every kind of call, whatever the short random run draws.
EVERY_FAULT = [
    *_saves(3),
    *_saves(2, i=1),
    step("redis_fault", i=0),  # thread 0's primary killed -9
    *_saves(2),
    step("fold", i=0, mode="ok"),
    step("stranger_reads", i=0, who="alice "),
    step("crash_after_commit", i=1),
    step("redis_recovers"),  # failover done, the node back as a replica
    step("redeliver", i=1, data=Drawn(1)),
    *_saves(2),
    step("slot_migrating", i=1),  # thread 1's slot half moved
    *_saves(2, i=1),
    step("expire_copy", i=1),
    step("fold", i=1, mode="llm-free"),
    *_saves(1, i=1),
    step("redis_recovers"),  # the slot on its new node
    *_saves(2, i=1),
    step("fold", i=1, mode="ok"),
]


def test_memory_guarantees_hold_through_each_cluster_fault(cluster_world: World) -> None:
    faults = _faults(cluster_world)
    kills, migrations = faults.kills, faults.migrations
    replay(ClusterMemoryMachine(cluster_world), EVERY_FAULT)
    assert (faults.kills, faults.migrations) == (kills + 1, migrations + 1)
