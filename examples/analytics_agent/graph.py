"""The analytics agent graph.

    START -> load_context -> intent -> write_sql -> approve -> run_query -> visualize -> finalize
                                                      | (not approved) ---------------> finalize

- `load_context` reads the thread's conversation memory (owner-checked) into the state.
- `intent`, `write_sql` and `visualize` each render their own view of that memory under their
  own token budget (`brief`, `sql`, `visualizations`) and plan from it.
- `approve` pauses the run with LangGraph's `interrupt()` until a human approves the SQL; the
  checkpointer (Postgres, schema `langgraph`) lets another process resume it. SQL that memory
  shows already ran in an earlier turn of the thread is not asked about again.
- `finalize` hands the turn to conversation memory (in-process save, or the
  `memory.finalize_turn` job), so the next run of the thread sees it. A run after an enqueued
  turn names it (`await_session_id`) and its `load_context` waits for it.

`build(checkpointer, use_async=True)` makes `load_context` and `finalize` coroutines
(`aget_context`, `asave_session_to_thread_safe` / `aenqueue_turn`) for `ainvoke`/`astream` with
an AsyncPostgresSaver; the other nodes are the same functions (LangGraph runs them in threads).

Every node appends human-readable lines to `trace`; the runner prints them as the run goes.
"""

from __future__ import annotations

import asyncio
import operator
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from sqlalchemy import Engine

from examples.analytics_agent import planner
from examples.analytics_agent.dataset import TABLE_DOC, run_query
from memory_core import RedisConversationMemory
from memory_core.langgraph import (
    FinalizeMode,
    MemoryState,
    afinalize_turn,
    aload_conversation_context,
    context_from_state,
    context_view,
    finalize_turn,
    load_conversation_context,
    snapshot_from_state,
)
from memory_core.settings import Settings
from memory_core.tokens import count_tokens

# Each node's token budget for its view of memory.
BUDGETS = {"brief": 400, "sql": 1500, "visualizations": 800}


class AgentState(MemoryState, total=False):
    plan: dict[str, Any]
    sql: str
    approval: dict[str, Any]
    result: dict[str, Any]
    visualization: dict[str, Any] | None
    answer: str
    trace: Annotated[list[str], operator.add]


Node = Callable[[AgentState], Any]  # returns the update, or (async nodes) a coroutine of it


def _view(state: AgentState, focus: str) -> tuple[str, str]:
    """(the node's view, a note on its size for the transcript)."""
    text = context_view(state, focus, BUDGETS[focus])  # type: ignore[arg-type]
    return text, f"{focus} view {count_tokens(text)}/{BUDGETS[focus]} tokens"


