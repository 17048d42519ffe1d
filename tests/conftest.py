"""Test session setup: real Postgres and Redis (found or started), and every fixture module.

Fixtures are defined in tests/fixtures/ and registered here; helpers tests import are in
tests/support/.
"""

from __future__ import annotations

import os

import pytest

from memory_core.settings import reset_settings_cache
from tests.support.services import bootstrap_services, session_broker_url

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.broker",
    "tests.fixtures.faults",
    "tests.fixtures.llm",
    "tests.fixtures.workers",
]


def pytest_configure(config: pytest.Config) -> None:
    services = bootstrap_services(config)
    os.environ["CELERY_BROKER_URL"] = session_broker_url(services.redis_url)
    reset_settings_cache()
