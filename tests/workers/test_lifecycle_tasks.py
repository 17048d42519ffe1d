"""The lifecycle tasks through a real worker, and Celery beat as deployed, on both brokers.

memory.forget_owner, memory.apply_retention, memory.purge_traces and memory.sweep_folds ride
the memory.fold queue (workers/app.py task_routes); beat sends the last three on its schedule
(memory.sweep_folds's own test: test_fold_sweep_task.py). The threads are made
the way an agent makes them (`save_session_to_thread_safe`, working copy included).
"""

from __future__ import annotations

import os
import re
import shelve
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import crontab, maybe_schedule, schedule
from sqlalchemy import func, select, update

from memory_core import RedisConversationMemory
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from memory_core.events import MEMORY_OWNER_FORGOTTEN, MEMORY_RETENTION_RUN, MEMORY_THREAD_DELETED
from memory_core.fold.publisher import WORKER_APP
from memory_core.io.db import session_scope
from memory_core.io.queues import (
    DEAD_LETTER_QUEUE,
    FINALIZE_QUEUE,
    FOLD_QUEUE,
    FORGET_OWNER_TASK,
    PURGE_TRACES_TASK,
    RETENTION_TASK,
    SWEEP_FOLDS_TASK,
    is_amqp,
)
from memory_core.models import ConversationThread
from memory_core.write.session_handler import save_session_to_thread_safe
from tests.support.brokers import BROKERS, delayed, held, ready
from tests.support.snapshots import make_snapshot
from tests.support.state import drain_events, freshen_other_fold_requests, thread_rows
from tests.support.workers import destination, producer

on_both_brokers = pytest.mark.parametrize("broker", BROKERS, indirect=True)

# The schedule of workers/app.py: entry name -> (task, schedule, expires after s).
SCHEDULE = {
    "memory-retention": (RETENTION_TASK, crontab(minute=17), 3600),
    "memory-trace-purges": (PURGE_TRACES_TASK, schedule(300.0), 300),
    "memory-fold-sweep": (SWEEP_FOLDS_TASK, schedule(60.0), 60),
}


# ------------------------------------------------------------------ helpers


def send_lifecycle(agent: Celery, task: str, *args: Any) -> None:
    """Send a lifecycle task by name, as an agent service (or beat) would: to memory.fold."""
    agent.send_task(task, args=list(args), **destination(agent, FOLD_QUEUE))


def make_threads(
    memory: RedisConversationMemory, owner: str, count: int, turns: int = 2
) -> list[uuid.UUID]:
    """`count` threads of `owner`, `turns` turns each, saved as an agent saves them."""
    tids = [uuid.uuid4() for _ in range(count)]
    for tid in tids:
        for n in range(1, turns + 1):
            outcome = save_session_to_thread_safe(
                make_snapshot(tid, n, owner_id=owner), memory=memory
            )
            assert outcome.status == "saved", outcome
    return tids


def owner_threads(owner: str) -> int:
    with session_scope() as s:
        stmt = select(func.count()).where(ConversationThread.owner_id == owner)
        return int(s.scalar(stmt) or 0)


def threads_newer_than(age: timedelta) -> int:
    """Threads of the whole database with a turn in the last `age` (retention spares them)."""
    with session_scope() as s:
        stmt = select(func.count()).where(ConversationThread.updated_at > func.now() - age)
        return int(s.scalar(stmt) or 0)


def set_idle(tid: uuid.UUID, age: timedelta) -> None:
    """Make the thread's last turn `age` old, in SQL (what retention reads: updated_at)."""
    with session_scope() as s:
        s.execute(
            update(ConversationThread)
            .where(ConversationThread.id == tid)
            .values(updated_at=func.now() - age)
        )


def thread_keys(client: redis.Redis, tid: uuid.UUID) -> set[str]:
    """Every Redis key that names the thread."""
    return {k.decode() for k in client.scan_iter(match=f"*{tid}*", count=1000)}


def only_markers_left(client: redis.Redis, memory: RedisConversationMemory, tid: uuid.UUID) -> bool:
    """Of a deleted thread, only markers that refuse late copy writes: this memory's, and one
    under each other key prefix on record in memory_settings_seen (an earlier test of the
    same database may have used one; memory_core/lifecycle/purge.py forgets under them too)."""
    keys = thread_keys(client, tid)
    return gone_key(memory, tid) in keys and all(k.endswith(f"{{{tid}}}:gone") for k in keys)


