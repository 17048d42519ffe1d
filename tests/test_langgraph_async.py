"""Async LangGraph: the memory nodes as coroutines, AsyncPostgresSaver, read-your-writes.

Real Postgres, Redis, AsyncPostgresSaver and Celery workers. Every scenario runs in its own
event loop (`asyncio.run`, as one process or request would) and closes its async clients.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

pytest.importorskip("langgraph.checkpoint.postgres", reason="needs the langgraph extra")

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from sqlalchemy import text

from examples.analytics_agent.graph import AnalyticsAgent
from memory_core import (
    RedisConversationMemory,
    aclose_connections,
    delete_thread,
    save_session_to_thread_safe,
)
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import get_engine
from memory_core.langgraph import (
    CHECKPOINT_SCHEMA,
    FinalizeMode,
    MemoryState,
    afinalize_turn,
    aforget_run,
    aload_conversation_context,
    async_postgres_checkpointer,
    finalize_turn,
    make_async_finalize_node,
    make_async_load_context_node,
    new_run,
    run_config,
    run_config_for,
)
from memory_core.settings import get_settings
from tests import test_langgraph
from tests.support.snapshots import make_snapshot
from tests.test_langgraph import Q1, checkpoint_rows, conversation_runs, example, turns

# test_langgraph.py's module fixture: the checkpointer's tables and the sample dataset.
prepared = test_langgraph.prepared

T = TypeVar("T")
WORKER_ENV = {"MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"}
# A whole id, or the 8-character prefix the transcript shows.
_ID = re.compile(r"\b[0-9a-f]{8}(?:-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})?\b")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`main()` in an event loop of its own; that loop's async pools are closed after it."""

    async def scenario() -> T:
        try:
            return await main()
        finally:
            await aclose_connections()

    return asyncio.run(scenario())


def ids() -> tuple[str, str]:
    return str(uuid.uuid4()), f"lg-async-{uuid.uuid4().hex[:6]}"


def minimal_graph(
    memory: RedisConversationMemory, *, mode: FinalizeMode = "inprocess", checkpointer: Any = None
) -> Any:
    g = StateGraph(MemoryState)
    # Any: langgraph's node protocols name their parameter `state`, which a Callable type
    # cannot (mypy's verdict on the mismatch varies; see test_langgraph.py, langgraph #8950).
    load: Any = make_async_load_context_node(memory)
    finalize: Any = make_async_finalize_node(lambda st: {"answer": "ok"}, mode=mode, memory=memory)
    g.add_node("load_context", load)
    g.add_node("finalize", finalize)
    g.add_edge(START, "load_context")
    g.add_edge("load_context", "finalize")
    g.add_edge("finalize", END)
    return g.compile(checkpointer=checkpointer)


def agent_graph(memory: RedisConversationMemory, checkpointer: Any) -> Any:
    agent = AnalyticsAgent(memory, get_engine(), get_settings())
    return agent.build(checkpointer, use_async=True)


def run_metadata(session: str) -> set[tuple[str, str]]:
    """The conversation (thread, owner) recorded by each checkpoint of the run."""
    with get_engine().connect() as conn:
        rows = conn.execute(
            text(
                "SELECT metadata ->> 'memory_thread_id', metadata ->> 'memory_owner_id' "
                f"FROM {CHECKPOINT_SCHEMA}.checkpoints WHERE thread_id = :s"
            ),
            {"s": session},
        ).all()
    return {(r[0], r[1]) for r in rows}


async def start_paused(inp: MemoryState) -> Any:
    """Start the example agent's async graph on `inp`; it pauses for approval. Its state."""
    async with (
        RedisConversationMemory() as memory,
        async_postgres_checkpointer() as checkpointer,
    ):
        graph = agent_graph(memory, checkpointer)
        await graph.ainvoke(inp, run_config_for(inp))
        return await graph.aget_state(run_config(inp["session_id"]))


def test_async_nodes_load_and_finalize() -> None:
    tid, owner = ids()

    async def main() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        async with RedisConversationMemory() as memory:
            graph = minimal_graph(memory)
            outs = [await graph.ainvoke(new_run(tid, owner, q)) for q in ("first", "second")]
            stranger = await aload_conversation_context(new_run(tid, "mallory", "hi"), memory)
            return outs, stranger

    (first, second), stranger = run(main)
    assert first["conversation_context"]["recent"] == []  # a new thread: empty, no error
    assert first["memory_outcome"] == {
        "status": "saved",
        "mode": "inprocess",
        "seq": 1,
        "reason": None,
        "retryable": False,
        "session_id": first["session_id"],
        "thread_id": tid,
    }
    assert second["memory_outcome"]["seq"] == 2
    assert [t["seq"] for t in second["conversation_context"]["recent"]] == [1]
    assert stranger["conversation_context"]["recent"] == []  # nothing leaks
    assert [r.seq for r in turns(tid)] == [1, 2]


