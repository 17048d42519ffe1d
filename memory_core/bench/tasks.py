"""Tasks that exist only to measure the raw limits of the worker shape (`agent-memory bench`).

Loaded only by the benchmark's worker (`celery -A memory_core.workers.app worker -I
memory_core.bench.tasks`): production workers never register them. `shared_task` binds to
whichever app that worker runs, so this module does not import the worker package.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task


@shared_task(name="memory.bench_noop", acks_late=True)
def bench_noop(payload: Any = None) -> None:
    """Does nothing: the cost of a job on the same queue, serializer and acks_late settings."""
    return None
