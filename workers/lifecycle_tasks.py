"""Lifecycle tasks: `memory.forget_owner`, `memory.apply_retention`, `memory.purge_traces`,
`memory.sweep_folds`.

Thin shells over memory_core/lifecycle/threads.py, on the fold queue. Each is idempotent and commits
batch by batch, so a retry, a redelivery or a run killed by its time limit (requeued, not
acked: `acks_on_timeout = False`) goes on from what is left.
"""

from __future__ import annotations

from typing import Any, NoReturn

from memory_core.fold.folding import POSTGRES_DOWN
from memory_core.fold.sweep import sweep_lost_folds
from memory_core.io.db import describe_db_error
from memory_core.io.queues import (
    FORGET_OWNER_TASK,
    PURGE_TRACES_TASK,
    RETENTION_TASK,
    SWEEP_FOLDS_TASK,
)
from memory_core.lifecycle.purge import sweep_late_checkpoints
from memory_core.lifecycle.threads import DeleteFailed, apply_retention, forget_owner
from memory_core.lifecycle.trace_sweep import sweep_trace_purges
from memory_core.logs import get_logger

from .app import app
from .tasks import MemoryTask, finalize_retry_delay, refuse, retry_or_requeue

log = get_logger(__name__)

# Generous: batches commit as they go, so a run cut short loses one batch and is requeued.
SOFT_LIMIT_S, HARD_LIMIT_S = 1800, 1860


def _retry(task: MemoryTask, exc: Exception) -> NoReturn:
    """Postgres or Redis unreachable: nothing of the current batch was deleted; try later."""
    error = str(exc) if isinstance(exc, DeleteFailed) else describe_db_error(exc)
    cap = task.memory.settings.memory_finalize_retry_cap_s
    delay = finalize_retry_delay(task.request.retries, cap)
    log.warning("memory.lifecycle_retry", task=task.name, retry_in_s=round(delay, 1), error=error)
    retry_or_requeue(task, countdown=delay, exc=RuntimeError(error))


@app.task(
    bind=True,
    base=MemoryTask,
    name=FORGET_OWNER_TASK,
    max_retries=None,  # a right-to-be-forgotten request is never dropped
    soft_time_limit=SOFT_LIMIT_S,
    time_limit=HARD_LIMIT_S,
)
def forget_owner_task(self: MemoryTask, owner_id: Any) -> dict[str, Any]:
    if not isinstance(owner_id, str) or not owner_id or "\x00" in owner_id:
        refuse(self, "invalid_argument", "owner_id is not a non-empty string")
    try:
        report = forget_owner(owner_id, memory=self.memory)
    except (DeleteFailed, *POSTGRES_DOWN) as exc:
        _retry(self, exc)
    return report.as_dict()


@app.task(
    bind=True,
    base=MemoryTask,
    name=RETENTION_TASK,
    max_retries=3,  # beat sends the next run within the hour anyway
    soft_time_limit=SOFT_LIMIT_S,
    time_limit=HARD_LIMIT_S,
)
def apply_retention_task(self: MemoryTask) -> dict[str, Any]:
    try:
        result = apply_retention(memory=self.memory)
    except (DeleteFailed, *POSTGRES_DOWN) as exc:
        _retry(self, exc)
    return {"enabled": result.enabled, **result.deleted.as_dict()}


@app.task(
    bind=True,
    base=MemoryTask,
    name=PURGE_TRACES_TASK,
    max_retries=0,  # the requests stay in Postgres; the next beat tick retries them
    soft_time_limit=SOFT_LIMIT_S,
    time_limit=HARD_LIMIT_S,
)
def purge_traces_task(self: MemoryTask) -> dict[str, Any]:
    """What may still arrive after a delete: Langfuse traces of a fold that was mid-call, and
    checkpoints of a LangGraph run that was executing."""
    runs = sweep_late_checkpoints(self.memory)
    sweep = sweep_trace_purges(memory=self.memory)
    return {
        "checked": sweep.checked,
        "deleted": sweep.deleted,
        "pending": sweep.pending,
        "late_checkpoint_runs": runs,
    }


@app.task(
    bind=True,
    base=MemoryTask,
    name=SWEEP_FOLDS_TASK,
    max_retries=0,  # the requests stay on the rows; the next beat tick takes them
    soft_time_limit=120,
    time_limit=150,
)
def sweep_folds_task(self: MemoryTask) -> dict[str, Any]:
    """Folds requested and then lost (memory_core/fold/sweep.py): published again."""
    try:
        sweep = sweep_lost_folds(self.memory)
    except POSTGRES_DOWN as exc:
        log.warning("memory.fold_sweep_skipped", error=describe_db_error(exc))
        return {"found": 0, "published": 0, "error": describe_db_error(exc)}
    return {"found": sweep.found, "published": sweep.published}
