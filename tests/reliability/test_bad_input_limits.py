"""Scenario 4, bad input at the edges of what is valid: the size limits and odd Redash objects.

* Every size limit: exactly at it, a snapshot is saved (in-process and as a job) and stored
  unchanged; one more, it is rejected naming the field.
* Live Redash objects are free-form JSON: odd but valid shapes are saved, never crash finalize.

Generated bad payloads: test_bad_input.py; hostile text: test_bad_input_hostile.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage
from tests.support import figures
from tests.support.bad_input import MIB, names_field, nested
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import landed
from tests.support.workers import send_finalize

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

# ------------------------------------------------------------------ size limits

LIMITS: list[tuple[str, Callable[[int], dict[str, Any]], int]] = [
    ("owner_id", lambda n: {"owner_id": "o" * n}, 255),
    ("user_query", lambda n: {"user_query": "q" * n}, 8000),
    ("answer", lambda n: {"answer": "a" * n}, 100_000),
    ("sql", lambda n: {"sql": ["S" * n]}, 50_000),
    ("sql", lambda n: {"sql": ["SELECT 1"] * n}, 20),
    (
        "visualizations",
        lambda n: {"visualizations": [{"id": i, "type": "CHART"} for i in range(n)]},
        50,
    ),
    ("dashboards", lambda n: {"dashboards": [{"id": i} for i in range(n)]}, 20),
    # {"p": "xxx..."} is 9 bytes of JSON around the string.
    ("response_payload", lambda n: {"response_payload": {"p": "x" * (n - 9)}}, MIB),
]


def _saved_at_the_limit_rejected_over(
    memory: RedisConversationMemory,
    field: str,
    change: Callable[[int], dict[str, Any]],
    limit: int,
) -> dict[str, Any]:
    """In-process: the snapshot at the limit is saved, one over is rejected naming the field.
    Returns the saved one."""
    at_limit = {**make_snapshot(uuid.uuid4(), 1), **change(limit)}
    over = {**make_snapshot(uuid.uuid4(), 1), **change(limit + 1)}
    out = save_session_to_thread_safe(at_limit, memory=memory)
    assert out.status == "saved", (field, limit, out.reason)
    rejected = save_session_to_thread_safe(over, memory=memory)
    assert rejected.status == "rejected" and names_field(field, rejected.reason or ""), rejected
    return at_limit


def _assert_stored_unchanged(field: str, at_limit: dict[str, Any]) -> None:
    with session_scope() as s:
        row = ThreadMessage.by_session(s, uuid.UUID(at_limit["session_id"]))
        assert row is not None
        thread = s.get(ConversationThread, row.thread_id)
        assert thread is not None
        stored = {
            "owner_id": thread.owner_id,
            "user_query": row.user_query,
            "answer": row.answer,
            "sql": [a["sql"] for a in row.artifacts if a["kind"] == "sql"],
            "response_payload": row.response_payload,
        }
        if field in stored:
            assert stored[field] == at_limit[field]


def test_size_limits_exact_is_accepted_one_more_is_rejected(
    stack: Stack, start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    memory = RedisConversationMemory()
    w = start_worker(concurrency=1)
    jobs = []
    for field, change, limit in LIMITS:
        at_limit = _saved_at_the_limit_rejected_over(memory, field, change, limit)
        # The largest accepted snapshot also travels as a job.
        job = {**make_snapshot(uuid.uuid4(), 1), **change(limit)}
        send_finalize(agent, job)
        jobs.append(job["session_id"])
        _assert_stored_unchanged(field, at_limit)
    wait_for(lambda: landed(jobs) == set(jobs), 60, "the jobs at the limits", w.log)
    figures.record(
        "input.2.limits",
        scenario="every size limit: the limit accepted, one more rejected",
        jobs=3 * len(LIMITS),
        faults=f"{len(LIMITS)} limits (owner_id 255 ... response_payload 1 MiB) at and over",
        lost=0,
        duplicated=0,
        recover="n/a",
        checked=(
            "at the limit: saved in-process and as a job, stored unchanged; over: rejected "
            "naming the field"
        ),
    )


# ------------------------------------------------------------------ odd but valid


def _odd_but_valid() -> list[dict[str, Any]]:
    """Live Redash objects are free-form JSON: odd shapes must be saved (never crash finalize)."""
    return [
        {
            "visualizations": [
                {
                    "id": 1,
                    "type": "CHART",
                    "options": {"columnMapping": {"a": ["x"], "b": {"r": 1}, "c": 3, "e": "y"}},
                }
            ]
        },
        {"visualizations": [{"id": "v-1", "type": "CHART", "options": {"globalSeriesType": {}}}]},
        {"visualizations": [{"id": 1, "type": "TABLE", "options": {"columnMapping": "n/a"}}]},
        {
            "dashboards": [
                {
                    "id": 1,
                    "widgets": [
                        {"visualization": {"id": 7, "options": {"x": [1]}, "extra": [1]}},
                        {"text": "a text widget"},
                    ],
                }
            ]
        },
        {"session_id": str(uuid.uuid4()).upper()},
        {"completed_at": 1764417600},
        {"completed_at": "2026-11-29T12:00:00+14:00"},
        {"response_payload": {"deep": nested(60)}},
        {"sql": ["   ", "SELECT 1"], "answer": ""},
    ]


def test_odd_but_valid_redash_objects_are_saved(stack: Stack) -> None:
    memory = RedisConversationMemory()
    odd = _odd_but_valid()
    for change in odd:
        snap = {**make_snapshot(uuid.uuid4(), 1), **change}
        out = save_session_to_thread_safe(snap, memory=memory)
        assert out.status == "saved", (change, out)
        tid = uuid.UUID(snap["thread_id"])
        hit = memory.get_context(tid, "user-42")
        memory.invalidate(tid)
        assert memory.get_context(tid, "user-42") == hit
    figures.record(
        "input.3.odd_valid",
        scenario="odd but valid Redash objects (free-form options, widgets, ids, dates)",
        jobs=len(odd),
        faults="non-string columnMapping roles, object chart types, text widgets, epoch dates",
        lost=0,
        duplicated=0,
        recover="n/a",
        checked="saved; descriptors keep only what they understand; copy == Postgres",
    )
