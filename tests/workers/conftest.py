"""Fixtures for real subprocess workers: a fake LLM, a private event stream, a clean broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from memory_core.settings import get_settings
from tests.fakes.llm_server import FakeLLMServer
from tests.workers.harness import WorkerProcess, producer, worker_test_env


@pytest.fixture
def llm() -> Iterator[FakeLLMServer]:
    with FakeLLMServer(delay_s=3.0) as server:
        yield server


@pytest.fixture
def events_stream(redis_client: redis.Redis) -> Iterator[str]:
    name = f"memory:events:test:{uuid.uuid4().hex[:8]}"
    yield name
    redis_client.delete(name, f"{name}:dead")


@pytest.fixture
def worker_env(llm: FakeLLMServer, events_stream: str) -> dict[str, str]:
    return worker_test_env(llm.base_url, events_stream)


@pytest.fixture
def start_worker(
    tmp_path: Path, worker_env: dict[str, str]
) -> Iterator[Callable[..., WorkerProcess]]:
    started: list[WorkerProcess] = []
    broker = redis.Redis.from_url(get_settings().celery_broker_url)
    broker.flushdb()  # the test broker database only: no leftovers from earlier tests

    def start(**kwargs: Any) -> WorkerProcess:
        env = {**worker_env, **kwargs.pop("env", {})}
        w = WorkerProcess(tmp_path, env=env, **kwargs).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.terminate(30)
    broker.close()


@pytest.fixture
def agent() -> Celery:
    return producer()
