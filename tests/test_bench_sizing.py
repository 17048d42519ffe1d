"""`agent-memory bench sizing` and the bench worker's shape options (pool, concurrency,
prefetch, queues).

The option plumbing is checked on the command line the bench worker would run, without
starting it. One real sweep at tiny scale (a threads-pool worker on `memory.finalize`, then
one on `memory.fold`) checks what the bench checks of every run: every job it enqueued ran,
nothing is left on the broker, everything it created is gone. No timing assertion: the figures
depend on the machine (docs/OPERATIONS.md, "Worker sizing", holds a real sweep).
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from importlib.machinery import ModuleSpec
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from memory_core.bench import sizing
from memory_core.bench.bench_worker import bench_worker, check_worker_options
from memory_core.bench.sizing import Point, bench_sizing, command_line, parse_points
from memory_core.bench.workers_bench import WorkersBench
from memory_core.cli.bench import bench_sizing_cmd
from memory_core.fold.publisher import WORKER_APP
from memory_core.io.db import get_engine
from memory_core.settings import get_settings
from tests.support.commands import run_module

UNREACHABLE_DB = "postgresql://nobody@127.0.0.1:1/none"


def test_the_default_bench_worker_is_unchanged(tmp_path: Path) -> None:
    """`bench workers` and its published figures ran this exact command."""
    worker = bench_worker(tmp_path, name="w", env={})
    assert worker.command == (
        f"celery -A {WORKER_APP} worker -Q memory.finalize,memory.fold -c 2 --pool prefork "
        "-l INFO --without-gossip --without-mingle --prefetch-multiplier 1 "
        "-I memory_core.bench.tasks"
    )


def test_a_threads_worker_with_prefetch_4_on_the_finalize_queue(tmp_path: Path) -> None:
    worker = bench_worker(
        tmp_path,
        name="w",
        env={},
        pool="threads",
        concurrency=8,
        prefetch=4,
        queues="memory.finalize",
    )
    for args in (worker.options, worker.argv):
        assert args.count("--prefetch-multiplier") == 1  # replaced, not given twice
        joined = " ".join(args)
        assert "worker -Q memory.finalize -c 8 --pool threads " in joined
        assert "--prefetch-multiplier 4" in joined
        assert "-I memory_core.bench.tasks" in joined
    assert worker.argv[-2:] == ["-n", worker.hostname]


@pytest.mark.parametrize(
    ("pool", "concurrency", "prefetch", "queues", "error"),
    [
        ("eventlet", 2, 1, "memory.finalize", "unknown pool 'eventlet': one of prefork, threads"),
        ("threads", 0, 1, "memory.finalize", "concurrency must be at least 1"),
        ("solo", 2, 1, "memory.finalize", "the solo pool runs one job at a time"),
        ("prefork", 2, 0, "memory.finalize", "prefetch multiplier must be at least 1"),
        ("prefork", 2, 1, "memory.dead", "queues must be among memory.finalize,memory.fold"),
    ],
)
def test_a_worker_shape_celery_would_not_run_is_refused(
    pool: str, concurrency: int, prefetch: int, queues: str, error: str
) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        check_worker_options(pool, concurrency, prefetch, queues)
    # Before anything is opened: no Postgres (unreachable here), broker or worker.
    with pytest.raises(ValueError, match="^" + re.escape(error)):
        WorkersBench(
            UNREACHABLE_DB,
            "redis://127.0.0.1:1/0",
            "redis://127.0.0.1:1/1",
            40,
            pool=pool,
            concurrency=concurrency,
            prefetch=prefetch,
            queues=queues,
        )


def test_a_finalize_only_worker_takes_no_more_jobs_than_fold_free_turns() -> None:
    with pytest.raises(ValueError, match="at most 2000 jobs"):
        WorkersBench(UNREACHABLE_DB, "", "", 2001, queues="memory.finalize")


def _hide(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    real = importlib.util.find_spec

    def find_spec(module: str, package: str | None = None) -> ModuleSpec | None:
        return None if module == name else real(module, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_gevent_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _hide(monkeypatch, "gevent")
    with pytest.raises(RuntimeError, match=r"pip install 'agent-memory\[bench\]'"):
        check_worker_options("gevent", 8, 1, "memory.finalize")


def test_matplotlib_missing_names_the_extra_before_measuring(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _hide(monkeypatch, "matplotlib")
    with pytest.raises(RuntimeError, match=r"pip install 'agent-memory\[bench\]'"):
        bench_sizing(
            database_url=UNREACHABLE_DB,
            redis_url="redis://127.0.0.1:1/0",
            broker_url="redis://127.0.0.1:1/1",
            plot=tmp_path / "p.png",
        )


def test_sizing_points() -> None:
    assert parse_points("prefork:1,2;threads:8@4; gevent:32 ;") == [
        Point("prefork", 1),
        Point("prefork", 2),
        Point("threads", 8, 4),
        Point("gevent", 32),
    ]
    assert parse_points("") == []
    for bad in ("prefork", "prefork:", "threads:x", "threads:4@y", "threads:4;threads:4"):
        with pytest.raises(ValueError, match="sizing point"):
            parse_points(bad)
    # The default sweep, as documented: every point a shape Celery runs.
    for p in parse_points(sizing.DEFAULT_FINALIZE) + parse_points(sizing.DEFAULT_FOLD):
        assert p.pool in ("prefork", "threads", "gevent")


def test_the_command_line_defaults_are_the_sweep_defaults() -> None:
    params = inspect.signature(bench_sizing_cmd).parameters
    assert params["jobs"].default == sizing.DEFAULT_JOBS
    assert params["folds"].default == sizing.DEFAULT_FOLDS
    assert params["llm_latency"].default == sizing.DEFAULT_LATENCY_S
    assert params["finalize"].default == sizing.DEFAULT_FINALIZE
    assert params["fold"].default == sizing.DEFAULT_FOLD
    assert Path(params["plot"].default) == sizing.DEFAULT_PLOT
    url = "redis://user:secret@127.0.0.1:6379/7"

    def line(fold: str, plot: Path | None) -> str:
        return command_line(
            url,
            jobs=sizing.DEFAULT_JOBS,
            folds=sizing.DEFAULT_FOLDS,
            llm_latency_s=sizing.DEFAULT_LATENCY_S,
            repeat=1,
            finalize=sizing.DEFAULT_FINALIZE,
            fold=fold,
            plot=plot,
        )

    assert line(sizing.DEFAULT_FOLD, sizing.DEFAULT_PLOT) == (
        f"{sizing.COMMAND} --broker-url redis://127.0.0.1:6379/7"  # no credentials
    )
    assert line("", None) == f"{sizing.COMMAND} --broker-url redis://127.0.0.1:6379/7 " + (
        "--fold '' --plot ''"
    )


def test_the_cli_refuses_a_bad_point_in_one_line() -> None:
    args = ["--broker-url", "redis://127.0.0.1:1/0", "--finalize", "eventlet:4", "--plot", ""]
    out = run_module("memory_core.cli", "bench", "sizing", *args)
    assert out.returncode == 1
    assert out.stderr == ("error: unknown pool 'eventlet': one of prefork, threads, gevent, solo\n")


@pytest.mark.workers
def test_a_tiny_sweep_on_threads_workers(tmp_path: Path) -> None:
    settings = get_settings()
    # The bench workers need the broker to themselves: this session's own broker database,
    # which in-process tests may have left fold jobs in (nothing consumes them).
    broker = redis.Redis.from_url(settings.celery_broker_url)
    broker.flushdb()
    lines: list[str] = []
    plot = tmp_path / "sizing.png"
    result = bench_sizing(
        database_url=settings.database_url,
        redis_url=settings.redis_url,
        broker_url=settings.celery_broker_url,
        jobs=8,
        folds=3,
        llm_latency_s=0.05,
        finalize="threads:2",
        fold="threads:2",
        plot=plot,
        out=lines.append,
    )
    [finalize] = result.finalize[Point("threads", 2)]
    assert finalize["jobs.finalized"] == 8  # every finalize job committed its turn, once
    assert finalize["jobs.noop_done"] == 8
    assert finalize["finalize.folds"] == 0  # a worker on memory.finalize alone: no fold due
    assert finalize["broker.left"] == 0
    [fold] = result.fold[Point("threads", 2)]
    assert fold["fold.folded"] == 3  # every thread's summary stored
    assert fold["fold.llm_calls"] == 3  # one LLM call per fold, no retry
    assert fold["broker.left"] == 0
    assert lines[-1] == f"plot: {plot}"
    header = next(i for i, line in enumerate(lines) if line.startswith("$ "))
    assert lines[header].startswith(f"$ {sizing.COMMAND} --broker-url redis://")
    assert "-Q memory.finalize -c 2 --pool threads" in "\n".join(lines)
    assert "-Q memory.fold -c 2 --pool threads" in "\n".join(lines)
    table = [line for line in lines if line.startswith("| threads | 2 |")]
    assert table[0].endswith("| all 8 + 8, 0 left |")
    assert table[1].endswith("| all 3, 0 left |")
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert broker.dbsize() == 0  # the keys the bench created on its broker are deleted
    broker.close()
    with get_engine(settings.database_url).connect() as conn:  # everything it made is gone
        left = conn.scalar(
            text("SELECT count(*) FROM conversation_threads WHERE owner_id LIKE 'benchw-%'")
        )
    assert left == 0


def test_fold_jobs_name_only_the_threads_asked_for_whatever_the_memory_broker_holds() -> None:
    """The fold arithmetic of `bench workers` publishes its folds to kombu's in-process memory
    broker; a sweep run after it in the same process took those stale jobs (a deleted
    thread's) for its own, and its warm-up timed out on folds that found no thread."""
    import base64
    import json
    import uuid

    import celery

    from memory_core.bench.fold_bench import render_fold_jobs
    from memory_core.io.queues import FOLD_QUEUE, FOLD_TASK

    stale = celery.Celery("stale", set_as_current=False)
    with stale.connection_for_write("memory://") as conn:
        producer = stale.amqp.Producer(conn)
        for _ in range(3):
            stale.send_task(
                FOLD_TASK, args=[str(uuid.uuid4())], queue=FOLD_QUEUE, producer=producer
            )
    wanted = [uuid.uuid4() for _ in range(2)]
    jobs = [json.loads(m) for m in render_fold_jobs(wanted)]
    args = [json.loads(base64.b64decode(j["body"]))[0] for j in jobs]
    assert args == [[str(t)] for t in wanted]
    assert all(j["headers"]["task"] == FOLD_TASK for j in jobs)
