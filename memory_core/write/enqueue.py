"""Enqueueing a finished turn (`memory.finalize_turn` on `memory.finalize`), sync and async.

The snapshot is validated here, so bad input is `rejected` at once and never queued. If the
broker cannot take the job, the turn is saved in-process instead (the same core the worker
runs): it is never dropped, and a job that did get through as well is a harmless duplicate
(finalize is idempotent on session_id). kombu has no asyncio producer: `aenqueue_turn` runs
the publish — bounded by PUBLISH_TIMEOUT_S and the broker's confirm — on the publish threads
(`aio.run_blocking`, 4, apart from the loop's default executor), so the event loop never
waits for the broker.

The `enqueued` outcome carries the thread and session ids: hand it to
`get_context(wait_for=outcome)` to read the thread with that turn (memory_core/copy/read_wait.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.fold.publisher import FINALIZE_QUEUE, FINALIZE_TASK, send_by_name
from memory_core.io.aio import run_blocking
from memory_core.logs import describe_error, get_logger
from memory_core.settings import get_settings
from memory_core.write.session_handler import (
    SaveOutcome,
    asave_session_to_thread_safe,
    reject_or_parse,
    save_session_to_thread_safe,
)
from memory_core.write.snapshot import TurnSnapshot

log = get_logger(__name__)


def enqueue_turn(
    snapshot: TurnSnapshot | Mapping[str, Any],
    *,
    memory: RedisConversationMemory | None = None,
    broker_url: str | None = None,
) -> SaveOutcome:
    """Hand the turn to a finalize worker; `enqueued`, `rejected`, or the in-process save's
    outcome when the broker is unreachable. Never raises."""
    snap = reject_or_parse(snapshot)
    if isinstance(snap, SaveOutcome):
        return snap
    try:
        return _enqueued(snap, send_by_name(*_job(snap, memory, broker_url)))
    except Exception as exc:  # any broker/transport error: fall back to the same core
        _log_fallback(snap, exc)
    return save_session_to_thread_safe(snap, memory=memory)


async def aenqueue_turn(
    snapshot: TurnSnapshot | Mapping[str, Any],
    *,
    memory: RedisConversationMemory | None = None,
    broker_url: str | None = None,
) -> SaveOutcome:
    """`enqueue_turn` for asyncio callers: the publish runs off the event loop."""
    snap = reject_or_parse(snapshot)
    if isinstance(snap, SaveOutcome):
        return snap
    try:
        job = _job(snap, memory, broker_url)
        return _enqueued(snap, await run_blocking(send_by_name, *job))
    except Exception as exc:
        _log_fallback(snap, exc)
    return await asave_session_to_thread_safe(snap, memory=memory)


def _job(
    snap: TurnSnapshot, memory: RedisConversationMemory | None, broker_url: str | None
) -> tuple[str, list[Any], str, str]:
    broker = broker_url or (memory.settings if memory else get_settings()).celery_broker_url
    return FINALIZE_TASK, [snap.model_dump(mode="json")], FINALIZE_QUEUE, broker


def _enqueued(snap: TurnSnapshot, task_id: str) -> SaveOutcome:
    return SaveOutcome("enqueued", str(snap.thread_id), str(snap.session_id), task_id=task_id)


def _log_fallback(snap: TurnSnapshot, exc: BaseException) -> None:
    log.warning(
        "memory.finalize_enqueue_failed",
        thread_id=str(snap.thread_id),
        session_id=str(snap.session_id),
        error=describe_error(exc),
    )
