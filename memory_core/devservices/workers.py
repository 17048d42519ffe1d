"""Celery worker subprocesses, as operators run them: for the demo, the benchmarks and the tests.

A `WorkerProcess` runs `python -m celery -A <WORKER_APP> worker` (the worker package, found by
its installed name, so it works from a wheel as from a checkout) in a process group of its own,
logging to a file; it is ready once the log says " ready.". SIGTERM is remapped to Celery's
cold shutdown as `agent-memory worker` does (REMAP_SIGTERM=SIGQUIT): running jobs get
MEMORY_WORKER_SOFT_SHUTDOWN_S to finish, everything else the worker holds goes back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.signals import deferred
from memory_core.fold.publisher import FINALIZE_QUEUE, FOLD_QUEUE, WORKER_APP

QUEUES = f"{FINALIZE_QUEUE},{FOLD_QUEUE}"
LOG_TAIL_CHARS = 4000


def _exited(pid: int, timeout_s: float) -> bool:
    """Wait until child `pid` has exited, without reaping it (its pid stays its own)."""

    def done() -> bool:
        try:
            return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        except ChildProcessError:  # reaped already
            return True

    try:
        wait_for(done, timeout_s, f"process {pid} to exit", interval_s=0.02)
    except WaitTimeout:
        return False
    return True


class WorkerExited(RuntimeError):
    """A worker exited that nobody stopped; the message names its log."""


class WorkerProcess:
    """One Celery worker subprocess in its own process group, logging to `log_path`."""

    def __init__(
        self,
        log_dir: Path,
        *,
        name: str | None = None,
        queues: str = QUEUES,
        concurrency: int = 2,
        pool: str = "prefork",
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        argv: Sequence[str] | None = None,
    ) -> None:
        """`env` is added to this process's environment; `argv` replaces the whole command
        (e.g. `agent-memory worker`, whose options differ), keeping the rest of the handling."""
        self.name = name or f"w{uuid.uuid4().hex[:6]}"
        self.hostname = f"{self.name}@{socket.gethostname()}"
        self.log_path = Path(log_dir) / f"worker-{self.name}.log"
        self.env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "REMAP_SIGTERM": "SIGQUIT",
            **(env or {}),
        }
        self.options = ["-A", WORKER_APP, "worker", "-Q", queues, "-c", str(concurrency)]
        self.options += ["--pool", pool, "-l", "INFO", "--without-gossip", "--without-mingle"]
        self.options += ["--prefetch-multiplier", "1", *extra_args]
        self.argv = [sys.executable, "-m", "celery", *self.options, "-n", self.hostname]
        if argv is not None:
            self.argv = list(argv)
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopped = False

    @property
    def command(self) -> str:
        """The worker's command line as an operator would type it (without its node name)."""
        return " ".join(["celery", *self.options])

    def start(self, timeout_s: float = 60) -> Self:
        """Start it and wait until it is ready (WorkerExited if it exits first)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log, deferred():  # started and recorded as one step
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C or a group kill reaches only this worker
            )
        wait_for(self.ready, timeout_s, f"worker {self.name} to be ready", self.log)
        return self

    def ready(self) -> bool:
        self.check()
        return " ready." in self.log()

    def check(self) -> None:
        """Raise WorkerExited if the worker exited without being stopped."""
        code = self.exit_code
        if code is not None and not self.stopped:
            tail = self.log()[-LOG_TAIL_CHARS:]
            raise WorkerExited(
                f"worker {self.name} exited with code {code}; see {self.log_path}\n{tail}"
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"worker {self.name} was never started")
        return self.proc.pid

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the worker's pool processes."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM (soft shutdown), wait; SIGKILL the whole group if it outlasts `timeout_s`,
        after writing where each of its processes was stuck to its log. Whatever of its group
        outlived it is killed too. Returns the exit code (-9: it hung). Idempotent."""
        self.stopped = True
        if self.proc is None:
            return 0
        if self.proc.returncode is None:
            if not _exited(self.proc.pid, 0):
                self.proc.send_signal(signal.SIGTERM)
            if not _exited(self.proc.pid, timeout_s):
                self._record_hang(timeout_s)
            # The group leader is a zombie until reaped, so its group id names no one else.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(10)

    def _record_hang(self, timeout_s: float) -> None:
        """Append to the log that the worker outlasted its stop, and every process's Python
        stacks (py-spy, when installed): a hang seen once in CI must explain itself."""
        pids = subprocess.run(
            ["pgrep", "-g", str(self.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        lines = [f"\n=== {self.name} still running {timeout_s:g} s after SIGTERM: SIGKILL ==="]
        search = [str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]
        spy = shutil.which("py-spy", path=os.pathsep.join(search))
        if spy is None:
            lines.append(f"processes {' '.join(pids)} (install py-spy for their stacks)")
            pids = []
        for pid in pids:
            try:
                out = subprocess.run(
                    [str(spy), "dump", "--pid", pid],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                )
                failed = (out.stderr.strip().splitlines() or ["?"])[0]
                lines.append(out.stdout if out.returncode == 0 else f"pid {pid}: {failed}")
            except (OSError, subprocess.TimeoutExpired) as exc:
                lines.append(f"py-spy dump --pid {pid}: {exc!r}")
        with self.log_path.open("a") as log:
            log.write("\n".join(lines) + "\n")

    def kill_hard(self) -> None:
        """kill -9 the whole worker: main process and children, no chance to clean up."""
        self.stopped = True
        os.killpg(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)
