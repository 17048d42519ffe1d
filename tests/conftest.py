"""Test session setup: real Postgres and Redis (found or started), and every fixture module.

Fixtures are defined in tests/fixtures/ and registered here; helpers tests import are in
tests/support/.

The marker `workers` names the tests that start Celery workers (or beat, Flower, the demo, a
private RabbitMQ node): `make test-fast` leaves them out. It is set here for every test that
takes the `start_worker` fixture and for tests/workers/ and tests/reliability/; a test that
starts one another way carries it itself, and a test without it that starts a worker fails.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from memory_core.devservices.workers import WorkerProcess
from memory_core.settings import reset_settings_cache
from tests.support.services import bootstrap_services, session_broker_url

pytest_plugins = [
    "tests.fixtures.services",
    "tests.fixtures.broker",
    "tests.fixtures.faults",
    "tests.fixtures.llm",
    "tests.fixtures.workers",
]

WORKER_DIRS = {"workers", "reliability", "clusters"}


def pytest_configure(config: pytest.Config) -> None:
    services = bootstrap_services(config)
    os.environ["CELERY_BROKER_URL"] = session_broker_url(services.redis_url)
    reset_settings_cache()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0]
        if folder in WORKER_DIRS or "start_worker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.workers)
    items[:] = sorted(items, key=_module_rank(items))


def _module_rank(items: list[pytest.Item]) -> Callable[[pytest.Item], tuple[int, int, float]]:
    """Longest modules first: `slow` ones, then those with workers, the longest declared
    timeout first within each. xdist (`--dist loadfile --no-loadscope-reorder`) hands modules
    out in this order, so the last ones to start are short and no worker is left alone with a
    long module at the end. A module stays in one piece (its fixtures are set up once)."""
    ranks: dict[Path, tuple[int, int, float]] = {}
    for item in items:
        timeout = item.get_closest_marker("timeout")
        seconds = float(timeout.args[0]) if timeout and timeout.args else 0.0
        rank = (
            0 if item.get_closest_marker("slow") else 1,
            0 if item.get_closest_marker("workers") else 1,
            -seconds,
        )
        ranks[item.path] = min(ranks.get(item.path, rank), rank)
    return lambda item: ranks[item.path]


@pytest.fixture(autouse=True)
def _workers_only_where_marked(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Keep the marker true: `make test-fast` must not start what it promises to leave out."""
    if request.node.get_closest_marker("workers") is None:
        start = WorkerProcess.start

        def refuse(self: WorkerProcess, *args: Any, **kwargs: Any) -> WorkerProcess:
            if "celery" in self.argv:  # a stand-in process (argv=...) is not a worker
                raise AssertionError(
                    f"{request.node.nodeid} starts a worker: mark it @pytest.mark.workers"
                )
            return start(self, *args, **kwargs)

        monkeypatch.setattr(WorkerProcess, "start", refuse)
    yield
