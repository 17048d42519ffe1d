"""Scenario 5, access: a thread is only ever returned to its owner, by every entry point.

A stranger (any other owner id: another user, the owner's id in another case, with a stray
space, a look-alike character, SQL or wildcard text, an id no snapshot could carry) asking
for a thread gets exactly what they get for a thread that does not exist: the same exception
and message, the same CLI exit code and output, an empty transcript, no history entry,
whether the thread's working copy is cached in Redis, expired, or Redis is down.
"""

from __future__ import annotations

import statistics
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from memory_core import (
    ConversationContext,
    RedisConversationMemory,
    render_conversation_context,
    save_session_to_thread_safe,
)
from memory_core.devservices.ports import free_port
from memory_core.io.db import session_scope
from memory_core.io.redis_client import make_redis
from memory_core.models import ConversationThread, ThreadMessage
from tests.support import figures
from tests.support.commands import run_module
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(240)]

OWNER = "owner-7"
STRANGERS = [
    "owner-8",
    "OWNER-7",
    "owner-7 ",
    " owner-7",
    "owner-7\n",
    "owner\u20117",  # non-breaking hyphen
    "\u043ewner-7",  # Cyrillic o
    "owner-7\u200b",  # zero-width space
    "",
    "%",
    "owner-%",
    "*",
    "' OR '1'='1",
    "owner-7' --",
    "{owner-7}",
    "owner-7\x00",  # no snapshot can carry these two: still just "not found"
    "owner-\ud800",
]


def _error(call: Callable[..., Any], *args: Any) -> tuple[str, str]:
    try:
        call(*args)
    except Exception as exc:  # the type and message are what a caller sees
        return type(exc).__name__, str(exc)
    return "returned", ""


def _same(
    stranger: tuple[str, str], unknown: tuple[str, str], tid: uuid.UUID, other: uuid.UUID
) -> bool:
    """Equal once each message's own thread id is taken out (it echoes the caller's input)."""
    return stranger[0] == unknown[0] == "ThreadNotFound" and stranger[1].replace(
        str(tid), "<id>"
    ) == unknown[1].replace(str(other), "<id>")


def _empty(rows: list[Any]) -> None:
    assert rows == [], "a stranger got transcript rows"


def _absent(tid: uuid.UUID, threads: list[Any]) -> None:
    assert tid not in {t.id for t in threads}, "a stranger's history lists the thread"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("memory_core.cli", *args, env=env)


def _a_long_thread(memory: RedisConversationMemory, tid: uuid.UUID) -> ConversationContext:
    """25 turns of OWNER's, past the first fold threshold: a summary-less long thread."""
    for n in range(1, 26):
        assert save_session_to_thread_safe(make_snapshot(tid, n, owner_id=OWNER), memory=memory).ok
    own = memory.get_context(tid, OWNER)
    assert [e.seq for e in own.recent] == list(range(1, 26))
    for focus in ("brief", "sql", "visualizations"):
        assert "Revenue by region" in render_conversation_context(own, focus)
    return own


def _check_reads(
    memory: RedisConversationMemory, dead: RedisConversationMemory, tid: uuid.UUID, stranger: str
) -> int:
    """The stranger, against a cached copy, an expired one, and with Redis down."""
    checks = 0
    for state in ("cached", "expired", "redis down"):
        m = dead if state == "redis down" else memory
        if state == "cached":
            memory.get_context(tid, OWNER)
        elif state == "expired":
            memory.invalidate(tid)
        other = uuid.uuid4()
        got = _error(m.get_context, tid, stranger)
        unknown = _error(m.get_context, other, stranger)
        assert _same(got, unknown, tid, other), (stranger, state, got, unknown)
        checks += 1
        if state == "expired":  # a stranger's miss must not rebuild the copy for them
            assert memory.copy.read(tid) == ({}, [])
    return checks


def _check_write_and_finders(memory: RedisConversationMemory, tid: uuid.UUID, stranger: str) -> int:
    """The stranger cannot write into the thread, nor find it in a transcript or a history."""
    # A stranger cannot write into the thread either (rejected, as for a foreign id).
    out = save_session_to_thread_safe(
        make_snapshot(tid, 99, owner_id=stranger or "x"), memory=memory
    )
    assert out.status == "rejected", (stranger, out)
    # Finders: the transcript page and the history list.
    with session_scope() as s:
        page = _error(lambda: _empty(ThreadMessage.transcript(s, tid, stranger)))
        none = _error(lambda: _empty(ThreadMessage.transcript(s, uuid.uuid4(), stranger)))
        assert page == none, (stranger, page, none)
    with session_scope() as s:
        history = _error(
            lambda: _absent(tid, ConversationThread.history(s, stranger, include_archived=True))
        )
        assert history[0] in ("returned", "ValueError", "UnicodeEncodeError"), history
    return 4


