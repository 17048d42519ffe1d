"""The broker topology: the memory queues as every producer and every worker declares them.

One definition, used by the workers (`workers/app.py`), the core's fold publisher and the
LangGraph enqueue path (`fold_publisher.send_by_name`): a declare that differs from the
existing queue fails (RabbitMQ answers PRECONDITION_FAILED), so nobody builds them by hand.

RabbitMQ (`amqp://`): durable quorum queues (Raft-replicated on a cluster), each bound with its
own routing key to the topic exchange `memory`. Topic, not direct: Celery's native delayed
delivery (retry countdowns wait in the broker's `celery_delayed_*` queues, not in a worker)
re-routes by routing key through a topic exchange, and silently falls back to holding the
countdown in the worker for a direct one. A delivery limit ends a job that keeps killing its
workers (each lost delivery counts): it is dead-lettered to `memory.dead`. The tasks dead-letter
such a job themselves one delivery earlier, with an event (`MEMORY_MAX_DELIVERIES`); the
broker's limit is the backstop for a job whose task never gets to run.

Redis: one direct exchange per queue, named after it, which is what Celery creates for a
named queue, so producers that only name the queue keep working.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from kombu import Exchange, Queue

FOLD_TASK = "memory.fold_thread"
FOLD_QUEUE = "memory.fold"
FINALIZE_TASK = "memory.finalize_turn"
FINALIZE_QUEUE = "memory.finalize"
# Lifecycle work (memory_core/lifecycle/threads.py) runs off the request path, on the fold
# queue: the workers sized for slow background jobs.
FORGET_OWNER_TASK = "memory.forget_owner"
RETENTION_TASK = "memory.apply_retention"
PURGE_TRACES_TASK = "memory.purge_traces"
SWEEP_FOLDS_TASK = "memory.sweep_folds"
# Every task a memory worker runs: a name outside this set is "other" in metrics and events.
MEMORY_TASKS = (
    FINALIZE_TASK,
    FOLD_TASK,
    FORGET_OWNER_TASK,
    RETENTION_TASK,
    PURGE_TRACES_TASK,
    SWEEP_FOLDS_TASK,
)
EXCHANGE = "memory"
DEAD_LETTER_EXCHANGE = "memory.dead"
DEAD_LETTER_QUEUE = "memory.dead"
# Deliveries after which RabbitMQ dead-letters a job by itself. Part of the queues' arguments:
# changing it means recreating the queues, so it is a constant, above MEMORY_MAX_DELIVERIES'
# range (memory_core/settings.py), so the tasks always get to dead-letter (with an event) first.
BROKER_DELIVERY_LIMIT = 20
AMQP_SCHEMES = frozenset({"amqp", "amqps", "pyamqp"})


def is_amqp(broker_url: str) -> bool:
    """Whether `broker_url` is RabbitMQ (AMQP), as opposed to Redis."""
    scheme = urlsplit(broker_url).scheme.split("+", 1)[0]
    return scheme in AMQP_SCHEMES


def _quorum(name: str, exchange: Exchange) -> Queue:
    return Queue(
        name,
        exchange,
        routing_key=name,
        durable=True,
        queue_arguments={
            "x-queue-type": "quorum",
            "x-delivery-limit": BROKER_DELIVERY_LIMIT,
            "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE,
        },
    )


def task_queues(broker_url: str) -> list[Queue]:
    """`memory.finalize` and `memory.fold`, declared as the workers consume them."""
    if is_amqp(broker_url):
        exchange = Exchange(EXCHANGE, type="topic", durable=True)
        return [_quorum(FINALIZE_QUEUE, exchange), _quorum(FOLD_QUEUE, exchange)]
    return [
        Queue(name, Exchange(name, type="direct"), routing_key=name)
        for name in (FINALIZE_QUEUE, FOLD_QUEUE)
    ]


def task_queue(broker_url: str, name: str) -> Queue:
    """The queue `name` of `task_queues`; KeyError for another name."""
    for queue in task_queues(broker_url):
        if queue.name == name:
            return queue
    raise KeyError(name)


def dead_letter_queue() -> Queue:
    """Where RabbitMQ puts a job that was delivered too often (kept for inspection)."""
    exchange = Exchange(DEAD_LETTER_EXCHANGE, type="fanout", durable=True)
    return Queue(
        DEAD_LETTER_QUEUE,
        exchange,
        routing_key="",
        durable=True,
        queue_arguments={"x-queue-type": "quorum"},
    )


def publish_options(broker_url: str, queue: str) -> dict[str, Any]:
    """`send_task` options that send to `queue` as its workers declare it, declaring nothing
    new: on RabbitMQ the exchange and routing key (naming the queue would make Celery declare
    a plain queue, which fails against the quorum one); on Redis the queue by name."""
    if is_amqp(broker_url):
        return {"exchange": EXCHANGE, "routing_key": queue, "declare": []}
    return {"queue": queue}


def task_reprs(args: Any = (), kwargs: Any = None) -> dict[str, str]:
    """`argsrepr` and `kwargsrepr` for a memory job: its ids, never its content.

    Celery puts these in the message headers and every worker's task events (Flower keeps
    them); left unset it writes the whole snapshot there, owner id, query and answer. Pass
    them to every `send_task`: `send_task(FINALIZE_TASK, args=[snapshot], **where,
    **task_reprs([snapshot]))`. The workers rewrite them on receipt anyway (workers/requests.py).
    """
    if isinstance(args, (list, tuple)):
        argsrepr = "[" + ", ".join(describe_argument(a) for a in args) + "]"
    else:
        argsrepr = describe_argument(args)
    if not kwargs:
        kwargsrepr = "{}"
    elif isinstance(kwargs, dict):
        kwargsrepr = f"{{<{len(kwargs)} keys>}}"
    else:
        kwargsrepr = describe_argument(kwargs)
    return {"argsrepr": argsrepr, "kwargsrepr": kwargsrepr}


def describe_argument(value: Any) -> str:
    """One job argument as the task events may show it: a canonical UUID string as itself, a
    dict by the UUIDs under `thread_id` / `session_id`, None and booleans as themselves,
    anything else by its type alone (an owner id, a query, a number are all content)."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, str) and canonical_uuid(value):
        return repr(value)
    if isinstance(value, dict):
        ids = [f"{k}={value[k]}" for k in ID_FIELDS if canonical_uuid(value.get(k))]
        return "<dict" + "".join(f" {i}" for i in ids) + ">"
    return f"<{type(value).__name__}>"


ID_FIELDS = ("thread_id", "session_id")


def canonical_uuid(value: Any) -> bool:
    """Whether `value` is a UUID in canonical text form (36 characters, lower or upper hex)."""
    if not isinstance(value, str) or len(value) != 36:
        return False
    try:
        return str(UUID(value)) == value.lower()
    except ValueError:
        return False
