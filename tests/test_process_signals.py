"""Commands that start processes (demo, worker, flower), ended by a signal at any moment.

Invariants after every example:
* the command exits (within a bound: the stop it runs, not a hang);
* no process it started outlives it (found by a tag in their environment, whatever session
  they moved to);
* a job it did not create is untouched: a finalize job an agent queued on the configured
  broker before the command started is still there after.

Hypothesis draws the command, the signal (SIGTERM, SIGINT, SIGHUP), whom it goes to (the
command, or its process group as a terminal's Ctrl-C or hangup does) and the moment (a delay,
or a line of the command's output). The demo runs with the LLM-free fold (no network). The
short run is deterministic; the long run:
`PROCESS_SIGNALS_EXAMPLES=40 make test PYTEST_ARGS="tests/test_process_signals.py -o timeout=3600"`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_core.devservices.ports import free_port
from memory_core.io.queues import FINALIZE_QUEUE
from tests.support.brokers import BROKERS, ready
from tests.support.commands_signals import Command, queue_foreign_job, tagged

pytestmark = [pytest.mark.workers, pytest.mark.timeout(900)]

EXAMPLES = int(os.environ.get("PROCESS_SIGNALS_EXAMPLES", "6"))
EXIT_BOUND_S = 90  # a worker's stop is bounded at 60 s, then the group is killed
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]
DEMO_READY = "worker demo-"  # "worker demo-<run>-1 ready in ..."
# Moments of the demo's run (a line it prints), from setup to its second worker.
DEMO_MOMENTS = [
    "Celery broker:",
    "schema migrated",
    DEMO_READY,
    "one memory.finalize_turn job per turn",
    "fold 1 folded",
    "starting another with OPENAI_BASE_URL",
]


def _end(cmd: Command, signum: int, group: bool = False) -> tuple[int | None, list[int]]:
    cmd.signal(signum, group)
    code = cmd.wait(EXIT_BOUND_S)
    left = cmd.leftovers() if code is not None else []
    if code is None or left:
        cmd.kill_all()
    return code, left


# ---------------------------------------------------------------- one plain test per item


def test_the_demo_never_purges_a_job_queued_on_the_configured_broker(
    tmp_path: Path, broker: str
) -> None:
    """Item 5: an agent's job on CELERY_BROKER_URL survives the demo, which refuses a broker
    that is not empty in one line."""
    job = queue_foreign_job(broker)
    assert ready(broker, FINALIZE_QUEUE) == 1
    cmd = Command(["demo"], tmp_path, {"CELERY_BROKER_URL": broker})
    code = cmd.wait(300)
    if code is None:
        cmd.kill_all()
    assert ready(broker, FINALIZE_QUEUE) == 1, f"job {job} was purged or run\n{cmd.output}"
    assert code == 1, cmd.output[-3000:]
    assert "is not empty" in cmd.output and "purged" not in cmd.output


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_on_rabbitmq_the_demo_plays_on_a_vhost_of_its_own(tmp_path: Path, broker: str) -> None:
    """Item 5 on RabbitMQ: the demo runs on a vhost it made; the agent's job is untouched."""
    queue_foreign_job(broker)
    cmd = Command(["demo"], tmp_path, {"CELERY_BROKER_URL": broker})
    assert cmd.wait_for_line("fold 1 folded", 120), cmd.output[-3000:]
    code, left = _end(cmd, signal.SIGTERM)
    assert ready(broker, FINALIZE_QUEUE) == 1, cmd.output[-3000:]
    assert "made for this run, deleted at the end" in cmd.output
    assert code == 128 + signal.SIGTERM and not left, cmd.output[-3000:]


def test_a_demo_ended_by_sigterm_leaves_no_process_behind(tmp_path: Path, broker: str) -> None:
    """Item 6: SIGTERM to the demo ends its worker (in a session of its own) with it."""
    cmd = Command(["demo"], tmp_path, {"CELERY_BROKER_URL": broker})
    assert cmd.wait_for_line(DEMO_READY, 120), cmd.output[-3000:]
    code, left = _end(cmd, signal.SIGTERM)
    assert code is not None, "the demo did not exit"
    assert not left, f"outlived the demo: {left}\n{cmd.output[-3000:]}"


