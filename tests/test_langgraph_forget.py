"""Forgetting a conversation forgets its LangGraph runs: checkpoints findable and deletable.

Every run's checkpoints record its conversation thread and owner (`run_config_for`), so
deleting a thread or forgetting a user deletes the checkpoints of its runs, paused ones
included, in the caller's transaction. Real Postgres, real PostgresSaver, a real graph.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("langgraph.checkpoint.postgres", reason="needs the langgraph extra")

from langgraph.graph import END, START, StateGraph
from sqlalchemy import create_engine, text

from memory_core import RedisConversationMemory
from memory_core.io.db import get_engine
from memory_core.langgraph import (
    CHECKPOINT_SCHEMA,
    MemoryState,
    checkpoint_runs,
    delete_owner_checkpoints,
    delete_thread_checkpoints,
    make_finalize_node,
    make_load_context_node,
    new_run,
    run_config,
    run_config_for,
    setup_checkpointer,
)
from tests import test_langgraph
from tests.support.commands import run_python
from tests.test_langgraph import turns

# test_langgraph.py's fixtures: the checkpointer set up (module, autouse) and a PostgresSaver.
prepared = test_langgraph.prepared
checkpointer = test_langgraph.checkpointer

DATA_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")
META_INDEXES = {
    "checkpoints_memory_thread_id_idx": "memory_thread_id",
    "checkpoints_memory_owner_id_idx": "memory_owner_id",
}


class RunState(MemoryState, total=False):
    answer: str


def review_subgraph() -> Any:
    """Drafts an answer, then pauses before a human checks it: its checkpoints get a namespace."""
    g = StateGraph(RunState)
    g.add_node("draft", lambda st: {"answer": f"draft for {st['user_query']}"})
    g.add_node("check", lambda st: {"answer": f"{st['answer']} (checked)"})
    g.add_edge(START, "draft")
    g.add_edge("draft", "check")
    g.add_edge("check", END)
    return g.compile(interrupt_before=["check"])


def small_graph(checkpointer: Any, memory: RedisConversationMemory) -> Any:
    """load_context → review (a subgraph that pauses) → finalize: a run that waits for a human."""
    g = StateGraph(RunState)
    # langgraph's node protocols name their parameter `state` (see test_langgraph.py).
    g.add_node("load_context", make_load_context_node(memory))  # type: ignore[arg-type]
    g.add_node("review", review_subgraph())
    finalize = make_finalize_node(lambda st: {"answer": st["answer"]}, memory=memory)
    g.add_node("finalize", finalize)  # type: ignore[arg-type]
    g.add_edge(START, "load_context")
    g.add_edge("load_context", "review")
    g.add_edge("review", "finalize")
    g.add_edge("finalize", END)
    return g.compile(checkpointer=checkpointer, interrupt_before=["finalize"])


@dataclass
class Run:
    thread_id: str
    owner_id: str
    session_id: str


def start_run(graph: Any, thread_id: str, owner_id: str) -> Run:
    """A run paused before it finalized (its thread may not even have a row yet)."""
    inp = new_run(thread_id, owner_id, "revenue by region?")
    graph.invoke(inp, run_config_for(inp))
    assert graph.get_state(run_config(inp["session_id"])).next  # paused
    return Run(thread_id, owner_id, inp["session_id"])


def resume_run(graph: Any, run: Run, *, with_conversation: bool = True) -> None:
    """Resume until the run finalizes its turn (past the check, then the finalize)."""
    config = run_config(run.session_id)
    if with_conversation:  # as the example runner resumes: from the saved state
        config = run_config_for(graph.get_state(config).values)
    while graph.get_state(config).next:
        graph.invoke(None, config)
    assert graph.get_state(run_config(run.session_id)).values["memory_outcome"]["status"] == "saved"


def rows(session_id: str) -> dict[str, int]:
    """The run's rows in each checkpointer table."""
    with get_engine().connect() as conn:
        return {
            t: int(
                conn.execute(
                    text(f"SELECT count(*) FROM {CHECKPOINT_SCHEMA}.{t} WHERE thread_id = :r"),
                    {"r": session_id},
                ).scalar_one()
            )
            for t in DATA_TABLES
        }


def runs_of(*, thread_ids: list[str] | None = None, owner_id: str | None = None) -> int:
    with get_engine().connect() as conn:
        ids = None if thread_ids is None else [uuid.UUID(t) for t in thread_ids]
        return checkpoint_runs(conn, thread_ids=ids, owner_id=owner_id)


def new_owner() -> str:
    return f"lg-forget-{uuid.uuid4().hex[:6]}"


