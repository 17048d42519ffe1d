"""Subprocess Celery workers on the real Redis broker, as operators run them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery

from memory_core.settings import get_settings

REPO = Path(__file__).resolve().parents[2]


def worker_test_env(llm_base_url: str, events_stream: str) -> dict[str, str]:
    """What every test worker runs with: the fake LLM, no Langfuse, its own event stream."""
    return {
        "OPENAI_BASE_URL": llm_base_url,
        "OPENAI_API_KEY": "sk-test",
        "LANGFUSE_PUBLIC_KEY": "",
        "LANGFUSE_SECRET_KEY": "",
        "MEMORY_LLM_TIMEOUT_S": "10",
        "MEMORY_EVENTS_STREAM": events_stream,
        "MEMORY_WORKER_SOFT_SHUTDOWN_S": "10",
    }


def run_module(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m module args` from the repo root, as a newcomer would run it; never raises."""
    return run_python("-m", module, *args, env=env)


def run_python(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python args` from the repo root with this environment (+ `env`); never raises."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class WorkerProcess:
    """`celery -A workers.app worker` in its own process group, logging to a file."""

    def __init__(
        self,
        tmp: Path,
        *,
        queues: str = "memory.finalize,memory.fold",
        concurrency: int = 2,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = f"w{uuid.uuid4().hex[:6]}@%h"
        self.log_path = tmp / f"{self.name.split('@')[0]}.log"
        # REMAP_SIGTERM as `agent-memory worker` sets it: SIGTERM means the soft shutdown.
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "REMAP_SIGTERM": "SIGQUIT",
            **(env or {}),
        }
        self.argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers.app",
            "worker",
            "-Q",
            queues,
            "-c",
            str(concurrency),
            "--pool",
            "prefork",
            "-l",
            "INFO",
            "-n",
            self.name,
            "--without-gossip",
            "--without-mingle",
            "--prefetch-multiplier",
            "1",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> WorkerProcess:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: " ready." in self.log(), timeout_s, "worker ready", self.log)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill_hard(self) -> None:
        """kill -9 the whole worker: main process and children, no chance to clean up."""
        os.killpg(self.pid, signal.SIGKILL)
        assert self.proc is not None
        self.proc.wait(10)

    def terminate(self, timeout_s: float = 60) -> int:
        if not self.alive():
            return self.proc.returncode if self.proc else 0
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.pid, signal.SIGKILL)
            return self.proc.wait(10)


def wait_for(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    extra = "\n" + diagnostics()[-4000:] if diagnostics else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{extra}")


def producer() -> Celery:
    """A service that does not import this package: it sends jobs by task name."""
    app = Celery(
        "some-agent-service", broker=get_settings().celery_broker_url, set_as_current=False
    )
    app.conf.task_serializer = "json"
    return app


def send_finalize(app: Celery, snapshot: Any) -> None:
    app.send_task("memory.finalize_turn", args=[snapshot], queue="memory.finalize")


def send_fold(app: Celery, thread_id: Any) -> None:
    app.send_task("memory.fold_thread", args=[thread_id], queue="memory.fold")