def test_a_hangup_ends_agent_memory_worker(tmp_path: Path, broker: str) -> None:
    """Item 6: SIGHUP ends `agent-memory worker` (Celery would restart it) and its pool."""
    cmd = Command(["worker", "-c", "2"], tmp_path, {"MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"})
    assert cmd.wait_for_line(" ready.", 120), cmd.output[-3000:]
    code, left = _end(cmd, signal.SIGHUP)
    assert code is not None, f"still running after SIGHUP\n{cmd.output[-3000:]}"
    assert not left, left


# ---------------------------------------------------------------- the generator


@st.composite
def runs(draw: st.DrawFn) -> dict[str, object]:
    command = draw(st.sampled_from(["demo", "demo", "worker", "flower"]))
    moment: object
    if command == "demo":
        moment = draw(st.sampled_from(DEMO_MOMENTS) | st.sampled_from([0.0, 1.5, 4.0]))
    else:
        moment = draw(st.sampled_from([0.0, 0.8, "ready"]))
    return dict(
        command=command,
        signum=int(draw(st.sampled_from(SIGNALS))),
        group=draw(st.booleans()),
        moment=moment,
        broker=draw(st.sampled_from(BROKERS)) if command == "demo" else "redis",
        # Redis: an agent's job on the configured broker makes it not the demo's (refused);
        # RabbitMQ: the demo plays beside it on a vhost of its own.
        foreign=command == "demo" and draw(st.booleans()),
    )


def _start(run: dict[str, object], tmp_path: Path, broker_url: str) -> tuple[Command, str]:
    env = {"CELERY_BROKER_URL": broker_url, "MEMORY_WORKER_SOFT_SHUTDOWN_S": "1"}
    if run["command"] == "demo":
        return Command(["demo"], tmp_path, env), DEMO_READY
    if run["command"] == "worker":
        return Command(["worker", "-c", "2"], tmp_path, env), " ready."
    env |= {"FLOWER_BASIC_AUTH": "u:p"}
    return Command(["flower", "--port", str(free_port())], tmp_path, env), "Visit me at"


@given(run=runs())
@settings(
    max_examples=EXAMPLES,
    derandomize=EXAMPLES <= 8,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_a_signal_at_any_moment_ends_the_command_and_all_it_started(
    run: dict[str, object], tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> None:
    from tests.support.brokers import purge

    rabbit = run["broker"] == "rabbitmq"
    url = request.getfixturevalue("rabbitmq_url") if rabbit else os.environ["CELERY_BROKER_URL"]
    purge(url, [FINALIZE_QUEUE])
    foreign = bool(run["foreign"])
    if foreign:
        queue_foreign_job(url)
    cmd, ready_line = _start(run, tmp_path_factory.mktemp("cmd"), url)
    moment = run["moment"]
    if isinstance(moment, float):
        time.sleep(moment)
    else:
        cmd.wait_for_line(ready_line if moment == "ready" else str(moment), 120)
    code, left = _end(cmd, int(str(run["signum"])), bool(run["group"]))
    assert code is not None, f"{run}: the command did not exit\n{cmd.output[-3000:]}"
    assert not left, f"{run}: outlived the command: {left}\n{cmd.output[-3000:]}"
    if foreign:
        assert ready(url, FINALIZE_QUEUE) == 1, f"{run}: a job it did not create was touched"
    purge(url, [FINALIZE_QUEUE])


def _started_children(cmd: Command, timeout_s: float) -> bool:
    """Whether the command has started processes of its own (its worker and pool)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and cmd.proc.poll() is None:
        if len([p for p in tagged(cmd.tag) if p != cmd.proc.pid]) >= 2:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize(
    "args",
    [["bench", "workers", "--jobs", "20000"], ["eval", "fidelity", "--limit", "3"]],
    ids=["bench-workers", "eval-fidelity"],
)
def test_a_bench_or_eval_ended_by_sigterm_stops_the_workers_it_started(
    tmp_path: Path, broker: str, args: list[str]
) -> None:
    """Item 6 beyond the demo: the bench and the eval start workers of their own too."""
    if args[0] == "bench":
        args = [*args, "--broker-url", broker]
    cmd = Command(args, tmp_path, {"CELERY_BROKER_URL": broker})
    assert _started_children(cmd, 120), cmd.output[-3000:]
    code, left = _end(cmd, signal.SIGTERM)
    assert not left, f"outlived the command: {left}\n{cmd.output[-3000:]}"
    assert code in (1, 128 + signal.SIGTERM), cmd.output[-3000:]  # the eval: "interrupted"
