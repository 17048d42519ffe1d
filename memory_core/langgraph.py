"""LangGraph integration: conversation memory in workflow state, and a separate checkpointer.

Two systems, deliberately kept apart (see README, "LangGraph"):

- **Conversation memory** carries context *across runs* of one conversation thread. A run loads
  it at its start (`load_conversation_context`, owner-checked), every node renders its own view
  under its own token budget (`context_view`), and the run hands its turn back at the end
  (`finalize_turn`: in-process `save_session_to_thread_safe`, or the `memory.finalize_turn` job).
- **The LangGraph checkpointer** keeps the execution state of *one run* so it can pause for a
  human and resume in another process. It lives in the same Postgres database but in its own
  schema (`langgraph`: tables checkpoints, checkpoint_blobs, checkpoint_writes,
  checkpoint_migrations), created by `setup_checkpointer` (run by `agent-memory migrate`).
  Alembic never sees that schema, so it is not migration drift. Its threads are runs: use the
  turn's `session_id` as the checkpointer's `thread_id` (`run_config`), and `forget_run` once
  the run has finalized (checkpoints are kept per session, not per conversation).

The state field `conversation_context` holds `ConversationContext.model_dump(mode="json")`:
plain JSON, so the checkpointer's serializer never needs to revive a custom class (it works with
`LANGGRAPH_STRICT_MSGPACK=true`). The memory helpers need no LangGraph; the checkpointer
functions need the extra: `pip install '.[langgraph]'`.
"""

from __future__ import annotations

import importlib
import re
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypedDict, cast

from pydantic import ValidationError

from memory_core.context import ConversationContext
from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.fold_publisher import FINALIZE_QUEUE, FINALIZE_TASK, send_by_name
from memory_core.logs import get_logger
from memory_core.session_handler import (
    format_validation_error,
    parse_snapshot,
    save_session_to_thread_safe,
)
from memory_core.settings import get_settings
from memory_core.views import DEFAULT_MAX_TOKENS, Focus, render_conversation_context

if TYPE_CHECKING:
    from langgraph.checkpoint.postgres import PostgresSaver

log = get_logger(__name__)

INSTALL_HINT = "pip install '.[langgraph]'"
CHECKPOINT_SCHEMA = "langgraph"
CHECKPOINT_TABLES = (
    "checkpoint_migrations",
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
)
# pg_advisory_lock key serialising concurrent setups (CREATE ... IF NOT EXISTS can still race).
_SETUP_LOCK = 0x4C47_4350  # "LGCP"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")

# The JSON form of memory_core.ConversationContext (what the state field holds).
ConversationContextJSON = dict[str, Any]
FinalizeMode = Literal["inprocess", "enqueue"]


class MemoryState(TypedDict, total=False):
    """The state keys the helpers read and write; extend it with your graph's own keys."""

    thread_id: str  # the conversation thread (memory)
    owner_id: str
    agent_type: Literal["chat", "copilot"]
    session_id: str  # this run's turn: finalize's idempotency key and the checkpointer thread
    user_query: str
    conversation_context: ConversationContextJSON
    memory_outcome: dict[str, Any]  # what finalize reported


# -- conversation memory in the state --------------------------------------------------------


def new_run(
    thread_id: str | uuid.UUID,
    owner_id: str,
    user_query: str,
    *,
    agent_type: Literal["chat", "copilot"] = "chat",
    session_id: str | uuid.UUID | None = None,
) -> MemoryState:
    """The input of a run: one user query in a conversation thread, with a fresh session id."""
    return MemoryState(
        thread_id=str(uuid.UUID(str(thread_id))),
        owner_id=owner_id,
        agent_type=agent_type,
        session_id=str(session_id or uuid.uuid4()),
        user_query=user_query,
    )


def run_config(session_id: str | uuid.UUID, **configurable: Any) -> dict[str, Any]:
    """The graph config of a run: the checkpointer's thread is the run (session), not the chat."""
    return {"configurable": {"thread_id": str(session_id), **configurable}}


def context_to_state(ctx: ConversationContext) -> ConversationContextJSON:
    return ctx.model_dump(mode="json")


def context_from_state(state: Mapping[str, Any]) -> ConversationContext:
    """The state's conversation context (empty when the run has not loaded one)."""
    raw = state.get("conversation_context")
    if raw is None:
        return ConversationContext(thread_id=uuid.UUID(str(state["thread_id"])))
    if isinstance(raw, ConversationContext):
        return raw
    return ConversationContext.model_validate(raw)


def load_conversation_context(
    state: Mapping[str, Any], memory: RedisConversationMemory | None = None
) -> dict[str, Any]:
    """Node body: read the thread's memory for its owner into `conversation_context`.

    A thread with no turns yet (the first run of a conversation) gets an empty context. So
    does a thread owned by someone else: memory never tells the two apart (the same
    `ThreadNotFound`), so nothing leaks, and that run's finalize is rejected.
    """
    thread_id = uuid.UUID(str(state["thread_id"]))
    memory = memory or RedisConversationMemory()
    try:
        ctx = memory.get_context(thread_id, str(state["owner_id"]))
    except ThreadNotFound:
        ctx = ConversationContext(thread_id=thread_id)
    return {"conversation_context": context_to_state(ctx)}