def test_afinalize_turn_reports_as_finalize_turn(memory: RedisConversationMemory) -> None:
    tid, owner = ids()
    snap = make_snapshot(tid, 1, owner_id=owner)
    bad = {**snap, "session_id": "nope"}
    saved = finalize_turn(snap, memory=memory)

    async def main() -> list[dict[str, Any]]:
        async with RedisConversationMemory() as amemory:
            return [
                await afinalize_turn(snap, memory=amemory),
                await afinalize_turn(bad, mode="enqueue", memory=amemory),
                await afinalize_turn(
                    make_snapshot(tid, 2, owner_id=owner),
                    mode="enqueue",
                    memory=amemory,
                    broker_url="redis://127.0.0.1:1/0",  # broker down: saved in-process
                ),
            ]

    duplicate, rejected, fallback = run(main)
    assert saved["status"] == "saved"
    assert duplicate == finalize_turn(snap, memory=memory)  # the sync one's answer, key for key
    assert duplicate == {**saved, "status": "duplicate", "reason": duplicate["reason"]}
    assert rejected == finalize_turn(bad, mode="enqueue", memory=memory)
    assert rejected["status"] == "rejected" and rejected["mode"] == "enqueue"
    assert "session_id" in rejected["reason"]
    assert (fallback["status"], fallback["mode"], fallback["seq"]) == ("saved", "inprocess", 2)
    assert [r.seq for r in turns(tid)] == [1, 2]


def test_paused_async_run_resumes_in_a_new_saver_and_loop() -> None:
    tid, owner = ids()
    inp = new_run(tid, owner, Q1)
    session = inp["session_id"]

    paused = run(lambda: start_paused(inp))
    assert paused.next == ("approve",)
    sql = paused.values["sql"]
    assert "NOT is_return" in sql
    assert checkpoint_rows(session) > 0 and turns(tid) == []  # paused, not finalized
    # Every checkpoint of the run records its conversation: deletable with it.
    assert run_metadata(session) == {(tid, owner)}

    async def resume() -> dict[str, Any]:
        async with (
            RedisConversationMemory() as memory,
            async_postgres_checkpointer() as checkpointer,  # a new saver, in a new loop
        ):
            graph = agent_graph(memory, checkpointer)
            state = await graph.aget_state(run_config(session))
            config = run_config_for({**state.values, "session_id": session})
            final: dict[str, Any] = await graph.ainvoke(
                Command(resume={"approved": True, "by": "test"}), config
            )
            assert run_metadata(session) == {(tid, owner)}  # the resumed steps' too
            await aforget_run(checkpointer, session)
            return final

    final = run(resume)
    assert final["memory_outcome"]["status"] == "saved" and final["memory_outcome"]["seq"] == 1
    assert final["approval"] == {"approved": True, "by": "test"}
    [(_, artifacts)] = turns(tid)
    assert artifacts[0] == {"kind": "sql", "sql": sql}
    assert checkpoint_rows(session) == 0  # aforget_run deleted the finished run's checkpoints


def test_delete_thread_deletes_a_paused_async_runs_checkpoints(
    memory: RedisConversationMemory,
) -> None:
    tid, owner = ids()
    assert save_session_to_thread_safe(make_snapshot(tid, 1, owner_id=owner), memory=memory).ok
    inp = new_run(tid, owner, Q1)
    assert run(lambda: start_paused(inp)).next == ("approve",)
    assert conversation_runs(tid, owner) == 1

    report = delete_thread(tid, owner, memory=memory)

    assert report.checkpoints == 1
    assert conversation_runs(tid, owner) == 0
    assert checkpoint_rows(inp["session_id"]) == 0