class AnalyticsAgent:
    """The nodes, bound to the agent's memory, dataset database and optional LLM."""

    def __init__(
        self,
        memory: RedisConversationMemory,
        engine: Engine,
        settings: Settings,
        *,
        finalize_mode: FinalizeMode = "inprocess",
        use_llm: bool | None = None,
    ) -> None:
        self.memory = memory
        self.engine = engine
        self.settings = settings
        self.finalize_mode = finalize_mode
        self.use_llm = settings.llm_configured if use_llm is None else use_llm

    def build(self, checkpointer: Any, *, use_async: bool = False) -> Any:
        """The compiled graph; `use_async`: memory nodes as coroutines (run it with ainvoke)."""
        g = StateGraph(AgentState)
        nodes: dict[str, Node] = {
            "load_context": self.aload_context if use_async else self.load_context,
            "intent": self.intent,
            "write_sql": self.write_sql,
            "approve": self.approve,
            "run_query": self.run_query,
            "visualize": self.visualize,
            "finalize": self.afinalize if use_async else self.finalize,
        }
        for name, fn in nodes.items():
            g.add_node(name, fn)  # type: ignore[call-overload]
        g.add_edge(START, "load_context")
        for a, b in [("load_context", "intent"), ("intent", "write_sql"), ("write_sql", "approve")]:
            g.add_edge(a, b)
        g.add_conditional_edges("approve", _after_approval, ["run_query", "finalize"])
        g.add_edge("run_query", "visualize")
        g.add_edge("visualize", "finalize")
        g.add_edge("finalize", END)
        return g.compile(checkpointer=checkpointer)

    # -- nodes -----------------------------------------------------------------------------

    def load_context(self, state: AgentState) -> dict[str, Any]:
        cached = self._cached(state["thread_id"])
        return _loaded(state, load_conversation_context(state, self.memory), cached)

    async def aload_context(self, state: AgentState) -> dict[str, Any]:
        cached = await asyncio.to_thread(self._cached, state["thread_id"])
        return _loaded(state, await aload_conversation_context(state, self.memory), cached)

    def _cached(self, thread_id: str) -> bool:
        """Whether the thread has a Redis working copy (for the transcript only)."""
        meta_key, _ = self.memory.copy.keys(thread_id)
        return bool(self.memory.redis.exists(meta_key))

    def intent(self, state: AgentState) -> dict[str, Any]:
        view, size = _view(state, "brief")
        plan = planner.plan_intent(state["user_query"], view)
        what = {"new_query": "a new question", "refine": "a follow-up on the last query"}
        detail = what.get(plan["kind"], f"a {plan.get('chart')} chart of the last result")
        if plan.get("dimension"):
            detail += f", broken down by {plan['dimension']}"
        trace = [f"{size} -> {plan['kind']}: {detail}"]
        # This agent declares: what the user set for the rest of the thread, every run.
        declared = planner.declare(state["user_query"])
        for d in declared:
            trace.append(
                f"declares standing instruction ({d['subject']}): {d['text'] or 'withdrawn'}"
            )
        return {"plan": plan, "standing_instructions": declared, "trace": trace}

    def write_sql(self, state: AgentState) -> dict[str, Any]:
        view, size = _view(state, "sql")
        plan, question = dict(state["plan"]), state["user_query"]
        prior = planner.last_sql(view)
        sql, origin = None, ""
        if plan["kind"] == "visualize" and prior:
            sql, origin = prior.sql, f"reuses the SQL of turn #{prior.seq} verbatim"
            plan["reused_from"] = prior.seq
        elif self.use_llm:
            sql = planner.llm_sql(question, view, TABLE_DOC, self.settings)
            origin = "written by the LLM" if sql else "LLM answer unusable: planner fallback"
        if sql is None and plan["kind"] == "refine" and prior:
            sql = planner.extend_sql(prior.sql, plan["dimension"])
            origin = (origin + "; " if origin else "") + (
                f"extends the SQL of turn #{prior.seq} (same filters) by {plan['dimension']}"
            )
        if sql is None:
            standing = planner.standing_conditions(view, state.get("standing_instructions", []))
            sql = planner.new_sql(question, plan.get("dimension"), standing)
            origin = (origin + "; " if origin else "") + "new query from the question"
            if standing:
                origin += " and the standing instructions in force"
        shown = "\n".join(f"    {line}" for line in sql.splitlines())
        return {"plan": plan, "sql": sql, "trace": [f"{size} -> {origin}:\n{shown}"]}

    def approve(self, state: AgentState) -> dict[str, Any]:
        seq = state["plan"].get("reused_from")
        if seq is not None:
            by = f"memory: this exact SQL was approved and ran in turn #{seq}"
            return {"approval": {"approved": True, "by": by}, "trace": [f"no pause ({by})"]}
        decision = interrupt({"action": "approve_sql", "sql": state["sql"]})
        if not isinstance(decision, dict):
            decision = {"approved": bool(decision)}
        approved, by = bool(decision.get("approved")), str(decision.get("by", "a human"))
        update: dict[str, Any] = {"approval": {"approved": approved, "by": by}}
        if not approved:
            update["answer"] = "The query was not approved, so nothing was run."
        update["trace"] = [f"resumed: {'approved' if approved else 'REJECTED'} by {by}"]
        return update

    def run_query(self, state: AgentState) -> dict[str, Any]:
        result = run_query(self.engine, state["sql"])
        preview = "; ".join(", ".join(planner._fmt(v) for v in row) for row in result["rows"][:4])
        more = " ..." if len(result["rows"]) > 4 else ""
        n, cols = len(result["rows"]), ", ".join(result["columns"])
        return {"result": result, "trace": [f"{n} row(s) [{cols}]: {preview}{more}"]}

    def visualize(self, state: AgentState) -> dict[str, Any]:
        view, size = _view(state, "visualizations")
        title = planner.describe_sql(state["sql"])
        viz = planner.choose_visualization(state["plan"], state["result"], view, title)
        answer = planner.compose_answer(title, state["result"], viz)
        line = f'{size} -> {viz["type"]} #{viz["id"]} "{viz["name"]}"'
        if viz["type"] == "CHART":
            opts = viz["options"]
            line += f" (globalSeriesType={opts['globalSeriesType']}, {opts['columnMapping']})"
            previous = planner.last_visualization(view)
            if previous:
                line += f"; replaces {previous['type']} #{previous['id']} from memory"
        return {"visualization": viz, "answer": answer, "trace": [line]}

    def finalize(self, state: AgentState) -> dict[str, Any]:
        outcome = finalize_turn(_turn(state), mode=self.finalize_mode, memory=self.memory)
        return _finalized(state, outcome)

    async def afinalize(self, state: AgentState) -> dict[str, Any]:
        outcome = await afinalize_turn(_turn(state), mode=self.finalize_mode, memory=self.memory)
        return _finalized(state, outcome)


def _loaded(state: AgentState, update: dict[str, Any], cached: bool) -> dict[str, Any]:
    """load_context's update with its transcript line."""
    ctx = context_from_state(update)
    if not ctx.recent and not ctx.summary:
        where = "no earlier turns: a new conversation"
    else:
        source = "the Redis working copy" if cached else "Postgres (no Redis copy: rehydrated)"
        where = f"{len(ctx.recent)} earlier turn(s), read from {source}"
    trace = [f"memory of thread {state['thread_id'][:8]}: {where}"]
    awaited = state.get("await_session_id")
    if awaited:
        missing = bool(ctx.missing_session_ids)
        found = "NOT in memory yet (timed out; the run goes on)" if missing else "in memory"
        trace.append(f"waited for the previous turn (session {awaited[:8]}): {found}")
    return {**update, "trace": trace}


def _turn(state: AgentState) -> dict[str, Any]:
    """The run's turn snapshot for finalize."""
    ran = bool(state.get("result"))
    viz = state.get("visualization")
    return snapshot_from_state(
        state,
        answer=state.get("answer", ""),
        sql=[state["sql"]] if ran else [],  # memory only ever holds SQL that ran
        visualizations=[viz] if viz else [],
        response_payload={
            "answer": state.get("answer", ""),
            "result": state.get("result") or {},
            "visualization": viz,
            "approval": state.get("approval"),
        },
    )


def _finalized(state: AgentState, outcome: Mapping[str, Any]) -> dict[str, Any]:
    """finalize's update with its transcript line."""
    seq = f" as turn #{outcome['seq']}" if outcome.get("seq") else ""
    line = f"turn {outcome['status']}{seq} ({outcome['mode']}, session {state['session_id']})"
    return {"memory_outcome": dict(outcome), "trace": [line]}


def _after_approval(state: AgentState) -> str:
    return "run_query" if state.get("approval", {}).get("approved") else "finalize"
