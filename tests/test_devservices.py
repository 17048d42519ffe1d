"""memory_core.devservices against real servers: reachable ones, and private ones it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import psycopg2
import pytest
import redis

from memory_core.devservices import DevServices, ensure_services, pg_connect_kwargs
from memory_core.devservices.ports import free_port
from memory_core.settings import get_settings, reset_settings_cache
from tests.support import services as test_services

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _query(database_url: str, query: str, dbname: str | None = None) -> Any:
    conn = psycopg2.connect(**pg_connect_kwargs(database_url, dbname))
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(query)
            row = cur.fetchone() if cur.description else None
            return row[0] if row else None
    finally:
        conn.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevServices]:
    """Whatever this environment provides: configured servers if they answer, else private."""
    services = ensure_services(
        os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL),
        os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        tmp_path_factory.mktemp("base-services"),
    )
    yield services
    services.stop()


def test_reachable_servers_start_nothing_and_get_the_database(
    servers: DevServices, tmp_path: Path
) -> None:
    name = f"devservices_{uuid.uuid4().hex[:12]}"
    services = ensure_services(
        servers.database_url, servers.redis_url, tmp_path, database_name=name
    )
    try:
        assert services.started == []
        assert services.notes == [f"created database {name}"]
        assert services.redis_url == servers.redis_url
        assert _query(services.database_url, "SELECT current_database()") == name
        again = ensure_services(
            servers.database_url, servers.redis_url, tmp_path, database_name=name
        )
        assert again.started == again.notes == []
        assert not (tmp_path / "pg").exists()
        assert not (tmp_path / "redis").exists()
    finally:
        services.stop()  # nothing to stop: the servers keep running
        assert _query(servers.database_url, "SELECT 1", "postgres") == 1
        _query(servers.database_url, f'DROP DATABASE IF EXISTS "{name}"', "postgres")


def test_unreachable_servers_are_replaced_by_private_ones(tmp_path: Path) -> None:
    database_url = f"postgresql+psycopg2://postgres@127.0.0.1:{free_port()}/agent_memory_test"
    redis_url = f"redis://127.0.0.1:{free_port()}/3"
    data_dir = tmp_path / "services"
    pg_root: Path | None = None
    try:
        began = time.monotonic()
        services = ensure_services(database_url, redis_url, data_dir)
        first_start = time.monotonic() - began
        pg_root = services.pg_data_dir
        try:
            assert len(services.started) == 2, services.started
            assert "PostgreSQL" in services.started[0]
            assert "Redis" in services.started[1]
            assert services.database_url.startswith("postgresql+psycopg2://postgres@127.0.0.1:")
            assert services.database_url.endswith("/agent_memory_test")
            assert _query(services.database_url, "SELECT 1") == 1
            assert _query(services.database_url, "SELECT current_database()") == (
                "agent_memory_test"
            )
            assert services.redis_url.startswith("redis://127.0.0.1:")
            assert services.redis_url.endswith("/3")
            client = redis.Redis.from_url(services.redis_url)
            assert client.ping()
            client.close()

            # A second bootstrap while they run reuses them and owns nothing.
            again = ensure_services(database_url, redis_url, data_dir)
            assert again.started == []
            assert len(again.notes) == 2
            assert (again.database_url, again.redis_url) == (
                services.database_url,
                services.redis_url,
            )
            again.stop()
            assert _query(services.database_url, "SELECT 1") == 1
        finally:
            services.stop()

        with pytest.raises(psycopg2.OperationalError):
            psycopg2.connect(**pg_connect_kwargs(services.database_url)).close()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(services.redis_url, socket_connect_timeout=1).ping()

        # The initialised data dir is reused (no initdb): quicker, and the data is still there.
        began = time.monotonic()
        restarted = ensure_services(database_url, redis_url, data_dir)
        second_start = time.monotonic() - began
        try:
            assert len(restarted.started) == 2
            assert restarted.notes == []  # the database survived
            assert _query(restarted.database_url, "SELECT current_database()") == (
                "agent_memory_test"
            )
        finally:
            restarted.stop()
        print(f"private start: first {first_start:.2f}s, with initialised data {second_start:.2f}s")
    finally:
        if pg_root is not None and not pg_root.is_relative_to(tmp_path):
            shutil.rmtree(pg_root, ignore_errors=True)


def test_command_line_prints_exports(servers: DevServices) -> None:
    env = {**os.environ, "DATABASE_URL": servers.database_url, "REDIS_URL": servers.redis_url}
    out = subprocess.run(
        [sys.executable, "-m", "memory_core.devservices"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert f"export REDIS_URL={servers.redis_url}" in out.splitlines()
    assert "export DATABASE_URL=" in out
    assert "export CELERY_BROKER_URL=" in out


class _StubConfig:
    def __init__(self) -> None:
        self.stash = pytest.Stash()
        self.cleanups: list[Any] = []

    def add_cleanup(self, func: Any) -> None:
        self.cleanups.append(func)


@pytest.fixture
def saved_environ() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    reset_settings_cache()


@pytest.mark.usefixtures("saved_environ")
def test_bootstrap_services_exports_effective_urls(
    servers: DevServices, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(test_services, "TEST_DATA_DIR", tmp_path)
    # Not this session's own database: the cleanup below drops it.
    monkeypatch.setattr(test_services, "TEST_DATABASE", f"am_boot_{uuid.uuid4().hex[:8]}")
    os.environ["DATABASE_URL"] = servers.database_url
    os.environ["REDIS_URL"] = servers.redis_url
    os.environ.pop("CELERY_BROKER_URL", None)
    reset_settings_cache()
    config = _StubConfig()
    services = test_services.bootstrap_services(cast(pytest.Config, config))
    assert config.stash[test_services.SERVICES] is services
    assert config.cleanups[0] == services.stop and len(config.cleanups) == 2
    assert os.environ["DATABASE_URL"].endswith(f"/{test_services.TEST_DATABASE}")
    assert os.environ["REDIS_URL"] == os.environ["CELERY_BROKER_URL"] == servers.redis_url
    settings = get_settings()
    assert settings.database_url.endswith(f"/{test_services.TEST_DATABASE}")
    assert settings.celery_broker_url == servers.redis_url
    db = _query(os.environ["DATABASE_URL"], "SELECT current_database()")
    assert db == test_services.TEST_DATABASE
    config.cleanups[1]()  # drops the session database again
    gone = f"SELECT count(*) FROM pg_database WHERE datname = '{db}'"
    assert _query(servers.database_url, gone, "postgres") == 0
