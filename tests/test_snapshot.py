"""TurnSnapshot validation: a bad-input corpus, each case naming its field, nothing written."""

from __future__ import annotations

import json
import uuid
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from sqlalchemy import func, select

from memory_core import RedisConversationMemory, TurnSnapshot, save_session_to_thread_safe
from memory_core.io.db import session_scope
from memory_core.models import ConversationThread, ThreadMessage
from memory_core.write.artifacts import SqlArtifact
from memory_core.write.snapshot import MAX_PAYLOAD_BYTES, _check_json
from tests.support.snapshots import make_snapshot

PROXY = MappingProxyType({"a": 1})
BAD: list[tuple[str, dict[str, Any]]] = [
    ("session_id", {"session_id": None}),
    ("session_id", {"session_id": "not-a-uuid"}),
    ("session_id", {"session_id": 12345}),
    ("session_id", {"session_id": "{1b4e28ba-2fa1-11d2-883f-0016d3cca427}"}),
    ("thread_id", {"thread_id": "6fa459ea-ee8a-3ca4-894e-db77e160355"}),
    ("thread_id", {"thread_id": ["6fa459ea-ee8a-3ca4-894e-db77e160355e"]}),
    ("owner_id", {"owner_id": ""}),
    ("owner_id", {"owner_id": 42}),
    ("owner_id", {"owner_id": "u" * 256}),
    ("agent_type", {"agent_type": "assistant"}),
    ("agent_type", {"agent_type": None}),
    ("user_query", {"user_query": ""}),
    ("user_query", {"user_query": "   "}),
    ("user_query", {"user_query": "x" * 8001}),
    ("user_query", {"user_query": "nul\x00byte"}),
    ("user_query", {"user_query": "lone \ud800 surrogate"}),
    ("user_query", {"user_query": 7}),
    ("answer", {"answer": "a" * 100_001}),
    ("answer", {"answer": None}),
    ("sql", {"sql": "SELECT 1"}),
    ("sql", {"sql": [""]}),
    ("sql", {"sql": ["SELECT 1"] * 21}),
    ("sql", {"sql": [1]}),
    ("visualizations", {"visualizations": [{"id": 1}]}),
    ("visualizations", {"visualizations": [{"id": 1.5, "type": "CHART"}]}),
    ("visualizations", {"visualizations": [{"id": 1, "type": "CHART", "options": []}]}),
    ("visualizations", {"visualizations": [{"id": 1, "type": "CHART", "options": {"x": "\x00"}}]}),
    ("visualizations", {"visualizations": [{"id": 1, "type": "CHART"}] * 51}),
    ("dashboards", {"dashboards": [{"name": "no id"}]}),
    ("dashboards", {"dashboards": {"id": 1}}),
    ("response_payload", {"response_payload": [1, 2]}),
    ("response_payload", {"response_payload": {"x": float("nan")}}),
    ("response_payload", {"response_payload": {"big": "x" * (1024 * 1024 + 1)}}),
    ("response_payload", {"response_payload": {"k": "\x00"}}),
    # Not JSON at all: json.dumps raised TypeError past the validators, out of the save.
    ("response_payload", {"response_payload": {"k": PROXY}}),
    ("response_payload", {"response_payload": {"k": [1, {2, 3}]}}),
    ("visualizations", {"visualizations": [{"id": 1, "type": "T", "options": {"m": PROXY}}]}),
    ("completed_at", {"completed_at": "yesterday"}),
    ("completed_at", {"completed_at": "2026-11-29T12:00:00"}),
    ("unexpected", {"unexpected": 1}),
]


@pytest.mark.parametrize(("field", "change"), BAD, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BAD)])
def test_bad_input_names_the_field_and_writes_nothing(
    field: str, change: dict[str, Any], memory: RedisConversationMemory
) -> None:
    tid = uuid.uuid4()
    snap = {**make_snapshot(tid, 1), **change}
    with pytest.raises(ValidationError) as err:
        TurnSnapshot.model_validate(snap)
    assert field in str(err.value)
    out = save_session_to_thread_safe(snap, memory=memory)
    assert out.status == "rejected" and not out.retryable
    assert out.reason is not None and field in out.reason
    with session_scope() as s:
        assert s.scalar(select(func.count()).where(ConversationThread.id == tid)) == 0


