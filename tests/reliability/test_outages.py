"""Scenario 2, outages of the stores: Postgres stopped, Redis restarted, under load.

Each runs against the suite's private servers (`stack`, tests/support/services.py), under load
from agents that enqueue jobs and agents that save in-process. The LLM and Langfuse failing:
test_outages_third_party.py.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pytest

from memory_core import RedisConversationMemory
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import emit_event
from memory_core.io.queues import is_amqp
from tests.support import figures
from tests.support.agents import InProcessAgent, JobLoad
from tests.support.brokers import BROKERS
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import (
    folds_caught_up,
    held_finalize_jobs,
    landed,
    queued_finalize_jobs,
    settle_folds,
    stale_copies,
)
from tests.support.tally import Tally, assert_gapless

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

PG_DOWN_S = 10.0


@dataclass(frozen=True)
class Outage:
    stop_began: float
    down_at: float
    up_began: float
    up_at: float


def _postgres_down_for_a_while(stack: Stack, llm: FakeLLMServer, w: WorkerProcess) -> Outage:
    """Stop Postgres while a (slowed-down) fold is in flight; start it again PG_DOWN_S later."""
    wait_for(lambda: llm.calls >= 1, 30, "the first folds", w.log)
    llm.delay_s = 2.0
    llm.set_mode("timeout")  # slow LLM calls for a moment: a fold is in flight at the stop
    calls = llm.calls
    wait_for(lambda: llm.calls > calls, 30, "a slow fold", w.log, 0.05)
    stop_began = time.monotonic()
    stack.pg.stop()  # pg_ctl stop -m fast: sessions terminated, transactions rolled back
    down_at = time.monotonic()
    llm.set_mode("ok")
    time.sleep(PG_DOWN_S - (down_at - stop_began))
    up_began = time.monotonic()
    stack.pg.start()
    return Outage(stop_began, down_at, up_began, time.monotonic())


def _time_recovery(
    before_up: dict[str, uuid.UUID], every: list[uuid.UUID], outage: Outage, w: WorkerProcess
) -> tuple[float, float]:
    """Seconds from the restart until everything handed over before it has landed, and until
    no thread is over the fold threshold any more (90 s at most for both)."""
    wait_for(lambda: not set(before_up) - landed(before_up), 90, "the backlog to land", w.log)
    recover_s = time.monotonic() - outage.up_began
    left_s = outage.up_at + 90 - time.monotonic()
    wait_for(lambda: folds_caught_up(every), left_s, "every thread folded up to date", w.log)
    return recover_s, time.monotonic() - outage.up_began


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_postgres_stopped_for_10_s_under_load(
    stack: Stack, start_worker: Callable[..., WorkerProcess], llm: FakeLLMServer, broker: str
) -> None:
    """On RabbitMQ the jobs' retry countdowns (1, 2, 4, ... s) wait in the broker's delay
    queues."""
    w = start_worker(concurrency=2)
    load = JobLoad(threads=8, interval_s=0.2).start()  # ~40 jobs/s through the worker
    agents = InProcessAgent(threads=2, interval_s=0.1).start()  # ~20 saves/s in-process
    outage = _postgres_down_for_a_while(stack, llm, w)
    every = load.tids + agents.tids
    recover_s, fold_catch_up_s = _time_recovery(
        {**load.tally.sent, **agents.tally.sent}, every, outage, w
    )
    time.sleep(max(0.0, 3 - (time.monotonic() - outage.up_at)))
    load.stop()
    agents.stop()
    sent = {**load.tally.sent, **agents.tally.sent}
    wait_for(lambda: not set(sent) - landed(sent), 60, "every turn", w.log, 0.25)
    settle_folds(every, 60, w.log)
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert not agents.errors, agents.errors[:3]
    during = [
        o for o in agents.outcomes if o.started >= outage.down_at and o.ended <= outage.up_began
    ]
    assert during and {o.status for o in during} == {"failed"}, "a save 'succeeded' without PG"
    saved = {o.session_id for o in agents.outcomes if o.status == "saved"}
    assert saved <= landed(saved)
    retries = w.log().count('"memory.finalize_retry"')
    fold_retries = w.log().count('"memory.fold_retry"')
    assert retries, "no finalize job met the outage"
    assert not stale_copies(every)
    assert w.alive()
    _record_postgres(
        outage,
        suffix=".rabbitmq" if is_amqp(broker) else "",
        jobs=len(load.tally.sent),
        in_process=len(agents.tally.sent),
        failed=len(during),
        finalize_retries=retries,
        fold_retries=fold_retries,
        lost=lost,
        duplicated=duplicated,
        recover_s=recover_s,
        fold_catch_up_s=fold_catch_up_s,
    )


def _record_postgres(
    outage: Outage,
    *,
    suffix: str,
    jobs: int,
    in_process: int,
    failed: int,
    finalize_retries: int,
    fold_retries: int,
    lost: int,
    duplicated: int,
    recover_s: float,
    fold_catch_up_s: float,
) -> None:
    figures.record(
        "outage.1.postgres" + suffix,
        scenario=f"Postgres stopped for {PG_DOWN_S:.0f} s under load (pg_ctl stop -m fast)"
        + (" (RabbitMQ)" if suffix else ""),
        jobs=jobs + in_process,
        faults=(
            f"1 x Postgres down {outage.up_began - outage.stop_began:.1f} s with folds in "
            f"flight; {finalize_retries} finalize + {fold_retries} fold retries; {failed} "
            "in-process saves answered `failed`"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=recover_s,
        recover=(
            f"{recover_s:.1f} s from restart to the backlog landed; every thread folded "
            f"up to date {fold_catch_up_s:.1f} s after restart"
        ),
        checked=(
            f"{jobs} jobs from 8 agent threads + {in_process} in-process saves from 2; every "
            "save during the outage reported `failed` (never `saved`) and landed on the "
            "agent's retry; jobs retried with bounded backoff and landed once; working "
            "copies == Postgres"
        ),
        in_process_failed=failed,
        job_retries=finalize_retries,
        fold_retries=fold_retries,
    )


# Jobs a worker holds when Redis goes away cannot be handed back while it is down; the worker
# hands them back when it reconnects (workers/broker.py). Whatever it cannot account for waits
# in `unacked` for the visibility timeout, lowered here from ~68 min.
REDIS_ENV = {"MEMORY_VISIBILITY_TIMEOUT_S": "10", "MEMORY_UNACKED_RESTORE_INTERVAL_S": "1"}


def _fold_in_flight(llm: FakeLLMServer, w: WorkerProcess) -> None:
    """Hold the next fold's LLM call for 2 s and return once it has arrived: the worker then
    holds that fold's message (acks late) whatever the pace of the finalize jobs, which a
    fast worker may have all done at any given instant."""
    llm.delay_s = 2.0
    llm.set_mode("timeout")
    calls = llm.calls
    wait_for(lambda: llm.calls > calls, 30, "a fold in flight", w.log, 0.02)


def _restart_redis(
    stack: Stack,
    w: WorkerProcess,
    llm: FakeLLMServer,
    events_stream: str,
    *,
    how: signal.Signals,
    down_s: float,
    meanwhile: Callable[[], None],
) -> tuple[float, float, int]:
    """Stop Redis with `how` while a fold is in flight, run `meanwhile`, start it again
    `down_s` after the stop. Returns how long it was down, how long until every job at risk
    had landed (both from the stop), and how many jobs were at risk. Checks an event emitted
    before the stop survived."""
    client = stack.client()
    marker = emit_event(client, "reliability_probe", stream=events_stream)
    assert marker is not None  # Redis is up here: the probe is written
    _fold_in_flight(llm, w)
    # Jobs queued or held by the worker at the fault: they must survive it (AOF).
    at_risk = held_finalize_jobs(client) | queued_finalize_jobs(client)
    at_risk -= landed(at_risk)
    client.close()
    t0 = time.monotonic()
    stack.redis.stop(how)
    llm.set_mode("ok")
    meanwhile()
    time.sleep(max(0.0, down_s - (time.monotonic() - t0)))
    stack.redis.start()
    up = time.monotonic()
    wait_for(lambda: not at_risk - landed(at_risk), 90, "the jobs at risk", w.log)
    recovered_s = time.monotonic() - t0
    client = stack.client()
    assert client.xrange(events_stream, marker, marker), "an event was lost by the restart"
    client.close()
    time.sleep(max(0.0, 4 - (time.monotonic() - up)))
    return up - t0, recovered_s, len(at_risk)


def _handed_back(log: str) -> int:
    """Jobs the worker handed back to the broker on reconnecting (its JSON log lines)."""
    return sum(
        json.loads(line)["jobs"]
        for line in log.splitlines()
        if '"memory.broker_handed_back"' in line and line.startswith("{")
    )


def test_redis_cache_and_broker_restarted_with_aof(
    stack: Stack,
    start_worker: Callable[..., WorkerProcess],
    llm: FakeLLMServer,
    events_stream: str,
) -> None:
    w = start_worker(concurrency=2, env=REDIS_ENV)
    load = JobLoad(threads=10, interval_s=0.08).start()  # ~125 jobs/s: a backlog builds
    agents = InProcessAgent(threads=2, interval_s=0.1).start()
    time.sleep(3)
    # A thread whose last turns are saved while Redis is down, and never touched again.
    quiet = uuid.uuid4()
    quiet_agent = InProcessAgent(threads=0, interval_s=0)
    memory = RedisConversationMemory()
    for n in (1, 2):
        assert quiet_agent.save(memory, make_snapshot(quiet, n)).status == "saved"

    def save(n: int) -> None:
        last = quiet_agent.save(memory, make_snapshot(quiet, n))
        assert (last.status, last.cache) == ("saved", "unavailable"), last

    faults = [
        _restart_redis(stack, w, llm, events_stream, how=how, down_s=s, meanwhile=partial(save, n))
        for how, s, n in ((signal.SIGKILL, 5.0, 3), (signal.SIGTERM, 3.0, 4))
    ]
    at_risk = sum(f[2] for f in faults)
    load.stop()
    agents.stop()
    sent = {**load.tally.sent, **agents.tally.sent}
    wait_for(lambda: not set(sent) - landed(sent), 90, "every turn", w.log, 0.25)
    lost, duplicated, rows = Tally(sent).check()
    assert (lost, duplicated) == (0, 0)
    assert_gapless(rows)
    assert not agents.errors, agents.errors[:3]
    assert {o.status for o in agents.outcomes} <= {"saved", "duplicate"}
    assert at_risk > 0, "no job was queued or held at the faults: the AOF was not tested"
    # Read-your-writes across the outage: the copy that survived in the AOF must not hide
    # turns 3 and 4, saved while Redis was down.
    ctx = RedisConversationMemory().get_context(quiet, "user-42")
    assert [e.seq for e in ctx.recent] == [1, 2, 3, 4], "a turn saved during the outage is hidden"
    stale = stale_copies(load.tids + agents.tids + [quiet])
    assert not stale, f"{len(stale)} working copies differ from Postgres"
    assert w.alive(), "the worker died with the broker connection"
    handed_back = _handed_back(w.log())
    assert handed_back >= 1, "the worker held no job at either fault, or did not hand it back"
    _record_redis(faults, load, agents, handed_back=handed_back, lost=lost, duplicated=duplicated)


def _record_redis(
    faults: list[tuple[float, float, int]],
    load: JobLoad,
    agents: InProcessAgent,
    *,
    handed_back: int,
    lost: int,
    duplicated: int,
) -> None:
    """outage.2; `faults`: (down s, recovered s, jobs at risk) of the kill -9 and the SIGTERM."""
    (kill_down, kill_recover, _), (term_down, term_recover, _) = faults
    at_risk = sum(f[2] for f in faults)
    unavailable = sum(o.cache == "unavailable" for o in agents.outcomes)
    figures.record(
        "outage.2.redis",
        scenario="Redis (cache + broker + events) restarted under load, AOF on",
        jobs=len(load.tally.sent) + len(agents.tally.sent),
        faults=(
            f"kill -9 (down {kill_down:.1f} s) and SIGTERM (down {term_down:.1f} s) of "
            f"Redis with {at_risk} jobs queued or held; {load.send_failures} sends "
            f"refused and retried by agents; {unavailable} in-process saves without cache"
        ),
        lost=lost,
        duplicated=duplicated,
        recover_s=max(kill_recover, term_recover),
        recover=(
            f"{kill_recover:.1f} s / {term_recover:.1f} s from the fault until every job at "
            f"risk landed; {handed_back} held job(s) handed back by the worker on reconnect"
        ),
        checked=(
            "the worker survives both restarts; queued and held jobs and the event stream "
            "survive (AOF); in-process saves during the outage report `saved`; afterwards "
            "every working copy equals Postgres, also for a thread whose last turns were "
            "saved while Redis was down (read-your-writes)"
        ),
        at_risk=at_risk,
        handed_back=handed_back,
    )
