"""An agent service on the asyncio API, written as a FastAPI app would be (mini_http.py stands
in for FastAPI): one `RedisConversationMemory` created by the lifespan at startup and
closed (`await memory.aclose()`) at shutdown, and a route that reads the thread's context and
saves the finished turn. Also the async agent the concurrency tests run by the hundred, and
what those tests check.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY

from memory_core import (
    RedisConversationMemory,
    SaveOutcome,
    ThreadNotFound,
    asave_session_to_thread_safe,
    save_session_to_thread_safe,
)
from memory_core.settings import Settings
from tests.support.mini_http import MiniApp
from tests.support.snapshots import make_snapshot


def memory_service(settings: Settings) -> MiniApp:
    """POST /turn {"snapshot": ...}: the thread's context before the turn, then the save."""

    @asynccontextmanager
    async def lifespan(app: MiniApp) -> AsyncIterator[None]:
        app.state.memory = RedisConversationMemory(settings=settings)
        try:
            yield
        finally:
            await app.state.memory.aclose()

    async def turn(app: MiniApp, body: dict[str, Any]) -> dict[str, Any]:
        seen, outcome = await read_then_save(app.state.memory, body["snapshot"])
        return {"seen": seen, "status": outcome.status, "seq": outcome.seq}

    return MiniApp({"/turn": turn}, lifespan)


async def read_then_save(
    memory: RedisConversationMemory, snapshot: dict[str, Any]
) -> tuple[list[int], SaveOutcome]:
    """What an agent does with one message: read the context (seqs seen; [] for a new
    thread), then save the finished turn."""
    try:
        ctx = await memory.aget_context(snapshot["thread_id"], snapshot["owner_id"])
        seen = [t.seq for t in ctx.recent]
    except ThreadNotFound:
        seen = []
    return seen, await asave_session_to_thread_safe(snapshot, memory=memory)


@dataclass
class Answer:
    thread_id: uuid.UUID
    session_id: str
    seen: list[int]
    status: str
    seq: int | None


def check_answers(answers: list[Answer], stored: dict[uuid.UUID, list[tuple[int, str]]]) -> None:
    """Every turn saved, and stored in order: per thread seqs 1..N without gaps or duplicates,
    each answer's seq the stored seq of its session, and each read a gap-free prefix of the
    thread that ends before the turn the agent then saved."""
    assert [a for a in answers if a.status != "saved"] == []
    for tid, rows in stored.items():
        assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), tid
    seq_of = {sid: seq for rows in stored.values() for seq, sid in rows}
    for a in answers:
        assert seq_of.get(a.session_id) == a.seq, a
        assert a.seen == list(range(1, len(a.seen) + 1)), a
        assert a.seq is not None and len(a.seen) < a.seq, a
    assert len(seq_of) >= len(answers)


def join_settings_checks() -> None:
    """Wait for the settings fingerprint threads every new memory starts
    (memory_core/copy/settings_check.py): a blocking connection of theirs must not be counted as
    the service's."""
    for thread in threading.enumerate():
        if thread.name == "memory-settings":
            thread.join(30)


async def until(predicate: Any, what: str, attempts: int = 5000) -> None:
    """Yield to the loop until `predicate()` holds (at most `attempts` 2 ms sleeps)."""
    for _ in range(attempts):
        if predicate():
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


def seed(memory: RedisConversationMemory, turns: int) -> uuid.UUID:
    """A thread with `turns` turns saved (blocking API, straight to the servers)."""
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        assert save_session_to_thread_safe(make_snapshot(tid, n), memory=memory).ok
    return tid


def reads(result: str) -> float:
    """`memory_cache_reads_total{result=...}`: hit, miss or unavailable, so far."""
    return REGISTRY.get_sample_value("memory_cache_reads_total", {"result": result}) or 0.0
