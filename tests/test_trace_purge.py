"""purge_session_traces: the real langfuse client against the fake Langfuse's trace API."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from memory_core.copy.context import Exchange
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.fold.prompts import make_langfuse_client
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.lifecycle.trace_purge import DELETE_BATCH, TracePurge, purge_session_traces
from memory_core.settings import Settings
from tests.support.fake_langfuse import FakeLangfuseServer

TIMEOUT_S = 0.5


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "LANGFUSE_PUBLIC_KEY",
        "LANGFUSE_SECRET_KEY",
        "LANGFUSE_BASE_URL",
        "LANGFUSE_HOST",
        "LANGFUSE_TRACING_ENABLED",
        "LANGFUSE_SAMPLE_RATE",
        "OTEL_SDK_DISABLED",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuseServer]:
    with FakeLangfuseServer() as server:
        yield server


def settings_for(base_url: str | None, **overrides: Any) -> Settings:
    """Langfuse keys (a fresh public key: the SDK shares state per key) pointing at base_url."""
    values: dict[str, Any] = {
        "openai_base_url": None,
        "openai_api_key": None,
        "langfuse_public_key": f"pk-lf-test-{uuid.uuid4().hex}" if base_url else None,
        "langfuse_secret_key": "sk-lf-test" if base_url else None,
        "langfuse_base_url": base_url,
        "langfuse_prompt_timeout_s": TIMEOUT_S,
        "langfuse_api_timeout_s": TIMEOUT_S,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


def session() -> str:
    return str(uuid.uuid4())


def seed(server: FakeLangfuseServer, session_id: str | None, n: int, spans: int = 2) -> set[str]:
    return {server.add_trace(session_id=session_id, observations=spans) for _ in range(n)}


def no_id_twice(ids: list[str]) -> bool:
    return len(ids) == len(set(ids))


# ----------------------------------------------------------------------------- purging


def test_purges_only_the_given_sessions_traces(langfuse: FakeLangfuseServer) -> None:
    gone, kept = session(), session()
    doomed = seed(langfuse, gone, 4)
    others = seed(langfuse, kept, 3)
    sessionless = seed(langfuse, None, 2)
    assert set(langfuse.trace_ids(gone)) == doomed
    before = len(langfuse.trace_ids())

    result = purge_session_traces([gone], settings=settings_for(langfuse.base_url))

    assert result == TracePurge(configured=True, deleted=len(doomed), remaining=0)
    assert result.done
    assert langfuse.trace_ids(gone) == []
    assert set(langfuse.trace_ids(kept)) == others
    assert set(langfuse.trace_ids(None)) == others | sessionless
    assert len(langfuse.trace_ids()) == before - len(doomed)
    assert set(langfuse.deleted_trace_ids) == doomed
    assert no_id_twice(langfuse.deleted_trace_ids)  # a trace's observations share one delete


def test_several_sessions_with_a_client_of_the_caller(langfuse: FakeLangfuseServer) -> None:
    a, b, untouched = session(), session(), session()
    doomed = seed(langfuse, a, 2) | seed(langfuse, b, 3)
    others = seed(langfuse, untouched, 2)
    client = make_langfuse_client(settings_for(langfuse.base_url))
    assert client is not None

    result = purge_session_traces([a, b, a, ""], client=client)

    assert result.done
    assert result.deleted == len(doomed)
    assert langfuse.trace_ids(a) == langfuse.trace_ids(b) == []
    assert set(langfuse.trace_ids(untouched)) == others
    listed = {r["query"].get("sessionId") for r in langfuse.trace_requests if r["method"] == "GET"}
    assert listed == {a, b}  # duplicates listed once, the empty id never (it would match all)
    # The caller's client still works afterwards.
    again = purge_session_traces([untouched], client=client)
    assert again.done
    assert again.deleted == len(others)


def test_pagination_and_delete_batches(langfuse: FakeLangfuseServer) -> None:
    many, kept = session(), session()
    langfuse.max_page_size = 40  # short pages: the purge must follow the cursor
    doomed = seed(langfuse, many, 250, spans=2)
    others = seed(langfuse, kept, 5)

    result = purge_session_traces([many], settings=settings_for(langfuse.base_url))

    assert result.done
    assert result.deleted == len(doomed)
    assert langfuse.trace_ids(many) == []
    assert set(langfuse.trace_ids(kept)) == others
    lists = langfuse.trace_api_calls("GET", "/api/public/v2/observations")
    # The first listing pages through every observation (2 per trace), the second finds none.
    observations = 2 * len(doomed)
    assert len(lists) == math.ceil(observations / langfuse.max_page_size) + 1
    assert sum(1 for r in lists if r["query"].get("cursor")) == len(lists) - 2
    deletes = langfuse.trace_api_calls("DELETE", "/api/public/traces")
    sizes = [len(r["body"]["traceIds"]) for r in deletes]
    assert len(deletes) == math.ceil(len(doomed) / DELETE_BATCH)
    assert max(sizes) <= DELETE_BATCH
    assert sum(sizes) == len(doomed)
    assert set(langfuse.deleted_trace_ids) == doomed
    assert no_id_twice(langfuse.deleted_trace_ids)


def test_a_session_without_traces_is_done_without_deleting(langfuse: FakeLangfuseServer) -> None:
    others = seed(langfuse, session(), 2)

    result = purge_session_traces([session()], settings=settings_for(langfuse.base_url))

    assert result == TracePurge(configured=True)
    assert result.done
    assert langfuse.trace_api_calls("DELETE", "/api/public/traces") == []
    assert set(langfuse.trace_ids()) == others


def test_not_configured_sends_nothing(langfuse: FakeLangfuseServer) -> None:
    seed(langfuse, "s", 1)

    result = purge_session_traces(["s"], settings=settings_for(None))

    assert result == TracePurge(configured=False)
    assert result.done
    assert langfuse.trace_requests == []
    assert len(langfuse.trace_ids("s")) == 1


def test_no_session_ids_sends_nothing(langfuse: FakeLangfuseServer) -> None:
    seed(langfuse, "s", 1)

    result = purge_session_traces(["", "  "], settings=settings_for(langfuse.base_url))

    assert result.done
    assert result.error is None
    assert langfuse.trace_requests == []


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize("mode", ["500", "401"])
def test_langfuse_failing_is_reported_not_raised(langfuse: FakeLangfuseServer, mode: str) -> None:
    sid = session()
    traces = seed(langfuse, sid, 3)
    langfuse.set_trace_api_mode(mode)

    result = purge_session_traces([sid], settings=settings_for(langfuse.base_url))

    assert result.configured
    assert not result.done
    assert result.error is not None
    assert f"HTTP {mode}" in result.error
    assert "Internal Server Error" not in result.error  # the status, never the body
    assert "Invalid credentials" not in result.error
    assert result.deleted == 0
    assert len(langfuse.trace_requests) == 1  # no retries of its own
    assert set(langfuse.trace_ids(sid)) == traces

    langfuse.set_trace_api_mode("ok")  # Langfuse back: the same purge finishes the job
    again = purge_session_traces([sid], settings=settings_for(langfuse.base_url))
    assert again.done
    assert again.deleted == len(traces)
    assert langfuse.trace_ids(sid) == []


def test_langfuse_hanging_returns_within_the_timeout(langfuse: FakeLangfuseServer) -> None:
    sid = session()
    traces = seed(langfuse, sid, 2)
    langfuse.hang_s = 60.0
    langfuse.set_trace_api_mode("hang")

    started = time.monotonic()
    result = purge_session_traces([sid], settings=settings_for(langfuse.base_url))
    elapsed = time.monotonic() - started

    # One request bounded by the timeout, then at most the same again flushing our client.
    assert elapsed < 2 * TIMEOUT_S + 1.0
    assert not result.done
    assert result.error is not None
    assert "Timeout" in result.error
    assert set(langfuse.trace_ids(sid)) == traces


def test_deletion_still_in_progress_is_not_done(langfuse: FakeLangfuseServer) -> None:
    sid = session()
    traces = seed(langfuse, sid, 3)
    langfuse.set_trace_api_mode("deferred")  # Langfuse accepted the delete, still listing them

    result = purge_session_traces([sid], settings=settings_for(langfuse.base_url))

    assert result.error is None
    assert result.deleted == len(traces)
    assert result.remaining == len(traces)
    assert not result.done


def test_a_server_ignoring_the_session_filter_deletes_nothing(
    langfuse: FakeLangfuseServer,
) -> None:
    sid, other = session(), session()
    mine = seed(langfuse, sid, 2)
    others = seed(langfuse, other, 2)
    langfuse.set_trace_api_mode("unfiltered")

    result = purge_session_traces([sid], settings=settings_for(langfuse.base_url))

    assert not result.done
    assert result.error is not None
    assert result.deleted == 0
    assert langfuse.trace_api_calls("DELETE", "/api/public/traces") == []
    assert set(langfuse.trace_ids(sid)) == mine
    assert set(langfuse.trace_ids(other)) == others


def test_unreachable_langfuse_is_reported() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = purge_session_traces([session()], settings=settings_for(url))
    assert not result.done
    assert result.error is not None
    assert result.error.startswith("ConnectError")


# ----------------------------------------------------------------------------- end to end


def exchange(seq: int, query: str, answer: str) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer=answer,
        completed_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    )


def test_a_folds_trace_is_purged_by_its_thread_id(
    llm: FakeLLMServer, langfuse: FakeLangfuseServer
) -> None:
    deleted_thread, kept_thread = session(), session()
    settings = settings_for(
        langfuse.base_url,
        openai_base_url=llm.base_url,
        openai_api_key="sk-test",
        memory_summarizer_model="fake-summarizer-1",
        memory_llm_timeout_s=5.0,
    )
    turns = [
        exchange(1, "Revenue by region for 2025 excluding refunds", "EMEA leads with 4.2M."),
        exchange(2, "Define active users as a login in the last 30 days", "12,400 users."),
    ]
    with ConversationSummarizer(settings) as summarizer:
        for thread in (deleted_thread, kept_thread):
            summarizer.summarize(thread_id=thread, previous_summary=None, exchanges=turns)
            summarizer.flush()
    fold_traces = wait_for(
        lambda: langfuse.trace_ids(deleted_thread), 15, "the fold's trace", interval_s=0.05
    )
    kept = wait_for(lambda: langfuse.trace_ids(kept_thread), 15, "the other fold's trace")
    assert {g["trace_id"] for g in langfuse.generations()} >= set(fold_traces)

    result = purge_session_traces([deleted_thread], settings=settings)

    assert result.done
    assert result.deleted == len(fold_traces)
    assert langfuse.trace_ids(deleted_thread) == []
    assert set(langfuse.deleted_trace_ids) == set(fold_traces)
    assert langfuse.trace_ids(kept_thread) == kept
    assert all(g["trace_id"] not in fold_traces for g in langfuse.generations())


# ----------------------------------------------------------------------------- the fake


def test_fake_legacy_trace_list_pages_by_session(langfuse: FakeLangfuseServer) -> None:
    sid = session()
    traces = seed(langfuse, sid, 7, spans=3)
    seed(langfuse, session(), 2)
    auth = ("pk-lf-test", "sk-lf-test")
    url = f"{langfuse.base_url}/api/public/traces"
    with httpx.Client(auth=auth, timeout=5) as http:
        assert http.get(url).status_code == 200
        listed: list[dict[str, Any]] = []
        page = 1
        while True:
            body = http.get(url, params={"sessionId": sid, "page": page, "limit": 3}).json()
            assert body["meta"]["totalItems"] == len(traces)
            assert body["meta"]["totalPages"] == math.ceil(len(traces) / 3)
            listed += body["data"]
            if page >= body["meta"]["totalPages"]:
                break
            page += 1
        assert {t["id"] for t in listed} == traces
        assert {t["sessionId"] for t in listed} == {sid}
        assert all(len(t["observations"]) == 3 for t in listed)
        one = listed[0]["id"]
        deleted = http.delete(f"{url}/{one}")
        assert deleted.status_code == 200
        assert deleted.json()["message"]
        assert one not in langfuse.trace_ids(sid)
        assert httpx.get(url, timeout=5).status_code == 401  # no credentials
