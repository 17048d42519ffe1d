"""The PostgreSQL and Redis that tests run against.

* `bootstrap_services`: the session's servers. Uses those in DATABASE_URL / REDIS_URL when they
  answer, otherwise starts private ones (state in .agent-memory/test-services), always with a
  database of its own (`agent_memory_test_<pid>`, dropped at the end), and exports the
  effective URLs so that subprocess workers inherit them.
* `PrivatePostgres`, `PrivateRedis`: servers a test may stop, kill and restart (the
  reliability suite's, tests/support/faults.py's). Both listen on spare ports of 127.0.0.1 with
  state in a throwaway directory, so the servers other test sessions use are never touched.
  PostgreSQL comes from `memory_core.devservices` (initdb/pg_ctl, as an unprivileged user when
  running as root); Redis is a `redis-server` child with AOF on (`--appendonly yes
  --appendfsync everysec`, `noeviction`: what docs/OPERATIONS.md asks of a Redis that is also
  the broker).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import pytest
import redis
from redis import Redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from memory_core.devservices import DevServices, ensure_services, pg_connect_kwargs
from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.postgres import PrivateCluster, pg_binaries, server_options
from memory_core.devservices.redis_server import redis_binary
from memory_core.devservices.system import run_as_user
from memory_core.io.db import reset_engines
from memory_core.settings import get_settings, reset_settings_cache
from tests.support import REPO

TEST_DATA_DIR = REPO / ".agent-memory" / "test-services"
# Redis databases of the session's server: 0 is the developer's, 1-2 are left to the demo and
# developers, 3-15 belong to test sessions (below).
FIRST_TEST_DB, REDIS_DBS = 3, 16
# One database per test session: concurrent sessions (two developers' runs, an IDE) never
# drop each other's schema. Dropped again when the session ends.
TEST_DATABASE = f"agent_memory_test_{os.getpid()}"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/"
# config.stash[SERVICES] holds the DevServices (e.g. for a pytest_report_header).
SERVICES = pytest.StashKey[DevServices]()


def xdist_worker() -> int | None:
    """This process's index among pytest-xdist's workers (gw0 -> 0), or None when it runs the
    tests itself (no `-n`) or is xdist's controller."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else None


def _redis_db(redis_url: str, db: int) -> str:
    return urlunsplit(urlsplit(redis_url)._replace(path=f"/{db}"))


def bootstrap_services(config: pytest.Config) -> DevServices:
    """Find or start the session's servers; export DATABASE_URL, REDIS_URL, CELERY_BROKER_URL.

    Under pytest-xdist the controller finds or starts the servers and its workers inherit the
    URLs; each worker then has a database of its own (by pid) and two Redis databases of its
    own (data and broker, by worker index), so workers never see each other's keys or jobs."""
    settings = get_settings()
    # Only the server of DATABASE_URL is used: tests always get their own database.
    explicit = "database_url" in settings.model_fields_set
    base = make_url(settings.database_url if explicit else DEFAULT_DATABASE_URL)
    services = ensure_services(
        base.set(database=TEST_DATABASE).render_as_string(hide_password=False),
        settings.redis_url,
        TEST_DATA_DIR,
        database_name=TEST_DATABASE,
    )
    config.add_cleanup(services.stop)
    config.add_cleanup(lambda: _drop_database(services.database_url))
    config.stash[SERVICES] = services
    redis_url = services.redis_url
    worker = xdist_worker()
    if worker is not None:
        if FIRST_TEST_DB + 2 * worker + 1 >= REDIS_DBS:
            raise pytest.UsageError(
                f"at most {(REDIS_DBS - FIRST_TEST_DB) // 2} xdist workers: each needs two of "
                f"Redis's {REDIS_DBS} databases"
            )
        redis_url = _redis_db(redis_url, FIRST_TEST_DB + 2 * worker)
    os.environ["DATABASE_URL"] = services.database_url
    os.environ["REDIS_URL"] = redis_url
    os.environ["CELERY_BROKER_URL"] = redis_url
    reset_settings_cache()
    return services


def session_broker_url(redis_url: str) -> str:
    """The session's broker: a Redis database of its own, so that test jobs mix with nothing
    else and can be purged freely. An xdist worker's is the one after its data database; a
    session without xdist takes one of 3-15 by pid (concurrent sessions rarely share one)."""
    worker = xdist_worker()
    if worker is not None:
        return _redis_db(redis_url, FIRST_TEST_DB + 2 * worker + 1)
    return _redis_db(redis_url, FIRST_TEST_DB + os.getpid() % (REDIS_DBS - FIRST_TEST_DB))


def _drop_database(database_url: str) -> None:
    reset_engines()
    url = make_url(database_url).set(drivername="postgresql+psycopg2")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    finally:
        admin.dispose()


class PrivatePostgres:
    """A private PostgreSQL cluster started by devservices; stop/start keep its port."""

    def __init__(self, data_dir: Path, database: str, redis_url: str) -> None:
        # `redis_url` answers (PrivateRedis), so ensure_services starts only PostgreSQL.
        self.services: DevServices = ensure_services(
            f"postgresql://postgres@127.0.0.1:{free_port()}/{database}",
            redis_url,
            data_dir,
            database_name=database,
        )
        self.url = self.services.database_url
        assert self.services.pg_data_dir is not None, self.services.started
        self.cluster = PrivateCluster(self.services.pg_data_dir, run_as_user())
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        version = (self.cluster.pgdata / "PG_VERSION").read_text().strip()
        self.bindir = pg_binaries(version)[0]

    def _pg_ctl(self, *args: str) -> None:
        self.cluster.run(self.bindir, "pg_ctl", "-D", str(self.cluster.pgdata), *args)

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
        options = server_options(self.port, self.cluster.run_dir)
        self._pg_ctl("-l", str(self.cluster.log), "-w", "-o", options, "start")
        wait_for(self.reachable, 30, "PostgreSQL to restart", interval_s=0.05)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.services.stop()


class PrivateRedis:
    """`redis-server` with AOF on, as a child process: SIGTERM (clean) or SIGKILL (crash)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "redis-aof"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.exe = redis_binary()[0]
        self.port = free_port()
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
        wait_for(self.reachable, 30, "Redis to start", interval_s=0.05)

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


@dataclass
class Stack:
    """The reliability suite's own PostgreSQL and Redis (fixture `stack`)."""

    pg: PrivatePostgres
    redis: PrivateRedis
    data_dir: Path

    @property
    def database_url(self) -> str:
        return self.pg.url

    @property
    def redis_url(self) -> str:
        return self.redis.url

    def client(self) -> Redis:  # (`redis` in this class is the field, not the module)
        return redis.Redis.from_url(self.redis.url)
