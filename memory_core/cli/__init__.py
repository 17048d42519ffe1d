"""`agent-memory`: migrate, run workers and Flower, inspect threads, context and events, bench."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from collections.abc import Callable
from functools import wraps
from typing import Annotated, Any, TypeVar

import typer

from memory_core.fold_publisher import WORKER_APP
from memory_core.settings import get_settings

app = typer.Typer(
    help="Agent conversation memory: Postgres canon, Redis working copy, Celery folding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
events_app = typer.Typer(help="Read the memory:events stream.", no_args_is_help=True)
bench_app = typer.Typer(
    help="Benchmarks that print figures beside their raw limits.", no_args_is_help=True
)
app.add_typer(events_app, name="events")
app.add_typer(bench_app, name="bench")

F = TypeVar("F", bound=Callable[..., Any])
QUEUES = "memory.finalize,memory.fold"


def fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def one_line_errors(fn: F) -> F:
    """Infrastructure errors become one clear line on stderr instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import psycopg2
        import redis
        from sqlalchemy.exc import OperationalError

        from memory_core.conversation_memory import ThreadNotFound

        try:
            return fn(*args, **kwargs)
        except ThreadNotFound as exc:
            fail(str(exc))
        except OperationalError as exc:
            fail(
                f"cannot reach Postgres at {_safe_url(get_settings().database_url)}: "
                f"{str(exc.orig).strip().splitlines()[0]}"
            )
        except psycopg2.OperationalError as exc:  # the benches talk to Postgres directly
            fail(
                f"cannot reach Postgres at {_safe_url(get_settings().database_url)}: "
                f"{str(exc).strip().splitlines()[0]}"
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            fail(f"cannot reach Redis at {_safe_url(get_settings().redis_url)}: {exc}")
        except redis.RedisError as exc:
            fail(f"Redis error: {exc}")

    return wrapper  # type: ignore[return-value]


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.rsplit("@", maxsplit=1)[-1]


@app.command()
@one_line_errors
def migrate(revision: str = "head") -> None:
    """Upgrade the database schema (Alembic) to REVISION."""
    from memory_core.langgraph import CHECKPOINT_SCHEMA, langgraph_available, setup_checkpointer
    from memory_core.migrate import upgrade

    upgrade(get_settings().database_url, revision)
    typer.echo(f"database at {_safe_url(get_settings().database_url)} is at {revision}")
    if langgraph_available():  # the `langgraph` extra: its checkpointer has tables of its own
        setup_checkpointer(get_settings().database_url)
        typer.echo(f"LangGraph checkpointer tables ready in schema {CHECKPOINT_SCHEMA}")


@app.command()
def worker(
    queues: Annotated[str, typer.Option(help="Comma-separated queues to serve.")] = QUEUES,
    concurrency: Annotated[int, typer.Option("--concurrency", "-c")] = 2,
    loglevel: Annotated[str, typer.Option("--loglevel", "-l")] = "INFO",
    hostname: Annotated[str | None, typer.Option("--hostname", "-n")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve memory metrics (Prometheus) on this port.")
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


@app.command()
def flower(
    port: int = 5555,
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
    celery_app.start(["flower", f"--port={port}", f"--address={address}", f"--basic-auth={auth}"])


@app.command()
@one_line_errors
def context(
    thread_id: str,
    owner: Annotated[
        str, typer.Option(help="The thread's owner (required: memory is owner-only).")
    ],
    focus: Annotated[str, typer.Option(help="brief | sql | visualizations")] = "brief",
    max_tokens: int = 2000,
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw context.")] = False,
) -> None:
    """Print a thread's memory as the node view FOCUS would see it."""
    from memory_core.conversation_memory import RedisConversationMemory
    from memory_core.views import FOCUSES, render_conversation_context

    if focus not in FOCUSES:
        fail(f"--focus must be one of {', '.join(FOCUSES)}")
    ctx = RedisConversationMemory().get_context(thread_id, owner)
    if json_output:
        typer.echo(ctx.model_dump_json(indent=2))
        return
    typer.echo(render_conversation_context(ctx, focus, max_tokens), nl=False)  # type: ignore[arg-type]


@app.command()
@one_line_errors
def threads(
    owner: Annotated[str, typer.Option(help="Whose history to list.")],
    limit: int = 20,
    archived: Annotated[bool, typer.Option(help="Include archived threads.")] = False,
) -> None:
    """List a user's threads, most recently active first (the history UI's list)."""
    from memory_core.db import session_scope
    from memory_core.models import ConversationThread

    with session_scope() as session:
        rows = ConversationThread.history(session, owner, limit=limit, include_archived=archived)
        for t in rows:
            flag = " [archived]" if t.is_archived else ""
            typer.echo(
                f"{t.id}  {t.updated_at:%Y-%m-%d %H:%M}  {t.agent_type:<7}  "
                f"{t.last_seq:>4} turns  {t.title[:60]}{flag}"
            )
    if not rows:
        typer.echo(f"no threads for {owner}", err=True)


@events_app.command("tail")
@one_line_errors
def events_tail(  # options only: typer passes them by name
    *,
    group: Annotated[str | None, typer.Option(help="Consumer group (acks what it reads).")] = None,
    consumer: Annotated[str | None, typer.Option(help="Consumer name within the group.")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f")] = False,
    count: int = 20,
    from_start: bool = False,
    routine: Annotated[
        bool, typer.Option(help="The routine stream (memory_summarized) instead.")
    ] = False,
) -> None:
    """Print memory events (memory_summarization_failed, memory_finalize_rejected, ...)."""
    from memory_core.events import format_event, routine_stream, tail_events
    from memory_core.redis_client import get_redis

    s = get_settings()
    stream = routine_stream(s.memory_events_stream) if routine else s.memory_events_stream
    for event in tail_events(
        get_redis(s.redis_url),
        stream=stream,
        group=group,
        consumer=consumer,
        follow=follow,
        count=count,
        block_ms=5000,
        from_start=from_start,
    ):
        typer.echo(format_event(event))


@bench_app.command("core")
@one_line_errors
def bench_core_cmd(iterations: int = 2000) -> None:
    """Save, get_context, rehydration and rendering against their raw limits."""
    from memory_core.bench.core import bench_core

    s = get_settings()
    bench_core(database_url=s.database_url, redis_url=s.redis_url, iterations=iterations)


@bench_app.command("access")
@one_line_errors
def bench_access_cmd(reps: int = 300) -> None:
    """A stranger's refusal vs an unknown thread's, for a small and a large copy."""
    from memory_core.bench.guest import bench_access

    bench_access(settings=get_settings(), reps=reps)


@bench_app.command("rss")
@one_line_errors
def bench_rss_cmd(turns: int = 1000) -> None:
    """A fold-worker-like process's RSS after 100 and after N distinct turns."""
    from memory_core.bench.guest import bench_rss

    bench_rss(settings=get_settings(), turns=turns)


@bench_app.command("workers")
@one_line_errors
def bench_workers_cmd(
    broker_url: Annotated[
        str, typer.Option(help="A Redis broker (database) for the bench worker alone.")
    ],
    jobs: int = 2000,
) -> None:
    """Finalize jobs/s vs a no-op task, LLM calls per 100 turns, fold prompt size."""
    from memory_core.bench.workers import bench_workers

    s = get_settings()
    try:
        bench_workers(
            database_url=s.database_url,
            redis_url=s.redis_url,
            broker_url=broker_url,
            jobs=jobs,
        )
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))


@bench_app.command("broker")
@one_line_errors
def bench_broker_cmd(
    broker_url: Annotated[str, typer.Option(help="A Redis broker (database) to bench on.")],
    messages: int = 5000,
) -> None:
    """The workers' atomic take (workers/broker.py) vs kombu's BRPOP, consume + ack."""
    from memory_core.bench.broker import bench_broker

    bench_broker(broker_url, messages)


@app.command()
def demo() -> None:
    """Play a scripted analytics conversation through a real worker (see README)."""
    from memory_core.cli.demo import run_demo

    sys.exit(run_demo())


def main() -> None:
    # The library is silent unless its host configures logging; the command line is a host:
    # warnings and errors as JSON lines on stderr (MEMORY_LOG_LEVEL), never on stdout.
    # `worker` and `flower` replace this process and configure their own.
    from memory_core.logs import configure_logging
    from memory_core.settings import SettingsError

    configure_logging(os.environ.get("MEMORY_LOG_LEVEL", "WARNING").upper())
    if "--help" not in sys.argv:
        try:
            get_settings()  # settings that cannot work: one line, before anything is done
        except SettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise SystemExit(1) from None
    app()


if __name__ == "__main__":
    main()
