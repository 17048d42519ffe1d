"""`agent-memory bench core`: each hot-path figure beside its raw limit, measured in one run.

Each figure is paired with a baseline doing the same I/O without the framework; the two are
timed interleaved (alternating order, same process and servers), so noise hits both alike.

1. save: `save_session_to_thread_safe` of distinct turns over 50 warm threads vs the same one
   SQL statement (as the core renders and sends it: claim.finalize_statement) via psycopg2 in
   autocommit, plus one EVALSHA of the same working-copy script with the same arguments.
2. get_context hit on a full working copy (summary + 40 turns) vs a plain GET of as many bytes.
3. rehydration (invalidate, then get_context) of a 10 000-turn vs a 60-turn thread, 40 unfolded
   turns each: the cost must not grow with history.
4. render_conversation_context(ctx, "sql", 2000) of 20 exchanges, warm (per-part token counts
   cached) and cold (cache cleared before each call), vs one tokenization of its output.

Bench threads get `fold_due_at = 'infinity'`, so no fold is published to a shared broker. Logs
go through a JSON renderer to /dev/null (their cost counts, nothing prints). All rows and keys
are removed at the end.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg2
import redis
from sqlalchemy.engine import make_url

from memory_core.bench.common import (
    BASE_TIME,
    LOAD_TURNS,
    Pair,
    exchange,
    format_table,
    json_logs_to_devnull,
    machine,
    paired,
    snapshot,
)
from memory_core.bench.floor import holds, materialize
from memory_core.conversation_memory import RedisConversationMemory
from memory_core.copy.context import ConversationContext
from memory_core.copy.views import render_conversation_context
from memory_core.copy.working_copy import _WRITE
from memory_core.io.db import get_engine
from memory_core.io.fast_write import render
from memory_core.io.redis_client import make_redis
from memory_core.settings import Settings
from memory_core.tokens import count_cache, encoding, turn_size
from memory_core.write.artifacts import artifacts_json
from memory_core.write.claim import claim_params, finalize_statement
from memory_core.write.session_handler import TITLE_MAX, save_session_to_thread_safe

COMMAND = "agent-memory bench core"
KEY_PREFIX = "chat_conversation:bench"
THREADS = 50
WARM_TURNS = 3
UNFOLDED = 40
LONG_TURNS, SHORT_TURNS = 10_000, 60
RENDER_EXCHANGES = 20
SUMMARY = (
    "The user analyses 2025 revenue by region, excluding returns (is_return = false). "
    "Revenue means SUM(revenue) in USD from sales. EMEA leads with 41%, then NA and APAC. "
) * 6

_LOAD_THREAD = """
INSERT INTO conversation_threads
  (id, owner_id, agent_type, title, summary, summary_through_seq, last_seq, fold_due_at)
