"""LangGraph integration: conversation memory in workflow state, and a separate checkpointer.

Two systems, deliberately kept apart (see README, "LangGraph"):

- **Conversation memory** carries context *across runs* of one conversation thread. A run loads
  it at its start (`load_conversation_context`, owner-checked), every node renders its own view
  under its own token budget (`context_view`), and the run hands its turn back at the end
  (`finalize_turn`: in-process `save_session_to_thread_safe`, or the `memory.finalize_turn` job).
  A run whose previous turn was enqueued names it in `await_session_id`: the load waits for it
  (read-your-writes, `on_timeout="flag"`). Every helper has an async twin for `ainvoke`
  (`aload_conversation_context`, `make_async_load_context_node`, `afinalize_turn`,
  `make_async_finalize_node`, `async_postgres_checkpointer`, `aforget_run`).
- **The LangGraph checkpointer** keeps the execution state of *one run* so it can pause for a
  human and resume in another process. It lives in the same Postgres database but in its own
  schema (`langgraph`: tables checkpoints, checkpoint_blobs, checkpoint_writes,
  checkpoint_migrations), created by `setup_checkpointer` (run by `agent-memory migrate`).
  Alembic never sees that schema, so it is not migration drift. Its threads are runs: use the
  turn's `session_id` as the checkpointer's `thread_id` (`run_config_for(state)`), and
  `forget_run` once the run has finalized (checkpoints are kept per session, not per
  conversation). Every checkpoint's metadata records the run's conversation
  (`memory_thread_id`, `memory_owner_id`, indexed), so deleting a conversation thread or
  forgetting a user deletes its runs' checkpoints too, paused runs included, in the caller's
  transaction (`delete_thread_checkpoints`, `delete_owner_checkpoints`: plain SQLAlchemy).

The state field `conversation_context` holds `ConversationContext.model_dump(mode="json")`:
plain JSON, so the checkpointer's serializer never needs to revive a custom class (it works with
`LANGGRAPH_STRICT_MSGPACK=true`). The memory helpers and the checkpoint deletions need no
LangGraph; the checkpointer functions need the extra: `pip install '.[langgraph]'`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypedDict

from memory_core import (
    SaveOutcome,
    aenqueue_turn,
    asave_session_to_thread_safe,
    enqueue_turn,
    save_session_to_thread_safe,
)
from memory_core.conversation_memory import RedisConversationMemory, ThreadNotFound
from memory_core.copy.context import ConversationContext
from memory_core.copy.views import DEFAULT_MAX_TOKENS, Focus, render_conversation_context
from memory_core.lifecycle.checkpoints import (
    CHECKPOINT_SCHEMA,
    CHECKPOINT_TABLES,
    INSTALL_HINT,
    META_OWNER_ID,
    META_THREAD_ID,
    aforget_run,
    async_postgres_checkpointer,
    checkpoint_runs,
    checkpointer_conninfo,
    delete_owner_checkpoints,
    delete_thread_checkpoints,
    forget_run,
    langgraph_available,
    postgres_checkpointer,
    setup_checkpointer,
)

# The checkpointer half lives in memory_core/lifecycle/checkpoints.py; its names are public
# here too.
__all__ = [
    "CHECKPOINT_SCHEMA",
    "CHECKPOINT_TABLES",
    "INSTALL_HINT",
    "META_OWNER_ID",
    "META_THREAD_ID",
    "MemoryState",
    "afinalize_turn",
    "aforget_run",
    "aload_conversation_context",
    "async_postgres_checkpointer",
    "checkpoint_runs",
    "checkpointer_conninfo",
    "context_from_state",
    "context_to_state",
    "context_view",
    "delete_owner_checkpoints",
    "delete_thread_checkpoints",
    "finalize_turn",
    "forget_run",
    "langgraph_available",
    "load_conversation_context",
    "make_async_finalize_node",
    "make_async_load_context_node",
    "make_finalize_node",
    "make_load_context_node",
    "new_run",
    "outcome_to_state",
    "postgres_checkpointer",
    "run_config",
    "run_config_for",
    "setup_checkpointer",
    "snapshot_from_state",
]

ConversationContextJSON = dict[str, Any]
FinalizeMode = Literal["inprocess", "enqueue"]
Node = Callable[[Mapping[str, Any]], dict[str, Any]]
AsyncNode = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]


class MemoryState(TypedDict, total=False):
    """The state keys the helpers read and write; extend it with your graph's own keys."""

    thread_id: str  # the conversation thread (memory)
    owner_id: str
    agent_type: Literal["chat", "copilot"]
    session_id: str  # this run's turn: finalize's idempotency key and the checkpointer thread
    user_query: str
    conversation_context: ConversationContextJSON
    memory_outcome: dict[str, Any]  # what finalize reported
    # The previous run's turn when it was enqueued (its memory_outcome["session_id"]): the load
    # waits for it to land (MEMORY_READ_WAIT_S), then flags it in missing_session_ids if not.
    await_session_id: str
    # What this run's planner says the user set for the rest of the thread ({subject, text},
    # text None withdraws): finalize sends it as the snapshot's standing_instructions. An
    # agent that declares sets it on every run (an empty list when nothing changed).
    standing_instructions: list[dict[str, str | None]]