def copy_keys(memory: RedisConversationMemory, tid: uuid.UUID) -> set[str]:
    """The working copy's keys (meta, turns), as memory_core/copy/working_copy.py names them."""
    tag = f"{memory.settings.memory_key_prefix}:{{{tid}}}"
    return {f"{tag}:meta", f"{tag}:turns"}


def gone_key(memory: RedisConversationMemory, tid: uuid.UUID) -> str:
    return f"{memory.settings.memory_key_prefix}:{{{tid}}}:gone"


def succeeded(log: str, task: str) -> int:
    """How many runs of `task` the worker log reports as succeeded."""
    return len(re.findall(rf"Task {re.escape(task)}\[[0-9a-f-]+\] succeeded", log))


def drained(url: str) -> bool:
    """memory.fold holds nothing: no job waiting, none held by a worker."""
    return ready(url, FOLD_QUEUE) == 0 and held(url) == 0


# ------------------------------------------------------------------ memory.forget_owner


@on_both_brokers
def test_forget_owner_deletes_every_thread_of_the_owner_and_nothing_else(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
) -> None:
    broker, memory = agent.conf.broker_url, RedisConversationMemory(redis_client)
    owner, bystander = f"owner-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    doomed = make_threads(memory, owner, 4)
    kept = make_threads(memory, bystander, 2)
    assert (owner_threads(owner), owner_threads(bystander)) == (4, 2)
    for tid in doomed + kept:  # every thread has its working copy before
        assert copy_keys(memory, tid) <= thread_keys(redis_client, tid), tid

    w = start_worker()
    send_lifecycle(agent, FORGET_OWNER_TASK, owner)
    wait_for(lambda: owner_threads(owner) == 0, 60, "the owner's threads deleted", w.log)
    wait_for(lambda: succeeded(w.log(), FORGET_OWNER_TASK) == 1, 30, "the task done", w.log)
    wait_for(lambda: drained(broker), 30, "memory.fold drained", w.log)

    # The other owner's threads, turns and copies are untouched.
    assert owner_threads(bystander) == 2
    rows = thread_rows(kept)
    assert set(rows) == set(kept) and all(t.last_seq == 2 for t in rows.values())
    for tid in kept:
        assert copy_keys(memory, tid) <= thread_keys(redis_client, tid), tid
        ctx = memory.get_context(tid, bystander)
        assert [e.seq for e in ctx.recent] == [1, 2]
        assert gone_key(memory, tid) not in thread_keys(redis_client, tid)
    # Of a deleted thread only the marker that refuses late copy writes is left in Redis.
    for tid in doomed:
        assert only_markers_left(redis_client, memory, tid), thread_keys(redis_client, tid)
        assert redis_client.ttl(gone_key(memory, tid)) > 0  # it expires with the copy's TTL

    # Events: one per deleted thread, and the run's own, none naming the owner.
    events = drain_events(redis_client, events_stream)
    deleted = [e for e in events if e.event == MEMORY_THREAD_DELETED]
    assert sorted(e.thread_id for e in deleted) == sorted(str(t) for t in doomed)
    (forgotten,) = [e for e in events if e.event == MEMORY_OWNER_FORGOTTEN]
    assert forgotten.fields["threads"] == "4" and forgotten.fields["turns"] == "8"
    assert not any(owner in value for e in events for value in e.fields.values())
    assert "memory.lifecycle_retry" not in w.log() and w.alive()


@on_both_brokers
def test_forget_owner_with_a_bad_argument_is_rejected_and_leaves_the_queue(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    broker: str,
    memory: RedisConversationMemory,
) -> None:
    w = start_worker()
    bad_jobs: list[tuple[Any, ...]] = [(12345,), (None,), ("",), (["owner"],), ()]
    for args in bad_jobs:
        send_lifecycle(agent, FORGET_OWNER_TASK, *args)
    wait_for(
        lambda: w.log().count('"memory.job_rejected"') >= len(bad_jobs),
        60,
        f"{len(bad_jobs)} rejections",
        w.log,
    )
    # The worker moves on: a valid job sent after them runs.
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    make_threads(memory, owner, 1)
    send_lifecycle(agent, FORGET_OWNER_TASK, owner)
    wait_for(lambda: owner_threads(owner) == 0, 60, "the valid job after the bad ones", w.log)
    wait_for(lambda: drained(broker), 30, "memory.fold drained", w.log)

    # Rejected once each, never retried: nothing waits in a countdown or comes back.
    log = w.log()
    assert log.count('"memory.job_rejected"') == len(bad_jobs)
    assert "memory.lifecycle_retry" not in log and "memory.task_unexpected_error" not in log
    assert succeeded(log, FORGET_OWNER_TASK) == 1 and w.alive()
    if is_amqp(broker):
        assert delayed(broker) == 0
        # Refused for good, acked: memory.dead is for poison jobs only.
        assert ready(broker, DEAD_LETTER_QUEUE) == 0


