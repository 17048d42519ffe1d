"""PostgreSQL: is it reachable, create a database, and a private cluster started with
`initdb`/`pg_ctl` (system binaries, else the `pgserver` wheel's) on a free port of 127.0.0.1."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.errors
from psycopg2 import sql
from sqlalchemy.engine import make_url

from memory_core.devservices.ports import free_port
from memory_core.devservices.system import (
    START_TIMEOUT_S,
    DevServicesError,
    PrivateServer,
    as_user,
    log_tail,
    run_as_user,
    traversable,
    wait_until_up,
)

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


def pg_connect_kwargs(database_url: str, dbname: str | None = None) -> dict[str, Any]:
    """psycopg2.connect() keyword arguments for a (SQLAlchemy- or libpq-style) URL."""
    url = make_url(database_url)
    kwargs: dict[str, Any] = url.translate_connect_args(username="user", database="dbname")
    kwargs.update({k: v for k, v in url.query.items() if isinstance(v, str)})
    if dbname is not None:
        kwargs["dbname"] = dbname
    kwargs.setdefault("connect_timeout", 2)
    return kwargs


def pg_reachable(database_url: str) -> bool:
    try:
        psycopg2.connect(**pg_connect_kwargs(database_url, "postgres")).close()
    except psycopg2.OperationalError as exc:
        if _PG_UNREACHABLE.search(str(exc)):
            return False
        where = make_url(database_url).render_as_string()  # password hidden
        raise DevServicesError(f"PostgreSQL answers at {where} but: {exc}") from exc
    return True


def create_database(database_url: str, name: str) -> bool:
    """Create database `name` unless it exists; True if this call created it."""
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


def pg_root(data_dir: Path, user: str | None) -> Path:
    """data_dir/pg, unless `user` cannot reach it or the socket path would be too long."""
    root = data_dir / "pg"
    if (user is None or traversable(data_dir, user)) and len(str(root)) < 80:
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


def pg_binaries(want_major: str | None) -> tuple[Path, str, str]:
    """(bindir, label, major version) of usable initdb/pg_ctl, matching `want_major` if set."""
    seen: list[str] = []
    user = run_as_user()
    for bindir, label in _pg_bindirs():
        if not ((bindir / "initdb").exists() and (bindir / "pg_ctl").exists()):
            continue
        if user and not traversable(bindir, user):  # e.g. a venv under /root
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


def server_options(port: int, run_dir: Path) -> str:
    """`pg_ctl start -o` of a private server: 127.0.0.1:`port`, socket in `run_dir`, no fsync."""
    return f"-c listen_addresses=127.0.0.1 -p {port} -k {shlex.quote(str(run_dir))} {_PG_FAST}"


def _probe_url(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def _running_port(pgdata: Path) -> int | None:
    """Port of a postmaster already serving `pgdata` (postmaster.pid line 4), if it answers."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        port = int(lines[3])
    except (OSError, IndexError, ValueError):
        return None
    return port if pg_reachable(_probe_url(port)) else None


@dataclass
class PrivateCluster:
    """Where a private cluster keeps its state, and how to run its binaries on it."""

    root: Path
    user: str | None

    @classmethod
    def under(cls, data_dir: Path) -> PrivateCluster:
        user = run_as_user()
        return cls(pg_root(data_dir, user), user)

    @property
    def pgdata(self) -> Path:
        return self.root / "data"

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def run(self, bindir: Path, *args: str) -> None:
        cmd = as_user([str(bindir / args[0]), *args[1:]], self.user)
        # cwd=root: the unprivileged user may not be allowed into the caller's cwd.
        proc = subprocess.run(
            cmd,
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
            timeout=START_TIMEOUT_S * 2,
        )
        if proc.returncode:
            raise DevServicesError(
                f"{shlex.join(cmd)} failed ({proc.returncode}):\n"
                f"{proc.stdout}{proc.stderr}{log_tail(self.log)}"
            )

    def prepare(self) -> None:
        """The run dir and log, owned by the user that runs the server."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        if self.user is not None:
            import pwd

            pw = pwd.getpwnam(self.user)
            for path in (self.root, self.run_dir, self.log):
                os.chown(path, pw.pw_uid, pw.pw_gid)
        os.chmod(self.root, 0o700)


def start_postgres(data_dir: Path) -> PrivateServer:
    """A private cluster under `data_dir` (initialised on first use), or the one running there."""
    cluster = PrivateCluster.under(data_dir)
    port = _running_port(cluster.pgdata)
    if port is not None:
        note = f"private PostgreSQL already running on 127.0.0.1:{port}"
        return PrivateServer(port, note, None, cluster.root)
    version_file = cluster.pgdata / "PG_VERSION"
    want = version_file.read_text().strip() if version_file.exists() else None
    bindir, label, major = pg_binaries(want)
    cluster.prepare()
    pgdata = str(cluster.pgdata)
    if want is None:
        initdb = shlex.split("-U postgres -A trust -E UTF8 --no-locale -N")
        cluster.run(bindir, "initdb", "-D", pgdata, *initdb)
    port = free_port()
    options = server_options(port, cluster.run_dir)
    cluster.run(
        bindir, "pg_ctl", "-D", pgdata, "-l", str(cluster.log), "-w", "-o", options, "start"
    )

    def stop() -> None:
        cluster.run(bindir, "pg_ctl", "-D", pgdata, "-m", "fast", "-w", "stop")

    try:
        wait_until_up(lambda: pg_reachable(_probe_url(port)), "private PostgreSQL", cluster.log)
    except DevServicesError:
        stop()
        raise
    as_whom = f", as user {cluster.user}" if cluster.user else ""
    note = (
        f"started private PostgreSQL {major} on 127.0.0.1:{port} ({label}{as_whom}; data {pgdata})"
    )
    return PrivateServer(port, note, stop, cluster.root)


def stop_postgres(data_dir: Path) -> None:
    """Stop a private cluster left running under `data_dir`, if there is one."""
    cluster = PrivateCluster.under(data_dir)
    if (cluster.pgdata / "postmaster.pid").exists():
        bindir, _, _ = pg_binaries((cluster.pgdata / "PG_VERSION").read_text().strip())
        with contextlib.suppress(DevServicesError):
            cluster.run(bindir, "pg_ctl", "-D", str(cluster.pgdata), "-m", "fast", "-w", "stop")
