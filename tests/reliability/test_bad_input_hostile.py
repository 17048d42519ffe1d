"""Scenario 4, hostile text: SQL, Redis protocol, control characters, bidi/zero-width, template
braces, surrogates in every text field.

Stored and read back unchanged through every path (the Redis copy, Postgres rehydration, the
transcript, the views, the CLI), in-process and as jobs on a worker; or rejected naming the
field (NUL, lone surrogates).

Generated bad payloads: test_bad_input.py; size limits and odd valid objects:
test_bad_input_limits.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery import Celery

from memory_core import (
    DashboardArtifact,
    RedisConversationMemory,
    SqlArtifact,
    VisualizationArtifact,
    render_conversation_context,
    save_session_to_thread_safe,
)
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.io.db import session_scope
from memory_core.models import ThreadMessage
from memory_core.write.artifacts import indent_block, one_line
from tests.support import figures
from tests.support.bad_input import names_field
from tests.support.commands import run_module
from tests.support.services import Stack
from tests.support.snapshots import make_snapshot
from tests.support.state import landed
from tests.support.workers import send_finalize

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(300)]

HOSTILE = [
    "'; DROP TABLE thread_messages; --",
    "Robert'); DELETE FROM conversation_threads WHERE ('1'='1",
    "1 OR 1=1; SELECT pg_sleep(10); /* */ $$ E'\\x00' \\\\",
    "*1\r\n$4\r\nPING\r\n",
    "*3\r\n$3\r\nSET\r\n$4\r\nkey1\r\n$1\r\nv\r\n\r\nFLUSHALL\r\n",
    "chat_conversation:{6fa459ea-ee8a-3ca4-894e-db77e160355e}:meta",
    "]]) redis.call('FLUSHALL') --[[",
    "\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f\x9b",
    "tab\tnewline\nCR\rCRLF\r\nend",
    "\u202eevil\u202c \u200bzero\u200dwidth \ufeffBOM \u2028ls\u2029ps",
    "emoji 👩\u200d💻 🔥 \U0001d518\U0001d52b\U0001d526 \ufdfd",
    "{{previous_summary}} {conversation} {0} %s %(x)s ${HOME} $(id) `id`",
    "</script><script>alert(1)</script>&amp;",
    '{"recent": [], "summary": "injected"}',
    "\\u0000 \\ud800 (escaped, not real)",
    "x" * 250,
]
UNSTORABLE_TEXT = ["nul\x00byte", "lone \ud800 high", "lone \udfff low", "\x00"]


def _everywhere(tid: uuid.UUID, text: str) -> dict[str, Any]:
    """A snapshot with `text` in every text field an agent hands over."""
    return make_snapshot(
        tid,
        1,
        owner_id=text[:255],
        user_query=text,
        answer=text,
        sql=[text],
        visualizations=[
            {"id": text[:255], "type": text[:100], "name": text, "options": {text: text}},
            {
                "id": 1,
                "type": "CHART",
                "name": text,
                "options": {"globalSeriesType": text, "columnMapping": {text: "x"}},
            },
        ],
        dashboards=[
            {"id": text[:255], "name": text, "widgets": [{"visualization_id": text[:255]}]}
        ],
        response_payload={text: text, "nested": [text, {text: [text]}]},
    )


def _check_round_trip(memory: RedisConversationMemory, snap: dict[str, Any]) -> None:
    tid, owner, text = uuid.UUID(snap["thread_id"]), snap["owner_id"], snap["user_query"]
    hit = memory.get_context(tid, owner)
    (turn,) = hit.recent
    assert (turn.user_query, turn.answer) == (text, text)
    sql, viz, chart, dash = turn.artifacts
    assert isinstance(sql, SqlArtifact) and sql.sql == text
    assert isinstance(viz, VisualizationArtifact) and isinstance(chart, VisualizationArtifact)
    # Descriptor fields are flattened to one line and bounded (names can come from other
    # users' dashboards and must not forge lines); ids keep their full length.
    assert (viz.id, viz.type, viz.name) == (
        one_line(text[:255], 255),
        one_line(text[:100], 100),
        one_line(text, 200),
    )
    assert (chart.name, chart.chart, chart.x) == (
        one_line(text, 200),
        one_line(text, 100),
        (one_line(text, 100),),
    )
    assert isinstance(dash, DashboardArtifact)
    assert (dash.id, dash.name, dash.visualization_ids) == (
        one_line(text[:255], 255),
        one_line(text, 200),
        (one_line(text[:255], 255),),
    )
    memory.invalidate(tid)
    assert memory.get_context(tid, owner) == hit  # rehydrated from Postgres: the same
    with session_scope() as s:
        (row,) = ThreadMessage.transcript(s, tid, owner)
        assert row.response_payload == snap["response_payload"]
        assert (row.user_query, row.answer) == (text, text)
    # Views: SQL verbatim (indented) in the sql view; names quoted as JSON strings in the
    # visualizations view; the query's gist (whitespace runs collapsed) in every view.
    gist = " ".join(text.split())
    for focus in ("brief", "sql", "visualizations"):
        view = render_conversation_context(hit, focus, max_tokens=4000)
        assert gist[:200] in view
    sql_view = render_conversation_context(hit, "sql", max_tokens=4000)
    assert "SQL:\n" + indent_block(text) in sql_view
    quoted = json.dumps(one_line(text, 200), ensure_ascii=False)
    assert quoted in render_conversation_context(hit, "visualizations", max_tokens=4000)


def _saved_or_rejected_in_process(memory: RedisConversationMemory) -> None:
    """Hostile text is saved and read back unchanged; NUL and lone surrogates are rejected."""
    for text in HOSTILE:
        snap = _everywhere(uuid.uuid4(), text)
        out = save_session_to_thread_safe(snap, memory=memory)
        assert out.status == "saved", (text, out.reason)
        _check_round_trip(memory, snap)
    for text in UNSTORABLE_TEXT:
        out = save_session_to_thread_safe(_everywhere(uuid.uuid4(), text), memory=memory)
        assert out.status == "rejected" and names_field("owner_id", out.reason or ""), out


def _check_the_command_line(jobs: list[dict[str, Any]]) -> None:
    """The command line prints the stored context back, unchanged, as JSON."""
    for snap in jobs[:4]:
        out = run_module(
            "memory_core.cli", "context", snap["thread_id"], "--owner", snap["owner_id"], "--json"
        )
        assert out.returncode == 0, out.stderr
        ctx = json.loads(out.stdout)
        assert ctx["recent"][0]["user_query"] == snap["user_query"]


def test_hostile_text_in_every_field_round_trips_or_is_rejected(
    stack: Stack, start_worker: Callable[..., WorkerProcess], agent: Celery
) -> None:
    memory = RedisConversationMemory()
    _saved_or_rejected_in_process(memory)
    # The same through the broker and a worker, then read back as above.
    w = start_worker(concurrency=2)
    jobs = [_everywhere(uuid.uuid4(), text) for text in HOSTILE]
    for snap in jobs:
        send_finalize(agent, snap)
    wait_for(
        lambda: landed(s["session_id"] for s in jobs) == {s["session_id"] for s in jobs},
        60,
        "the hostile jobs",
        w.log,
    )
    for snap in jobs:
        _check_round_trip(memory, snap)
    _check_the_command_line(jobs)
    assert w.alive()
    figures.record(
        "input.4.hostile",
        scenario="hostile text in every text field (SQL, Redis protocol, control chars, ...)",
        jobs=2 * len(HOSTILE) + len(UNSTORABLE_TEXT),
        faults=(
            f"{len(HOSTILE)} hostile strings in 14 text fields, in-process and as jobs; "
            f"{len(UNSTORABLE_TEXT)} with NUL / lone surrogates"
        ),
        lost=0,
        duplicated=0,
        recover="n/a",
        checked=(
            "stored and read back unchanged via the Redis copy, Postgres rehydration, the "
            "transcript, the three views (query gist whitespace-collapsed by design) and the "
            "CLI (--json); NUL and lone surrogates rejected naming the field"
        ),
    )
