"""The reliability suite's own PostgreSQL and Redis, which it may stop, kill and restart.

Both listen on spare ports of 127.0.0.1 with state in a throwaway directory, so the shared
servers other test sessions use are never touched. PostgreSQL comes from
`memory_core.devservices` (initdb/pg_ctl, as an unprivileged user when running as root);
Redis is a `redis-server` child with AOF on (`--appendonly yes --appendfsync everysec`,
`noeviction`: what docs/OPERATIONS.md asks of a Redis that is also the broker).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg2
import redis

from memory_core import devservices
from memory_core.devservices import DevServices, ensure_services, pg_connect_kwargs
from tests.fakes.langfuse_server import closed_port


def _wait(check: object, what: str, timeout_s: float = 30.0) -> float:
    started = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - started > timeout_s:
            raise RuntimeError(f"{what} did not happen within {timeout_s:.0f}s")
        time.sleep(0.05)
    return time.monotonic() - started


class PrivatePostgres:
    """A private PostgreSQL cluster started by devservices; stop/start keep its port."""

    def __init__(self, data_dir: Path, database: str, redis_url: str) -> None:
        # `redis_url` answers (PrivateRedis), so ensure_services starts only PostgreSQL.
        self.services: DevServices = ensure_services(
            f"postgresql://postgres@127.0.0.1:{closed_port()}/{database}",
            redis_url,
            data_dir,
            database_name=database,
        )
        self.url = self.services.database_url
        assert self.services.pg_data_dir is not None, self.services.started
        root = self.services.pg_data_dir
        self.pgdata, self.run_dir, self.log = root / "data", root / "run", root / "postgres.log"
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        self.user = devservices._run_as_user()
        version = (self.pgdata / "PG_VERSION").read_text().strip()
        self.bindir = devservices._pg_binaries(version)[0]

    def _pg_ctl(self, *args: str) -> None:
        cmd = devservices._as_user(
            [str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), *args], self.user
        )
        subprocess.run(cmd, cwd=self.pgdata.parent, check=True, capture_output=True, timeout=60)

    def reachable(self) -> bool:
        try:
            psycopg2.connect(**pg_connect_kwargs(self.url, "postgres")).close()
        except psycopg2.OperationalError:
            return False
        return True

    def stop(self) -> None:
        """`pg_ctl stop -m fast`: sessions are terminated, in-flight transactions roll back."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.run_dir} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        self._pg_ctl("-l", str(self.log), "-w", "-o", options, "start")
        _wait(self.reachable, "PostgreSQL restart")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.services.stop()


class PrivateRedis:
    """`redis-server` with AOF on, as a child process: SIGTERM (clean) or SIGKILL (crash)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "redis-aof"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.exe = devservices._redis_binary()[0]
        self.port = closed_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        argv = [
            self.exe,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.dir),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--logfile", str(self.dir / "redis.log"),
        ]  # fmt: skip
        self.proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)
        _wait(self.reachable, "Redis start")

    def reachable(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=2)
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False
        finally:
            client.close()

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """SIGTERM: Redis flushes the AOF and exits; SIGKILL: a crash, the AOF is what was
        written (every acknowledged write is in the file; `everysec` only delays fsync)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        self.proc.wait(30)

    def close(self) -> None:
        self.stop(signal.SIGTERM)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def make_data_dir(base: Path) -> Path:
    """A per-session directory the unprivileged PostgreSQL user can traverse."""
    base.mkdir(parents=True, exist_ok=True)
    path = base / f"run-{os.getpid()}"
    remove_tree(path)
    path.mkdir()
    path.chmod(0o755)
    return path


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