def make_load_context_node(
    memory: RedisConversationMemory | None = None,
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A graph node that loads the conversation context (add it right after START)."""

    def load_context(state: Mapping[str, Any]) -> dict[str, Any]:
        return load_conversation_context(state, memory)

    return load_context


def context_view(
    state: Mapping[str, Any], focus: Focus, max_tokens: int = DEFAULT_MAX_TOKENS
) -> str:
    """The node's own view of the run's memory: `render_conversation_context` on the state."""
    return render_conversation_context(context_from_state(state), focus, max_tokens)


# -- finalize at the end of a run ------------------------------------------------------------


def snapshot_from_state(state: Mapping[str, Any], **turn: Any) -> dict[str, Any]:
    """A TurnSnapshot dict: ids and query from the state, the run's results from `turn`."""
    base = {
        "session_id": state["session_id"],
        "thread_id": state["thread_id"],
        "owner_id": state["owner_id"],
        "agent_type": state.get("agent_type", "chat"),
        "user_query": state["user_query"],
    }
    return {**base, **turn}


def finalize_turn(
    snapshot: Mapping[str, Any],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
    broker_url: str | None = None,
) -> dict[str, Any]:
    """Hand the run's turn to memory; returns a JSON dict for the state (`memory_outcome`).

    `inprocess` runs `save_session_to_thread_safe`. `enqueue` validates the snapshot here
    (bad input is `rejected` at once, never queued) and sends `memory.finalize_turn` by name;
    if the broker is unreachable it saves in-process instead: the turn is never dropped, and
    a job that did get through as well is a harmless duplicate (idempotent on session_id).
    A node that finalizes may be re-run by LangGraph after a crash: same session, same result.
    """
    if mode == "enqueue":
        try:
            payload = parse_snapshot(snapshot).model_dump(mode="json")
        except ValidationError as exc:
            return {"status": "rejected", "mode": mode, "reason": format_validation_error(exc)}
        broker = broker_url or (memory.settings if memory else get_settings()).celery_broker_url
        try:
            task_id = send_by_name(FINALIZE_TASK, [payload], FINALIZE_QUEUE, broker)
        except Exception as exc:  # any broker/transport error: fall back to the same core
            log.warning("memory.finalize_enqueue_failed", error=repr(exc))
        else:
            return {"status": "enqueued", "mode": mode, "task_id": task_id}
    outcome = save_session_to_thread_safe(snapshot, memory=memory)
    return {
        "status": outcome.status,
        "mode": "inprocess",
        "seq": outcome.seq,
        "reason": outcome.reason,
        "retryable": outcome.retryable,
    }


def make_finalize_node(
    build_turn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A graph node that finalizes the run's turn; `build_turn(state)` gives answer, sql, ..."""

    def finalize(state: Mapping[str, Any]) -> dict[str, Any]:
        snapshot = snapshot_from_state(state, **build_turn(state))
        return {"memory_outcome": finalize_turn(snapshot, mode=mode, memory=memory)}

    return finalize


# -- the checkpointer: same database, own schema ---------------------------------------------


def langgraph_available() -> bool:
    """True when the `langgraph` extra (langgraph-checkpoint-postgres, psycopg 3) is installed."""
    try:
        for name in ("psycopg", "psycopg_pool", "langgraph.checkpoint.postgres"):
            importlib.import_module(name)
    except ImportError:
        return False
    return True


def _require_langgraph() -> None:
    if not langgraph_available():
        raise ImportError(f"the LangGraph checkpointer needs the langgraph extra: {INSTALL_HINT}")


def checkpointer_conninfo(database_url: str | None = None, schema: str = CHECKPOINT_SCHEMA) -> str:
    """A psycopg 3 conninfo for DATABASE_URL whose search_path is the checkpointer's schema.

    DATABASE_URL is SQLAlchemy-style (`postgresql+psycopg2://...`); libpq wants `postgresql://`.
    """
    _require_langgraph()
    from psycopg.conninfo import make_conninfo
    from sqlalchemy.engine import make_url

    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema must be a plain lower-case identifier, not {schema!r}")
    url = make_url(database_url or get_settings().database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"the checkpointer needs a PostgreSQL URL, not {url.drivername}")
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return make_conninfo(
        libpq,
        options=f"-c search_path={schema}",
        application_name="agent-memory-checkpointer",
        connect_timeout=5,
    )


def setup_checkpointer(database_url: str | None = None, schema: str = CHECKPOINT_SCHEMA) -> None:
    """Create the schema and let PostgresSaver create or migrate its tables (idempotent)."""
    _require_langgraph()
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import sql
    from psycopg.rows import dict_row

    conninfo = checkpointer_conninfo(database_url, schema)
    # autocommit: PostgresSaver's migrations include CREATE INDEX CONCURRENTLY.
    with psycopg.connect(
        conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK,))
        try:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            PostgresSaver(conn).setup()
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK,))


@contextmanager
def postgres_checkpointer(
    database_url: str | None = None,
    *,
    schema: str = CHECKPOINT_SCHEMA,
    max_size: int = 4,
    setup: bool = False,
) -> Iterator[PostgresSaver]:
    """A PostgresSaver on a psycopg 3 pool over DATABASE_URL, in the checkpointer's schema.

    The tables must exist (`agent-memory migrate`, or `setup=True`). The pool is closed on exit.
    """
    _require_langgraph()
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import Connection
    from psycopg.rows import DictRow, dict_row
    from psycopg_pool import ConnectionPool

    if setup:
        setup_checkpointer(database_url, schema)
    pool = ConnectionPool(
        checkpointer_conninfo(database_url, schema),
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        open=False,
        name="agent-memory-checkpointer",
    )
    pool.open(wait=True, timeout=10)
    try:
        yield PostgresSaver(cast("ConnectionPool[Connection[DictRow]]", pool))
    finally:
        pool.close()


def forget_run(checkpointer: Any, session_id: str | uuid.UUID) -> None:
    """Delete a finished run's checkpoints (the turn itself is in conversation memory)."""
    checkpointer.delete_thread(str(session_id))
