"""Turn snapshots as an analytics agent sends them: the test data of every test."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

BASE_TIME = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def make_snapshot(
    thread_id: uuid.UUID | str,
    n: int,
    *,
    owner_id: str = "user-42",
    agent_type: str = "chat",
    session_id: uuid.UUID | str | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The n-th turn of an analytics conversation, as an agent would send it (JSON dict)."""
    snap: dict[str, Any] = {
        "session_id": str(session_id or uuid.uuid4()),
        "thread_id": str(thread_id),
        "owner_id": owner_id,
        "agent_type": agent_type,
        "user_query": f"Revenue by region for {2000 + n}, excluding returns (turn {n})",
        "answer": f"Turn {n}: EMEA leads with 41% of revenue.",
        "sql": [
            f"SELECT region, SUM(revenue) AS revenue FROM sales WHERE year = {2000 + n} "
            "AND NOT is_return GROUP BY region"
        ],
        "visualizations": [
            {
                "id": 100 + n,
                "type": "CHART",
                "name": f"Revenue by region {n}",
                "options": {
                    "globalSeriesType": "column",
                    "columnMapping": {"region": "x", "revenue": "y"},
                    "legend": {"enabled": True},
                    "seriesOptions": {"revenue": {"color": "#ff0000"}},
                },
            }
        ],
        "dashboards": [{"id": 3, "name": "Sales", "widgets": [{"visualization_id": 100 + n}]}],
        "response_payload": {"blocks": [{"type": "text", "text": f"answer {n}"}]},
        "completed_at": (BASE_TIME + timedelta(minutes=n)).isoformat(),
    }
    snap.update(overrides)
    return snap
