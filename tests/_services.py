"""Test-session bootstrap of PostgreSQL and Redis; call `bootstrap_services` from conftest.py.

    def pytest_configure(config):
        bootstrap_services(config)

Uses the servers in DATABASE_URL / REDIS_URL when they answer, otherwise starts private ones
(state in .agent-memory/test-services), always with a database of its own
(`agent_memory_test_<pid>`, dropped at the end), and
exports the effective URLs so that subprocess workers inherit them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from memory_core.devservices import DevServices, ensure_services
from memory_core.settings import get_settings, reset_settings_cache

REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_DATA_DIR = REPO_ROOT / ".agent-memory" / "test-services"
# One database per test session: concurrent sessions (two developers' runs, an IDE) never
# drop each other's schema. Dropped again when the session ends.
TEST_DATABASE = f"agent_memory_test_{os.getpid()}"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/"
# config.stash[SERVICES] holds the DevServices (e.g. for a pytest_report_header).
SERVICES = pytest.StashKey[DevServices]()


def bootstrap_services(config: pytest.Config) -> DevServices:
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
    os.environ["DATABASE_URL"] = services.database_url
    os.environ["REDIS_URL"] = services.redis_url
    os.environ["CELERY_BROKER_URL"] = services.redis_url
    reset_settings_cache()
    return services


def _drop_database(database_url: str) -> None:
    from sqlalchemy import create_engine, text

    from memory_core.db import reset_engines

    reset_engines()
    url = make_url(database_url).set(drivername="postgresql+psycopg2")
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    finally:
        admin.dispose()
