"""`enqueue_turn` / `aenqueue_turn` through both doors, on both brokers: a valid turn is sent
(nothing written yet), bad input is refused before sending with the save's own reason, and an
unreachable broker falls back to the in-process save."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.ports import free_port
from memory_core.io.queues import FINALIZE_QUEUE
from tests.support.api import Api
from tests.support.brokers import BROKERS, ready
from tests.support.snapshots import make_snapshot
from tests.support.state import stored_seqs, thread_row

pytestmark = pytest.mark.parametrize("broker", BROKERS, indirect=True)


def test_a_valid_turn_is_enqueued_and_nothing_is_written_yet(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    snap = make_snapshot(tid, 1)
    out = api.enqueue(snap, memory=memory, broker_url=broker)
    assert (out.status, out.ok, out.retryable, out.seq) == ("enqueued", True, False, None), out
    assert (out.thread_id, out.session_id) == (str(tid), snap["session_id"])
    assert out.task_id
    assert ready(broker, FINALIZE_QUEUE) == 1
    assert thread_row(tid) is None and memory.copy.read(tid) == ({}, [])


def test_bad_input_is_rejected_and_never_sent(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    bad_inputs: list[Any] = [
        make_snapshot(tid, 1, agent_type="robot"),
        make_snapshot(tid, 1, session_id="nope"),
        "not a snapshot",
    ]
    for bad in bad_inputs:
        out = api.enqueue(bad, memory=memory, broker_url=broker)
        reference = save_session_to_thread_safe(bad, memory=memory)
        assert (out.status, out.ok, out.retryable) == ("rejected", False, False), out
        assert out.reason == reference.reason, (api.kind, bad)
        assert out.task_id is None
    assert ready(broker, FINALIZE_QUEUE) == 0
    assert thread_row(tid) is None


def test_an_unreachable_broker_falls_back_to_the_in_process_save(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    scheme = "amqp://guest:guest@" if broker.startswith("amqp") else "redis://"
    dead = f"{scheme}127.0.0.1:{free_port()}/"
    tid = uuid.uuid4()
    outcomes = [api.enqueue(make_snapshot(tid, n), memory=memory, broker_url=dead) for n in (1, 2)]
    assert [(o.status, o.seq, o.ok) for o in outcomes] == [("saved", 1, True), ("saved", 2, True)]
    assert stored_seqs(tid) == [1, 2]
    assert [e.seq for e in api.get_context(memory, tid, "user-42").recent] == [1, 2]
    assert ready(broker, FINALIZE_QUEUE) == 0


def test_without_memory_or_broker_url_the_settings_are_used(
    api: Api, broker: str, memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    saved = api.save(make_snapshot(tid, 1))  # a memory of the settings' servers
    assert (saved.status, saved.seq) == ("saved", 1)
    out = api.enqueue(make_snapshot(tid, 2))  # ... and the settings' broker: this test's
    assert out.status == "enqueued" and out.task_id
    assert ready(broker, FINALIZE_QUEUE) == 1
    assert stored_seqs(tid) == [1]
    assert [e.seq for e in api.get_context(memory, tid, "user-42").recent] == [1]