@dataclass
class Conversations:
    """Thread A (owner 1): a finished and a paused run; thread B (owner 1): a finished run,
    resumed without the conversation in its config; thread C (owner 2): two paused runs."""

    owner1: str
    owner2: str
    a_done: Run
    a_paused: Run
    b_done: Run
    c_paused: list[Run]

    @property
    def all_runs(self) -> list[Run]:
        return [self.a_done, self.a_paused, self.b_done, *self.c_paused]


@pytest.fixture
def convs(checkpointer: Any, memory: RedisConversationMemory) -> Iterator[Conversations]:
    graph = small_graph(checkpointer, memory)
    owner1, owner2 = new_owner(), new_owner()
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    a_done = start_run(graph, a, owner1)
    resume_run(graph, a_done)
    b_done = start_run(graph, b, owner1)
    resume_run(graph, b_done, with_conversation=False)
    c_paused = [start_run(graph, c, owner2) for _ in range(2)]
    yield Conversations(owner1, owner2, a_done, start_run(graph, a, owner1), b_done, c_paused)


def test_run_config_records_the_conversation_in_every_checkpoint(
    checkpointer: Any, memory: RedisConversationMemory
) -> None:
    tid, owner = uuid.uuid4(), new_owner()
    inp = new_run(tid, owner, "hello")
    assert run_config(inp["session_id"]) == {"configurable": {"thread_id": inp["session_id"]}}
    config = run_config_for(inp)
    assert config == run_config(inp["session_id"], thread_id=tid, owner_id=owner)
    assert config["configurable"] == {"thread_id": inp["session_id"]}
    with pytest.raises(ValueError):
        run_config(inp["session_id"], thread_id="not-a-uuid")
    run = start_run(small_graph(checkpointer, memory), str(tid), owner)
    want = {"memory_thread_id": str(tid), "memory_owner_id": owner}
    listed = list(checkpointer.list(run_config(run.session_id)))
    assert listed and all(want.items() <= dict(c.metadata).items() for c in listed)
    assert [c.config for c in checkpointer.list(None, filter=want)] == [c.config for c in listed]
    with get_engine().connect() as conn:
        stored = conn.execute(
            text(
                f"SELECT checkpoint_ns, metadata FROM {CHECKPOINT_SCHEMA}.checkpoints"
                " WHERE thread_id = :r"
            ),
            {"r": run.session_id},
        ).all()
    assert {ns == "" for ns, _ in stored} == {True, False}  # the subgraph's namespace too
    assert all(want.items() <= meta.items() for _, meta in stored)
    assert turns(str(tid)) == []  # paused: never finalized


def test_deleting_a_thread_deletes_its_runs_finished_and_paused(
    convs: Conversations, checkpointer: Any
) -> None:
    a = convs.a_done.thread_id
    before = {r.session_id: rows(r.session_id) for r in convs.all_runs}
    assert all(n > 0 for counts in before.values() for n in counts.values())
    assert runs_of(thread_ids=[a]) == 2 and [t.seq for t in turns(a)] == [1]
    with get_engine().begin() as conn:
        assert delete_thread_checkpoints(conn, [uuid.UUID(a)]) == 2
    for run in (convs.a_done, convs.a_paused):
        assert checkpointer.get_tuple(run_config(run.session_id)) is None
        assert rows(run.session_id) == dict.fromkeys(DATA_TABLES, 0)
    for run in (convs.b_done, *convs.c_paused):
        assert rows(run.session_id) == before[run.session_id]
    assert runs_of(thread_ids=[a]) == 0
    assert runs_of(owner_id=convs.owner1) == 1  # thread B's run
    assert [t.seq for t in turns(a)] == [1]  # memory's rows are the caller's business
    with get_engine().begin() as conn:
        assert delete_thread_checkpoints(conn, [uuid.UUID(a)]) == 0  # nothing left: idempotent
        assert delete_thread_checkpoints(conn, []) == 0


def test_a_run_is_deleted_whole_though_its_resumed_steps_lack_the_conversation(
    convs: Conversations, checkpointer: Any
) -> None:
    run = convs.b_done
    metas = [dict(c.metadata) for c in checkpointer.list(run_config(run.session_id))]
    assert any("memory_thread_id" in m for m in metas)
    assert any("memory_thread_id" not in m for m in metas)  # resumed with run_config(session)
    with get_engine().begin() as conn:
        assert delete_thread_checkpoints(conn, [run.thread_id]) == 1
    assert rows(run.session_id) == dict.fromkeys(DATA_TABLES, 0)


