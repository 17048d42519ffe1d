"""SIGTERM landing while the worker's main thread holds a lock its shutdown needs: it still exits.

Celery runs its soft/cold shutdown inside the signal handler, on top of whatever the main thread
was doing. kombu's `Hub._ready_lock` is held, for a moment, by every `Hub.call_soon` (each ack,
each buffered task event) and by every loop iteration; cancelling the running job sends a
`task-cancelled` event, which calls `Hub.call_soon`. A SIGTERM handled inside that moment left
the worker waiting for itself: the log ended at "Initiating Soft Shutdown", the process never
exited (workers/shutdown.py). The moment is microseconds long; the probe below holds it open.
"""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from celery import Celery

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.poll import wait_for
from memory_core.devservices.workers import WorkerProcess
from tests.support.brokers import BROKERS, held
from tests.support.snapshots import make_snapshot
from tests.support.state import count_stored, thread_row
from tests.support.workers import send_finalize

SOFT_SHUTDOWN_S = 2
HOLD_S = 3
HOLDING = "shutdown probe: holding the hub lock"
RELEASED = "shutdown probe: released the hub lock"

# Imported by the worker (`-I shutdown_probe`): once the flag file appears, a hub timer holds
# the hub's call_soon lock in the worker's main thread for HOLD_S seconds, as Hub.call_soon
# does for a moment whenever the loop schedules a callback.
PROBE = f"""
import os
import time
from pathlib import Path

from celery.signals import worker_ready

FLAG = Path(os.environ["SHUTDOWN_PROBE_FLAG"])


@worker_ready.connect
def _arm(sender=None, **_):
    hub = sender.hub

    def hold_when_asked():
        if not FLAG.exists():
            return
        FLAG.unlink()
        with hub._ready_lock:
            print({HOLDING!r}, flush=True)
            end = time.monotonic() + {HOLD_S}
            while time.monotonic() < end:
                time.sleep(0.01)
        print({RELEASED!r}, flush=True)

    hub.call_repeatedly(0.05, hold_when_asked)
"""


@pytest.mark.parametrize("broker", BROKERS, indirect=True)
def test_sigterm_while_the_loop_holds_the_hub_lock_exits_and_hands_the_fold_back(
    start_worker: Callable[..., WorkerProcess],
    agent: Celery,
    llm: FakeLLMServer,
    broker: str,
    tmp_path: Path,
) -> None:
    (tmp_path / "shutdown_probe.py").write_text(textwrap.dedent(PROBE))
    flag = tmp_path / "hold-now"
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "SHUTDOWN_PROBE_FLAG": str(flag),
        "MEMORY_WORKER_SOFT_SHUTDOWN_S": str(SOFT_SHUTDOWN_S),
        "MEMORY_FOLD_LEASE_S": "3",
    }
    w = start_worker(concurrency=1, env=env, extra_args=["-I", "shutdown_probe"])
    tid = uuid.uuid4()
    for n in range(1, 21):
        send_finalize(agent, make_snapshot(tid, n))
    wait_for(lambda: count_stored([tid]) == 20, 60, "20 turns", w.log)
    llm.delay_s = 30.0
    llm.set_mode("timeout")  # the fold is running (an active, unacked job) at the SIGTERM
    send_finalize(agent, make_snapshot(tid, 21))
    wait_for(lambda: llm.calls >= 1, 60, "the fold's LLM call", w.log)
    flag.touch()
    wait_for(lambda: HOLDING in w.log(), 10, "the probe to hold the lock", w.log)
    assert RELEASED not in w.log(), "the SIGTERM must land while the lock is held"

    started = time.monotonic()
    code = w.stop(HOLD_S + SOFT_SHUTDOWN_S + 40)  # SIGTERM; SIGKILL if it outlasts this
    waited = time.monotonic() - started
    assert code == 0, f"exit code {code} after {waited:.0f} s (-9: it hung and was killed)"
    assert "Cold shutdown" in w.log()
    # Nothing stays held by the dead worker: the fold is back in the queue.
    wait_for(lambda: held(broker) == 0, 30, "nothing held by the stopped worker", w.log)

    llm.set_mode("ok")
    second = start_worker(concurrency=1, env={"MEMORY_FOLD_LEASE_S": "3"})
    wait_for(lambda: _thread_through(tid) == 11, 60, "the handed-back fold", second.log)


def _thread_through(tid: uuid.UUID) -> int | None:
    row = thread_row(tid)
    return None if row is None else row.summary_through_seq
