"""The Celery app: the one module that owns worker configuration.

`celery -A workers.app worker` in a checkout; installed, this package is `memory_core.workers`
(docs/ARCHITECTURE.md, "Names"), so every name below is relative to `__package__`.

Reliability settings and why:
* acks_late + reject_on_worker_lost: a job is acked only after it ran; a worker child killed
  mid-job gets its job redelivered (finalize and fold are idempotent, so that is safe).
* visibility_timeout: with the Redis broker an unacked message (including a retry waiting for
  its countdown inside a worker) is redelivered after this long. It must exceed the longest
  retry countdown (MEMORY_FOLD_BACKOFF_CAP_S, 3600 s) plus the fold time limit, else a waiting
  retry would be duplicated. The price: jobs held by a worker host that dies hard wait this
  long before redelivery (docs/OPERATIONS.md): at most visibility_timeout +
  unacked_restore_interval. Set in both transport-option dicts, as kombu reads each separately.
* the broker: RabbitMQ (`amqp://`, the production broker) or Redis. The queues are declared as
  memory_core/io/queues.py says, for both; only the transport options differ (below).
* soft shutdown: on SIGTERM (remapped to Celery's cold shutdown by `agent-memory worker`,
  REMAP_SIGTERM=SIGQUIT) running jobs get `worker_soft_shutdown_timeout` to finish; then they
  and everything else the worker holds (prefetched jobs, ETA retries it is only waiting on)
  go back to the queue.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from celery import Celery, bootsteps
from celery.schedules import crontab
from celery.signals import setup_logging, worker_init, worker_process_shutdown
from celery.worker.consumer import Consumer
from kombu.exceptions import ContentDisallowed
from prometheus_client import multiprocess

from memory_core.io.queues import (
    FINALIZE_QUEUE,
    FINALIZE_TASK,
    FOLD_QUEUE,
    FOLD_TASK,
    FORGET_OWNER_TASK,
    PURGE_TRACES_TASK,
    RETENTION_TASK,
    SWEEP_FOLDS_TASK,
    dead_letter_queue,
    is_amqp,
    task_queues,
)
from memory_core.logs import get_logger
from memory_core.metrics import serve_worker_metrics
from memory_core.settings import SettingsError, get_settings
from memory_core.tokens import encoding

from .broker import use_atomic_take
from .logging import configure_logging
from .requests import refuse_message
from .shutdown import DeferShutdownSignals


def finalize_limits() -> tuple[int, int]:
    """Soft/hard time limits of a finalize (MEMORY_FINALIZE_SOFT_LIMIT_S, 30 s; hard twice
    that): a finalize is milliseconds of work, so only a stuck Postgres call gets near them."""
    soft = get_settings().memory_finalize_soft_limit_s
    return soft, 2 * soft


def fold_limits() -> tuple[int, int]:
    """Soft/hard time limits of a fold: room for one LLM call (timeout) and the writes."""
    soft = int(get_settings().memory_llm_timeout_s) + 60
    return soft, soft + 30


def visibility_timeout_s() -> int:
    s = get_settings()
    if s.memory_visibility_timeout_s is not None:
        return s.memory_visibility_timeout_s
    return s.memory_fold_backoff_cap_s + fold_limits()[1] + 300


class MemoryConsumer(Consumer):
    """Celery's consumer, surviving the loss of a Redis broker while it holds unacked jobs.

    On a broken connection Celery 5.7 first `collect()`s it (which drops the transport's
    client) and then `close()`s it; closing the Redis channel tries to hand back the jobs it
    holds (acks_late: every running or prefetched one) through that dropped client and raises
    AttributeError, which Celery treats as unrecoverable: any Redis restart killed every busy
    worker. The jobs cannot be handed back while Redis is down anyway: workers/broker.py
    remembers them and hands them back once the worker has reconnected.
    Found by tests/reliability/test_outages.py.

    A message no task will run (unknown task, not a task message, another serializer, an
    undecodable or malformed body) is acked with an event and a metric, never rejected into
    `memory.dead` nor logged with its body (`refuse_message`, workers/requests.py).
    """

    def on_unknown_message(self, body: Any, message: Any) -> None:
        refuse_message(self, message, "not_a_task")

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        refuse_message(self, message, "unknown_task")

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        reason = "serializer" if isinstance(exc, ContentDisallowed) else "invalid_message"
        refuse_message(self, message, reason)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        refuse_message(self, message, "undecodable")

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        handle = super().create_task_handler(*args, **kwargs)
        connection_errors = tuple(self.connection_errors)

        def on_task_received(message: Any) -> Any:
            try:
                return handle(message)
            except connection_errors:
                raise
            except Exception:  # a message Celery cannot even read (e.g. no id): refused
                if message.acknowledged:
                    raise
                refuse_message(self, message, "invalid_message")
                return None

        return on_task_received

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            close = connection.close

            def close_broken_connection() -> None:
                try:
                    close()
                except AttributeError as error:
                    get_logger(__name__).warning("memory.broker_close_failed", error=repr(error))

            connection.close = close_broken_connection
        super().on_connection_error_after_connected(exc)


class DeclareTopology(bootsteps.StartStopStep):
    """At every (re)connection, the broker-side setup Celery's own declares leave out.

    RabbitMQ: the dead-letter exchange and queue. The task queues name `memory.dead` as their
    dead-letter exchange, and RabbitMQ silently drops what it would dead-letter into an
    exchange that does not exist.
    Redis: drop the binding of `memory.fold` to `memory.finalize`'s exchange and key that
    workers before 0.2 declared (each queue has its own exchange now); kombu keeps bindings
    in Redis across restarts, and that one copied every finalize job into the fold queue.
    """

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Consumer) -> None:
        if c.connection is None:
            return
        channel = c.connection.default_channel
        if is_amqp(c.app.conf.broker_url or ""):
            dead_letter_queue()(channel).declare()
            return
        sep = "\x06\x16"
        stale = sep.join([FINALIZE_QUEUE, "", FOLD_QUEUE])
        for prefix in ("_kombu.binding.", "_kombu.binding_permanent."):
            channel.client.srem(prefix + FINALIZE_QUEUE, stale)


def transport_options(broker_url: str) -> dict[str, Any]:
    """The broker's transport options: confirms on RabbitMQ; timeouts and sweeps on Redis."""
    if is_amqp(broker_url):
        # Retries a worker publishes (and their countdowns, in the broker's delay queues) are
        # confirmed: a retry that returned is on the broker's disk before the job is acked.
        return {"confirm_publish": True}
    s = get_settings()
    return {
        "visibility_timeout": visibility_timeout_s(),
        # Sweep for expired unacked messages every N s (kombu's default is ~100 s: 10 s
        # interval x throttle 10), so a dead host's jobs return soon after the timeout.
        "unacked_restore_interval": s.memory_unacked_restore_interval_s,
        "unacked_restore_throttle": 1,
        # The sweep holds a Redis mutex; if its worker dies holding it (likelier the more
        # often it sweeps), kombu's default 300 s expiry would stall every restore that long.
        "unacked_mutex_expire": max(5, 3 * s.memory_unacked_restore_interval_s),
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
        "health_check_interval": 30,
    }


