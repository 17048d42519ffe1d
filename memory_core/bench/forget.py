"""`bench forget`: a right-to-be-forgotten run over a large owner, and what remained after it.

Seeds two owners with the same data (N threads x T turns, a working copy and a LangGraph
checkpoint per thread) plus a bystander. `forget_owner` deletes the first; the raw limit
deletes the second with the same I/O done by hand, in batches of the same size (one
transaction per batch: lock, Redis DEL + marker in one pipeline, DELETE turns / threads /
checkpoints, INSERT tombstones, COMMIT), with no events, logs or metrics. Then every store is
counted for what is left of the forgotten owner (must be zero) and of the bystander
(must be unchanged).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from memory_core.bench.common import BASE_TIME, LOAD_TURNS, machine
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.io.db import get_engine
from memory_core.io.redis_client import make_redis
from memory_core.lifecycle.threads import forget_owner
from memory_core.settings import Settings

_CHECKPOINTS = "langgraph.checkpoints"


def _owner(tag: str) -> str:
    return f"bench-forget-{tag}-{uuid.uuid4().hex[:8]}"


def _seed(memory: RedisConversationMemory, owner: str, threads: int, turns: int) -> list[uuid.UUID]:
    """Threads with `turns` turns each, a working copy each and a checkpoint each."""
    ids = [uuid.uuid4() for _ in range(threads)]
    raw = memory.engine.raw_connection()
    try:
        cur = raw.cursor()
        has_checkpoints = _has_checkpoints(cur)
        for tid in ids:
            cur.execute(
                "INSERT INTO conversation_threads (id, owner_id, agent_type, title, last_seq) "
                "VALUES (%s, %s, 'chat', 'bench', %s)",
                (str(tid), owner, turns),
            )
            cur.execute(LOAD_TURNS, {"id": str(tid), "n": turns, "base": BASE_TIME})
            if has_checkpoints:
                cur.execute(
                    f"INSERT INTO {_CHECKPOINTS} (thread_id, checkpoint_ns, checkpoint_id, "
                    "checkpoint, metadata) VALUES (%s, '', %s, '{}'::jsonb, "
                    "jsonb_build_object('memory_thread_id', %s::text, "
                    "'memory_owner_id', %s::text))",
                    (str(uuid.uuid4()), str(uuid.uuid4()), str(tid), owner),
                )
        raw.commit()
    finally:
        raw.close()
    for tid in ids:
        memory.rehydrate(tid, owner)
    return ids


def _has_checkpoints(cur: Any) -> bool:
    cur.execute("SELECT to_regclass(%s) IS NOT NULL", (_CHECKPOINTS,))
    return bool(cur.fetchone()[0])


def _raw_forget(memory: RedisConversationMemory, owner: str, batch: int) -> int:
    """The same deletion by hand; returns the number of batches."""
    raw = memory.engine.raw_connection()
    pipe_client = memory.redis
    batches = 0
    try:
        cur = raw.cursor()
        checkpoints = _has_checkpoints(cur)
        raw.commit()
        while True:
            cur.execute(
                "SELECT id FROM conversation_threads WHERE owner_id = %s ORDER BY id LIMIT %s "
                "FOR UPDATE",
                (owner, batch),
            )
            ids = [r[0] for r in cur.fetchall()]
            if not ids:
                raw.commit()
                return batches
            pipe = pipe_client.pipeline(transaction=False)
            for tid in ids:
                meta, turns, gone = memory.copy.write_keys(tid)
                pipe.delete(meta, turns)
                pipe.set(gone, "1", px=memory.copy.ttl_ms)
            pipe.execute()
            cur.execute("DELETE FROM thread_messages WHERE thread_id = ANY(%s::uuid[])", (ids,))
            cur.execute("DELETE FROM conversation_threads WHERE id = ANY(%s::uuid[])", (ids,))
            cur.execute(
                "INSERT INTO thread_tombstones (thread_id) SELECT unnest(%s::uuid[]) "
                "ON CONFLICT DO NOTHING",
                (ids,),
            )
            if checkpoints:  # the runs, then their rows in the three tables (as the product)
                cur.execute(
                    f"SELECT DISTINCT thread_id FROM {_CHECKPOINTS} "
                    "WHERE metadata->>'memory_thread_id' = ANY(%s::text[])",
                    ([str(i) for i in ids],),
                )
                runs = [r[0] for r in cur.fetchall()]
                for table in ("checkpoint_writes", "checkpoint_blobs", "checkpoints"):
                    cur.execute(
                        f"DELETE FROM langgraph.{table} WHERE thread_id = ANY(%s::text[])",
                        (runs,),
                    )
            raw.commit()
            batches += 1
    finally:
        raw.close()


def _remaining(memory: RedisConversationMemory, owner: str, ids: list[uuid.UUID]) -> dict[str, int]:
    metas = [memory.copy.keys(tid)[0] for tid in ids]
    with memory.engine.connect() as conn:
        params = {"owner": owner, "ids": ids, "texts": [str(i) for i in ids]}
        counts = {
            "threads": "SELECT count(*) FROM conversation_threads WHERE owner_id = :owner",
            "turns": "SELECT count(*) FROM thread_messages WHERE thread_id = ANY(:ids)",
            "tombstones": "SELECT count(*) FROM thread_tombstones WHERE thread_id = ANY(:ids)",
        }
        out = {k: int(conn.scalar(text(q), params) or 0) for k, q in counts.items()}
        if conn.scalar(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": _CHECKPOINTS}):
            q = (
                f"SELECT count(*) FROM {_CHECKPOINTS} "
                "WHERE metadata->>'memory_thread_id' = ANY(:texts)"
            )
            out["checkpoints"] = int(conn.scalar(text(q), params) or 0)
    out["copies"] = sum(int(memory.redis.exists(k)) for k in metas)
    return out


def bench_forget(
    *,
    settings: Settings,
    threads: int = 1000,
    turns: int = 30,
    batch_size: int | None = None,
    out: Callable[[str], None] = print,
) -> dict[str, float]:
    memory = RedisConversationMemory(make_redis(settings.redis_url), settings=settings)
    get_engine(settings.database_url)
    batch = batch_size or settings.memory_purge_batch_size
    owner, raw_owner, bystander = _owner("product"), _owner("raw"), _owner("bystander")
    out(f"seeding 2 x {threads} threads x {turns} turns (+ copies, checkpoints) ...")
    ids = _seed(memory, owner, threads, turns)
    raw_ids = _seed(memory, raw_owner, threads, turns)
    kept = _seed(memory, bystander, 20, turns)
    before = _remaining(memory, bystander, kept)

    started = time.perf_counter()
    report = forget_owner(owner, memory=memory, batch_size=batch)
    product_s = time.perf_counter() - started
    started = time.perf_counter()
    raw_batches = _raw_forget(memory, raw_owner, batch)
    raw_s = time.perf_counter() - started

    left = _remaining(memory, owner, ids)
    raw_left = _remaining(memory, raw_owner, raw_ids)
    after = _remaining(memory, bystander, kept)
    out(f"bench forget: {machine()}; batch size {batch}")
    out("")
    out("| run | threads | turns | copies | checkpoints | batches | seconds | threads/s |")
    out("|---|--:|--:|--:|--:|--:|--:|--:|")
    out(
        f"| forget_owner | {report.threads} | {report.turns} | {report.copies} "
        f"| {report.checkpoints} | {report.batches} | {product_s:.2f} "
        f"| {report.threads / product_s:,.0f} |"
    )
    out(
        f"| raw limit (same I/O by hand) | {threads} | {threads * turns} | {threads} | {threads} "
        f"| {raw_batches} | {raw_s:.2f} | {threads / raw_s:,.0f} |"
    )
    out("")
    out(f"remained of the forgotten owner: {_fmt(left)} (tombstones = {left['tombstones']})")
    out(f"remained after the raw limit:   {_fmt(raw_left)}")
    out(f"bystander before / after:       {_fmt(before)} / {_fmt(after)}")
    out(f"ratio (forget_owner / raw): {product_s / raw_s:.2f}x")
    forget_owner(bystander, memory=memory)
    return {"seconds": product_s, "raw_seconds": raw_s, "batches": report.batches, **left}


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if k != "tombstones")
