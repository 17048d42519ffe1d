"""Hostile generator: every task's arguments, drawn across Unicode categories and JSON types,
plus unknown task names and other serializers, sent raw to one real worker per broker.

Invariants after every example: each job is served (`task-succeeded`) or refused (its
`memory_job_refused` / `memory_finalize_rejected` event), never both; no drawn content (each
string carries a marker) appears in any Celery event field, the event streams, the worker's
log, or `memory.dead`. Long run: TASK_ARGS_HOSTILE_EXAMPLES=200 (default 4).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.queues import (
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    FOLD_QUEUE,
    FORGET_OWNER_TASK,
    MEMORY_TASKS,
    SWEEP_FOLDS_TASK,
)
from tests.support.brokers import BROKERS
from tests.support.raw_jobs import checkout_worker_argv, dead_letters, send_raw
from tests.support.snapshots import make_snapshot
from tests.support.task_events import TaskEvents, strings

pytestmark = pytest.mark.workers
EXAMPLES = int(os.environ.get("TASK_ARGS_HOSTILE_EXAMPLES", "4"))
# How long one job may take to be served or refused; shorter to run it against an old commit,
# where a refused job has no event at all.
OUTCOME_WAIT_S = float(os.environ.get("TASK_ARGS_HOSTILE_WAIT_S", "60"))
MARK = "c0ntent" + uuid.uuid4().hex[:10]
REFUSALS = ("memory_job_refused", "memory_finalize_rejected")
Entries = list[tuple[bytes, dict[bytes, bytes]]]

hostile_text = st.text(
    st.characters(codec="utf-8", categories=("L", "M", "N", "P", "S", "Z", "Cc", "Cf")),
    max_size=12,
).map(lambda s: f"{s}{MARK}{s}")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | hostile_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=6,
)
valid_snapshot = st.builds(
    lambda q, o: make_snapshot(uuid.uuid4(), 1, owner_id=o.strip() or MARK, user_query=q),
    hostile_text.filter(lambda s: "\x00" not in s),
    hostile_text.filter(lambda s: "\x00" not in s and len(s) < 200),
)
# The periodic sweep takes no arguments and scans every thread: left out to keep examples short.
TASKS = [t for t in MEMORY_TASKS if t != SWEEP_FOLDS_TASK]
job = st.one_of(
    st.tuples(st.sampled_from(TASKS), st.lists(json_values, max_size=2), st.just("json")),
    st.tuples(st.just(FINALIZE_TASK), valid_snapshot.map(lambda s: [s]), st.just("json")),
    st.tuples(st.just(FORGET_OWNER_TASK), hostile_text.map(lambda s: [s]), st.just("json")),
    st.tuples(
        st.from_regex(r"memory\.[a-z_]{1,12}", fullmatch=True).filter(lambda n: n not in TASKS),
        st.lists(json_values, max_size=2),
        st.just("json"),
    ),
    st.tuples(
        st.sampled_from(TASKS),
        st.lists(json_values, max_size=1),
        st.sampled_from(
            ["application/x-yaml", "application/x-python-serialize", "text/plain", "garbage"]
        ),
    ),
)


@pytest.fixture
def world(
    broker: str, start_worker: Callable[..., WorkerProcess]
) -> Iterator[tuple[WorkerProcess, TaskEvents]]:
    """One worker and one event receiver for every example of the test (function-scoped
    fixtures are set up once for all of hypothesis' examples; a worker costs ~5 s)."""
    events = TaskEvents(broker).start()
    yield start_worker(argv=checkout_worker_argv()), events
    events.stop()


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
@settings(
    max_examples=EXAMPLES,
    derandomize=EXAMPLES <= 4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(jobs=st.lists(job, min_size=1, max_size=4))
def test_every_job_is_served_or_refused_and_its_content_goes_nowhere(
    jobs: list[tuple[str, list[Any], str]],
    broker: str,
    world: tuple[WorkerProcess, TaskEvents],
    redis_client: redis.Redis,
    events_stream: str,
) -> None:
    w, task_events = world
    sent: list[str] = []
    for task, args, kind in jobs:
        queue = FINALIZE_QUEUE if task == FINALIZE_TASK else FOLD_QUEUE
        if kind == "json":
            sent.append(send_raw(broker, queue, task, args))
        else:
            body = repr(args).encode("utf-8", "surrogatepass")
            sent.append(send_raw(broker, queue, task, content_type=kind, body=body))

    def refusals() -> dict[str, int]:
        entries = cast(Entries, redis_client.xrange(events_stream))
        got: dict[str, int] = {}
        for _, fields in entries:
            f = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
            if f.get("event") in REFUSALS and f.get("message_id"):
                got[f["message_id"]] = got.get(f["message_id"], 0) + 1
        return got

    def outcome(task_id: str) -> tuple[bool, int]:
        return "task-succeeded" in task_events.types(task_id), refusals().get(task_id, 0)

    def decided(task_id: str) -> bool:
        return any(outcome(task_id))

    for task_id in sent:
        wait_for(partial(decided, task_id), OUTCOME_WAIT_S, f"an outcome of {task_id}", w.log)
    for task_id in sent:
        served, refused = outcome(task_id)
        assert (served, refused) in {(True, 0), (False, 1)}, (task_id, served, refused)
    entries = cast(Entries, redis_client.xrange(events_stream))
    stream = [v for _, f in entries for v in f.values()]
    leaks = [s for e in list(task_events.events) for s in strings(e) if MARK in s]
    assert leaks == [], "content in a Celery task event"
    assert [v for v in stream if MARK.encode() in v] == [], "content in memory:events"
    assert MARK not in w.log(), "content in the worker's log"
    assert dead_letters(broker) == [], "memory.dead holds poison jobs only"
