"""Celery tasks `memory.finalize_turn` and `memory.fold_thread`: thin shells over memory_core."""

from __future__ import annotations

import inspect
import random
import uuid
from typing import Any, NoReturn

from celery import Task
from celery.exceptions import Ignore, Reject, Retry

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.events import (
    MEMORY_FINALIZE_REJECTED,
    MEMORY_JOB_DEAD_LETTERED,
    MEMORY_SUMMARIZATION_FAILED,
    MEMORY_SUMMARIZED,
    emit_event,
)
from memory_core.fold.folding import POSTGRES_DOWN, Folder
from memory_core.fold.outcome import FoldOutcome, backoff_delay
from memory_core.fold.publisher import FINALIZE_TASK, FOLD_TASK, publish_fold
from memory_core.fold.summarizer import ConversationSummarizer
from memory_core.io.db import describe_db_error
from memory_core.io.queues import task_reprs
from memory_core.logs import describe_error, get_logger
from memory_core.metrics import JOBS_DEAD_LETTERED, TASK_UNEXPECTED
from memory_core.settings import get_settings
from memory_core.write.session_handler import (
    REASON_DELETED,
    SaveOutcome,
    save_session_to_thread_safe,
)

from .app import app, finalize_limits, fold_limits
from .requests import MemoryRequest, record_refusal, request_ids

log = get_logger(__name__)


class Discard(Ignore):
    """A final no: bad input, or a turn of a deleted thread. The job is acked, not rejected:
    on RabbitMQ a rejected job is dead-lettered to `memory.dead`, which is for poison jobs
    (workers dying on them) only; a refused job must not outlive its refusal there, with
    its content (a deleted thread's turn, a snapshot nobody will ever read back)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MemoryTask(Task):
    """Base task: per-process memory objects; each step opens and owns its own transaction.

    The core commits Postgres before touching Redis or the LLM (durability first), so a task
    runs several short transactions rather than one: `memory.session_factory` commits on
    return and rolls back on error.

    A job ends in exactly one of: done (its turn landed, its fold ran or had nothing to do),
    refused for bad input or a deleted thread (`Discard`: acked, with an event), dead-lettered
    after `MEMORY_MAX_DELIVERIES` lost deliveries (RabbitMQ), or still in the broker. Celery
    acks a task that raises; so no exception leaves a task: one nothing else handled is logged
    and counted and the job retried with backoff (`__call__`); a retry that cannot be
    published goes back to the queue (`retry_or_requeue`); a hard time limit requeues
    (`acks_on_timeout = False`).
    """

    acks_late = True
    reject_on_worker_lost = True
    acks_on_timeout = False
    Request = MemoryRequest  # ids-only argsrepr in every task event (workers/requests.py)
    _memory: RedisConversationMemory | None = None
    _folder: Folder | None = None

    def apply_async(self, args: Any = None, kwargs: Any = None, *rest: Any, **options: Any) -> Any:
        # Retries and `delay()` too: Celery would put the job's repr in the message's headers
        # and in the `task-sent` event.
        options.update(task_reprs(args or (), kwargs))
        return super().apply_async(args, kwargs, *rest, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            self._signature().bind(*args, **kwargs)
        except TypeError:  # a job of the wrong shape: bad input, final; no memory is built
            refuse(self, "wrong_arguments", "wrong arguments")
        try:
            deliveries = delivery_count(self.request)
            if deliveries > get_settings().memory_max_deliveries:
                self._dead_letter(args, deliveries)
            return super().__call__(*args, **kwargs)
        except (Retry, Reject, Ignore):
            raise
        except Exception as exc:  # an exit nothing else handled: back to the queue, later
            error = describe_error(exc)
            log.error("memory.task_unexpected_error", error=error)
            TASK_UNEXPECTED.labels(self.name).inc()
            delay = finalize_retry_delay(self.request.retries, 60)
            retry_or_requeue(self, countdown=delay, exc=RuntimeError(error))

    def _dead_letter(self, args: tuple[Any, ...], deliveries: int) -> NoReturn:
        """A job its workers keep dying on (RabbitMQ counts each lost delivery): stop running
        it. Rejected without requeue, the quorum queue dead-letters it to `memory.dead`."""
        job = args[0] if args else None
        snapshot = job if isinstance(job, dict) else {}
        fold_job = job if self.name == FOLD_TASK else None  # other jobs carry no thread id
        thread_id = _uuid_text(snapshot.get("thread_id") if snapshot else fold_job)
        reason = f"delivered {deliveries} times, the last {deliveries - 1} after a lost delivery"
        log.error("memory.job_dead_lettered", deliveries=deliveries)
        JOBS_DEAD_LETTERED.labels(self.name).inc()
        emit_event(
            self.memory.redis,
            MEMORY_JOB_DEAD_LETTERED,
            thread_id=thread_id,
            session_id=_uuid_text(snapshot.get("session_id")),
            attempt=deliveries,
            error=reason,
            task=self.name,
        )
        raise Reject(reason, requeue=False)

    def _signature(self) -> inspect.Signature:
        sig = self.__dict__.get("_sig")
        if sig is None:
            sig = self.__dict__["_sig"] = inspect.signature(self.run)
        return sig

    @property
    def memory(self) -> RedisConversationMemory:
        if MemoryTask._memory is None:
            MemoryTask._memory = RedisConversationMemory()
        return MemoryTask._memory

    @property
    def folder(self) -> Folder:
        if MemoryTask._folder is None:
            MemoryTask._folder = Folder(self.memory, ConversationSummarizer())
        return MemoryTask._folder


def refuse(task: Task, code: str, detail: str) -> NoReturn:
    """A final no to a job's arguments: `memory_job_refused` (ids only), acked (`Discard`)."""
    log_as = "memory.fold_rejected" if task.name == FOLD_TASK else "memory.job_rejected"
    record_refusal(code, request_ids(task), detail=detail, log_as=log_as)
    raise Discard(detail)