def test_missing_required_fields_are_named() -> None:
    with pytest.raises(ValidationError) as err:
        TurnSnapshot.model_validate({})
    for field in ("session_id", "thread_id", "owner_id", "agent_type", "user_query"):
        assert field in str(err.value)


def test_architecture_example_is_accepted() -> None:
    """The example snapshot of docs/ARCHITECTURE.md (and the README) validates."""
    snap = TurnSnapshot.model_validate(
        {
            "session_id": "1b4e28ba-2fa1-11d2-883f-0016d3cca427",
            "thread_id": "6fa459ea-ee8a-3ca4-894e-db77e160355e",
            "owner_id": "user-42",
            "agent_type": "chat",
            "user_query": "Revenue by region for 2025",
            "answer": "Revenue by region for 2025: EMEA leads with ...",
            "sql": [
                "SELECT region, SUM(revenue) AS revenue FROM sales "
                "WHERE year = 2025 GROUP BY region"
            ],
            "visualizations": [
                {
                    "id": 17,
                    "type": "CHART",
                    "name": "Revenue by region",
                    "options": {
                        "globalSeriesType": "column",
                        "columnMapping": {"region": "x", "revenue": "y"},
                        "...": "...",
                    },
                }
            ],
            "dashboards": [{"id": 3, "name": "Sales 2025", "widgets": [{"visualization_id": 17}]}],
            "response_payload": {"any": "JSON the transcript UI renders"},
            "completed_at": "2026-11-29T12:00:00Z",
        }
    )
    assert snap.completed_at.utcoffset() is not None and snap.completed_at.hour == 12


hostile = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=200
).filter(str.strip)


@settings(max_examples=40, deadline=None)
@given(query=hostile, answer=hostile, sql=hostile, owner=hostile.filter(lambda s: len(s) <= 255))
def test_hostile_text_round_trips_unchanged(query: str, answer: str, sql: str, owner: str) -> None:
    from memory_core import RedisConversationMemory

    memory = RedisConversationMemory()
    tid = uuid.uuid4()
    out = save_session_to_thread_safe(
        make_snapshot(
            tid,
            1,
            owner_id=owner,
            user_query=query,
            answer=answer,
            sql=[sql],
            response_payload={query: answer},
        ),
        memory=memory,
    )
    assert out.status == "saved", out.reason
    hit = memory.get_context(tid, owner)
    assert (hit.recent[0].user_query, hit.recent[0].answer) == (query, answer)
    artifact = hit.recent[0].artifacts[0]
    assert isinstance(artifact, SqlArtifact) and artifact.sql == sql
    memory.invalidate(tid)
    assert memory.get_context(tid, owner) == hit
    with session_scope() as s:
        row = ThreadMessage.transcript(s, tid, owner)[0]
        assert row.response_payload == {query: answer}


json_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(json_text, inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(json_text, json_values, max_size=6))
@example({"ints": [2**62, -(2**63), -1.7976931348623157e308]})
@example({"beyond 64 bits": [2**64, -(2**80)]})
@example({"\u2028": '\U0001f600\x01\\"' * 5})
def test_the_walk_never_bounds_a_payload_below_its_json_size(value: dict[str, Any]) -> None:
    """The 1 MiB check computes the exact size only when the walk's bound passes the limit:
    the bound must never be below what json.dumps writes (astral characters, escapes, ints
    past 64 bits, the separators)."""
    bound = _check_json(value)
    assert bound >= len(json.dumps(value, allow_nan=False).encode("utf-8"))


def test_a_payload_just_under_the_limit_is_saved_and_one_just_over_is_refused(
    memory: RedisConversationMemory,
) -> None:
    envelope = len(json.dumps({"big": ""}))  # the bytes around the string
    for extra, status in ((0, "saved"), (1, "rejected")):
        text = "x" * (MAX_PAYLOAD_BYTES - envelope + extra)
        snap = make_snapshot(uuid.uuid4(), 1, response_payload={"big": text})
        out = save_session_to_thread_safe(snap, memory=memory)
        assert out.status == status, out.reason
        if status == "rejected":
            assert out.reason is not None and "response_payload" in out.reason
