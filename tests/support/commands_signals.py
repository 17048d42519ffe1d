"""Commands that start processes, run as an operator runs them, and what they leave behind.

Every command runs in a session of its own with a tag in its environment
(AGENT_MEMORY_TEST_TAG): every process it starts inherits it, whatever session or group that
process moves to, so `tagged(tag)` finds each one that outlived the command.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from celery import Celery

from memory_core.devservices.system import alive
from memory_core.io.queues import FINALIZE_QUEUE, FINALIZE_TASK, publish_options, task_queues
from tests.support import REPO

TAG = "AGENT_MEMORY_TEST_TAG"


def tagged(tag: str) -> list[int]:
    """Live processes whose environment carries `tag`."""
    marker = f"{TAG}={tag}\0".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


class Command:
    """`python -m memory_core.cli ARGS` in a session of its own; its output read as it comes."""

    def __init__(self, args: list[str], cwd: Path, env: Mapping[str, str]) -> None:
        self.tag = uuid.uuid4().hex
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        full = {**os.environ, "COLUMNS": "200", "PYTHONPATH": path, **env, TAG: self.tag}
        full.pop("MEMORY_SUMMARY_MAX_TOKENS", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_core.cli", *args],
            cwd=cwd,
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for raw in self.proc.stdout:
                self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, needle: str, timeout_s: float) -> bool:
        """Whether a line holding `needle` came before the command exited or `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                self._reader.join(5)
                return any(needle in line for line in self.lines)
            time.sleep(0.02)
        return False

    def signal(self, signum: int, group: bool = False) -> None:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)

    def wait(self, timeout_s: float) -> int | None:
        """Its exit code, or None if it still runs after `timeout_s`."""
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(5)
        return code

    def leftovers(self, settle_s: float = 5.0) -> list[int]:
        """Its processes still alive once it has exited (given `settle_s` to finish exiting)."""
        deadline = time.monotonic() + settle_s
        while (pids := tagged(self.tag)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return pids

    def kill_all(self) -> None:
        """What a failed check leaves: kill -9 everything tagged (it is ours)."""
        for pid in [self.proc.pid, *tagged(self.tag)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


def queue_foreign_job(broker_url: str) -> str:
    """A finalize job as an agent queues it on `broker_url`; its task id."""
    app = Celery("foreign-agent", broker=broker_url, set_as_current=False)
    app.conf.update(task_serializer="json", broker_connection_retry=False)
    app.conf.update(broker_read_url=broker_url, broker_write_url=broker_url)  # over the env's
    try:
        with app.connection_for_write() as conn:  # as a worker would have declared them
            for queue in task_queues(broker_url):
                queue(conn.default_channel).declare()
        snapshot = {"session_id": str(uuid.uuid4()), "thread_id": str(uuid.uuid4())}
        where = publish_options(broker_url, FINALIZE_QUEUE)
        return str(app.send_task(FINALIZE_TASK, args=[snapshot], **where).id)
    finally:
        app.close()
