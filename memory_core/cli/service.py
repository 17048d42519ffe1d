"""The commands that run the system: `migrate`, `worker`, `flower`."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
from typing import Annotated

import typer

from memory_core.cli.errors import fail, one_line_errors, safe_url
from memory_core.fold.publisher import WORKER_APP
from memory_core.settings import get_settings

FLOWER_EXIT_BOUND_S = 10.0

QUEUES = "memory.finalize,memory.fold"


@one_line_errors
def migrate(revision: str = "head") -> None:
    """Upgrade the database schema (Alembic) to REVISION."""
    from memory_core.langgraph import CHECKPOINT_SCHEMA, langgraph_available, setup_checkpointer
    from memory_core.migrate import migration_lock, upgrade

    url = get_settings().database_url
    with migration_lock(url):  # other migrators (a Job, an init container) wait, then no-op
        upgrade(url, revision)
        typer.echo(f"database at {safe_url(url)} is at {revision}")
        if langgraph_available():  # the `langgraph` extra: its checkpointer has its own tables
            setup_checkpointer(url)
            typer.echo(f"LangGraph checkpointer tables ready in schema {CHECKPOINT_SCHEMA}")


def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues to serve.")] = QUEUES,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1)] = 2,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=1, max=65_535, help="Serve memory metrics (Prometheus) on this port."),
    ] = None,
) -> None:
    """Start a Celery worker on the memory queues (prefetch 1 when it serves memory.fold)."""
    wanted = [q.strip() for q in queues.split(",") if q.strip()]
    unknown = set(wanted) - set(QUEUES.split(","))
    if not wanted or unknown:
        fail(f"--queues must be among {QUEUES}, got {queues!r}")
    # Folds are long LLM calls: never let one worker hoard them. Finalize jobs are short.
    prefetch = 1 if "memory.fold" in wanted else 4
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        WORKER_APP,
        "worker",
        "-Q",
        ",".join(wanted),
        "-c",
        str(concurrency),
        "-l",
        loglevel,
        "--prefetch-multiplier",
        str(prefetch),
        "-E",
    ]
    if hostname:
        argv += ["-n", hostname]
    env = dict(os.environ)
    # Celery starts its time-boxed soft shutdown (MEMORY_WORKER_SOFT_SHUTDOWN_S) only on a cold
    # shutdown: map SIGTERM (what orchestrators send) to it, so running jobs get that long to
    # finish and everything else the worker holds goes back to the queue.
    env.setdefault("REMAP_SIGTERM", "SIGQUIT")
    if metrics_port is not None:
        # prometheus_client's multiprocess mode must be on before it is first imported:
        # hence a fresh process (exec) with the directory set. The worker app serves the port.
        env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="agent-memory-metrics-")
        env["MEMORY_METRICS_PORT"] = str(metrics_port)
    os.execvpe(sys.executable, argv, env)  # noqa: S606 - replaces this process on purpose


def flower(
    port: Annotated[int, typer.Option(min=1, max=65_535)] = 5555,
    address: str = "127.0.0.1",
    basic_auth: Annotated[
        str | None, typer.Option(help="user:password (FLOWER_BASIC_AUTH)")
    ] = None,
) -> None:
    """Start Flower (basic auth on; Prometheus metrics at /metrics)."""
    celery_app = importlib.import_module(WORKER_APP).app

    auth = basic_auth or get_settings().flower_basic_auth
    if not auth or ":" not in auth:
        fail("Flower needs basic auth: set FLOWER_BASIC_AUTH=user:password")
    try:
        celery_app.start(
            ["flower", f"--port={port}", f"--address={address}", f"--basic-auth={auth}"]
        )
    finally:
        # Stopped (a signal, or its loop ended): at interpreter exit Python joins the threads
        # of Flower's executor, and one still waiting in an inspect call on the broker held a
        # SIGINT'd Flower for over 90 s in CI. Flower keeps nothing (docs/OPERATIONS.md), so
        # the exit is bounded instead.
        _exit_within(FLOWER_EXIT_BOUND_S)


def _exit_within(seconds: float) -> None:
    timer = threading.Timer(seconds, os._exit, args=(0,))
    timer.daemon = True  # runs while the interpreter joins the others
    timer.start()
