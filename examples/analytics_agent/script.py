"""The scripted conversation: one thread, four runs, every step in a process of its own.

1. "From now on leave out returns. What was total revenue in 2025?" declares a standing
   instruction to memory (returns: NOT is_return) and pauses for approval; a NEW process
   resumes it from the Postgres checkpointer.
2. "now break that down by region": the SQL writer extends turn 1's SQL (same filters) with the
   breakdown, read from its `sql` view of memory. Approved in a new process too.
3. The Redis working copy is deleted (as if its TTL had expired), then "make that a bar chart":
   memory is rehydrated from Postgres and the visualizer builds a column chart of the region
   query.
4. "How many units did we sell in 2025?" is a new query: the SQL writer applies the standing
   instruction its `sql` view shows as declared (`NOT is_return`), though the question does
   not say it. Approved in a new process.

Each run finalizes its turn into conversation memory. `--async` plays the same conversation
with the async graph (same transcript); `--finalize enqueue` hands each turn to a worker (one
must be running: `agent-memory worker`), and each next run waits for the previous turn
(`--await-session`) before it reads memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from examples.analytics_agent.dataset import SCHEMA, ensure_dataset
from examples.analytics_agent.runner import PAUSED, Mode
from memory_core import RedisConversationMemory
from memory_core.devservices import DevServices, ensure_services
from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.io.db import get_engine
from memory_core.io.redis_client import make_redis
from memory_core.langgraph import CHECKPOINT_SCHEMA, FinalizeMode, setup_checkpointer
from memory_core.migrate import upgrade
from memory_core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
TURN_WAIT_S = 60  # enqueue mode: how long the driver waits for a worker to save a turn
QUESTIONS = (
    "From now on leave out returns. What was total revenue in 2025?",
    "now break that down by region",
    "make that a bar chart",
    "How many units did we sell in 2025?",
)


class ScriptError(RuntimeError):
    pass


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _step(env: dict[str, str], *args: str, expect: int) -> None:
    argv = [sys.executable, "-m", "examples.analytics_agent", *args]
    code = subprocess.run(argv, cwd=REPO, env=env, check=False, timeout=120).returncode
    if code != expect:
        raise ScriptError(f"step {' '.join(args[:1])} exited {code}, expected {expect}")


def _prepare(settings: Settings, mode: Mode) -> None:
    engine = get_engine(settings.database_url)
    upgrade(settings.database_url)
    setup_checkpointer(settings.database_url)
    rows = ensure_dataset(engine)
    print(
        "schemas of one database: public (memory: alembic upgrade head), "
        f"{CHECKPOINT_SCHEMA} (LangGraph checkpointer), {SCHEMA} (sample data: sales, {rows} rows)"
    )
    llm = settings.llm_configured
    print(
        f"planner: LLM {settings.memory_summarizer_model} writes SQL from the sql view, "
        "deterministic fallback"
        if llm
        else "planner: deterministic, reading the node views (set OPENAI_BASE_URL/_API_KEY "
        "to let an LLM write the SQL)"
    )
    graph = (
        "async: astream, AsyncPostgresSaver" if mode.use_async else "sync: stream, PostgresSaver"
    )
    print(f"graph: {graph}; finalize: {mode.finalize}")


def _checkpoint_rows(settings: Settings, session: str) -> int:
    with get_engine(settings.database_url).connect() as conn:
        query = text(f"SELECT count(*) FROM {CHECKPOINT_SCHEMA}.checkpoints WHERE thread_id = :s")
        return int(conn.execute(query, {"s": session}).scalar_one())


def _run(
    env: dict[str, str], n: int, common: list[str], pause: bool, s: Settings, *, after: str | None
) -> str:
    """Run `n` (paused and resumed when `pause`); its session. `after`: the turn to wait for."""
    session = str(uuid.uuid4())
    label = f"run {n}"
    start = [*common, "start", "--session", session, "--query", QUESTIONS[n - 1]]
    if after:
        start += ["--await-session", after]
    _step(env, *start, "--label", label, expect=PAUSED if pause else 0)
    if pause:
        rows = _checkpoint_rows(s, session)
        print(
            f"\n[driver] run {n} is paused: {rows} checkpoint(s) for session {session[:8]} in "
            f"{CHECKPOINT_SCHEMA}.checkpoints; resuming it in a new process, approved.",
            flush=True,
        )
        resume = [*common, "resume", "--session", session, "--by", "analyst (scripted approval)"]
        _step(env, *resume, "--label", label, expect=0)
    return session


def _landed(settings: Settings, session: str) -> None:
    """Enqueue mode: wait until a worker has saved the turn of `session`."""
    print(f"\n[driver] waiting for a worker to save the turn of session {session[:8]}", flush=True)
    query = text("SELECT seq FROM thread_messages WHERE session_id = :s")

    def saved() -> bool:
        with get_engine(settings.database_url).connect() as conn:
            return conn.execute(query, {"s": session}).first() is not None

    try:
        wait_for(saved, TURN_WAIT_S, f"the turn of session {session} (is a worker running?)")
    except WaitTimeout as exc:
        raise ScriptError(str(exc)) from None


def _kind(artifact: dict[str, Any]) -> str:
    if artifact["kind"] == "standing":  # what the agent declared in the turn
        subjects = ", ".join(d["subject"] for d in artifact["items"]) or "nothing new"
        return f"standing ({subjects})"
    if artifact["kind"] == "sql":
        return "sql"
    return f"{artifact['kind']}/{artifact.get('chart') or artifact.get('type')}"


def _recap(settings: Settings, thread_id: str, owner: str) -> None:
    print("\n=== what conversation memory holds now (Postgres, thread_messages) ===")
    with get_engine(settings.database_url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT seq, user_query, artifacts FROM thread_messages "
                "WHERE thread_id = :t ORDER BY seq"
            ),
            {"t": thread_id},
        ).all()
    for seq, query, artifacts in rows:
        kinds = ", ".join(_kind(a) for a in artifacts)
        print(f"  #{seq}  {query!r:<55} artifacts: {kinds or 'none'}")
    print(f"\nnext: agent-memory context {thread_id} --owner {owner} --focus visualizations")


def play(
    thread_id: str | None = None,
    owner: str = "analyst-7",
    *,
    use_async: bool = False,
    finalize: FinalizeMode = "inprocess",
) -> int:
    mode = Mode(use_async=use_async, finalize=finalize)
    base = Settings()
    data_dir = REPO / ".agent-memory" / "example"
    services: DevServices = ensure_services(base.database_url, base.redis_url, data_dir)
    try:
        s = base.model_copy(
            update={"database_url": services.database_url, "redis_url": services.redis_url}
        )
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DATABASE_URL": s.database_url}
        env["REDIS_URL"] = s.redis_url
        thread = thread_id or str(uuid.uuid4())
        print("=== LangGraph analytics agent: one conversation thread, four runs ===")
        for line in [*services.started, *services.notes]:
            print(line)
        print(f"PostgreSQL {_safe(s.database_url)}, Redis {_safe(s.redis_url)}")
        _prepare(s, mode)
        print(f"thread {thread}, owner {owner}", flush=True)
        _play_runs(env, s, thread, owner, mode)
        _recap(s, thread, owner)
    except ScriptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        services.stop()
    return 0


def _play_runs(env: dict[str, str], s: Settings, thread: str, owner: str, mode: Mode) -> None:
    """The four runs; with enqueue, each next run waits for the previous run's turn."""
    common = ["--thread", thread, "--owner", owner, "--finalize", mode.finalize]
    if mode.use_async:
        common.append("--async")
    enqueue = mode.finalize == "enqueue"
    first = _run(env, 1, common, True, s, after=None)
    second = _run(env, 2, common, True, s, after=first if enqueue else None)
    if enqueue:  # deleting the copy stands for its TTL: the turn is in memory by then
        _landed(s, second)
    RedisConversationMemory(make_redis(s.redis_url), settings=s).invalidate(thread)
    print(
        f"\n[driver] deleted the Redis working copy of thread {thread[:8]} "
        "(as if its 24 h TTL had expired)",
        flush=True,
    )
    third = _run(env, 3, common, False, s, after=second if enqueue else None)
    fourth = _run(env, 4, common, True, s, after=third if enqueue else None)
    if enqueue:
        _landed(s, fourth)