def test_forgetting_an_owner_deletes_its_runs_in_batches(convs: Conversations) -> None:
    before = {r.session_id: rows(r.session_id) for r in convs.all_runs}
    assert runs_of(owner_id=convs.owner2) == len(convs.c_paused) == 2
    assert turns(convs.c_paused[0].thread_id) == []  # paused runs of a thread with no row yet
    removed = []
    while True:
        with get_engine().begin() as conn:
            n = delete_owner_checkpoints(conn, convs.owner2, limit=1)
        removed.append(n)
        if n == 0:
            break
    assert removed == [1, 1, 0]  # at most `limit` runs per call
    for run in convs.c_paused:
        assert rows(run.session_id) == dict.fromkeys(DATA_TABLES, 0)
    for run in (convs.a_done, convs.a_paused, convs.b_done):
        assert rows(run.session_id) == before[run.session_id]
    with get_engine().begin() as conn:
        assert delete_owner_checkpoints(conn, convs.owner1) == 3  # no limit: all at once
    assert runs_of(owner_id=convs.owner1) == 0
    with pytest.raises(ValueError, match="limit"), get_engine().begin() as conn:
        delete_owner_checkpoints(conn, convs.owner1, limit=0)


def test_a_rolled_back_transaction_leaves_every_run_in_place(
    convs: Conversations, checkpointer: Any, memory: RedisConversationMemory
) -> None:
    before = {r.session_id: rows(r.session_id) for r in convs.all_runs}
    with get_engine().connect() as conn, conn.begin() as tx:
        assert delete_thread_checkpoints(conn, [convs.a_done.thread_id]) == 2
        assert delete_owner_checkpoints(conn, convs.owner2) == 2
        assert checkpoint_runs(conn, owner_id=convs.owner2) == 0  # seen inside the tx
        tx.rollback()
    assert {r.session_id: rows(r.session_id) for r in convs.all_runs} == before
    # The paused run is intact: a human can still let it finish.
    resume_run(small_graph(checkpointer, memory), convs.a_paused)
    assert [t.seq for t in turns(convs.a_paused.thread_id)] == [1, 2]


def test_no_checkpointer_schema_is_nothing_to_delete() -> None:
    absent = f"lg_absent_{uuid.uuid4().hex[:8]}"
    tid = uuid.uuid4()
    with get_engine().begin() as conn:
        assert delete_thread_checkpoints(conn, [tid], schema=absent) == 0
        assert delete_owner_checkpoints(conn, "someone", schema=absent, limit=5) == 0
        assert checkpoint_runs(conn, thread_ids=[tid], owner_id="someone", schema=absent) == 0
        with pytest.raises(ValueError, match="identifier"):
            delete_thread_checkpoints(conn, [tid], schema="x; DROP")
        with pytest.raises(ValueError, match="thread_ids, owner_id"):
            checkpoint_runs(conn)


def test_deletions_need_no_langgraph_extra() -> None:
    code = (
        "import sys, uuid\n"
        "for m in ('langgraph', 'psycopg', 'psycopg_pool'): sys.modules[m] = None\n"
        "from memory_core.io.db import get_engine\n"
        "import memory_core.langgraph as lg\n"
        "assert not lg.langgraph_available()\n"
        "with get_engine().begin() as conn:\n"
        "    print(lg.delete_thread_checkpoints(conn, [uuid.uuid4()]),\n"
        "          lg.delete_owner_checkpoints(conn, 'nobody-' + uuid.uuid4().hex, limit=2),\n"
        "          lg.checkpoint_runs(conn, owner_id='nobody'),\n"
        "          lg.delete_thread_checkpoints(conn, [uuid.uuid4()], schema='lg_none'))\n"
    )
    out = run_python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "0", "0", "0"]


def metadata_indexes(conn: Any) -> dict[str, str]:
    found = conn.execute(
        text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = :s"),
        {"s": CHECKPOINT_SCHEMA},
    ).all()
    return {name: d for name, d in found if name in META_INDEXES}


def test_setup_indexes_the_conversation_keys_idempotently(scratch_db: str) -> None:
    setup_checkpointer(scratch_db)
    engine = create_engine(scratch_db)
    try:
        with engine.connect() as conn:
            first = metadata_indexes(conn)
        assert set(first) == set(META_INDEXES)
        for name, key in META_INDEXES.items():
            assert f"ON {CHECKPOINT_SCHEMA}.checkpoints" in first[name]
            assert f"((metadata ->> '{key}'::text))" in first[name]
        setup_checkpointer(scratch_db)  # idempotent
        with engine.connect() as conn:
            assert metadata_indexes(conn) == first
    finally:
        engine.dispose()


