"""One step of a run, in this process: start a run, or resume a paused one from the checkpointer.

    python -m examples.analytics_agent start --thread T --owner O --session S --query "..."
    python -m examples.analytics_agent resume --session S [--reject]

Exit status: 0 the run finished (its turn is finalized), 3 it is paused waiting for approval.
The checkpointer's thread is the run (`session_id`); the conversation thread is memory's, and
every checkpoint records it (`run_config_for`), so deleting the conversation deletes its runs.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from langgraph.types import Command

from examples.analytics_agent.dataset import ensure_dataset
from examples.analytics_agent.graph import AnalyticsAgent
from memory_core import RedisConversationMemory
from memory_core.db import get_engine
from memory_core.langgraph import (
    forget_run,
    new_run,
    postgres_checkpointer,
    run_config,
    run_config_for,
)
from memory_core.settings import get_settings

PAUSED = 3
_LABEL = 14  # width of the node column in the transcript


def quiet_logs() -> None:
    """Memory's structured logs at WARNING, on stderr: stdout is the transcript."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


@contextmanager
def open_graph() -> Iterator[tuple[Any, Any]]:
    """(compiled graph, checkpointer) over DATABASE_URL / REDIS_URL."""
    settings = get_settings()
    engine = get_engine(settings.database_url)
    agent = AnalyticsAgent(RedisConversationMemory(settings=settings), engine, settings)
    with postgres_checkpointer(settings.database_url) as checkpointer:
        yield agent.build(checkpointer), checkpointer


def banner(title: str) -> None:
    print(f"\n=== {title} · process {os.getpid()} ===", flush=True)


def _print_trace(node: str, lines: list[str]) -> None:
    for line in lines:
        first, *rest = line.splitlines()
        print(f"  {node:<{_LABEL}}{first}")
        for more in rest:
            print(f"  {'':<{_LABEL}}{more}")


def stream(graph: Any, value: Any, config: dict[str, Any]) -> bool:
    """Run until the graph ends or pauses; print the trace as it goes. True when paused."""
    paused = False
    for chunk in graph.stream(value, config, stream_mode="updates"):
        for node, update in chunk.items():
            if node == "__interrupt__":
                paused = True
                for pending in update:
                    what = pending.value.get("action", "input")
                    _print_trace("approve", [f"PAUSED: interrupt({what}), a human must say yes"])
            elif update:
                _print_trace(node, update.get("trace", []))
    sys.stdout.flush()
    return paused


def _finish(graph: Any, checkpointer: Any, config: dict[str, Any], session: str) -> int:
    state = graph.get_state(config)
    if state.next:  # paused (again)
        print(
            f"  (paused at {', '.join(state.next)}: the run's state is checkpointed in Postgres, "
            f"checkpointer thread = session {session[:8]}; this process exits now)"
        )
        return PAUSED
    values = state.values
    print(f"assistant> {values.get('answer', '')}")
    forget_run(checkpointer, session)
    print("  (run finished: its checkpoints are deleted; the turn lives on in memory)")
    outcome = values.get("memory_outcome") or {}
    return 0 if outcome.get("status") in ("saved", "duplicate", "enqueued") else 1


def start(thread_id: str, owner_id: str, session_id: str, query: str, label: str) -> int:
    quiet_logs()
    banner(f"{label} · start")
    ensure_dataset(get_engine(get_settings().database_url))
    print(f"user> {query}")
    inp = new_run(thread_id, owner_id, query, session_id=session_id)
    config = run_config_for(inp)  # its checkpoints record the conversation thread and owner
    with open_graph() as (graph, checkpointer):
        stream(graph, inp, config)
        return _finish(graph, checkpointer, config, inp["session_id"])


def resume(session_id: str, approved: bool, by: str, label: str) -> int:
    quiet_logs()
    banner(f"{label} · resume")
    with open_graph() as (graph, checkpointer):
        state = graph.get_state(run_config(session_id))
        if not state.next:
            print(f"error: no paused run for session {session_id}", file=sys.stderr)
            return 1
        # The resumed steps' checkpoints record the conversation too (from the saved state).
        config = run_config_for({**state.values, "session_id": session_id})
        print(
            f"  (loaded the checkpoint of session {session_id[:8]} from Postgres: "
            f"paused at {', '.join(state.next)}; user asked: {state.values['user_query']!r})"
        )
        stream(graph, Command(resume={"approved": approved, "by": by}), config)
        return _finish(graph, checkpointer, config, session_id)