def retry_or_requeue(task: Task, *, countdown: float, exc: Exception) -> NoReturn:
    """`task.retry`, except that a retry Celery could not publish (broker trouble) puts the
    job back on its queue instead of dropping it (Celery rejects it without requeue)."""
    try:
        raise task.retry(countdown=countdown, exc=exc)
    except Reject as failed:
        if failed.requeue:
            raise
        reason = failed.reason
        error = describe_error(reason) if isinstance(reason, BaseException) else str(reason)
        log.warning("memory.retry_not_published", error=error)
        raise Reject(error, requeue=True) from None


def delivery_count(request: Any) -> int:
    """Which delivery of its message this run is: 1 + the times RabbitMQ's quorum queue saw it
    return unacked (its `x-delivery-count` header). Always 1 on Redis, which counts nothing."""
    returned = request.get("x-delivery-count") if request is not None else None
    return 1 + returned if isinstance(returned, int) and returned > 0 else 1


def finalize_retry_delay(retries: int, cap_s: int) -> float:
    """Bounded backoff for a Postgres outage: 1, 2, 4, ... capped, plus a little jitter."""
    return float(min(2**retries, cap_s)) + random.uniform(0, 1)  # noqa: S311 - jitter


def _uuid_text(value: Any) -> str:
    """The id if it is a canonical UUID, else "": events and logs carry nothing else of a job."""
    if isinstance(value, str) and len(value) == 36:
        try:
            return str(uuid.UUID(value))
        except ValueError:
            pass
    return ""


_FINALIZE_SOFT, _FINALIZE_HARD = finalize_limits()


@app.task(
    bind=True,
    base=MemoryTask,
    name=FINALIZE_TASK,
    max_retries=None,  # infrastructure failures retry until Postgres is back: never lost
    soft_time_limit=_FINALIZE_SOFT,
    time_limit=_FINALIZE_HARD,
)
def finalize_turn(self: MemoryTask, snapshot: Any) -> dict[str, Any]:
    if not isinstance(snapshot, dict):
        reason = f"invalid turn snapshot: expected a JSON object, got {type(snapshot).__name__}"
        log.warning("memory.finalize_rejected", reason=reason)  # the core logs the others
        _reject_finalize(self, {}, reason)
    try:
        outcome = save_session_to_thread_safe(snapshot, memory=self.memory)
    except Exception as exc:  # the core returns outcomes; this is a bug or a broken process
        outcome = SaveOutcome("failed", reason=f"error: {describe_error(exc)}", retryable=True)
    if outcome.status == "rejected":
        _reject_finalize(self, snapshot, outcome.reason or "rejected")
    if outcome.status == "failed":
        delay = finalize_retry_delay(
            self.request.retries, self.memory.settings.memory_finalize_retry_cap_s
        )
        log.warning("memory.finalize_retry", retry_in_s=round(delay, 1), reason=outcome.reason)
        retry_or_requeue(self, countdown=delay, exc=RuntimeError(outcome.reason))
    return {"status": outcome.status, "seq": outcome.seq, "cache": outcome.cache}