# -- conversation memory in the state --------------------------------------------------------


def new_run(
    thread_id: str | uuid.UUID,
    owner_id: str,
    user_query: str,
    *,
    agent_type: Literal["chat", "copilot"] = "chat",
    session_id: str | uuid.UUID | None = None,
    await_session_id: str | uuid.UUID | None = None,
) -> MemoryState:
    """The input of a run: one user query in a conversation thread, with a fresh session id.

    `await_session_id`: the previous run's enqueued turn, which this run's load waits for.
    """
    state = MemoryState(
        thread_id=str(uuid.UUID(str(thread_id))),
        owner_id=owner_id,
        agent_type=agent_type,
        session_id=str(session_id or uuid.uuid4()),
        user_query=user_query,
    )
    if await_session_id is not None:
        state["await_session_id"] = str(uuid.UUID(str(await_session_id)))
    return state


def run_config(
    session_id: str | uuid.UUID,
    *,
    thread_id: str | uuid.UUID | None = None,
    owner_id: str | None = None,
    **configurable: Any,
) -> dict[str, Any]:
    """The graph config of a run: the checkpointer's thread is the run (session), not the chat.

    Pass the run's conversation (`thread_id`, `owner_id`) so its checkpoints can be found and
    deleted with the conversation (`delete_thread_checkpoints`, `delete_owner_checkpoints`),
    paused runs included: LangGraph copies `config["metadata"]` into every checkpoint's
    metadata. `run_config_for(state)` does this from a run's input.
    """
    config: dict[str, Any] = {"configurable": {"thread_id": str(session_id), **configurable}}
    metadata: dict[str, str] = {}
    if thread_id is not None:
        metadata[META_THREAD_ID] = str(uuid.UUID(str(thread_id)))
    if owner_id is not None:
        metadata[META_OWNER_ID] = str(owner_id)
    if metadata:
        config["metadata"] = metadata
    return config


def run_config_for(state: Mapping[str, Any], **configurable: Any) -> dict[str, Any]:
    """The full config of a run from its input (`new_run`) or saved state values.

    The checkpointer's thread is the state's `session_id`; its checkpoints record the
    conversation `thread_id` and `owner_id` (when the state has them).
    """
    return run_config(
        state["session_id"],
        thread_id=state.get("thread_id"),
        owner_id=state.get("owner_id"),
        **configurable,
    )


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


def _read_args(state: Mapping[str, Any]) -> tuple[uuid.UUID, str, dict[str, Any]]:
    """(thread, owner, the read-your-writes options) of a run's memory read."""
    awaited = state.get("await_session_id")
    wait = {"wait_for": str(awaited), "on_timeout": "flag"} if awaited else {}
    return uuid.UUID(str(state["thread_id"])), str(state["owner_id"]), wait


def _unknown_thread(state: Mapping[str, Any], tid: uuid.UUID) -> ConversationContext:
    """An empty context; the awaited turn, if any, is certainly not in memory yet."""
    awaited = state.get("await_session_id")
    missing = [uuid.UUID(str(awaited))] if awaited else []
    return ConversationContext(thread_id=tid, missing_session_ids=missing)


def load_conversation_context(
    state: Mapping[str, Any], memory: RedisConversationMemory | None = None
) -> dict[str, Any]:
    """Node body: read the thread's memory for its owner into `conversation_context`.

    A thread with no turns yet (the first run of a conversation) gets an empty context. So
    does a thread owned by someone else: memory never tells the two apart (the same
    `ThreadNotFound`), so nothing leaks, and that run's finalize is rejected. With an
    `await_session_id` in the state the read waits for that turn; if it has not landed in
    time, the context lists it in `missing_session_ids` instead of failing the run.
    """
    tid, owner, wait = _read_args(state)
    try:
        ctx = (memory or RedisConversationMemory()).get_context(tid, owner, **wait)
    except ThreadNotFound:
        ctx = _unknown_thread(state, tid)
    return {"conversation_context": context_to_state(ctx)}


async def aload_conversation_context(
    state: Mapping[str, Any], memory: RedisConversationMemory | None = None
) -> dict[str, Any]:
    """`load_conversation_context` with `aget_context` (for `ainvoke`/`astream`)."""
    tid, owner, wait = _read_args(state)
    try:
        ctx = await (memory or RedisConversationMemory()).aget_context(tid, owner, **wait)
    except ThreadNotFound:
        ctx = _unknown_thread(state, tid)
    return {"conversation_context": context_to_state(ctx)}