LIFECYCLE_TASKS = (FORGET_OWNER_TASK, RETENTION_TASK, PURGE_TRACES_TASK, SWEEP_FOLDS_TASK)
# How often beat sends `memory.sweep_folds`; a lost fold waits the republish grace plus this.
FOLD_SWEEP_EVERY_S = 60.0


def make_app() -> Celery:
    s = get_settings()
    transport = transport_options(s.celery_broker_url)
    # Benchmark tasks are not here: only the benchmark's worker loads them (`-I`).
    include = [f"{__package__}.tasks", f"{__package__}.lifecycle_tasks"]
    app = Celery("agent_memory", broker=s.celery_broker_url, include=include)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_queues=task_queues(s.celery_broker_url),
        task_default_queue=FINALIZE_QUEUE,
        task_routes={
            FINALIZE_TASK: {"queue": FINALIZE_QUEUE},
            **{t: {"queue": FOLD_QUEUE} for t in (FOLD_TASK, *LIFECYCLE_TASKS)},
        },
        beat_schedule=beat_schedule(s.memory_retention_minute),
        result_expires=None,  # no results are kept: no daily celery.backend_cleanup either
        broker_transport_options=transport,
        result_backend_transport_options=dict(transport),
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        worker_consumer=f"{__name__}:MemoryConsumer",
        worker_soft_shutdown_timeout=s.memory_worker_soft_shutdown_s,
        worker_enable_soft_shutdown_on_idle=True,
        worker_hijack_root_logger=False,
        worker_send_task_events=True,  # Flower's task view
        task_send_sent_event=True,
    )
    app.steps["consumer"].add(DeclareTopology)
    app.steps["consumer"].add(DeferShutdownSignals)  # SIGTERM never deadlocks the shutdown
    return app


