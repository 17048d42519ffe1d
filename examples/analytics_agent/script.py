"""The scripted conversation: one thread, three runs, every step in a process of its own.

1. "What was total revenue in 2025, excluding returns?" pauses for approval; a NEW process
   resumes it from the Postgres checkpointer.
2. "now break that down by region": the SQL writer extends turn 1's SQL (same filters) with the
   breakdown, read from its `sql` view of memory. Approved in a new process too.
3. The Redis working copy is deleted (as if its TTL had expired), then "make that a bar chart":
   memory is rehydrated from Postgres and the visualizer builds a column chart of the region
   query.

Each run finalizes its turn into conversation memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from examples.analytics_agent.dataset import SCHEMA, ensure_dataset
from examples.analytics_agent.runner import PAUSED
from memory_core import RedisConversationMemory
from memory_core.db import get_engine
from memory_core.devservices import DevServices, ensure_services
from memory_core.langgraph import CHECKPOINT_SCHEMA, setup_checkpointer
from memory_core.migrate import upgrade
from memory_core.redis_client import make_redis
from memory_core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = (
    "What was total revenue in 2025, excluding returns?",
    "now break that down by region",
    "make that a bar chart",
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


def _prepare(settings: Settings) -> None:
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


def _checkpoint_rows(settings: Settings, session: str) -> int:
    with get_engine(settings.database_url).connect() as conn:
        query = text(f"SELECT count(*) FROM {CHECKPOINT_SCHEMA}.checkpoints WHERE thread_id = :s")
        return int(conn.execute(query, {"s": session}).scalar_one())


def _run(env: dict[str, str], n: int, common: list[str], pause: bool, s: Settings) -> None:
    session = str(uuid.uuid4())
    label = f"run {n}"
    start = [*common, "start", "--session", session, "--query", QUESTIONS[n - 1]]
    _step(env, *start, "--label", label, expect=PAUSED if pause else 0)
    if pause:
        rows = _checkpoint_rows(s, session)
        print(
            f"\n[driver] run {n} is paused: {rows} checkpoint(s) for session {session[:8]} in "
            f"{CHECKPOINT_SCHEMA}.checkpoints; resuming it in a new process, approved.",
            flush=True,
        )
        resume = ["resume", "--session", session, "--by", "analyst (scripted approval)"]
        _step(env, *resume, "--label", label, expect=0)


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
        kinds = ", ".join(
            a["kind"] + (f"/{a.get('chart') or a.get('type')}" if a["kind"] != "sql" else "")
            for a in artifacts
        )
        print(f"  #{seq}  {query!r:<55} artifacts: {kinds or 'none'}")
    print(f"\nnext: agent-memory context {thread_id} --owner {owner} --focus visualizations")


def play(thread_id: str | None = None, owner: str = "analyst-7") -> int:
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
        print("=== LangGraph analytics agent: one conversation thread, three runs ===")
        for line in [*services.started, *services.notes]:
            print(line)
        print(f"PostgreSQL {_safe(s.database_url)}, Redis {_safe(s.redis_url)}")
        _prepare(s)
        print(f"thread {thread}, owner {owner}", flush=True)
        common = ["--thread", thread, "--owner", owner]
        _run(env, 1, common, True, s)
        _run(env, 2, common, True, s)
        RedisConversationMemory(make_redis(s.redis_url), settings=s).invalidate(thread)
        print(
            f"\n[driver] deleted the Redis working copy of thread {thread[:8]} "
            "(as if its 24 h TTL had expired)",
            flush=True,
        )
        _run(env, 3, common, False, s)
        _recap(s, thread, owner)
    except ScriptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        services.stop()
    return 0
