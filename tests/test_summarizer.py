"""ConversationSummarizer against the real openai and langfuse clients and local fake servers."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from langfuse import Langfuse

from memory_core.copy.context import Exchange
from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.fold.prompts import langfuse_prompt
from memory_core.fold.summarizer import (
    ConversationSummarizer,
    SummarizationError,
    SummaryResult,
    validate_summary,
)
from memory_core.settings import Settings
from memory_core.tokens import count_tokens
from memory_core.write.artifacts import derive_artifacts
from tests.support.fake_langfuse import FakeLangfuseServer, HangingServer

THREAD = "6fa459ea-ee8a-3ca4-894e-db77e160355e"
MODEL = "fake-summarizer-1"


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
def public_key() -> str:
    """A fresh Langfuse public key per test: the SDK keeps one resource manager (HTTP client,
    span processor, prompt cache) per key per process, so a new key means no shared state."""
    return f"pk-lf-test-{uuid.uuid4().hex}"  # its manager is closed by _close_langfuse_clients


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuseServer]:
    with FakeLangfuseServer(version=7) as server:
        yield server


def make_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "openai_base_url": None,
        "openai_api_key": None,
        "memory_summarizer_model": MODEL,
        "memory_llm_timeout_s": 5.0,
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "langfuse_base_url": None,
        "langfuse_prompt_timeout_s": 0.5,
        "memory_summary_max_tokens": 1500,
    }
    values.update(overrides)
    return Settings(_env_file=None, **values)


def llm_settings(llm: FakeLLMServer, **overrides: Any) -> Settings:
    return make_settings(openai_base_url=llm.base_url, openai_api_key="sk-test", **overrides)


def lf_settings(llm: FakeLLMServer, public_key: str, base_url: str, **overrides: Any) -> Settings:
    return llm_settings(
        llm,
        langfuse_public_key=public_key,
        langfuse_secret_key="sk-lf-test",
        langfuse_base_url=base_url,
        **overrides,
    )


def exchange(
    seq: int,
    query: str,
    answer: str = "",
    *,
    sql: tuple[str, ...] = (),
    visualizations: tuple[dict[str, Any], ...] = (),
    dashboards: tuple[dict[str, Any], ...] = (),
) -> Exchange:
    return Exchange(
        seq=seq,
        session_id=uuid.UUID(int=seq),
        user_query=query,
        answer=answer,
        artifacts=derive_artifacts(sql, visualizations, dashboards),
        completed_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
    )


REVENUE = exchange(
    1,
    "Revenue by region for 2025 excluding refunds",
    "EMEA leads with 4.2M.",
    sql=("SELECT region, SUM(revenue) FROM sales WHERE year = 2025 AND NOT refund GROUP BY 1",),
    visualizations=(
        {
            "id": 17,
            "type": "CHART",
            "name": "Revenue by region",
            "options": {"globalSeriesType": "column", "columnMapping": {"region": "x"}},
        },
    ),
)
ACTIVE = exchange(
    2,
    "Define active users as users with a login in the last 30 days. How many are there?",
    "There are 12,400 active users.",
    sql=("SELECT COUNT(*) FROM users WHERE last_login > now() - interval '30 days'",),
    dashboards=({"id": 3, "name": "Sales 2025", "widgets": [{"visualization_id": 17}]},),
)


def summarize(
    s: ConversationSummarizer, previous: str | None = None, exchanges: list[Exchange] | None = None
) -> SummaryResult:
    return s.summarize(
        thread_id=THREAD, previous_summary=previous, exchanges=exchanges or [REVENUE, ACTIVE]
    )


# ------------------------------------------------------------------------- prompts


def test_builtin_prompt_without_langfuse_keys(llm: FakeLLMServer) -> None:
    result = summarize(ConversationSummarizer(llm_settings(llm)))

    assert result.prompt == "builtin:v2"
    assert result.model == MODEL
    assert "Revenue by region for 2025 excluding refunds" in result.text
    prompt = llm.prompt_text()
    assert "User: Revenue by region for 2025 excluding refunds" in prompt
    assert "Assistant: EMEA leads with 4.2M." in prompt
    assert 'Visualization #17 "Revenue by region" (chart/column)' in prompt
    assert 'Dashboard #3 "Sales 2025" (1 widgets)' in prompt
    assert "definitions" in prompt  # the built-in instructions
    body = llm.requests[-1]
    assert body["model"] == MODEL
    assert body["temperature"] <= 0.3


@pytest.mark.parametrize("prompt_type", ["text", "chat"])
def test_langfuse_prompt_used_and_version_recorded(
    llm: FakeLLMServer, langfuse: FakeLangfuseServer, public_key: str, prompt_type: str
) -> None:
    langfuse.prompt_type = prompt_type
    summarizer = ConversationSummarizer(lf_settings(llm, public_key, langfuse.base_url))

    result = summarize(summarizer, previous="EARLIER-SUMMARY-MARKER")

    assert result.prompt == "langfuse:conversation_summarizer:v7"
    prompt = llm.prompt_text()
    assert "LANGFUSE PROMPT" in prompt
    assert "EARLIER-SUMMARY-MARKER" in prompt
    assert "User: Define active users as users with a login" in prompt
    assert "{{" not in prompt
    roles = [m["role"] for m in llm.requests[-1]["messages"]]
    assert roles == (["user"] if prompt_type == "text" else ["system", "user"])
    # Authenticated with the configured key, and served from the SDK cache afterwards.
    assert public_key in str(langfuse.prompt_requests[0]["headers"].get("x-langfuse-public-key"))
    assert summarize(summarizer).prompt == result.prompt
    assert len(langfuse.prompt_requests) == 1


@pytest.mark.parametrize("failure", ["401", "404", "500", "unreachable", "hanging"])
def test_langfuse_failure_falls_back_to_builtin(
    llm: FakeLLMServer, langfuse: FakeLangfuseServer, public_key: str, failure: str
) -> None:
    hanging = HangingServer()
    base_url = {
        "401": langfuse.base_url,
        "404": langfuse.base_url,
        "500": langfuse.base_url,
        "unreachable": f"http://127.0.0.1:{free_port()}",
        "hanging": hanging.base_url,
    }[failure]
    if failure in ("401", "404", "500"):
        langfuse.set_mode(failure)
    summarizer = ConversationSummarizer(lf_settings(llm, public_key, base_url))
    try:
        started = time.monotonic()
        result = summarize(summarizer, previous="EARLIER-SUMMARY-MARKER")
        elapsed = time.monotonic() - started
    finally:
        hanging.close()

    assert result.prompt == "builtin:v2"
    assert "EARLIER-SUMMARY-MARKER" in llm.prompt_text()
    assert elapsed < 20  # bounded: not the SDK's default timeouts and retries
    if failure in ("401", "404"):
        assert len(langfuse.prompt_requests) == 1  # no retries


def test_uninitialized_langfuse_client_falls_back() -> None:
    # A client built without keys is the SDK's disabled client: get_prompt raises
    # "SDK is not correctly initialized"; that must read as "no Langfuse prompt".
    disabled = Langfuse(public_key=None, secret_key=None)
    assert langfuse_prompt(disabled, make_settings(), "(none yet)", "User: hi") is None


def test_langfuse_prompt_without_conversation_variable_is_not_used(
    llm: FakeLLMServer, public_key: str
) -> None:
    with FakeLangfuseServer(prompt_type="text") as lf:
        lf.serve_text_prompt("Summarize.", version=2)
        result = summarize(ConversationSummarizer(lf_settings(llm, public_key, lf.base_url)))
    assert result.prompt == "builtin:v2"


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("Summarize these turns:\n{{conversation}}", "missing"),  # would erase the summary
        ("Keep the memory:\n{{previous_summary}}", "missing"),
        ("{{previous_summary}}\n{{conversation}}\nTenant: {{tenant}}", "unknown"),
    ],
    ids=["no-previous_summary", "no-conversation", "unfilled-tenant"],
)
def test_a_managed_prompt_with_the_wrong_variables_is_refused(
    llm: FakeLLMServer, public_key: str, template: str, reason: str
) -> None:
    from memory_core.metrics import PROMPT_REFUSED

    before = PROMPT_REFUSED.labels(reason)._value.get()
    with FakeLangfuseServer(prompt_type="text") as lf:
        lf.serve_text_prompt(template, version=4)
        result = summarize(
            ConversationSummarizer(lf_settings(llm, public_key, lf.base_url)),
            previous="Earlier: revenue excludes refunds.",
        )
    assert result.prompt == "builtin:v2"
    assert PROMPT_REFUSED.labels(reason)._value.get() == before + 1
    # The built-in prompt carries the running summary into the call.
    assert "Earlier: revenue excludes refunds." in llm.prompt_text()


def test_a_managed_prompt_may_ask_for_the_standing_instructions_code_found(
    llm: FakeLLMServer, public_key: str
) -> None:
    template = "Known: {{standing_instructions}}\nWas: {{previous_summary}}\n{{conversation}}"
    with FakeLangfuseServer(prompt_type="text") as lf:
        lf.serve_text_prompt(template, version=5)
        result = summarize(
            ConversationSummarizer(lf_settings(llm, public_key, lf.base_url)),
            previous="Standing instructions:\n- Show amounts in EUR",
        )
    assert result.prompt == "langfuse:conversation_summarizer:v5"
    prompt = llm.prompt_text()
    # The previous summary's instruction and the one turn 2 set, one line each.
    assert "Known: - Show amounts in EUR\n- Define active users as users with a login" in prompt
    assert "{{" not in prompt


def test_the_builtin_prompt_asks_for_the_section_and_lists_what_code_found(
    llm: FakeLLMServer,
) -> None:
    summarize(ConversationSummarizer(llm_settings(llm)), previous=None)
    prompt = llm.prompt_text()
    assert 'headed exactly "Standing instructions:"' in prompt
    found = prompt.split("<standing_instructions>", 1)[1].split("</standing_instructions>")[0]
    # The condition the defining turn's query brought in stands with it: the user set it.
    assert found.strip().splitlines() == [
        "- Define active users as users with a login in the last 30 days",
        "- Applied in SQL: last_login > now() - interval '30 days'",
    ]


# ------------------------------------------------------------------------- the LLM call


def test_llm_ok_returns_validated_summary_with_usage(llm: FakeLLMServer) -> None:
    result = summarize(ConversationSummarizer(llm_settings(llm)))

    assert result.text.startswith("Running summary of the analysis.")
    assert result.input_tokens is not None and result.input_tokens > 0
    assert result.output_tokens == len(result.text.split())
    assert llm.calls == 1


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("500", "LLM HTTP 500"),
        ("timeout", "LLM timeout"),
        ("empty", "empty"),
        ("garbage", "garbage"),
        ("refusal", "refusal"),
    ],
)
def test_llm_failures_raise_summarization_error(
    llm: FakeLLMServer, mode: str, message: str
) -> None:
    llm.set_mode(mode)
    llm.delay_s = 10.0
    summarizer = ConversationSummarizer(llm_settings(llm, memory_llm_timeout_s=0.5))

    with pytest.raises(SummarizationError, match=message):
        summarize(summarizer)
    assert llm.calls == 1  # no client-side retries: Celery owns them


def test_llm_unreachable_raises_summarization_error() -> None:
    settings = make_settings(
        openai_base_url=f"http://127.0.0.1:{free_port()}/v1", openai_api_key="sk-test"
    )
    with pytest.raises(SummarizationError, match="unreachable"):
        summarize(ConversationSummarizer(settings))


def test_mode_switch_at_runtime_recovers(llm: FakeLLMServer) -> None:
    summarizer = ConversationSummarizer(llm_settings(llm))
    llm.set_mode("500")
    with pytest.raises(SummarizationError):
        summarize(summarizer)
    llm.set_mode("ok")
    assert summarize(summarizer).prompt == "builtin:v2"
    assert llm.calls == 2


def test_previous_summary_is_carried_into_the_prompt(llm: FakeLLMServer) -> None:
    summarizer = ConversationSummarizer(llm_settings(llm))
    first = summarize(summarizer, exchanges=[REVENUE])
    summarize(summarizer, previous=first.text, exchanges=[ACTIVE])

    assert first.text in llm.prompt_text(-1)
    assert "(none yet)" in llm.prompt_text(0)


def test_token_bound_is_enforced(llm: FakeLLMServer) -> None:
    llm.set_mode("long")
    summarizer = ConversationSummarizer(llm_settings(llm, memory_summary_max_tokens=200))

    with pytest.raises(SummarizationError, match="exceeds the bound 200"):
        summarize(summarizer)
    assert llm.requests[-1]["max_tokens"] == 200


def test_validate_summary_rules() -> None:
    assert validate_summary("Here is the updated summary:\nThe user studies churn.", 100) == (
        "The user studies churn."
    )
    for bad in ("", "   ", "Error: upstream failed", "As an AI, I cannot", "$$ 0101 ## !!"):
        with pytest.raises(SummarizationError):
            validate_summary(bad, 100)
    # A legitimate summary mentioning errors is not a refusal.
    assert validate_summary("Error rates by region were analysed for 2025.", 100)


# ------------------------------------------------------------------------- LLM-free fold


def _many(start: int, count: int) -> list[Exchange]:
    return [
        exchange(
            seq,
            f"Goal number {seq}: weekly orders for store {seq} only in region R{seq % 3}",
            f"Answer {seq}.",
            sql=(f"SELECT week, COUNT(*) FROM orders WHERE store_id = {seq} GROUP BY week",),
        )
        for seq in range(start, start + count)
    ]


def test_llm_free_fold_is_deterministic_and_keeps_goals_filters_and_builds() -> None:
    settings = make_settings()
    first = summarize(ConversationSummarizer(settings), exchanges=[REVENUE])
    again = summarize(ConversationSummarizer(settings), exchanges=[REVENUE])
    assert first == again
    assert first.prompt == "llm-free:v2"
    assert (first.model, first.input_tokens, first.output_tokens) == (None, None, None)

    second = summarize(ConversationSummarizer(settings), previous=first.text, exchanges=[ACTIVE])
    text = second.text
    assert "Revenue by region for 2025 excluding refunds" in text  # earlier goal kept
    assert "Define active users as users with a login in the last 30 days" in text
    assert "excluding refunds" in text
    assert "WHERE year = 2025 AND NOT refund" in text
    assert "define active users as users with a login in the last 30 days" in text.lower()
    assert 'Visualization #17 "Revenue by region" (chart/column)' in text
    assert 'Dashboard #3 "Sales 2025" (1 widgets)' in text
    # Folding the same turns again does not duplicate lines.
    third = summarize(ConversationSummarizer(settings), previous=text, exchanges=[ACTIVE])
    assert third.text.count("Dashboard #3") == 1


def test_llm_free_fold_stays_within_bound_dropping_oldest_goals_first() -> None:
    bound = 300
    settings = make_settings(memory_summary_max_tokens=bound)
    summarizer = ConversationSummarizer(settings)
    summary: str | None = summarize(summarizer, exchanges=[REVENUE]).text
    for fold in range(8):  # a 90-turn thread, folded 11 turns at a time
        summary = summarize(summarizer, previous=summary, exchanges=_many(2 + 11 * fold, 11)).text
        assert count_tokens(summary) <= bound
    assert summary is not None
    assert "Goal number 89" in summary  # newest goal kept
    assert "Goal number 2:" not in summary  # oldest goals dropped
    assert "WHERE store_id = 89" in summary
    assert validate_summary(summary, bound) == summary  # a valid summary by the LLM rules too


def test_llm_free_fold_keeps_free_text_previous_summary_when_room() -> None:
    settings = make_settings()
    result = summarize(
        ConversationSummarizer(settings),
        previous="The user analyses churn in EMEA.",
        exchanges=[ACTIVE],
    )
    assert "The user analyses churn in EMEA." in result.text


# ------------------------------------------------------------------------- tracing


def test_generation_traced_to_langfuse(
    llm: FakeLLMServer, langfuse: FakeLangfuseServer, public_key: str
) -> None:
    result = summarize(ConversationSummarizer(lf_settings(llm, public_key, langfuse.base_url)))

    wait_for(langfuse.generations, 15, "a generation exported to Langfuse", interval_s=0.05)
    attrs = langfuse.generations()[0]["attributes"]
    assert attrs["langfuse.observation.model.name"] == MODEL
    usage = json.loads(attrs["langfuse.observation.usage_details"])
    assert usage["input"] == result.input_tokens
    assert usage["output"] == result.output_tokens
    assert json.loads(attrs["langfuse.observation.metadata.thread_id"]) == THREAD
    assert attrs["session.id"] == THREAD
    assert attrs["langfuse.observation.prompt.name"] == "conversation_summarizer"
    assert attrs["langfuse.observation.prompt.version"] == 7
    assert "Basic " in langfuse.otel_headers[0]["authorization"]


def test_failed_llm_call_traced_as_error(
    llm: FakeLLMServer, langfuse: FakeLangfuseServer, public_key: str
) -> None:
    llm.set_mode("500")
    with pytest.raises(SummarizationError):
        summarize(ConversationSummarizer(lf_settings(llm, public_key, langfuse.base_url)))

    wait_for(langfuse.generations, 15, "a generation exported to Langfuse", interval_s=0.05)
    attrs = langfuse.generations()[0]["attributes"]
    assert attrs["langfuse.observation.level"] == "ERROR"
    assert "LLM HTTP 500" in attrs["langfuse.observation.status_message"]
