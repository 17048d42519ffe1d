"""Tasks that exist only to measure the raw limits of the worker shape (`agent-memory bench`)."""

from __future__ import annotations

from typing import Any

from workers.app import app


@app.task(name="memory.bench_noop", acks_late=True)
def bench_noop(payload: Any = None) -> None:
    """Does nothing: the cost of a job on the same queue, serializer and acks_late settings."""
    return None
