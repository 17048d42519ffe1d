"""Scenario: the RabbitMQ broker killed with -9, later restarted cleanly, under load.

A private RabbitMQ node (`PrivateRabbitMQ`, spare port, its own data) is the broker; the suite's
Redis stays cache and event stream. Agents enqueue finalize jobs with publisher confirms: a
send that returned is on the broker's disk; a send during the outage raises, and the agent
retries it (as `JobLoad` does). Checked: every accepted send lands exactly once, seq 1..n in
every thread, folds catch up; timed: from the restart until every job the broker held at the
fault has landed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.rabbitmq import PrivateRabbitMQ
from memory_core.devservices.workers import WorkerProcess
from memory_core.fold.publisher import reset_publishers
from memory_core.settings import reset_settings_cache
from tests.support import figures
from tests.support.agents import JobLoad
from tests.support.state import count_stored, folds_caught_up, landed
from tests.support.tally import assert_gapless

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

DOWN_S = 4.0


@pytest.fixture
def rabbit(monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateRabbitMQ]:
    """A RabbitMQ node of the test's own, the broker of every worker and agent it starts."""
    with PrivateRabbitMQ() as node:
        monkeypatch.setenv("CELERY_BROKER_URL", node.url)
        reset_settings_cache()
        reset_publishers()
        yield node
    monkeypatch.undo()
    reset_settings_cache()
    reset_publishers()


def _outage(node: PrivateRabbitMQ, load: JobLoad, how: str) -> dict[str, float]:
    """Take the broker down (`kill`: -9; `stop`: SIGTERM) for DOWN_S, start it again; the
    jobs at stake (accepted, not landed at the fault) and when the broker was back."""
    at_stake = set(load.tally.sent) - landed(set(load.tally.sent))
    fault_at = time.monotonic()
    node.kill() if how == "kill" else node.stop()
    time.sleep(DOWN_S)
    node.restart()
    up_at = time.monotonic()
    wait_for(lambda: landed(at_stake) == at_stake, 120, f"jobs at stake in the {how}")
    return {
        "at_stake": len(at_stake),
        "down_s": up_at - fault_at,
        "recover_s": time.monotonic() - up_at,
    }


def test_jobs_survive_the_broker_killed_and_restarted_under_load(
    rabbit: PrivateRabbitMQ,
    start_worker: Callable[..., WorkerProcess],
    llm: FakeLLMServer,
) -> None:
    env = {"MEMORY_FOLD_REPUBLISH_GRACE_S": "3", "MEMORY_FOLD_LEASE_S": "3"}
    w = start_worker(concurrency=2, env=env)
    load = JobLoad(8, 0.1, max_turns=300).start()
    try:
        wait_for(lambda: len(load.tally.sent) >= 100, 60, "100 accepted sends", w.log)
        time.sleep(1.0)  # quorum queues declared > 0.5 s ago (PrivateRabbitMQ's caveat)
        killed = _outage(rabbit, load, "kill")
        failures_after_kill = load.send_failures
        stopped = _outage(rabbit, load, "stop")
        wait_for(lambda: not load.running(), 120, "the agents' last sends", w.log)
    finally:
        load.stop()
    tids = load.tids
    wait_for(lambda: count_stored(tids) == len(load.tally.sent), 120, "every turn", w.log)
    wait_for(lambda: folds_caught_up(tids), 90, "folds", w.log)
    lost, duplicated, rows = load.tally.check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert failures_after_kill >= 1, "no send met the outage: the test proved nothing"
    assert w.alive(), "the worker must survive the broker's outages"
    figures.record(
        "outage.6.rabbitmq",
        scenario="the RabbitMQ broker killed with -9, later SIGTERM'd, under load",
        jobs=len(load.tally.sent),
        faults=(
            f"kill -9 (down {killed['down_s']:.1f} s) and SIGTERM (down {stopped['down_s']:.1f} "
            f"s) of the node with {killed['at_stake']:.0f} / {stopped['at_stake']:.0f} jobs "
            f"accepted and not landed; {load.send_failures} sends refused and retried by agents"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=max(killed["recover_s"], stopped["recover_s"]),
        recover=(
            f"{killed['recover_s']:.1f} s / {stopped['recover_s']:.1f} s from the restart "
            "until every job at stake landed"
        ),
        checked=(
            "8 agent threads x 300 turns with publisher confirms; a refused send is retried; "
            "every accepted send stored once, seq 1..n, folds caught up; the worker reconnects"
        ),
        send_failures=load.send_failures,
    )
