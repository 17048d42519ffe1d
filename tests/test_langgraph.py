"""LangGraph integration with the real langgraph and the Postgres checkpointer (the extra).

The checkpointer keeps one *run* (pause/resume across processes); conversation memory carries a
*thread* across runs. Both live in one database, in separate schemas.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.postgres", reason="needs the langgraph extra")

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from langgraph.types import Command
from sqlalchemy import Row, create_engine, inspect, text

import memory_core.models  # noqa: F401
from examples.analytics_agent.dataset import ensure_dataset
from examples.analytics_agent.graph import AnalyticsAgent
from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices import fake_llm
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import Base, get_engine
from memory_core.langgraph import (
    CHECKPOINT_SCHEMA,
    CHECKPOINT_TABLES,
    MemoryState,
    checkpoint_runs,
    checkpointer_conninfo,
    context_view,
    finalize_turn,
    load_conversation_context,
    make_finalize_node,
    make_load_context_node,
    new_run,
    postgres_checkpointer,
    run_config,
    run_config_for,
    setup_checkpointer,
)
from memory_core.settings import Settings, get_settings
from tests.support.commands import run_module, run_python
from tests.support.snapshots import make_snapshot

Q1 = "What was total revenue in 2025, excluding returns?"
OK_DECLARED: dict[str, str | None] = {
    "subject": "returns",
    "text": "Leave out returns (NOT is_return)",
}


@pytest.fixture(scope="module", autouse=True)
def prepared() -> None:
    """What `agent-memory migrate` does with the extra installed, plus the sample dataset."""
    setup_checkpointer()
    ensure_dataset(get_engine())


@pytest.fixture
def checkpointer() -> Iterator[Any]:
    with postgres_checkpointer() as saver:
        yield saver


def agent_graph(checkpointer: Any, settings: Settings | None = None) -> Any:
    s = settings or get_settings()
    agent = AnalyticsAgent(RedisConversationMemory(settings=s), get_engine(), s)
    return agent.build(checkpointer)


def example(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("examples.analytics_agent", *args, env=env)


def turns(thread_id: str) -> Sequence[Row[*tuple[Any, ...]]]:
    with get_engine().connect() as conn:
        return conn.execute(
            text("SELECT seq, artifacts FROM thread_messages WHERE thread_id = :t ORDER BY seq"),
            {"t": thread_id},
        ).all()


def checkpoint_rows(session: str) -> int:
    with get_engine().connect() as conn:
        query = text(f"SELECT count(*) FROM {CHECKPOINT_SCHEMA}.checkpoints WHERE thread_id = :s")
        return int(conn.execute(query, {"s": session}).scalar_one())


def conversation_runs(thread_id: str, owner_id: str) -> int:
    with get_engine().connect() as conn:
        return checkpoint_runs(conn, thread_ids=[uuid.UUID(thread_id)], owner_id=owner_id)


def test_conninfo_converts_the_sqlalchemy_url() -> None:
    info = checkpointer_conninfo(
        "postgresql+psycopg2://u:p%40ss@db.internal:6543/mem?sslmode=require"
    )
    assert "host=db.internal" in info and "port=6543" in info and "dbname=mem" in info
    assert "password=p@ss" in info and "sslmode=require" in info
    assert "options='-c search_path=langgraph'" in info
    with pytest.raises(ValueError, match="identifier"):
        checkpointer_conninfo("postgresql://u@h/db", schema="x; DROP")


def test_helpers_import_without_the_extra() -> None:
    code = (
        "import sys\n"
        "for m in ('langgraph', 'psycopg', 'psycopg_pool'): sys.modules[m] = None\n"
        "import memory_core.langgraph as lg\n"
        "assert not lg.langgraph_available()\n"
        "try:\n    lg.setup_checkpointer('postgresql://u@h/db')\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    out = run_python("-c", code)
    assert out.returncode == 0, out.stderr
    assert "pip install '.[langgraph]'" in out.stdout


def test_migrate_sets_up_the_checkpointer_in_its_own_schema_without_drift(scratch_db: str) -> None:
    out = run_module("memory_core.cli", "migrate", env={"DATABASE_URL": scratch_db})
    assert out.returncode == 0, out.stderr
    assert f"LangGraph checkpointer tables ready in schema {CHECKPOINT_SCHEMA}" in out.stdout
    setup_checkpointer(scratch_db)  # idempotent
    engine = create_engine(scratch_db)
    insp = inspect(engine)
    assert set(insp.get_table_names(schema=CHECKPOINT_SCHEMA)) == set(CHECKPOINT_TABLES)
    # The default schema holds Alembic's tables only: none of the checkpointer's.
    assert set(insp.get_table_names()) == {"alembic_version", *Base.metadata.tables}
    with engine.connect() as conn:  # as migrations/env.py compares: the default schema only
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    engine.dispose()


def test_load_context_owner_checked_and_views(memory: RedisConversationMemory) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    state: dict[str, Any] = dict(new_run(tid, owner, "hello"))
    empty = load_conversation_context(state, memory)["conversation_context"]
    assert empty["recent"] == [] and empty["summary"] is None  # a new thread: no error
    for n in (1, 2):
        assert save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory).ok
    state.update(load_conversation_context(state, memory))
    assert [t["seq"] for t in state["conversation_context"]["recent"]] == [1, 2]
    json.dumps(state)  # the state field is plain JSON
    stranger = load_conversation_context({**state, "owner_id": "mallory"}, memory)
    assert stranger["conversation_context"]["recent"] == []  # nothing leaks
    sql_view = context_view(state, "sql", max_tokens=400)
    assert "SQL:\n  SELECT region, SUM(revenue)" in sql_view
    brief = context_view(state, "brief", max_tokens=130)
    assert "[#2]" in brief and "[#1]" not in brief  # its own budget: oldest dropped first


def test_finalize_turn_in_process_enqueue_rejected_and_fallback(
    memory: RedisConversationMemory,
) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    snap = make_snapshot(tid, 1, owner_id=owner)
    assert finalize_turn(snap, memory=memory)["status"] == "saved"
    assert finalize_turn(snap, memory=memory)["status"] == "duplicate"
    bad = finalize_turn({**snap, "session_id": "nope"}, mode="enqueue", memory=memory)
    assert bad["status"] == "rejected" and "session_id" in bad["reason"]
    # Broker down: the turn is saved in-process instead of being dropped.
    down = finalize_turn(
        make_snapshot(tid, 2, owner_id=owner),
        mode="enqueue",
        memory=memory,
        broker_url="redis://127.0.0.1:1/0",
    )
    assert down["status"] == "saved" and down["mode"] == "inprocess"
    assert [r.seq for r in turns(tid)] == [1, 2]


def test_node_factories_in_a_minimal_graph(memory: RedisConversationMemory) -> None:
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(MemoryState)
    # langgraph's node protocols name their parameter `state`: a Callable type (positional
    # parameter) matches no add_node overload, though it runs (langgraph issue 8950).
    g.add_node("load_context", make_load_context_node(memory))  # type: ignore[call-overload]
    finalize = make_finalize_node(lambda st: {"answer": "ok"}, memory=memory)
    g.add_node("finalize", finalize)  # type: ignore[call-overload]
    g.add_edge(START, "load_context")
    g.add_edge("load_context", "finalize")
    g.add_edge("finalize", END)
    graph = g.compile()
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    outcomes = [graph.invoke(new_run(tid, owner, q)) for q in ("first", "second")]
    assert [o["memory_outcome"]["seq"] for o in outcomes] == [1, 2]
    assert [t["seq"] for t in outcomes[1]["conversation_context"]["recent"]] == [1]
    # A planner that declares puts standing_instructions in the state; finalize sends them.
    said = new_run(tid, owner, "third")
    said["standing_instructions"] = [OK_DECLARED]
    assert graph.invoke(said)["memory_outcome"]["seq"] == 3
    view = context_view(
        {"conversation_context": memory.get_context(tid, owner).model_dump(mode="json")},
        "brief",
        2000,
    )
    assert f"- Declared (returns): {OK_DECLARED['text']}" in view


def test_finalize_enqueue_runs_on_a_worker(start_worker: Callable[..., WorkerProcess]) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    env = {"MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"}
    worker = start_worker(queues="memory.finalize", concurrency=1, env=env)
    sent = finalize_turn(make_snapshot(tid, 1, owner_id=owner), mode="enqueue")
    assert sent["status"] == "enqueued" and sent["task_id"]
    wait_for(lambda: turns(tid), 30, "the enqueued turn to land", worker.log)


def test_sync_load_waits_for_the_awaited_turn_or_flags_it(
    start_worker: Callable[..., WorkerProcess],
) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    snap = make_snapshot(tid, 1, owner_id=owner)
    sent = finalize_turn(snap, mode="enqueue")
    assert (sent["status"], sent["mode"]) == ("enqueued", "enqueue")
    assert (sent["session_id"], sent["thread_id"]) == (snap["session_id"], tid)
    start_worker(
        queues="memory.finalize", concurrency=1, env={"MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"}
    )
    state = dict(new_run(tid, owner, "next", await_session_id=sent["session_id"]))
    patient = get_settings().model_copy(update={"memory_read_wait_s": 60})
    ctx = load_conversation_context(state, RedisConversationMemory(settings=patient))
    assert [t["seq"] for t in ctx["conversation_context"]["recent"]] == [1]
    assert ctx["conversation_context"]["missing_session_ids"] == []
    # A turn that never comes: the run goes on with what there is, the turn flagged missing.
    never = str(uuid.uuid4())
    brief = get_settings().model_copy(update={"memory_read_wait_s": 0.2})
    flagged = load_conversation_context(
        {**state, "await_session_id": never}, RedisConversationMemory(settings=brief)
    )
    assert [t["seq"] for t in flagged["conversation_context"]["recent"]] == [1]
    assert flagged["conversation_context"]["missing_session_ids"] == [never]


def test_pause_here_resume_in_another_process(checkpointer: Any) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    inp = new_run(tid, owner, Q1)
    config = run_config_for(inp)
    graph = agent_graph(checkpointer)
    graph.invoke(inp, config)
    state = graph.get_state(config)
    assert state.next == ("approve",)
    assert "NOT is_return" in state.interrupts[0].value["sql"]
    json.dumps(state.values)  # the whole run state, memory included, is plain JSON
    assert isinstance(state.values["conversation_context"], dict)
    assert checkpoint_rows(inp["session_id"]) > 0 and turns(tid) == []  # paused, not finalized
    assert conversation_runs(tid, owner) == 1  # its checkpoints record the conversation
    # A new process (that would refuse to revive arbitrary classes) picks the run up.
    out = example(
        "resume",
        "--session",
        inp["session_id"],
        "--by",
        "test",
        env={"LANGGRAPH_STRICT_MSGPACK": "true"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "approved by test" in out.stdout and "turn saved as turn #1" in out.stdout
    [(_, artifacts)] = turns(tid)
    assert artifacts[0] == {"kind": "sql", "sql": state.values["sql"]}
    assert checkpoint_rows(inp["session_id"]) == 0  # a finished run's checkpoints are deleted
    assert conversation_runs(tid, owner) == 0


def test_rejected_sql_is_neither_run_nor_remembered(checkpointer: Any) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    inp = new_run(tid, owner, Q1)
    config = run_config_for(inp)
    graph = agent_graph(checkpointer)
    graph.invoke(inp, config)
    final = graph.invoke(Command(resume={"approved": False, "by": "test"}), config)
    assert "not approved" in final["answer"] and "result" not in final
    assert final["memory_outcome"]["status"] == "saved"
    # No SQL, no chart: only what the agent declares (nothing, for this question).
    assert turns(tid)[0].artifacts == [{"kind": "standing", "items": []}]


def test_the_llm_writes_sql_from_the_sql_view(
    checkpointer: Any, memory: RedisConversationMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    first = make_snapshot(tid, 25, owner_id=owner, user_query=Q1)
    assert save_session_to_thread_safe(first, memory=memory).ok
    llm_sql = "SELECT region, SUM(revenue) AS revenue FROM sales GROUP BY region"
    monkeypatch.setattr(fake_llm, "deterministic_summary", lambda body: llm_sql)
    with FakeLLMServer() as llm:
        s = get_settings().model_copy(
            update={"openai_base_url": llm.base_url, "openai_api_key": "sk-test"}
        )
        graph = agent_graph(checkpointer, s)
        inp = new_run(tid, owner, "now break that down by region")
        graph.invoke(inp, run_config_for(inp))
        prompt = llm.prompt_text()
    assert first["sql"][0] in prompt  # the LLM saw the previous SQL verbatim (the sql view)
    assert graph.get_state(run_config(inp["session_id"])).values["sql"] == llm_sql


def test_four_runs_of_one_thread_in_separate_processes(memory: RedisConversationMemory) -> None:
    tid, owner = str(uuid.uuid4()), f"lg-{uuid.uuid4().hex[:6]}"
    out = example("--thread", tid, "--owner", owner)
    assert out.returncode == 0, out.stdout + out.stderr
    pids = [line.rsplit(" ", 2)[-2] for line in out.stdout.splitlines() if "· process" in line]
    assert len(pids) == len(set(pids)) == 7  # start+resume twice, start, start+resume
    assert "read from Postgres (no Redis copy: rehydrated)" in out.stdout
    rows = turns(tid)
    assert [r.seq for r in rows] == [1, 2, 3, 4]  # each run finalized its turn
    # Run 1 declared the standing instruction; the others declared nothing new.
    declared = [r.artifacts[-1] for r in rows]
    assert [a["kind"] for a in declared] == ["standing"] * 4
    assert declared[0]["items"] == [
        {"subject": "returns", "text": "Leave out returns (SQL: NOT is_return)"}
    ]
    assert [a["items"] for a in declared[1:]] == [[], [], []]
    # Run 4 asks a new question without the word "returns": memory's section supplied it.
    sql4 = rows[3].artifacts[0]["sql"]
    assert "SUM(quantity)" in sql4 and "NOT is_return" in sql4
    sql1, sql2, sql3 = (r.artifacts[0]["sql"] for r in rows[:3])
    where1 = sql1[sql1.index("WHERE") :]
    assert "NOT is_return" in where1 and "2025" in where1
    assert where1 in sql2 and "GROUP BY region" in sql2  # run 2 extends run 1, same filters
    assert sql3 == sql2  # run 3 charts the region query
    viz = rows[2].artifacts[1]
    assert viz["kind"] == "visualization" and viz["type"] == "CHART"
    assert (viz["chart"], viz["x"], viz["y"]) == ("column", ["region"], ["revenue"])
    assert [t.seq for t in memory.get_context(tid, owner).recent] == [1, 2, 3, 4]