def test_load_flags_an_awaited_turn_that_never_lands(memory: RedisConversationMemory) -> None:
    tid, owner = ids()
    assert save_session_to_thread_safe(make_snapshot(tid, 1, owner_id=owner), memory=memory).ok
    never = str(uuid.uuid4())
    brief = get_settings().model_copy(update={"memory_read_wait_s": 0.2})

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with RedisConversationMemory(settings=brief) as amemory:
            known = new_run(tid, owner, "next", await_session_id=never)
            unknown = new_run(uuid.uuid4(), owner, "first", await_session_id=never)
            return (
                await aload_conversation_context(known, amemory),
                await aload_conversation_context(unknown, amemory),
            )

    known, unknown = run(main)
    ctx = known["conversation_context"]
    assert [t["seq"] for t in ctx["recent"]] == [1]  # the run goes on with what there is
    assert ctx["missing_session_ids"] == [never]
    # A thread that never appeared: empty, and the awaited turn is missing.
    assert unknown["conversation_context"]["recent"] == []
    assert unknown["conversation_context"]["missing_session_ids"] == [never]


def test_the_next_run_waits_for_the_enqueued_turn(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    tid, owner = ids()
    patient = get_settings().model_copy(update={"memory_read_wait_s": 120})

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with RedisConversationMemory(settings=patient) as memory:
            graph = minimal_graph(memory, mode="enqueue")
            first = await graph.ainvoke(new_run(tid, owner, "first"))
            sent = first["memory_outcome"]
            # No worker yet: turn 1 waits in the queue, and so does the next run's load.
            nxt = new_run(tid, owner, "second", await_session_id=sent["session_id"])
            second = asyncio.create_task(graph.ainvoke(nxt))
            done, _ = await asyncio.wait({second}, timeout=1.0)
            assert not done, "the load did not wait for the enqueued turn"
            await asyncio.to_thread(
                start_worker, queues="memory.finalize", concurrency=1, env=WORKER_ENV
            )
            return first, sent, await second

    first, sent, second = run(main)
    assert sent["status"] == "enqueued" and sent["mode"] == "enqueue" and sent["task_id"]
    assert (sent["session_id"], sent["thread_id"]) == (first["session_id"], tid)
    ctx = second["conversation_context"]
    assert [t["seq"] for t in ctx["recent"]] == [1]  # the load saw turn 1
    assert ctx["missing_session_ids"] == []
    assert second["memory_outcome"]["status"] == "enqueued"
    wait_for(lambda: len(turns(tid)) == 2, 30, "the second enqueued turn to land")


def normalized(transcript: str) -> list[str]:
    """The transcript without what differs between two plays: ids, pids, the mode line."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0)[:8], f"<id{len(names)}>")

    lines = []
    for line in transcript.splitlines():
        if not line.startswith("graph: "):
            lines.append(_ID.sub(name, re.sub(r"process \d+", "process N", line)))
    return lines


def test_the_example_async_plays_the_same_transcript() -> None:
    owner = f"lg-async-{uuid.uuid4().hex[:6]}"
    sync_tid, async_tid = str(uuid.uuid4()), str(uuid.uuid4())
    sync = example("--thread", sync_tid, "--owner", owner)
    assert sync.returncode == 0, sync.stdout + sync.stderr
    played = example("--thread", async_tid, "--owner", owner, "--async")
    assert played.returncode == 0, played.stdout + played.stderr
    assert "graph: async: astream, AsyncPostgresSaver" in played.stdout
    assert "graph: sync: stream, PostgresSaver" in sync.stdout
    assert normalized(played.stdout) == normalized(sync.stdout)
    # The same conversation: paused and resumed three times, four turns, the same artifacts.
    assert played.stdout.count("· resume · process") == 3
    assert [r.artifacts for r in turns(async_tid)] == [r.artifacts for r in turns(sync_tid)]
    assert [r.seq for r in turns(async_tid)] == [1, 2, 3, 4]


def test_the_example_enqueued_runs_wait_for_the_previous_turn(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    start_worker(queues="memory.finalize", concurrency=1, env=WORKER_ENV)
    tid, owner = ids()
    out = example(
        "--thread",
        tid,
        "--owner",
        owner,
        "--async",
        "--finalize",
        "enqueue",
        env={"MEMORY_READ_WAIT_S": "60"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("turn enqueued (enqueue, session") == 4
    waited = re.findall(r"waited for the previous turn \(session \w{8}\): (.+)", out.stdout)
    assert waited == ["in memory"] * 3  # runs 2, 3 and 4
    rows = turns(tid)
    assert [r.seq for r in rows] == [1, 2, 3, 4]
    assert "NOT is_return" in rows[3].artifacts[0]["sql"]  # run 4 read run 1's declaration
    sql1, sql2 = rows[0].artifacts[0]["sql"], rows[1].artifacts[0]["sql"]
    assert sql1[sql1.index("WHERE") :] in sql2  # run 2 saw turn 1's SQL: it waited for it
