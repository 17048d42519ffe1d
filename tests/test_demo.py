"""`agent-memory demo` end to end: what a newcomer sees after `make demo`.

Runs the demo as a subprocess with this session's services (DATABASE_URL, REDIS_URL and the
session's own CELERY_BROKER_URL db, exported by conftest), so it starts real workers, plays the
scripted conversation and the LLM outage, and must stop everything it started.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.brokers import BROKERS

TIMEOUT_S = 300


@pytest.mark.slow
@pytest.mark.workers  # the demo starts them
@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_demo_end_to_end(tmp_path: Path, broker: str) -> None:
    """On either broker (CELERY_BROKER_URL, as the `broker` fixture sets it)."""
    env = {**os.environ, "COLUMNS": "200", "PYTHONPATH": str(REPO)}
    env.pop("MEMORY_SUMMARY_MAX_TOKENS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "memory_core.cli", "demo"],
        cwd=tmp_path,  # its .agent-memory/demo (worker logs) lands in tmp_path
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-6000:]}\n{proc.stderr[-4000:]}"

    # Reachable services are used as they are; the broker is one of the run's own: the
    # session's (emptied) Redis db, claimed, or a vhost made for the run.
    assert "using PostgreSQL at" in out
    assert "using Redis at" in out
    if broker.startswith("amqp"):
        assert re.search(r"vhost agent_memory_demo_\w+ made for this run, deleted at the end", out)
        assert re.search(r"broker: deleted vhost agent_memory_demo_\w+", out)
    else:
        assert "(CELERY_BROKER_URL; empty, claimed for this run)" in out
        assert "keys of this run)" in out
    assert "summaries: LLM-free deterministic fold" in out
    assert re.search(r"worker demo-\w+-1 ready", out)

    # Folds happen at turns 21, 32 and 43 and cover 1-11, 12-22, 23-33.
    folds = re.findall(r"turn (\d+): fold (\d) folded turns (\d+)-(\d+)", out)
    assert folds == [("21", "1", "1", "11"), ("32", "2", "12", "22"), ("43", "3", "23", "33")]
    assert "turn 44/44" in out

    # The three node views, each within its budget, the summary first.
    assert 'follow-up question: "now make that a bar chart by quarter"' in out
    for focus in ("brief", "sql", "visualizations"):
        match = re.search(rf"view focus={focus}: (\d+)/(\d+) tokens = summary \+ newest (\d+)", out)
        assert match, focus
        used, budget, shown = map(int, match.groups())
        assert 0 < used <= budget
        assert shown >= 1  # the budget leaves room for recent exchanges
    assert out.count("Conversation summary:") >= 3
    # Only the visualizations view expands descriptors (here: dashboard #8 of turn 42).
    assert out.count("  visualizations: #106, #110") == 1

    assert "rehydrated from Postgres: identical" in out

    # The unreachable LLM: a failure event read through a consumer group, nothing lost.
    failure = [line for line in out.splitlines() if "memory_summarization_failed" in line]
    assert failure, out[-3000:]
    assert "attempt=1" in failure[0]
    assert "retry_in=60s" in failure[0]
    assert "LLM unreachable" in failure[0]
    assert "attempt=1 retry_in_s=60" in out
    assert "no turn was lost: 21/21 rows in thread_messages, 21 turns" in out

    # Everything it started is stopped; the recap names the next commands.
    assert re.search(r"stopped worker demo-\w+-1 \(exit code 0\)", out)
    assert re.search(r"stopped worker demo-\w+-2 \(exit code 0\)", out)
    assert "what you just saw" in out
    assert re.search(r"agent-memory context [0-9a-f-]{36} --owner demo-analyst --focus sql", out)
    assert "agent-memory threads --owner demo-analyst" in out
    assert "agent-memory events tail" in out
    assert not list((tmp_path / ".agent-memory" / "demo").glob("worker-*.log"))


_UNCLEAN_WORKER = """
import signal, sys, time
def term(*_):
    print("stuck closing the broker connection", flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, term)
print("celery@demo ready.", flush=True)
time.sleep(60)
"""


def test_a_worker_that_does_not_stop_cleanly_fails_the_demo_and_shows_its_log(
    tmp_path: Path,
) -> None:
    from io import StringIO

    from rich.console import Console

    from memory_core.cli.demo import Demo
    from memory_core.devservices.workers import WorkerProcess

    out = StringIO()
    demo = Demo(Console(file=out, width=200), tmp_path)
    worker = WorkerProcess(tmp_path, name="demo-x-1", argv=[sys.executable, "-c", _UNCLEAN_WORKER])
    demo.workers.append(worker.start())
    errors = demo.stop()
    assert errors == [f"worker demo-x-1 exited with code 3: {worker.log_path}"]
    assert "stopped worker demo-x-1 (exit code 3)" in out.getvalue()
    assert "stuck closing the broker connection" in out.getvalue()
    assert worker.log_path.exists()
