"""`agent-memory bench ...`: each benchmark prints its figures beside the raw limit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memory_core.cli.errors import fail, one_line_errors, stops_what_it_started
from memory_core.settings import get_settings

bench_app = typer.Typer(
    help="Benchmarks that print figures beside their raw limits.", no_args_is_help=True
)


DEFAULT_PLOTS_DIR = Path("docs/bench")


@bench_app.command("core")
@one_line_errors
def bench_core_cmd(
    iterations: Annotated[int, typer.Option(min=1)] = 2000,
    plots: Annotated[
        str | None,
        typer.Option(
            "--plots",
            metavar="DIR",
            help="Write PNG plots of each figure's latency distribution beside its raw limit "
            "(core-<figure>.png, core-overview.png) to DIR, created if missing. Default: "
            "docs/bench if that folder exists in the current directory, else no plots. "
            "Needs matplotlib: pip install 'agent-memory\\[bench]'.",
        ),
    ] = None,
    no_plots: Annotated[
        bool, typer.Option("--no-plots", help="Print the table only, write no plots.")
    ] = False,
) -> None:
    """Save, get_context, rehydration and rendering against their raw limits.

    Prints the table; with plots (see --plots) also writes one PNG per figure.
    """
    from memory_core.bench.core import bench_core

    if no_plots and plots:
        fail("--plots and --no-plots exclude each other")
    if no_plots or plots == "":
        plots_dir = None
    elif plots is not None:
        plots_dir = Path(plots)
    else:
        plots_dir = DEFAULT_PLOTS_DIR if DEFAULT_PLOTS_DIR.is_dir() else None
    s = get_settings()
    try:
        bench_core(
            database_url=s.database_url,
            redis_url=s.redis_url,
            iterations=iterations,
            plots_dir=plots_dir,
        )
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))


@bench_app.command("access")
@one_line_errors
def bench_access_cmd(reps: Annotated[int, typer.Option(min=1)] = 300) -> None:
    """A stranger's refusal vs an unknown thread's, for a small and a large copy."""
    from memory_core.bench.guest import bench_access

    bench_access(settings=get_settings(), reps=reps)


@bench_app.command("rss")
@one_line_errors
def bench_rss_cmd(turns: Annotated[int, typer.Option(min=1)] = 1000) -> None:
    """A fold-worker-like process's RSS after 100 and after N distinct turns."""
    from memory_core.bench.guest import bench_rss

    bench_rss(settings=get_settings(), turns=turns)


@bench_app.command("workers")
@stops_what_it_started
@one_line_errors
def bench_workers_cmd(
    broker_url: Annotated[
        list[str] | None,
        typer.Option(
            help="A broker for the bench worker alone: a Redis database (redis://) or RabbitMQ "
            "(amqp://; on the local node the bench uses a throwaway vhost). Repeatable: the "
            "brokers then run in turn and print side by side."
        ),
    ] = None,
    brokers: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated broker names, e.g. redis,rabbitmq: redis is database 2 of "
            "REDIS_URL's server, rabbitmq a throwaway vhost on CELERY_BROKER_URL's node if "
            "it is amqp://, else on the local node (amqp://guest:guest@127.0.0.1:5672/)."
        ),
    ] = None,
    jobs: Annotated[int, typer.Option(min=1)] = 2000,
    repeat: Annotated[
        int,
        typer.Option(min=1, help="Runs per broker, alternating brokers; prints each and medians."),
    ] = 1,
) -> None:
    """Finalize jobs/s vs a no-op task, LLM calls per 100 turns, fold prompt size."""
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from memory_core.bench.workers import bench_workers, bench_workers_brokers

    s = get_settings()
    specs = [b.strip() for b in (brokers or "").split(",") if b.strip()] + list(broker_url or [])
    if not specs:
        fail("name a broker: --broker-url URL (repeatable) or --brokers redis,rabbitmq")
    try:
        if len(specs) == 1 and repeat == 1 and "://" in specs[0]:
            bench_workers(
                database_url=s.database_url,
                redis_url=s.redis_url,
                broker_url=specs[0],
                jobs=jobs,
            )
        else:
            bench_workers_brokers(
                database_url=s.database_url,
                redis_url=s.redis_url,
                brokers=specs,
                celery_broker_url=s.celery_broker_url,
                jobs=jobs,
                repeat=repeat,
            )
    except BrokerUnreachable as exc:
        fail(f"cannot reach the broker: {exc}")
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))


