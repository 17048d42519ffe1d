"""Flower via `agent-memory flower`: basic auth on, both memory queues, Prometheus metrics."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection

from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.rabbitmq import PrivateRabbitMQ
from memory_core.io.queues import FINALIZE_QUEUE, FOLD_QUEUE, task_queues
from memory_core.settings import get_settings
from tests.support import REPO
from tests.support.commands import run_module
from tests.support.snapshots import make_snapshot
from tests.support.workers import producer, send_finalize


def _get(url: str, auth: str | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


@contextlib.contextmanager
def running_flower(tmp_path: Path, extra_env: dict[str, str]) -> Iterator[str]:
    """`agent-memory flower` with basic auth ops:s3cret; its base URL, stopped afterwards."""
    port = free_port()
    env = {**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret", **extra_env}
    with (tmp_path / "flower.log").open("wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "memory_core.cli", "flower", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return _get(base + "/healthcheck")[0] in (200, 401)
        except OSError:
            return False

    try:
        wait_for(up, 60, "flower", lambda: (tmp_path / "flower.log").read_text())
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[str]:
    with running_flower(tmp_path, {}) as base:
        yield base


def test_flower_requires_basic_auth_and_shows_both_queues(flower: str) -> None:
    broker = redis.Redis.from_url(get_settings().celery_broker_url)
    broker.delete("memory.finalize", "memory.fold")
    agent = producer()
    for n in range(1, 4):  # no worker runs: the jobs wait in the queue
        send_finalize(agent, make_snapshot(uuid.uuid4(), n))
    assert _get(flower + "/")[0] == 401
    assert _get(flower + "/", "ops:wrong")[0] == 401
    assert _get(flower + "/", "ops:s3cret")[0] == 200
    status, body = _get(flower + "/api/queues/length", "ops:s3cret")
    assert status == 200
    lengths = {q["name"]: q["messages"] for q in json.loads(body)["active_queues"]}
    assert lengths == {"memory.finalize": 3, "memory.fold": 0}
    status, metrics = _get(flower + "/metrics", "ops:s3cret")
    assert status == 200 and "flower_events_total" in metrics
    broker.delete("memory.finalize")


@pytest.fixture
def rabbit_with_management() -> Iterator[PrivateRabbitMQ]:
    with PrivateRabbitMQ(management=True) as node:
        yield node


def test_flower_shows_both_rabbitmq_queues_through_the_management_api(
    rabbit_with_management: PrivateRabbitMQ,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """RabbitMQ tells queue lengths only through its management API (FLOWER_BROKER_API, as
    compose and deploy/ set it)."""
    node = rabbit_with_management
    url = node.url
    with Connection(url) as conn:  # the queues as a worker declares them at start
        for queue in task_queues(url):
            queue(conn.default_channel).declare()
    monkeypatch.setenv("CELERY_BROKER_URL", url)  # Celery prefers it to broker=
    api = f"http://127.0.0.1:{node.management_port}/api/"
    agent = producer(url)
    for n in range(1, 4):  # no worker runs: the jobs wait in the queue
        send_finalize(agent, make_snapshot(uuid.uuid4(), n))
    with running_flower(tmp_path, {"CELERY_BROKER_URL": url, "FLOWER_BROKER_API": api}) as base:
        assert _get(base + "/api/queues/length")[0] == 401

        def lengths() -> dict[str, int] | None:
            status, body = _get(base + "/api/queues/length", "ops:s3cret")
            if status != 200:
                return None
            got = {q["name"]: q.get("messages") for q in json.loads(body)["active_queues"]}
            # The management API refreshes its statistics every few seconds.
            return got if got.get(FINALIZE_QUEUE) == 3 else None

        got = wait_for(lengths, 60, "queue lengths from the management API")
    assert got == {FINALIZE_QUEUE: 3, FOLD_QUEUE: 0}


def test_flower_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    out = run_module("memory_core.cli", "flower", env={"FLOWER_BASIC_AUTH": ""})
    assert out.returncode == 1
    assert (
        out.stderr.strip() == "error: Flower needs basic auth: set FLOWER_BASIC_AUTH=user:password"
    )
