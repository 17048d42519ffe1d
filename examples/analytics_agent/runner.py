"""One step of a run, in this process: start a run, or resume a paused one from the checkpointer.

    python -m examples.analytics_agent [--async] [--finalize enqueue] start --thread T \
        --owner O --session S --query "..." [--await-session PREVIOUS]
    python -m examples.analytics_agent [--async] resume --session S [--reject]

Exit status: 0 the run finished (its turn is finalized), 3 it is paused waiting for approval.
The checkpointer's thread is the run (`session_id`); the conversation thread is memory's, and
every checkpoint records it (`run_config_for`), so deleting the conversation deletes its runs.
`--async` runs the same graph with its memory nodes as coroutines, `astream` and an
AsyncPostgresSaver over the same tables: the transcript is the same.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import structlog
from langgraph.types import Command

from examples.analytics_agent.dataset import ensure_dataset
from examples.analytics_agent.graph import AnalyticsAgent
from memory_core import RedisConversationMemory, aclose_connections
from memory_core.io.db import get_engine
from memory_core.langgraph import (
    FinalizeMode,
    aforget_run,
    async_postgres_checkpointer,
    forget_run,
    new_run,
    postgres_checkpointer,
    run_config,
    run_config_for,
)
from memory_core.settings import get_settings

PAUSED = 3
_LABEL = 14  # width of the node column in the transcript


@dataclass(frozen=True)
class Mode:
    """How a step runs: sync or async graph, and how finalize hands the turn to memory."""

    use_async: bool = False
    finalize: FinalizeMode = "inprocess"


def quiet_logs() -> None:
    """Memory's structured logs at WARNING, on stderr: stdout is the transcript."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _agent(mode: Mode, memory: RedisConversationMemory | None = None) -> AnalyticsAgent:
    settings = get_settings()
    memory = memory or RedisConversationMemory(settings=settings)
    engine = get_engine(settings.database_url)
    return AnalyticsAgent(memory, engine, settings, finalize_mode=mode.finalize)


@contextmanager
def open_graph(mode: Mode) -> Iterator[tuple[Any, Any]]:
    """(compiled graph, PostgresSaver) over DATABASE_URL / REDIS_URL."""
    with postgres_checkpointer(get_settings().database_url) as checkpointer:
        yield _agent(mode).build(checkpointer), checkpointer


@asynccontextmanager
async def aopen_graph(mode: Mode) -> AsyncIterator[tuple[Any, Any]]:
    """(compiled async graph, AsyncPostgresSaver); memory's async clients closed on exit."""
    settings = get_settings()
    try:
        async with (
            RedisConversationMemory(settings=settings) as memory,
            async_postgres_checkpointer(settings.database_url) as checkpointer,
        ):
            yield _agent(mode, memory).build(checkpointer, use_async=True), checkpointer
    finally:
        await aclose_connections()  # this event loop's pools: asyncio.run closes the loop


def banner(title: str) -> None:
    print(f"\n=== {title} · process {os.getpid()} ===", flush=True)


def _print_trace(node: str, lines: list[str]) -> None:
    for line in lines:
        first, *rest = line.splitlines()
        print(f"  {node:<{_LABEL}}{first}")
        for more in rest:
            print(f"  {'':<{_LABEL}}{more}")


def _print_chunk(chunk: dict[str, Any]) -> None:
    """One `stream_mode="updates"` chunk of the run as transcript lines."""
    for node, update in chunk.items():
        if node == "__interrupt__":
            for pending in update:
                what = pending.value.get("action", "input")
                _print_trace("approve", [f"PAUSED: interrupt({what}), a human must say yes"])
        elif update:
            _print_trace(node, update.get("trace", []))


def stream(graph: Any, value: Any, config: dict[str, Any]) -> None:
    """Run until the graph ends or pauses; print the trace as it goes."""
    for chunk in graph.stream(value, config, stream_mode="updates"):
        _print_chunk(chunk)
    sys.stdout.flush()