def test_setup_rebuilds_an_index_whose_build_failed(scratch_db: str) -> None:
    setup_checkpointer(scratch_db)
    name, key = "checkpoints_memory_owner_id_idx", "memory_owner_id"
    engine = create_engine(scratch_db, isolation_level="AUTOCOMMIT")
    table = f"{CHECKPOINT_SCHEMA}.checkpoints"
    valid = text(
        f"SELECT indisvalid FROM pg_index WHERE indexrelid = '{CHECKPOINT_SCHEMA}.{name}'::regclass"
    )
    try:
        with engine.connect() as conn:
            for n in (1, 2):  # duplicates: a unique index build fails, leaving it invalid
                conn.execute(
                    text(
                        f"INSERT INTO {table} (thread_id, checkpoint_id, checkpoint, metadata)"
                        " VALUES (:t, 'c', '{}', CAST(:m AS jsonb))"
                    ),
                    {"t": f"run-{n}", "m": f'{{"{key}": "same"}}'},
                )
            conn.execute(text(f"DROP INDEX {CHECKPOINT_SCHEMA}.{name}"))
            with pytest.raises(Exception, match="could not create unique index"):
                conn.execute(
                    text(
                        f"CREATE UNIQUE INDEX CONCURRENTLY {name} ON {table}"
                        f" ((metadata ->> '{key}'))"
                    )
                )
            assert conn.execute(valid).scalar_one() is False
        setup_checkpointer(scratch_db)
        with engine.connect() as conn:
            assert conn.execute(valid).scalar_one() is True
            assert "UNIQUE" not in metadata_indexes(conn)[name]
            assert checkpoint_runs(conn, owner_id="same") == 2
    finally:
        engine.dispose()


# -- through the product's deletions (memory_core.lifecycle.threads) -----------------


def test_delete_thread_deletes_its_runs_and_forget_owner_its_unsaved_runs(
    checkpointer: Any, memory: RedisConversationMemory
) -> None:
    from memory_core import delete_thread, forget_owner

    graph = small_graph(checkpointer, memory)
    owner, other = new_owner(), new_owner()
    saved = start_run(graph, str(uuid.uuid4()), owner)
    resume_run(graph, saved)  # its thread now has a row
    paused = start_run(graph, saved.thread_id, owner)
    first_only = start_run(graph, str(uuid.uuid4()), owner)  # paused before any row existed
    kept = start_run(graph, str(uuid.uuid4()), other)
    before_other = runs_of(owner_id=other)

    report = delete_thread(saved.thread_id, owner, memory=memory)

    assert report.checkpoints == 2  # the finished run and the paused one
    assert runs_of(thread_ids=[saved.thread_id]) == 0
    assert checkpointer.get_tuple(run_config(paused.session_id)) is None
    assert runs_of(thread_ids=[first_only.thread_id]) == 1  # another thread: untouched

    forgotten = forget_owner(owner, memory=memory)

    assert forgotten.threads == 0  # no row was ever written for it
    assert forgotten.checkpoints == 1 and forgotten.remaining_checkpoints == 0
    assert runs_of(owner_id=owner) == 0
    assert runs_of(owner_id=other) == before_other
    assert rows(kept.session_id)["checkpoints"] > 0


def test_a_run_executing_during_the_delete_is_swept_afterwards(
    checkpointer: Any, memory: RedisConversationMemory
) -> None:
    from memory_core import delete_thread
    from memory_core.lifecycle.purge import sweep_late_checkpoints

    graph = small_graph(checkpointer, memory)
    owner = new_owner()
    first = start_run(graph, str(uuid.uuid4()), owner)
    resume_run(graph, first)
    live = start_run(graph, first.thread_id, owner)  # mid-run (paused) when the delete comes
    delete_thread(first.thread_id, owner, memory=memory)
    # The run goes on in its process: it checkpoints again after the delete, with the
    # conversation in its metadata, and its finalize is refused.
    late = new_run(first.thread_id, owner, "and by quarter?")
    graph.invoke(late, run_config_for(late))
    graph.invoke(None, run_config_for(late))
    graph.invoke(None, run_config_for(late))
    outcome = graph.get_state(run_config(late["session_id"])).values["memory_outcome"]
    assert (outcome["status"], outcome["reason"]) == ("rejected", "deleted")
    assert runs_of(thread_ids=[first.thread_id]) == 1
    assert checkpointer.get_tuple(run_config(live.session_id)) is None

    assert sweep_late_checkpoints(memory) == 1

    assert runs_of(thread_ids=[first.thread_id]) == 0