def make_load_context_node(memory: RedisConversationMemory | None = None) -> Node:
    """A graph node that loads the conversation context (add it right after START)."""

    def load_context(state: Mapping[str, Any]) -> dict[str, Any]:
        return load_conversation_context(state, memory)

    return load_context


def make_async_load_context_node(memory: RedisConversationMemory | None = None) -> AsyncNode:
    """`make_load_context_node` for async graphs: the node awaits `aget_context`."""

    async def load_context(state: Mapping[str, Any]) -> dict[str, Any]:
        return await aload_conversation_context(state, memory)

    return load_context


def context_view(
    state: Mapping[str, Any], focus: Focus, max_tokens: int = DEFAULT_MAX_TOKENS
) -> str:
    """The node's own view of the run's memory: `render_conversation_context` on the state."""
    return render_conversation_context(context_from_state(state), focus, max_tokens)


# -- finalize at the end of a run ------------------------------------------------------------


def snapshot_from_state(state: Mapping[str, Any], **turn: Any) -> dict[str, Any]:
    """A TurnSnapshot dict: ids and query from the state (and the standing instructions the
    run declared, when it did), the run's results from `turn`."""
    base = {
        "session_id": state["session_id"],
        "thread_id": state["thread_id"],
        "owner_id": state["owner_id"],
        "agent_type": state.get("agent_type", "chat"),
        "user_query": state["user_query"],
    }
    if state.get("standing_instructions") is not None:
        base["standing_instructions"] = list(state["standing_instructions"])
    return {**base, **turn}


def outcome_to_state(outcome: SaveOutcome, mode: FinalizeMode) -> dict[str, Any]:
    """A finalize's SaveOutcome as the JSON dict for `memory_outcome`.

    `mode` says how the turn was handled: `enqueue` when it was queued (or refused before
    anything was sent), `inprocess` when it was saved here, the broker-down fallback included.
    Every shape names the turn (`session_id`, `thread_id`): after an enqueue, the next run
    passes `session_id` as its `await_session_id`.
    """
    ids = {"session_id": outcome.session_id, "thread_id": outcome.thread_id}
    if outcome.status == "enqueued":
        return {"status": "enqueued", "mode": "enqueue", "task_id": outcome.task_id, **ids}
    if outcome.status == "rejected" and mode == "enqueue" and outcome.thread_id is None:
        return {"status": "rejected", "mode": "enqueue", "reason": outcome.reason, **ids}
    return {
        "status": outcome.status,
        "mode": "inprocess",
        "seq": outcome.seq,
        "reason": outcome.reason,
        "retryable": outcome.retryable,
        **ids,
    }


def finalize_turn(
    snapshot: Mapping[str, Any],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
    broker_url: str | None = None,
) -> dict[str, Any]:
    """Hand the run's turn to memory; returns a JSON dict for the state (`memory_outcome`).

    `inprocess` runs `save_session_to_thread_safe`. `enqueue` runs `enqueue_turn`: the
    snapshot is validated here (bad input is `rejected` at once, never queued) and sent as the
    `memory.finalize_turn` job; if the broker is unreachable it is saved in-process instead:
    the turn is never dropped, and a job that did get through as well is a harmless duplicate
    (idempotent on session_id). A node that finalizes may be re-run by LangGraph after a
    crash: same session, same result.
    """
    if mode == "enqueue":
        outcome = enqueue_turn(snapshot, memory=memory, broker_url=broker_url)
    else:
        outcome = save_session_to_thread_safe(snapshot, memory=memory)
    return outcome_to_state(outcome, mode)


async def afinalize_turn(
    snapshot: Mapping[str, Any],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
    broker_url: str | None = None,
) -> dict[str, Any]:
    """`finalize_turn` for async graphs: `asave_session_to_thread_safe` or `aenqueue_turn`."""
    if mode == "enqueue":
        outcome = await aenqueue_turn(snapshot, memory=memory, broker_url=broker_url)
    else:
        outcome = await asave_session_to_thread_safe(snapshot, memory=memory)
    return outcome_to_state(outcome, mode)


def make_finalize_node(
    build_turn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
) -> Node:
    """A graph node that finalizes the run's turn; `build_turn(state)` gives answer, sql, ..."""

    def finalize(state: Mapping[str, Any]) -> dict[str, Any]:
        snapshot = snapshot_from_state(state, **build_turn(state))
        return {"memory_outcome": finalize_turn(snapshot, mode=mode, memory=memory)}

    return finalize


def make_async_finalize_node(
    build_turn: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    *,
    mode: FinalizeMode = "inprocess",
    memory: RedisConversationMemory | None = None,
) -> AsyncNode:
    """`make_finalize_node` for async graphs (`build_turn` stays a plain function)."""

    async def finalize(state: Mapping[str, Any]) -> dict[str, Any]:
        snapshot = snapshot_from_state(state, **build_turn(state))
        return {"memory_outcome": await afinalize_turn(snapshot, mode=mode, memory=memory)}

    return finalize