# ------------------------------------------------------------------ memory.apply_retention


@on_both_brokers
def test_retention_deletes_only_threads_idle_longer_than_the_setting(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    redis_client: redis.Redis,
    events_stream: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker, memory = agent.conf.broker_url, RedisConversationMemory(redis_client)
    monkeypatch.delenv("MEMORY_RETENTION_DAYS", raising=False)  # the workers' default: unset
    owner = f"owner-{uuid.uuid4().hex[:8]}"
    old, recent, fresh = make_threads(memory, owner, 3)
    set_idle(old, timedelta(days=2))
    set_idle(recent, timedelta(hours=23))  # inside the day: kept
    spared = threads_newer_than(timedelta(hours=23, minutes=30))

    # MEMORY_RETENTION_DAYS unset (the default): the run deletes nothing. (No soft shutdown:
    # this idle worker is stopped at once, below.)
    w = start_worker(env={"MEMORY_WORKER_SOFT_SHUTDOWN_S": "0"})
    send_lifecycle(agent, RETENTION_TASK)
    wait_for(lambda: succeeded(w.log(), RETENTION_TASK) == 1, 60, "the no-op run", w.log)
    assert set(thread_rows([old, recent, fresh])) == {old, recent, fresh}
    assert w.stop(30) == 0

    w = start_worker(env={"MEMORY_RETENTION_DAYS": "1"})
    send_lifecycle(agent, RETENTION_TASK)
    wait_for(lambda: thread_rows([old]) == {}, 60, "the idle thread deleted", w.log)
    wait_for(lambda: succeeded(w.log(), RETENTION_TASK) == 1, 30, "the run done", w.log)
    wait_for(lambda: drained(broker), 30, "memory.fold drained", w.log)

    assert set(thread_rows([old, recent, fresh])) == {recent, fresh}
    assert threads_newer_than(timedelta(hours=23, minutes=30)) == spared  # nobody else's
    assert only_markers_left(redis_client, memory, old), thread_keys(redis_client, old)
    for tid in (recent, fresh):
        assert [e.seq for e in memory.get_context(tid, owner).recent] == [1, 2]
    runs = [e for e in drain_events(redis_client, events_stream) if e.event == MEMORY_RETENTION_RUN]
    assert [e.fields["dry_run"] for e in runs] == ["False"]  # the no-op run emits nothing
    assert int(runs[0].fields["threads"]) >= 1


# ------------------------------------------------------------------ Celery beat


def test_beat_schedule_sends_the_lifecycle_tasks_to_the_fold_queue() -> None:
    from workers import lifecycle_tasks  # noqa: F401 - registers the tasks
    from workers.app import app

    entries = {
        name: (entry["task"], maybe_schedule(entry["schedule"]), entry["options"]["expires"])
        for name, entry in app.conf.beat_schedule.items()
    }
    assert entries == SCHEDULE
    assert app.conf.result_expires is None  # no daily celery.backend_cleanup from beat
    for task in (FORGET_OWNER_TASK, RETENTION_TASK, PURGE_TRACES_TASK, SWEEP_FOLDS_TASK):
        assert task in app.tasks
        assert app.amqp.router.route({}, task)["queue"].name == FOLD_QUEUE


class BeatProcess:
    """`celery -A <installed app> beat` as the deployments run it, in a process group of its
    own, logging to a file; the schedule file in `directory`."""

    def __init__(self, directory: Path, broker_url: str, *, retention_minute: int = 17) -> None:
        self.schedule = directory / "celerybeat-schedule"
        self.log_path = directory / "beat.log"
        self.node = f"celerybeat-{uuid.uuid4().hex[:6]}@test"
        self.argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            f"{WORKER_APP}:app",
            "beat",
            "--schedule",
            str(self.schedule),
            "--loglevel",
            "INFO",
            "--enable-remote-control",
            "--hostname",
            self.node,
        ]
        self.env = {
            **os.environ,
            "CELERY_BROKER_URL": broker_url,
            "MEMORY_RETENTION_MINUTE": str(retention_minute),
            "PYTHONUNBUFFERED": "1",
        }
        self.cwd = directory  # not the checkout: the app is found by its installed name
        self.proc: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self) -> BeatProcess:
        self.log_path.write_bytes(b"")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.DEVNULL,  # the banner; the log records go to stderr
                stderr=log,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        wait_for(lambda: "beat: Starting..." in self.log() or self.exited(), 60, "beat", self.log)
        assert not self.exited(), self.log()
        return self

    def exited(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def stop(self, timeout_s: float = 20) -> int:
        """SIGTERM, as an orchestrator stops it; its exit code (SIGKILL after `timeout_s`)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                return -9
        return self.proc.returncode

    def __enter__(self) -> BeatProcess:
        return self  # `with BeatProcess(...).start() as beat:` stops it on the way out

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


def ping(broker_url: str, node: str) -> bool:
    """Whether `node` answers a remote-control ping (what the liveness probes run)."""
    app = producer(broker_url)
    try:
        replies = app.control.ping(destination=[node], timeout=2)
    finally:
        app.close()
    return any(r.get(node) == {"ok": "pong"} for r in replies)


def make_overdue(schedule: Path, entries: Iterable[str], by: timedelta) -> None:
    """Move the entries' last run back in beat's schedule file (a beat down for a while)."""
    with shelve.open(str(schedule), writeback=True) as db:  # noqa: S301 - our beat's own file
        stored = db["entries"]
        for name in entries:
            stored[name].last_run_at -= by


def errors_in(log: str) -> list[str]:
    return [ln for ln in log.splitlines() if '"level": "error"' in ln or "Traceback" in ln]


@on_both_brokers
def test_beat_starts_sends_due_tasks_and_stops_cleanly(
    start_worker: Callable[..., WorkerProcess], broker: str, tmp_path: Path
) -> None:
    # Retention runs at minute MEMORY_RETENTION_MINUTE: half an hour from now, clear of this
    # test (production's 17 would send an extra run whenever the test crossed minute 17).
    minute = (datetime.now(UTC).minute + 30) % 60
    # A fresh schedule: beat starts, answers the probes' ping, and sends nothing before the
    # first interval has passed.
    with BeatProcess(tmp_path, broker, retention_minute=minute).start() as beat:
        wait_for(lambda: ping(broker, beat.node), 30, "a pong from beat", beat.log)
        assert ready(broker, FOLD_QUEUE) == 0
        assert beat.stop() == 0  # SIGTERM: a clean exit, the schedule saved
    assert errors_in(beat.log()) == []

    # Restarted after a day down: every entry is overdue and sent at once, to memory.fold.
    make_overdue(beat.schedule, SCHEDULE, timedelta(days=1))
    with beat.start():
        lines = [f"Scheduler: Sending due task {n} ({t})" for n, (t, _, _) in SCHEDULE.items()]
        wait_for(lambda: all(ln in beat.log() for ln in lines), 30, " and ".join(lines), beat.log)
        sent = len(SCHEDULE)
        wait_for(lambda: ready(broker, FOLD_QUEUE) == sent, 30, f"{sent} jobs", beat.log)
        assert ready(broker, FINALIZE_QUEUE) == 0
        assert beat.stop() == 0
    assert errors_in(beat.log()) == []

    # Restarted again: the schedule file remembers those runs, nothing is sent twice.
    with beat.start():
        wait_for(lambda: ping(broker, beat.node), 30, "a pong from beat", beat.log)
        assert ready(broker, FOLD_QUEUE) == len(SCHEDULE)
        assert beat.log().count("Scheduler: Sending due task") == 0
        assert beat.stop() == 0
    assert errors_in(beat.log()) == []

    # A fold worker runs what beat sent. Earlier tests' long-due folds are made due now
    # first, so the sweep publishes none of them (their folds would keep memory.fold busy).
    freshen_other_fold_requests()
    w = start_worker(queues=FOLD_QUEUE)
    tasks = [task for task, _, _ in SCHEDULE.values()]
    wait_for(lambda: all(succeeded(w.log(), t) == 1 for t in tasks), 60, "every run", w.log)
    wait_for(lambda: drained(broker), 30, "memory.fold drained", w.log)
