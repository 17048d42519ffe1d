"""`agent-memory` commands as a user runs them: output, and one-line errors."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
import redis

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.events import emit_event
from memory_core.settings import get_settings
from tests.support.commands import run_module
from tests.support.snapshots import make_snapshot

# Commands warn on stderr about settings other tests recorded; these tests read stderr.
pytestmark = pytest.mark.usefixtures("settings_agree")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_module("memory_core.cli", *args, env=env)


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["migrate"],
        ["worker"],
        ["flower"],
        ["demo"],
        ["context"],
        ["threads"],
        ["events", "tail"],
        ["bench", "core"],
        ["bench", "workers"],
        ["eval", "fidelity"],
        ["eval", "schema"],
        ["inspect", "serve"],
    ],
)
def test_every_command_has_help(command: list[str]) -> None:
    out = run(*command, "--help")
    assert out.returncode == 0 and "Usage:" in out.stdout


def test_context_threads_and_strangers(memory: RedisConversationMemory) -> None:
    owner = f"cli-{uuid.uuid4().hex[:6]}"
    tid = uuid.uuid4()
    for n in (1, 2):
        save_session_to_thread_safe(make_snapshot(tid, n, owner_id=owner), memory=memory)
    out = run("context", str(tid), "--owner", owner, "--focus", "sql")
    assert out.returncode == 0
    assert "[#2] User: Revenue by region for 2002" in out.stdout
    assert "SQL:\n  SELECT region, SUM(revenue)" in out.stdout
    listed = run("threads", "--owner", owner)
    assert listed.returncode == 0 and str(tid) in listed.stdout and "2 turns" in listed.stdout
    stranger = run("context", str(tid), "--owner", "mallory")
    unknown = run("context", str(uuid.uuid4()), "--owner", "mallory")
    assert stranger.returncode == unknown.returncode == 1
    assert stranger.stderr == f"error: thread {tid} not found\n"
    assert "Traceback" not in stranger.stderr + unknown.stderr
    assert str(tid) not in run("threads", "--owner", "mallory").stdout
    bad_focus = run("context", str(tid), "--owner", owner, "--focus", "charts")
    assert bad_focus.returncode == 1 and "--focus must be one of" in bad_focus.stderr


def test_eval_schema_prints_the_shipped_schema_json() -> None:
    from memory_core.eval.files import CONVERSATIONS

    out = run("eval", "schema")
    assert out.returncode == 0 and out.stdout == (CONVERSATIONS / "schema.json").read_text()


def test_eval_on_a_broken_conversation_folder_is_one_line_and_starts_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "01-mine.yaml").write_text("name: mine\nround: one\n")
    out = run("eval", "fidelity", "--conversations", str(tmp_path))
    assert out.returncode == 1 and out.stdout == ""
    # the only line: no "using PostgreSQL at ...", no worker, before anything is started
    assert out.stderr == (
        "error: eval corpus: 01-mine.yaml: round: Input should be a valid integer (and 4 more)\n"
    )


def test_unreachable_database_is_one_clear_line() -> None:
    out = run("threads", "--owner", "x", env={"DATABASE_URL": "postgresql://u@127.0.0.1:1/x"})
    assert out.returncode == 1
    assert out.stderr.startswith(
        "error: cannot reach Postgres at postgresql+psycopg2://u@127.0.0.1:1/x"
    )
    assert len(out.stderr.strip().splitlines()) == 1


def test_bench_on_a_missing_database_is_one_clear_line() -> None:
    """The workers bench connects with psycopg2 directly: its errors too are one line."""
    url = get_settings().database_url.rsplit("/", 1)[0] + "/agent_memory_no_such_db"
    out = run(
        "bench", "workers", "--broker-url", "redis://127.0.0.1:1/0", env={"DATABASE_URL": url}
    )
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach Postgres at ")
    assert 'database "agent_memory_no_such_db" does not exist' in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_bench_on_an_unreachable_broker_names_the_broker() -> None:
    out = run("bench", "workers", "--broker-url", "redis://127.0.0.1:1/0")
    assert out.returncode == 1
    assert out.stderr.startswith("error: cannot reach the broker at redis://127.0.0.1:1/0: ")
    assert len(out.stderr.strip().splitlines()) == 1


def test_events_tail_plain_and_with_a_group(redis_client: redis.Redis) -> None:
    stream = f"memory:events:cli:{uuid.uuid4().hex[:6]}"
    tid = str(uuid.uuid4())
    for attempt in (1, 2):
        emit_event(
            redis_client,
            "memory_summarization_failed",
            thread_id=tid,
            attempt=attempt,
            error="LLM HTTP 500",
            retry_in_s=60 * attempt,
            stream=stream,
        )
    env = {"MEMORY_EVENTS_STREAM": stream}
    plain = run("events", "tail", env=env)
    assert plain.returncode == 0 and plain.stdout.count("memory_summarization_failed") == 2
    grouped = run("events", "tail", "--group", "ops", "--consumer", "c1", env=env)
    assert grouped.stdout.count(tid) == 2
    again = run("events", "tail", "--group", "ops", "--consumer", "c1", env=env)
    assert again.returncode == 0 and tid not in again.stdout  # acked: not delivered twice
    redis_client.delete(stream)


def test_a_failover_broker_list_is_shown_node_by_node_without_its_passwords() -> None:
    from memory_core.cli.errors import safe_url

    nodes = [f"amqp://guest:s3cret@127.0.0.1:{port}/agent_memory_demo_x" for port in (1, 2, 3)]
    shown = safe_url(";".join(nodes))
    assert "s3cret" not in shown and "%3B" not in shown
    assert shown.split(";") == [safe_url(node) for node in nodes]
    assert [part.rsplit("/", 1)[-1] for part in shown.split(";")] == ["agent_memory_demo_x"] * 3