@bench_app.command("sizing")
@stops_what_it_started
@one_line_errors
def bench_sizing_cmd(
    *,
    broker_url: Annotated[
        str,
        typer.Option(
            help="A broker for the bench workers alone: a Redis database nothing else uses "
            "(redis://; the fold points need Redis) or RabbitMQ (amqp://)."
        ),
    ],
    jobs: Annotated[
        int, typer.Option(min=1, help="Finalize (and no-op) jobs per finalize point.")
    ] = 800,
    folds: Annotated[int, typer.Option(min=1, help="Fold jobs per fold point.")] = 48,
    llm_latency: Annotated[
        float, typer.Option(min=0, help="Seconds the bench's fake LLM holds each fold request.")
    ] = 0.5,
    repeat: Annotated[
        int,
        typer.Option(min=1, help="Passes over the points (order reversed every other); medians."),
    ] = 1,
    finalize: Annotated[
        str,
        typer.Option(
            help="Finalize worker shapes: pool:c1,c2;pool:c@prefetch (pools prefork, threads, "
            "gevent, solo); empty: none."
        ),
    ] = "prefork:1,2,4,8;threads:4,8,16;gevent:8,32;prefork:4@4",
    fold: Annotated[
        str, typer.Option(help="Fold worker shapes, as --finalize; empty: none.")
    ] = "prefork:2,4;threads:8,32;gevent:32",
    plot: Annotated[
        str, typer.Option(help="The PNG to draw (needs the `bench` extra); empty: none.")
    ] = "docs/bench/sizing-throughput.png",
) -> None:
    """Finalize and fold jobs/s per worker pool (prefork, threads, gevent) and concurrency."""
    from pathlib import Path

    from kombu.exceptions import OperationalError as BrokerUnreachable

    from memory_core.bench.sizing import bench_sizing

    s = get_settings()
    try:
        bench_sizing(
            database_url=s.database_url,
            redis_url=s.redis_url,
            broker_url=broker_url,
            jobs=jobs,
            folds=folds,
            llm_latency_s=llm_latency,
            repeat=repeat,
            finalize=finalize,
            fold=fold,
            plot=Path(plot) if plot else None,
        )
    except BrokerUnreachable as exc:
        fail(f"cannot reach the broker: {exc}")
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))


@bench_app.command("forget")
@stops_what_it_started
@one_line_errors
def bench_forget_cmd(
    threads: Annotated[int, typer.Option(min=1)] = 1000,
    turns: Annotated[int, typer.Option(min=1)] = 30,
    batch_size: Annotated[
        int | None, typer.Option(min=1, max=1000, help="Default MEMORY_PURGE_BATCH_SIZE.")
    ] = None,
) -> None:
    """forget_owner over THREADS x TURNS vs the same deletes by hand; what remained after."""
    from memory_core.bench.forget import bench_forget

    bench_forget(settings=get_settings(), threads=threads, turns=turns, batch_size=batch_size)


