"""A library is a guest in its host: bounded caches, no content in failures, a quiet stdout.

* Every per-process cache is bounded in entries and in bytes.
* No snapshot content (a marker string placed in every field) reaches a failure reason, a log
  record, an event or an exception message, on any failure path.
* Saving a turn prints nothing: not on stdout, not on stderr, unless the host configures
  logging.
"""

from __future__ import annotations

import ast
import json
import logging
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.caches import BoundedCache
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.fold.folding import Folder
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.db import make_engine
from memory_core.settings import Settings, get_settings
from memory_core.tokens import CACHE_MAX_BYTES, count_cache, count_tokens
from tests.support import REPO
from tests.support.commands import run_python
from tests.support.faults import RowLock, engine_with_lock_timeout
from tests.support.snapshots import make_snapshot

MARKER = "ZQXMARKER"

# ---------------------------------------------------------------- 6. bounded caches


@settings(max_examples=200, deadline=None)
@given(
    entries=st.integers(0, 20),
    max_bytes=st.integers(0, 2000),
    puts=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 400)), max_size=60),
)
def test_bounded_cache_never_exceeds_its_bounds(
    entries: int, max_bytes: int, puts: list[tuple[int, int]]
) -> None:
    cache: BoundedCache[int, int] = BoundedCache(entries, max_bytes)
    for key, size in puts:
        cache.put(key, size, size)
        assert cache.entries <= entries and cache.bytes <= max_bytes
        assert cache.bytes == sum(cache.get(k) or 0 for k in range(31) if cache.get(k) is not None)


def test_token_counts_of_distinct_texts_stay_within_the_byte_bound() -> None:
    count_cache().clear()
    for i in range(3000):
        count_tokens(f"{i} " + "distinct long text " * 200)
    assert 0 < count_cache().bytes <= CACHE_MAX_BYTES


def test_parsed_contexts_stay_within_their_byte_bound(redis_client: Any) -> None:
    s = get_settings().model_copy(update={"memory_local_cache_max_bytes": 1_000_000})
    memory = RedisConversationMemory(redis_client, settings=s)
    for _ in range(20):  # ~72 KB per copy: 1.4 MB in all
        tid = uuid.uuid4()
        for n in (1, 2):
            snap = make_snapshot(tid, n, answer=f"{tid} " + "long answer " * 3000)
            save_session_to_thread_safe(snap, memory=memory)
        memory.get_context(tid, "user-42")
    assert 500_000 < memory._parsed.bytes <= 1_000_000