def beat_schedule(retention_minute: int) -> dict[str, dict[str, Any]]:
    """The beat schedule of `celery -A workers.app beat` (one per deployment): retention hourly
    (a no-op unless MEMORY_RETENTION_DAYS is set), Langfuse trace purges of deleted threads
    every 5 min, the fold sweep.

    Retention at a fixed minute (MEMORY_RETENTION_MINUTE, 17): beat's schedule file is lost
    when its pod is replaced, and an interval would restart its hour each time. A run not taken
    before the next one is sent expires (no pile-up while the fold workers are down or backed
    up)."""
    return {
        "memory-retention": {
            "task": RETENTION_TASK,
            "schedule": crontab(minute=retention_minute),
            "options": {"expires": 3600},
        },
        "memory-trace-purges": {
            "task": PURGE_TRACES_TASK,
            "schedule": 300.0,
            "options": {"expires": 300},
        },
        "memory-fold-sweep": {
            "task": SWEEP_FOLDS_TASK,
            "schedule": FOLD_SWEEP_EVERY_S,
            "options": {"expires": FOLD_SWEEP_EVERY_S},
        },
    }


@worker_init.connect
def _warm_up(**_: Any) -> None:
    # Load the BPE ranks once in the parent, before the pool forks: otherwise every child
    # pays ~0.5 s on its first fold or view. The same for Langfuse's SDK, which only a
    # configured Langfuse loads (memory_core/fold/prompts.py).
    encoding()
    if get_settings().langfuse_configured:
        import langfuse  # noqa: F401, PLC0415
        import opentelemetry.sdk.trace  # noqa: F401, PLC0415


@worker_init.connect
def _serve_metrics(**_: Any) -> None:
    port = os.environ.get("MEMORY_METRICS_PORT")
    if port:
        s = get_settings()
        serve_worker_metrics(int(port), s.database_url, s.memory_compression_threshold)


@worker_process_shutdown.connect
def _metrics_child_exit(pid: int | None = None, **_: Any) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(pid or os.getpid())


@setup_logging.connect
def _json_logs(loglevel: Any = None, **_: Any) -> None:
    # Connected: Celery leaves logging to us, and only in a worker (or `celery` command),
    # never in a process that merely imports this module.
    configure_logging(loglevel)


def _settings_or_exit() -> None:
    """A worker with settings that cannot work must not take a single job: one line, exit 2."""
    try:
        get_settings()
    except SettingsError as exc:
        sys.stderr.write(f"error: {exc}\n")
        raise SystemExit(2) from None


_settings_or_exit()
use_atomic_take()
app = make_app()