@bench_app.command("redis-cluster")
@stops_what_it_started
@one_line_errors
def bench_redis_cluster_cmd(
    threads: Annotated[int, typer.Option(min=1)] = 50,
    turns: Annotated[int, typer.Option(min=1)] = 10,
    reads: Annotated[int, typer.Option(min=1)] = 10,
    data_dir: Path = Path(".agent-memory/dev-services"),
) -> None:
    """Saves and reads on REDIS_URL vs a private Redis Cluster, in one run."""
    from memory_core.bench.redis_cluster_bench import bench_redis_cluster

    try:
        bench_redis_cluster(
            settings=get_settings(),
            data_dir=data_dir.resolve(),
            threads=threads,
            turns=turns,
            reads=reads,
        )
    except RuntimeError as exc:  # a save that failed: the message names why
        fail(str(exc))


@bench_app.command("broker")
@stops_what_it_started
@one_line_errors
def bench_broker_cmd(
    broker_url: Annotated[str, typer.Option(help="A Redis broker (database) to bench on.")],
    messages: Annotated[int, typer.Option(min=1)] = 5000,
) -> None:
    """The workers' atomic take (workers/broker.py) vs kombu's BRPOP, consume + ack."""
    from memory_core.bench.broker import bench_broker

    bench_broker(broker_url, messages)


@bench_app.command("publish")
@stops_what_it_started
@one_line_errors
def bench_publish_cmd(
    broker_url: Annotated[
        list[str],
        typer.Option(help="A broker nothing consumes from (redis:// or amqp://); repeatable."),
    ],
    publishes: Annotated[int, typer.Option(min=1)] = 300,
) -> None:
    """A publish on a kept broker connection vs a new one each vs kombu's raw publish."""
    from memory_core.bench.publish import BrokerInUse, bench_publish

    try:
        bench_publish(broker_url, publishes)
    except BrokerInUse as exc:
        fail(str(exc))


@bench_app.command("async")
@stops_what_it_started
@one_line_errors
def bench_async_cmd(
    *,
    iterations: Annotated[int, typer.Option(help="Calls per side, one at a time.")] = 2000,
    agents: Annotated[int, typer.Option(help="Concurrent agents, a thread each.")] = 200,
    pool: Annotated[
        int, typer.Option(help="The smaller sync thread pool (the other: one per agent).")
    ] = 32,
    rounds: Annotated[int, typer.Option(help="Turns each agent reads and saves.")] = 5,
    samples: Annotated[int, typer.Option(help="Read-your-writes samples per row.")] = 20,
    backlog: Annotated[int, typer.Option(help="Finalize jobs queued ahead of a probe.")] = 50,
    broker_url: Annotated[
        str | None,
        typer.Option(
            help="A broker for the read-your-writes worker alone (default: database 2 of "
            "REDIS_URL's server)."
        ),
    ] = None,
) -> None:
    """The async API beside the sync one (one call, 200 agents), its peers, read-your-writes."""
    from kombu.exceptions import OperationalError as BrokerUnreachable

    from memory_core.bench.aio import bench_async
    from memory_core.bench.broker_adapters import resolve_broker

    s = get_settings()
    url = broker_url or resolve_broker("redis", redis_url=s.redis_url)
    try:
        bench_async(
            database_url=s.database_url,
            redis_url=s.redis_url,
            broker_url=url,
            broker_flag=broker_url,
            iterations=iterations,
            agents=agents,
            pool=pool,
            rounds=rounds,
            samples=samples,
            backlog=backlog,
        )
    except BrokerUnreachable as exc:
        fail(f"cannot reach the broker: {exc}")
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))


@bench_app.command("profile")
@stops_what_it_started
@one_line_errors
def bench_profile_cmd(
    calls: Annotated[int, typer.Option(help="Profiled calls of each: saves, first reads.")] = 2000,
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", help="Where the call trees go (profile-save.txt, profile-read.txt)."),
    ] = None,
) -> None:
    """Where the sync save's and the first read's time goes (pyinstrument), by self time."""
    from memory_core.bench.profile import bench_profile

    s = get_settings()
    try:
        bench_profile(
            database_url=s.database_url, redis_url=s.redis_url, calls=calls, out_dir=out_dir
        )
    except (RuntimeError, ValueError) as exc:
        fail(str(exc))