def _unbounded_caches(path: Path) -> list[str]:
    """functools caches without a size bound on functions that take arguments."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        takes_args = bool(node.args.args or node.args.kwonlyargs or node.args.vararg)
        for dec in node.decorator_list:
            name = ast.unparse(dec)
            unbounded = name in ("cache", "functools.cache") or "maxsize=None" in name
            if takes_args and unbounded:
                found.append(f"{path.name}:{node.lineno} {node.name}")
    return found


def test_no_unbounded_cache_in_the_library() -> None:
    found = [f for p in sorted((REPO / "memory_core").rglob("*.py")) for f in _unbounded_caches(p)]
    assert found == []


# ---------------------------------------------------------------- 10. no content in failures


def _marked(tid: uuid.UUID) -> dict[str, Any]:
    """A valid snapshot with the marker in every field that holds user content."""
    return make_snapshot(
        tid,
        1,
        owner_id=f"owner-{MARKER}",
        user_query=f"revenue {MARKER}",
        answer=f"answer {MARKER}",
        sql=[f"SELECT '{MARKER}'"],
        visualizations=[{"id": 1, "type": "CHART", "name": MARKER, "options": {MARKER: 1}}],
        dashboards=[{"id": 2, "name": MARKER, "widgets": []}],
        response_payload={MARKER: MARKER},
    )


BAD_INPUTS = [
    ("owner_id", f"{MARKER}" * 40),
    ("user_query", f"{MARKER}\x00"),
    ("answer", f"{MARKER}\ud800"),
    ("sql", [f"{MARKER}" * 6000]),
    ("visualizations", [{"id": 1, "type": MARKER * 20, "name": MARKER * 200}]),
    ("dashboards", [{"id": [MARKER], "name": MARKER}]),
    ("response_payload", {f"{MARKER}\x00": MARKER}),
    ("response_payload", {MARKER: {MARKER: float("nan")}}),
    (f"{MARKER} of the user", MARKER),  # an unknown key that is not a field name
    ("agent_type", MARKER),
    ("thread_id", f"{MARKER}-0000-0000-0000-000000000000"[:36]),
    ("completed_at", MARKER),
]


def _no_marker(*texts: Any) -> None:
    for value in texts:
        assert MARKER not in str(value), str(value)[:300]


@pytest.mark.parametrize(("field", "value"), BAD_INPUTS, ids=[f for f, _ in BAD_INPUTS])
def test_a_rejection_names_the_field_never_the_content(
    memory: RedisConversationMemory, field: str, value: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    snap = _marked(uuid.uuid4()) | {field: value}
    out = save_session_to_thread_safe(snap, memory=memory)
    assert out.status == "rejected"
    _no_marker(out.reason, *(r.getMessage() for r in caplog.records))


def test_a_postgres_failure_reason_and_log_carry_no_content(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tid = uuid.uuid4()
    url = get_settings().database_url
    engine = engine_with_lock_timeout(url, "am-hygiene", lock_timeout_ms=200)
    memory = RedisConversationMemory(redis_client, engine=engine)
    assert save_session_to_thread_safe(_marked(tid), memory=memory).status == "saved"
    lock = RowLock(url)
    assert lock.hold(tid)
    caplog.set_level(logging.DEBUG)
    try:
        out = save_session_to_thread_safe(_marked(tid), memory=memory)
    finally:
        lock.close()
        engine.dispose()
    assert out.status == "failed" and out.retryable
    assert out.reason and "SQLSTATE 55P03" in out.reason
    _no_marker(out.reason, *(r.getMessage() for r in caplog.records))
    # The library's own engines never put bound parameters into an error at all.
    assert make_engine(url).hide_parameters


@pytest.mark.parametrize("mode", ["refusal_echo", "context_length", "500", "garbage_echo"])
def test_a_failed_fold_carries_no_content(
    redis_client: Any, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    with FakeLLMServer(mode=mode) as llm:
        s = Settings(
            _env_file=None,
            openai_base_url=llm.base_url,
            openai_api_key="sk-test",
            langfuse_public_key=None,
            langfuse_secret_key=None,
            memory_fold_max_llm_attempts=1,
        )
        memory = RedisConversationMemory(redis_client, settings=s)
        tid = uuid.uuid4()
        for n in range(1, 22):
            snap = _marked(tid) | {"session_id": str(uuid.uuid4()), "user_query": f"q{n} {MARKER}"}
            save_session_to_thread_safe(snap, memory=memory)
        caplog.set_level(logging.DEBUG)
        out = Folder(memory, ConversationSummarizer(s)).fold(tid)
    # With one LLM attempt allowed, the fold falls back to the LLM-free summary and says why.
    assert out.status == "folded" and out.fallback
    _no_marker(out.error, out.fallback, *(r.getMessage() for r in caplog.records))


# ---------------------------------------------------------------- 13. a quiet guest

_SCRIPT = """
import json, sys, uuid
from memory_core import save_session_to_thread_safe
snap = json.loads(sys.argv[1])
out = save_session_to_thread_safe(snap)
print(out.seq)
"""


@pytest.mark.parametrize("redis_url", ["live", "down"])
def test_saving_a_turn_prints_nothing_but_what_the_host_prints(redis_url: str) -> None:
    env = {"PYTHONPATH": str(REPO)}
    if redis_url == "down":  # warnings are logged, and still nothing is printed
        env["REDIS_URL"] = "redis://127.0.0.1:1/0"
    snap = make_snapshot(uuid.uuid4(), 1)
    done = run_python("-c", _SCRIPT, json.dumps(snap), env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "1\n", "")


def test_the_library_logger_is_silent_by_default() -> None:
    lib = logging.getLogger("memory_core")
    assert any(isinstance(h, logging.NullHandler) for h in lib.handlers)