async def astream(graph: Any, value: Any, config: dict[str, Any]) -> None:
    async for chunk in graph.astream(value, config, stream_mode="updates"):
        _print_chunk(chunk)
    sys.stdout.flush()


def _paused(state: Any, session: str) -> bool:
    """Print where the run stands: paused (again), or its answer."""
    if state.next:
        print(
            f"  (paused at {', '.join(state.next)}: the run's state is checkpointed in Postgres, "
            f"checkpointer thread = session {session[:8]}; this process exits now)"
        )
        return True
    print(f"assistant> {state.values.get('answer', '')}")
    return False


def _forgotten(values: dict[str, Any]) -> int:
    """After forget_run: the exit status of a finished run."""
    print("  (run finished: its checkpoints are deleted; the turn lives on in memory)")
    outcome = values.get("memory_outcome") or {}
    return 0 if outcome.get("status") in ("saved", "duplicate", "enqueued") else 1


def _finish(graph: Any, checkpointer: Any, config: dict[str, Any], session: str) -> int:
    state = graph.get_state(config)
    if _paused(state, session):
        return PAUSED
    forget_run(checkpointer, session)
    return _forgotten(state.values)


async def _afinish(graph: Any, checkpointer: Any, config: dict[str, Any], session: str) -> int:
    state = await graph.aget_state(config)
    if _paused(state, session):
        return PAUSED
    await aforget_run(checkpointer, session)
    return _forgotten(state.values)


def _resume_config(state: Any, session_id: str) -> dict[str, Any] | None:
    """The config to resume a paused run with (None, reported, when it is not paused)."""
    if not state.next:
        print(f"error: no paused run for session {session_id}", file=sys.stderr)
        return None
    print(
        f"  (loaded the checkpoint of session {session_id[:8]} from Postgres: "
        f"paused at {', '.join(state.next)}; user asked: {state.values['user_query']!r})"
    )
    # The resumed steps' checkpoints record the conversation too (from the saved state).
    return run_config_for({**state.values, "session_id": session_id})


def start(
    thread_id: str,
    owner_id: str,
    session_id: str,
    query: str,
    label: str,
    *,
    mode: Mode | None = None,
    await_session: str | None = None,
) -> int:
    mode = mode or Mode()
    quiet_logs()
    banner(f"{label} · start")
    ensure_dataset(get_engine(get_settings().database_url))
    print(f"user> {query}")
    inp = new_run(thread_id, owner_id, query, session_id=session_id, await_session_id=await_session)
    config = run_config_for(inp)  # its checkpoints record the conversation thread and owner
    if mode.use_async:
        return asyncio.run(_astart(inp, config, mode))
    with open_graph(mode) as (graph, checkpointer):
        stream(graph, inp, config)
        return _finish(graph, checkpointer, config, inp["session_id"])


async def _astart(inp: Any, config: dict[str, Any], mode: Mode) -> int:
    async with aopen_graph(mode) as (graph, checkpointer):
        await astream(graph, inp, config)
        return await _afinish(graph, checkpointer, config, inp["session_id"])


def resume(
    session_id: str, approved: bool, by: str, label: str, *, mode: Mode | None = None
) -> int:
    mode = mode or Mode()
    quiet_logs()
    banner(f"{label} · resume")
    decision: Command[Any] = Command(resume={"approved": approved, "by": by})
    if mode.use_async:
        return asyncio.run(_aresume(session_id, decision, mode))
    with open_graph(mode) as (graph, checkpointer):
        config = _resume_config(graph.get_state(run_config(session_id)), session_id)
        if config is None:
            return 1
        stream(graph, decision, config)
        return _finish(graph, checkpointer, config, session_id)


async def _aresume(session_id: str, decision: Command[Any], mode: Mode) -> int:
    async with aopen_graph(mode) as (graph, checkpointer):
        config = _resume_config(await graph.aget_state(run_config(session_id)), session_id)
        if config is None:
            return 1
        await astream(graph, decision, config)
        return await _afinish(graph, checkpointer, config, session_id)