def _check_malformed_ids(memory: RedisConversationMemory, tid: uuid.UUID) -> int:
    """Malformed thread ids: the same answer as an unknown thread, for owner and stranger."""
    checks = 0
    for bad in ("", "not-a-uuid", str(tid).upper() + "x", "' OR 1=1 --"):
        for who in (OWNER, "owner-8"):
            kind, message = _error(memory.get_context, bad, who)
            assert (kind, message) == ("ThreadNotFound", f"thread {bad} not found")
            checks += 1
    return checks


def _check_the_langgraph_node(memory: RedisConversationMemory, tid: uuid.UUID) -> int:
    """The LangGraph node: a stranger's run starts with an empty context, as for a new thread."""
    try:
        from memory_core.langgraph import load_conversation_context
    except ImportError:  # pragma: no cover - the module is optional
        return 0
    checks = 0
    for stranger in STRANGERS[:8]:
        state = load_conversation_context({"thread_id": str(tid), "owner_id": stranger}, memory)
        assert state["conversation_context"]["recent"] == []
        checks += 1
    return checks


def test_a_thread_is_never_returned_to_another_owner(stack: Stack) -> None:
    memory = RedisConversationMemory()
    tid = uuid.uuid4()
    own = _a_long_thread(memory, tid)
    dead = RedisConversationMemory(make_redis(f"redis://127.0.0.1:{free_port()}/0"))
    checks = 0
    for stranger in STRANGERS:
        checks += _check_reads(memory, dead, tid, stranger)
        checks += _check_write_and_finders(memory, tid, stranger)
    checks += _check_malformed_ids(memory, tid)
    # The owner still sees everything, unchanged by all of the above.
    assert memory.get_context(tid, OWNER) == own
    checks += _check_the_langgraph_node(memory, tid)

    cli_checks = _check_the_command_line(tid)
    stranger_ms, unknown_ms = _refusal_times(memory, tid)
    # Both look in Postgres; a fast refusal for a cached thread would reveal that it exists.
    assert stranger_ms > unknown_ms / 4, (stranger_ms, unknown_ms)
    figures.record(
        "access.1.owner_only",
        scenario="a thread asked for by strangers through every entry point",
        jobs=checks + cli_checks,
        faults=(
            f"{len(STRANGERS)} stranger owner ids x (copy cached / expired / Redis down), "
            "finalize, transcript, history, malformed ids, LangGraph node, CLI"
        ),
        lost=0,
        duplicated=0,
        recover="n/a",
        checked=(
            "never returned to a stranger; the stranger gets exactly the unknown-thread "
            "error (ThreadNotFound, same message; CLI: same exit code, same stderr); a "
            "stranger's miss does not rebuild the copy; median answer "
            f"{stranger_ms:.2f} ms for a stranger vs {unknown_ms:.2f} ms for an unknown thread"
        ),
        stranger_ms=round(stranger_ms, 3),
        unknown_ms=round(unknown_ms, 3),
    )


def _check_the_command_line(tid: uuid.UUID) -> int:
    """`context` and the `threads` history list, for strangers and for the owner."""
    checks = 0
    other = uuid.uuid4()
    for stranger in ("owner-8", "OWNER-7", "' OR '1'='1", "%"):
        got = _cli("context", str(tid), "--owner", stranger, "--json")
        unknown = _cli("context", str(other), "--owner", stranger, "--json")
        assert got.returncode == unknown.returncode == 1
        assert got.stdout == unknown.stdout == ""
        assert got.stderr.replace(str(tid), "<id>") == unknown.stderr.replace(str(other), "<id>")
        assert got.stderr == f"error: thread {tid} not found\n"
        listed = _cli("threads", "--owner", stranger, "--archived")
        assert str(tid) not in listed.stdout + listed.stderr
        checks += 3
    mine = _cli("context", str(tid), "--owner", OWNER, "--json")
    assert mine.returncode == 0 and str(tid) in mine.stdout
    assert str(tid) in _cli("threads", "--owner", OWNER).stdout
    return checks


def _refusal_times(memory: RedisConversationMemory, tid: uuid.UUID) -> tuple[float, float]:
    """Median ms to refuse a stranger a cached thread, and anyone an unknown thread."""
    memory.get_context(tid, OWNER)

    def median_ms(call: Callable[[], Any]) -> float:
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            _error(call)
            times.append((time.perf_counter() - t0) * 1000)
        return statistics.median(times)

    return (
        median_ms(lambda: memory.get_context(tid, "owner-8")),
        median_ms(lambda: memory.get_context(uuid.uuid4(), "owner-8")),
    )