def _reject_finalize(task: MemoryTask, snapshot: dict[str, Any], reason: str) -> NoReturn:
    """Bad input is final: emit `memory_finalize_rejected`, ack without retry. A turn of a
    deleted thread is rejected too, but its event names no thread: after
    `memory_thread_deleted` nothing is said about that thread."""
    deleted = reason == REASON_DELETED
    emit_event(
        task.memory.redis,
        MEMORY_FINALIZE_REJECTED,
        thread_id="" if deleted else _uuid_text(snapshot.get("thread_id")),
        session_id="" if deleted else _uuid_text(snapshot.get("session_id")),
        error=reason,
        message_id=request_ids(task)["message_id"],
    )
    raise Discard(reason)


_FOLD_SOFT, _FOLD_HARD = fold_limits()


@app.task(
    bind=True,
    base=MemoryTask,
    name=FOLD_TASK,
    max_retries=None,  # folds keep retrying with the capped backoff; each failure is an event
    soft_time_limit=_FOLD_SOFT,
    time_limit=_FOLD_HARD,
)
def fold_thread(self: MemoryTask, thread_id: Any) -> dict[str, Any]:
    tid = _uuid_text(thread_id)
    if not tid:  # malformed: nothing to fold, ever
        refuse(self, "invalid_argument", "thread_id is not a UUID string")
    # Retries and redeliveries of this job keep its task id, and so its lease token.
    token = uuid.uuid5(uuid.NAMESPACE_URL, f"{FOLD_TASK}:{self.request.id}")
    try:
        outcome = self.folder.fold(tid, lease_token=token if self.request.id else None)
    except POSTGRES_DOWN as exc:
        # Postgres unreachable mid-fold: not a summarizer failure (no attempt is counted);
        # retry with the finalize backoff. Without this the fold was dropped and the thread
        # waited for the republish grace (and the lease) before folding again.
        delay = finalize_retry_delay(
            self.request.retries, self.memory.settings.memory_finalize_retry_cap_s
        )
        log.warning("memory.fold_retry", retry_in_s=round(delay, 1), reason=describe_db_error(exc))
        retry_or_requeue(self, countdown=delay, exc=RuntimeError(describe_db_error(exc)))
    except Exception as exc:  # before the lease (after it, Folder counts an attempt)
        s = self.memory.settings
        delay = backoff_delay(
            self.request.retries + 1, s.memory_fold_backoff_base_s, s.memory_fold_backoff_cap_s
        )
        error = describe_error(exc)
        _fold_failed_event(self, tid, "", self.request.retries + 1, error, retry_in_s=delay)
        retry_or_requeue(self, countdown=delay, exc=RuntimeError(error))
    return _after_fold(self, outcome)


def _after_fold(task: MemoryTask, outcome: FoldOutcome) -> dict[str, Any]:
    """What an attempt's outcome asks of the task: a retry, an event, the next fold."""
    if outcome.status == "busy":
        # Another fold holds the lease. If its worker died, the lease lapses: check again then
        # (a no-op if the holder finished), so a killed fold is never silently dropped.
        retry_or_requeue(
            task,
            countdown=task.memory.settings.memory_fold_lease_s + 1,
            exc=RuntimeError("another fold holds the lease"),
        )
    if outcome.status == "failed":
        _fold_failed_event(
            task,
            outcome.thread_id,
            outcome.session_id or "",
            outcome.attempt,
            outcome.error or "",
            retry_in_s=outcome.retry_in_s,
        )
        retry_or_requeue(task, countdown=outcome.retry_in_s or 60, exc=RuntimeError(outcome.error))
    if outcome.status == "folded":
        extra: dict[str, Any] = {"fallback": outcome.fallback} if outcome.fallback else {}
        emit_event(
            task.memory.redis,
            MEMORY_SUMMARIZED,  # to the routine stream
            thread_id=outcome.thread_id,
            session_id=outcome.session_id or "",
            through_seq=str(outcome.through_seq),
            prompt=outcome.prompt or "",
            instructions_restored=str(outcome.instructions_restored),
            superseded_dropped=str(outcome.superseded_dropped),
            **extra,
        )
    if outcome.more_pending:  # a backlog, or turns that came during the fold: keep going
        publish_fold(outcome.thread_id, task.memory.settings.celery_broker_url)
    return {"status": outcome.status, "through_seq": outcome.through_seq}


def _fold_failed_event(
    task: MemoryTask, tid: str, sid: str, attempt: int, error: str, *, retry_in_s: int | None
) -> None:
    emit_event(
        task.memory.redis,
        MEMORY_SUMMARIZATION_FAILED,
        thread_id=tid,
        session_id=sid,
        attempt=attempt,
        error=error,
        retry_in_s=retry_in_s,
    )