VALUES (%(id)s, %(owner)s, 'chat', 'bench', %(summary)s, %(through)s, %(n)s, 'infinity')
"""


class _Bench:
    def __init__(self, database_url: str, redis_url: str, iterations: int) -> None:
        self.settings = Settings(database_url=database_url, redis_url=redis_url)
        self.n = iterations
        self.warmup = max(5, min(100, iterations // 10))
        self.owner = f"bench-{uuid.uuid4().hex[:12]}"
        self.memory = RedisConversationMemory(
            make_redis(redis_url), settings=self.settings, key_prefix=KEY_PREFIX, ttl_hours=1
        )
        self.plain = redis.Redis.from_url(redis_url)
        dsn = make_url(self.settings.database_url).set(drivername="postgresql")
        self.pg = psycopg2.connect(dsn.render_as_string(hide_password=False))
        # The raw save's connection: autocommit, as the product's one statement.
        self.pg_auto = psycopg2.connect(self.pg.dsn)
        self.pg_auto.autocommit = True
        self.threads: list[uuid.UUID] = []
        self.scratch = f"{KEY_PREFIX}:{{{self.owner}}}:scratch"

    def _sql(self, sql: str, params: dict[str, Any] | None = None) -> None:
        with self.pg.cursor() as cur:
            cur.execute(sql, {"owner": self.owner} if params is None else params)
        self.pg.commit()

    def close(self) -> None:
        self.pg.rollback()
        self._sql("DELETE FROM conversation_threads WHERE owner_id = %(owner)s")
        self.pg.close()
        self.pg_auto.close()
        keys = [k for t in self.threads for k in self.memory.copy.keys(t)] + [self.scratch]
        for i in range(0, len(keys), 500):
            self.plain.delete(*keys[i : i + 500])
        self.plain.close()
        self.memory.redis.close()

    def _new_thread(self) -> uuid.UUID:
        tid = uuid.uuid4()
        self.threads.append(tid)
        return tid

    def versions(self) -> str:
        pg = self.pg.server_version  # e.g. 150020
        rv = self.plain.info("server").get("redis_version", "?")
        return f"PostgreSQL {pg // 10000}.{pg % 10000}, Redis {rv}"

    # -- 1. save -------------------------------------------------------------------------

    def _capture_save_sql(self, first: dict[str, Any]) -> None:
        """Run one core save, and keep the statement the save sends as it sends it: the SQL
        text and literal parameters fast_write renders from claim.finalize_statement."""
        self._core_save(first)
        rendered = render(finalize_statement(), get_engine(self.settings.database_url).dialect)
        if not rendered.sql.startswith("WITH claim AS"):
            raise RuntimeError("save did not render the expected SQL")
        self.save_sql, self.rendered = rendered.sql, rendered

    def _raw_job(self, tid: uuid.UUID, n: int) -> tuple[Any, ...]:
        """Everything the raw save sends, prepared untimed (seq is predictable: one writer)."""
        snap = snapshot(tid, n, self.owner)
        seq = self.raw_seqs[tid] = self.raw_seqs.get(tid, 0) + 1
        turn = exchange(snap, seq)
        copy = self.memory.copy
        if seq == 1:
            first = ConversationContext(thread_id=tid, recent=[turn])
            args = copy.merge_args(self.owner, first, last_seq=1)
        else:
            args = copy.append_args(self.owner, 0, turn)
        title = " ".join(snap["user_query"].split())[:TITLE_MAX]
        mem = self.memory
        # The product's parameters, bound by the same processors (UUID text, JSONB as JSON).
        params = self.rendered.bind(
            claim_params(
                thread_id=tid,
                owner_id=self.owner,
                agent_type=snap["agent_type"],
                title=title,
                fold_threshold=mem.compression_threshold,
                republish_grace_s=mem.settings.memory_fold_republish_grace_s,
                turn_tokens=turn_size(turn),
                token_trigger=mem.fold_token_trigger,
            )
            | {
                "thread_id": tid,
                "session_id": snap["session_id"],
                "user_query": snap["user_query"],
                "answer": snap["answer"],
                "artifacts": artifacts_json(turn.artifacts),
                "response_payload": snap["response_payload"],
                "completed_at": turn.completed_at,
            }
        )
        return seq, params, copy.write_keys(tid), args

    def _raw_save(self, job: tuple[Any, ...]) -> None:
        seq, params, (meta, turns, gone), args = job
        cur = self.cur  # autocommit: the statement commits on its own, as the product's
        cur.execute(self.save_sql, params)
        if cur.fetchone()[0] != seq:
            raise RuntimeError("raw save: unexpected seq")
        self.plain.evalsha(self.sha, 3, meta, turns, gone, *args)

    def save(self) -> Pair:
        core_t = [self._new_thread() for _ in range(THREADS)]
        raw_t = [self._new_thread() for _ in range(THREADS)]
        self._capture_save_sql(snapshot(core_t[0], 1, self.owner))
        self.sha = self.plain.script_load(_WRITE)
        self.raw_seqs: dict[uuid.UUID, int] = {}
        self.cur = self.pg_auto.cursor()
        # Warm threads and copies (a few turns each), then keep folds from being published.
        for n in range(1, WARM_TURNS + 1):
            for i in range(THREADS):
                if (i, n) != (0, 1):
                    self._core_save(snapshot(core_t[i], n, self.owner))
                self._raw_save(self._raw_job(raw_t[i], n))
        self._sql(
            "UPDATE conversation_threads SET fold_due_at = 'infinity' WHERE owner_id = %(owner)s"
        )
        total = self.warmup + self.n
        turn = [WARM_TURNS + 1 + i // THREADS for i in range(total)]
        core_jobs = [snapshot(core_t[i % THREADS], turn[i], self.owner) for i in range(total)]
        raw_jobs = [self._raw_job(raw_t[i % THREADS], turn[i]) for i in range(total)]
        times = paired(
            self.n,
            self.warmup,
            lambda i: self._core_save(core_jobs[i]),
            lambda i: self._raw_save(raw_jobs[i]),
        )
        self.cur.close()
        label = f"sync save `save_session_to_thread_safe` ({THREADS} warm threads)"
        raw = "the same SQL statement via psycopg2 (autocommit) + 1 EVALSHA, same args"
        return Pair("save", label, raw, 1.5, *times)

    def _core_save(self, snap: dict[str, Any]) -> None:
        out = save_session_to_thread_safe(snap, memory=self.memory)
        if out.status != "saved" or out.cache != "ok":
            raise RuntimeError(f"bench save did not take the fast path: {out}")

    # -- 3. rehydration, then 2. get_context hit on a full copy ---------------------------

    def _load_thread(self, turns: int) -> uuid.UUID:
        tid = self._new_thread()
        params = {"id": str(tid), "owner": self.owner, "summary": SUMMARY, "n": turns}
        self._sql(_LOAD_THREAD, {**params, "through": turns - UNFOLDED})
        self._sql(LOAD_TURNS, {**params, "base": BASE_TIME})
        return tid

    def rehydrate(self) -> tuple[Pair, uuid.UUID]:
        long_t, short_t = self._load_thread(LONG_TURNS), self._load_thread(SHORT_TURNS)
        self._sql("ANALYZE conversation_threads, thread_messages")
        mem = self.memory

        def miss(tid: uuid.UUID) -> None:
            if len(mem.get_context(tid, self.owner).recent) != UNFOLDED:
                raise RuntimeError("rehydration returned the wrong number of turns")

        times = paired(
            max(5, self.n // 2),
            self.warmup // 4 + 2,
            lambda _: miss(long_t),
            lambda _: miss(short_t),
            lambda side, _: mem.invalidate(short_t if side else long_t),
        )
        label = f"rehydration (miss) of a {LONG_TURNS:,}-turn thread"
        raw = f"the same for a {SHORT_TURNS}-turn thread ({UNFOLDED} unfolded turns each)"
        return Pair("rehydrate", label, raw, 1.2, *times), short_t

    def get_context(self, tid: uuid.UUID, *, parsed_cache: bool = True) -> Pair:
        # parsed_cache=False: a process that has not parsed this copy yet (e.g. another API
        # replica) pays the full validation of the context on every hit.
        mem = (
            self.memory
            if parsed_cache
            else RedisConversationMemory(
                self.memory.redis,
                settings=self.memory.settings,
                engine=self.memory.engine,
                local_cache_size=0,
            )
        )
        ctx = mem.get_context(tid, self.owner)
        meta, members = mem.copy.read(tid)
        if not meta or len(ctx.recent) != UNFOLDED:
            raise RuntimeError("get_context bench needs a full working copy")
        payload = b"".join([*(k + v for k, v in meta.items()), *members])
        self.plain.set(self.scratch, payload, px=3_600_000)
        times = paired(
            self.n,
            self.warmup,
            lambda _: mem.get_context(tid, self.owner),
            lambda _: self.plain.get(self.scratch),
        )
        which = "parsed context reused" if parsed_cache else "parsed anew each call"
        label = f"get_context hit (summary + {UNFOLDED} turns; {which})"
        raw = f"plain GET of the same {len(payload):,} bytes"
        return Pair("get_context" if parsed_cache else "get_context_cold", label, raw, 2.0, *times)

    def floor(self, tid: uuid.UUID) -> Pair:
        """A plain GET plus building the context's objects from its JSON without validation
        (floor.py): the least any first read can cost, beside the same GET."""
        ctx = self.memory.get_context(tid, self.owner)
        doc = ctx.model_dump_json().encode()
        if not holds(doc, ctx):
            raise RuntimeError("the floor did not decode the context get_context returns")
        get = self.plain.get

        def bound(_: int) -> Any:
            payload = get(self.scratch)
            if payload is None:
                raise RuntimeError("the floor's GET found nothing")
            return materialize(doc)

        times = paired(self.n, self.warmup, bound, lambda _: get(self.scratch))
        label = f"lower bound: plain GET + the same {UNFOLDED}-turn context decoded untyped"
        return Pair(
            "get_context_floor", label, "plain GET of the same bytes", 2.0, *times, bound=True
        )

    # -- 4. rendering --------------------------------------------------------------------

    def render(self) -> tuple[Pair, Pair]:
        tid = uuid.uuid4()
        recent = [exchange(snapshot(tid, n, self.owner), n) for n in range(1, RENDER_EXCHANGES + 1)]
        ctx = ConversationContext(
            thread_id=tid, summary=SUMMARY, summary_through_seq=0, recent=recent
        )
        text = render_conversation_context(ctx, "sql", 2000)
        enc, clear = encoding(), count_cache().clear

        def view(_: int) -> None:
            render_conversation_context(ctx, "sql", 2000)

        def tokenize(_: int) -> None:
            enc.encode_ordinary(text)

        warm = paired(self.n, self.warmup, view, tokenize)
        cold = paired(self.n, self.warmup, view, tokenize, lambda side, _: side or clear())
        tokens = len(enc.encode_ordinary(text))
        raw = f"1 x encode_ordinary of its output ({tokens:,} tokens)"
        label = f"render {RENDER_EXCHANGES} exchanges, 'sql', 2000 tokens"
        return (
            Pair("render_warm", f"{label}: warm", raw, 0.5, *warm),
            Pair("render_cold", f"{label}: cold", raw, 0.5, *cold),
        )


def bench_core(
    *,
    database_url: str,
    redis_url: str,
    iterations: int = 2000,
    out: Callable[[str], None] = print,
    plots_dir: Path | None = None,
) -> dict[str, float]:
    """Run the core benchmark once; print the table and return every figure (µs, ratios).

    With plots_dir, also write `core-<key>.png` per figure and `core-overview.png` there
    (memory_core/bench/plots.py; needs the `bench` extra, checked before the run).
    """
    if iterations < 1:
        raise ValueError("iterations must be positive")
    if plots_dir is not None:
        from memory_core.bench.plots import require_matplotlib

        require_matplotlib()
    started = time.perf_counter()
    bench = _Bench(database_url, redis_url, iterations)
    try:
        with json_logs_to_devnull():
            save = bench.save()
            rehydrate, short_thread = bench.rehydrate()
            hit = bench.get_context(short_thread)
            hit_cold = bench.get_context(short_thread, parsed_cache=False)
            floor = bench.floor(short_thread)
            warm, cold = bench.render()
        versions = bench.versions()
    finally:
        bench.close()
    pairs = [save, hit, hit_cold, floor, rehydrate, warm, cold]
    results: dict[str, float] = {}
    for p in pairs:
        results.update(p.figures())
    results["wall_s"] = time.perf_counter() - started
    header = [
        f"$ {COMMAND}",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC · iterations={iterations} "
        f"(rehydration: {len(rehydrate.core)} per side) · wall {results['wall_s']:.1f} s",
        f"{machine()} · {versions}",
    ]
    for line in format_table(pairs, header):
        out(line)
    if plots_dir is not None:
        from memory_core.bench.plots import PREFIX, write_latency_plots

        files = write_latency_plots(pairs, plots_dir, title_note="\n".join(header))
        out(f"plots: {plots_dir}/{PREFIX}-*.png ({len(files)} files)")
    return results
