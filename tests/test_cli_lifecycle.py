"""`agent-memory threads list|archive|unarchive|delete`, `forget`, `retention run`, as a user
runs them: the real command in a subprocess against the session's Postgres, Redis and broker."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from tests.support import REPO
from tests.support.fake_langfuse import FakeLangfuseServer
from tests.support.snapshots import make_snapshot

# No Langfuse (the trace lines are only printed with it) and no retention unless a test asks.
QUIET = {"LANGFUSE_PUBLIC_KEY": "", "LANGFUSE_SECRET_KEY": ""}
UNSET = ("MEMORY_RETENTION_DAYS",)


# Commands warn on stderr about settings other tests recorded; these tests read stderr.
pytestmark = pytest.mark.usefixtures("settings_agree")


def command_env(env: dict[str, str] | None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in UNSET}
    return {**base, **QUIET, **(env or {})}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`agent-memory args` without a terminal (stdin is /dev/null); never raises."""
    return subprocess.run(
        [sys.executable, "-m", "memory_core.cli", *args],
        cwd=REPO,
        env=command_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@dataclass
class TtyRun:
    returncode: int
    stdout: str  # a pipe: only the result
    terminal: str  # what the terminal (stdin, stderr) showed: prompt, echo, errors


def run_on_tty(*args: str, answer: str, env: dict[str, str] | None = None) -> TtyRun:
    """`agent-memory args` with stdin and stderr on a pseudo-terminal, answering its question
    with `answer` once it is asked; stdout stays a pipe."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "memory_core.cli", *args],
        cwd=REPO,
        env=command_env({"TERM": "xterm", **(env or {})}),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=slave,
        start_new_session=True,
        text=True,
    )
    os.close(slave)
    seen = b""
    answered = False
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the command closed the terminal (exited)
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"[y/N]: " in seen:
                os.write(master, answer.encode() + b"\n")
                answered = True
        assert proc.stdout is not None
        stdout = proc.stdout.read()
        returncode = proc.wait(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert answered, f"never asked: {seen.decode(errors='replace')}"
    return TtyRun(returncode, stdout, seen.decode(errors="replace").replace("\r\n", "\n"))


def new_owner(tag: str) -> str:
    return f"cli-{tag}-{uuid.uuid4().hex[:8]}"


def age(memory: RedisConversationMemory, tid: uuid.UUID, days: int) -> None:
    """Make the thread look inactive for `days` (its last turn that long ago)."""
    with memory.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE conversation_threads SET updated_at = now() - make_interval(days => :d) "
                "WHERE id = :t"
            ),
            {"t": tid, "d": days},
        )


def make_thread(memory: RedisConversationMemory, owner: str, turns: int = 2) -> uuid.UUID:
    tid = uuid.uuid4()
    for n in range(1, turns + 1):
        outcome = save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
        assert outcome.status == "saved", outcome
    return tid


def scalar(memory: RedisConversationMemory, sql: str, **params: object) -> int:
    with memory.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


def thread_rows(memory: RedisConversationMemory, tid: uuid.UUID) -> int:
    return scalar(memory, "SELECT count(*) FROM conversation_threads WHERE id = :t", t=tid)


def turn_rows(memory: RedisConversationMemory, tid: uuid.UUID) -> int:
    return scalar(memory, "SELECT count(*) FROM thread_messages WHERE thread_id = :t", t=tid)


def owner_threads(memory: RedisConversationMemory, owner: str) -> int:
    return scalar(memory, "SELECT count(*) FROM conversation_threads WHERE owner_id = :o", o=owner)


# ----------------------------------------------------------------------------- help


@pytest.mark.parametrize(
    "command",
    [
        ["threads"],
        ["threads", "list"],
        ["threads", "archive"],
        ["threads", "unarchive"],
        ["threads", "delete"],
        ["forget"],
        ["retention"],
        ["retention", "run"],
    ],
)
def test_every_lifecycle_command_has_help(command: list[str]) -> None:
    out = run(*command, "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout


# ----------------------------------------------------------------------------- list / archive


def test_list_archive_unarchive(memory: RedisConversationMemory) -> None:
    owner = new_owner("arch")
    kept, hidden = make_thread(memory, owner), make_thread(memory, owner, turns=1)

    default, listed = run("threads", "--owner", owner), run("threads", "list", "--owner", owner)
    assert default.returncode == listed.returncode == 0
    assert default.stdout == listed.stdout
    lines = default.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(str(hidden))  # most recent first
    assert "1 turns  Revenue by region for 2001" in lines[0]
    assert "2 turns" in lines[1] and "[archived]" not in default.stdout

    archived = run("threads", "archive", str(hidden), "--owner", owner)
    assert archived.returncode == 0 and archived.stdout == f"archived thread {hidden}\n"
    after = run("threads", "--owner", owner)
    assert str(hidden) not in after.stdout and str(kept) in after.stdout
    assert str(hidden) not in run("threads", "list", "--owner", owner).stdout
    shown = run("threads", "--owner", owner, "--archived")
    assert f"{hidden}" in shown.stdout and shown.stdout.count("[archived]") == 1
    assert run("threads", "list", "--owner", owner, "--archived").stdout == shown.stdout
    readable = run("context", str(hidden), "--owner", owner)
    assert readable.returncode == 0 and "Revenue by region for 2001" in readable.stdout
    limited = run("threads", "list", "--owner", owner, "--archived", "--limit", "1")
    assert len(limited.stdout.splitlines()) == 1

    unarchived = run("threads", "unarchive", str(hidden), "--owner", owner)
    assert unarchived.returncode == 0 and unarchived.stdout == f"unarchived thread {hidden}\n"
    assert run("threads", "--owner", owner).stdout == default.stdout

    stranger = run("threads", "archive", str(kept), "--owner", "mallory")
    assert stranger.returncode == 1 and stranger.stderr == f"error: thread {kept} not found\n"
    assert "[archived]" not in run("threads", "--owner", owner, "--archived").stdout


def test_list_without_owner_or_with_an_empty_one() -> None:
    missing = run("threads")
    assert missing.returncode == 2 and "Missing option '--owner'" in missing.stderr
    empty = run("threads", "--owner", "")
    assert empty.returncode == 1 and empty.stderr == "error: --owner must be a non-empty string\n"
    nobody = run("threads", "list", "--owner", new_owner("nobody"))
    assert nobody.returncode == 0 and nobody.stdout == "" and "no threads for" in nobody.stderr


# ----------------------------------------------------------------------------- delete


def test_delete_with_yes(memory: RedisConversationMemory) -> None:
    owner = new_owner("del")
    tid, other = make_thread(memory, owner, turns=3), make_thread(memory, owner)
    out = run("threads", "delete", str(tid), "--owner", owner, "--yes")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"deleted thread {tid}: 3 turns, 1 copy, 0 checkpoints\n"
    assert owner not in out.stdout + out.stderr
    gone = run("context", str(tid), "--owner", owner)
    assert gone.returncode == 1 and gone.stderr == f"error: thread {tid} not found\n"
    assert thread_rows(memory, tid) == 0 and turn_rows(memory, tid) == 0
    assert thread_rows(memory, other) == 1  # only that one
    again = run("threads", "delete", str(tid), "--owner", owner, "-y")  # already deleted
    assert again.returncode == 1 and again.stderr == f"error: thread {tid} not found\n"


def test_delete_without_a_terminal_or_yes_refuses(memory: RedisConversationMemory) -> None:
    owner = new_owner("refuse")
    tid = make_thread(memory, owner)
    out = run("threads", "delete", str(tid), "--owner", owner)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == (
        "error: refusing to delete without confirmation: stdin is not a terminal (pass --yes)\n"
    )
    assert thread_rows(memory, tid) == 1 and turn_rows(memory, tid) == 2
    assert run("context", str(tid), "--owner", owner).returncode == 0


def test_delete_on_a_terminal_asks(memory: RedisConversationMemory) -> None:
    owner = new_owner("tty")
    tid = make_thread(memory, owner)

    no = run_on_tty("threads", "delete", str(tid), "--owner", owner, answer="n")
    assert no.returncode == 1 and no.stdout == ""
    assert f"Delete thread {tid} for good? [y/N]: " in no.terminal
    assert "error: not confirmed: nothing was deleted\n" in no.terminal
    assert thread_rows(memory, tid) == 1 and turn_rows(memory, tid) == 2

    yes = run_on_tty("threads", "delete", str(tid), "--owner", owner, answer="y")
    assert yes.returncode == 0, yes.terminal
    assert yes.stdout == f"deleted thread {tid}: 2 turns, 1 copy, 0 checkpoints\n"
    assert thread_rows(memory, tid) == 0 and turn_rows(memory, tid) == 0


def test_a_strangers_delete_answers_as_an_unknown_id(memory: RedisConversationMemory) -> None:
    owner = new_owner("own")
    tid, unknown = make_thread(memory, owner), uuid.uuid4()
    stranger = run("threads", "delete", str(tid), "--owner", "mallory", "--yes")
    nobody = run("threads", "delete", str(unknown), "--owner", "mallory", "--yes")
    assert (stranger.returncode, stranger.stdout) == (nobody.returncode, nobody.stdout) == (1, "")
    assert stranger.stderr == f"error: thread {tid} not found\n"
    assert stranger.stderr.replace(str(tid), "ID") == nobody.stderr.replace(str(unknown), "ID")
    malformed = run("threads", "delete", "not-a-uuid", "--owner", "mallory", "--yes")
    assert malformed.returncode == 1 and malformed.stderr == "error: thread not-a-uuid not found\n"
    assert thread_rows(memory, tid) == 1 and turn_rows(memory, tid) == 2


def test_delete_with_redis_down_deletes_nothing(memory: RedisConversationMemory) -> None:
    owner = new_owner("down")
    tid = make_thread(memory, owner)
    out = run(
        "threads", "delete", str(tid), "--owner", owner, "--yes",
        env={"REDIS_URL": "redis://127.0.0.1:1/0"},
    )  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: nothing was deleted: Redis failed")
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert thread_rows(memory, tid) == 1 and turn_rows(memory, tid) == 2


# ----------------------------------------------------------------------------- forget


def test_forget_with_yes_leaves_other_owners_alone(memory: RedisConversationMemory) -> None:
    owner, other = new_owner("forget"), new_owner("keep")
    mine = [make_thread(memory, owner, turns=n) for n in (1, 2, 2)]
    theirs = make_thread(memory, other)
    out = run("forget", "--owner", owner, "--yes", "--batch-size", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "forgot owner: 3 threads, 5 turns, 3 copies, 0 checkpoints in 2 batches; "
        "remaining: 0 threads, 0 checkpoints\n"
    )
    assert out.stderr == ""  # no terminal: no progress bar
    assert owner_threads(memory, owner) == 0 and all(thread_rows(memory, t) == 0 for t in mine)
    assert owner_threads(memory, other) == 1 and turn_rows(memory, theirs) == 2
    assert run("context", str(theirs), "--owner", other).returncode == 0
    again = run("forget", "--owner", owner, "--yes")  # idempotent
    assert again.returncode == 0 and again.stdout.startswith("forgot owner: 0 threads")


def test_forget_refuses_without_a_terminal_and_asks_on_one(
    memory: RedisConversationMemory,
) -> None:
    owner = new_owner("ask")
    tid = make_thread(memory, owner)
    refused = run("forget", "--owner", owner)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: refusing to delete without confirmation")
    refused_enqueue = run("forget", "--owner", owner, "--enqueue")
    assert refused_enqueue.returncode == 1 and refused_enqueue.stdout == ""
    no = run_on_tty("forget", "--owner", owner, answer="no")
    assert no.returncode == 1 and no.stdout == ""
    assert thread_rows(memory, tid) == 1

    yes = run_on_tty("forget", "--owner", owner, answer="yes")
    assert yes.returncode == 0, yes.terminal
    assert yes.stdout.startswith("forgot owner: 1 thread, 2 turns, 1 copy")
    assert len(yes.stdout.splitlines()) == 1
    assert "forgetting" in yes.terminal  # the progress bar: on the terminal (stderr) only
    assert owner_threads(memory, owner) == 0


def test_forget_bad_owner_is_one_line() -> None:
    out = run("forget", "--owner", "", "--yes")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr == "error: --owner must be a non-empty string\n"


def test_forget_enqueue_with_an_unreachable_broker() -> None:
    out = run(
        "forget", "--owner", new_owner("nobroker"), "--yes", "--enqueue",
        env={"CELERY_BROKER_URL": "redis://127.0.0.1:1/0"},
    )  # fmt: skip
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: cannot reach the broker at redis://127.0.0.1:1/0: ")
    assert len(out.stderr.strip().splitlines()) == 1


def test_forget_enqueue_runs_on_a_worker(
    memory: RedisConversationMemory, broker: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    owner, other = new_owner("queued"), new_owner("stays")
    for _ in range(3):
        make_thread(memory, owner, turns=1)
    theirs = make_thread(memory, other)
    start_worker()
    out = run("forget", "--owner", owner, "--yes", "--enqueue", env={"CELERY_BROKER_URL": broker})
    assert out.returncode == 0, out.stderr
    task_id = out.stdout.strip()
    assert uuid.UUID(task_id) and out.stdout == f"{task_id}\n"
    wait_for(lambda: owner_threads(memory, owner) == 0, 60, "the worker to forget the owner")
    assert thread_rows(memory, theirs) == 1 and turn_rows(memory, theirs) == 2


# ----------------------------------------------------------------------------- retention


def test_retention_off() -> None:
    for args in (["retention", "run"], ["retention", "run", "--dry-run"]):
        out = run(*args)
        assert out.returncode == 0, out.stderr
        assert out.stdout == "retention is off (MEMORY_RETENTION_DAYS unset)\n"


def test_retention_dry_run_then_run(memory: RedisConversationMemory) -> None:
    owner = new_owner("ret")
    old, young = make_thread(memory, owner, turns=2), make_thread(memory, owner, turns=1)
    age(memory, old, 30000)  # far older than any other test's thread
    env = {"MEMORY_RETENTION_DAYS": "29000"}

    dry = run("retention", "run", "--dry-run", env=env)  # never asks, changes nothing
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("retention dry run: cutoff ")
    assert dry.stdout.endswith(" (29000 days); would delete 1 thread, 2 turns\n")
    assert thread_rows(memory, old) == 1 and turn_rows(memory, old) == 2

    refused = run("retention", "run", env=env)
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith("error: refusing to delete without confirmation")
    assert thread_rows(memory, old) == 1

    done = run("retention", "run", "--yes", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("retention: cutoff ")
    assert done.stdout.endswith(
        " (29000 days); deleted 1 thread, 2 turns, 1 copy, 0 checkpoints in 1 batch\n"
    )
    assert thread_rows(memory, old) == 0 and turn_rows(memory, old) == 0
    assert thread_rows(memory, young) == 1 and turn_rows(memory, young) == 1
    assert owner not in dry.stdout + done.stdout


@pytest.fixture
def langfuse() -> Iterator[FakeLangfuseServer]:
    with FakeLangfuseServer() as server:
        yield server


def test_retention_purges_traces_and_sweeps(
    memory: RedisConversationMemory, langfuse: FakeLangfuseServer
) -> None:
    """With Langfuse configured: the deleted thread's traces go, then the pending purges are
    swept (and their counts printed)."""
    owner = new_owner("traces")
    old, young = make_thread(memory, owner), make_thread(memory, owner, turns=1)
    age(memory, old, 30000)
    doomed = {langfuse.add_trace(session_id=str(old), observations=2) for _ in range(2)}
    kept = {langfuse.add_trace(session_id=str(young), observations=1)}
    env = {
        "MEMORY_RETENTION_DAYS": "29000",
        "MEMORY_TRACE_PURGE_SETTLE_S": "0",
        "LANGFUSE_PUBLIC_KEY": f"pk-lf-test-{uuid.uuid4().hex}",
        "LANGFUSE_SECRET_KEY": "sk-lf-test",
        "LANGFUSE_BASE_URL": langfuse.base_url,
    }
    out = run("retention", "run", "--yes", env=env)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.endswith(
        " (29000 days); deleted 1 thread, 2 turns, 1 copy, 0 checkpoints, 2 traces in 1 batch"
    )
    assert second.startswith("trace purges: ") and second.endswith(" pending")
    assert langfuse.trace_ids(str(old)) == [] and set(langfuse.deleted_trace_ids) == doomed
    assert set(langfuse.trace_ids(str(young))) == kept and thread_rows(memory, young) == 1
