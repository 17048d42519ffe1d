"""Flower via `agent-memory flower`: basic auth on, both memory queues, Prometheus metrics."""

from __future__ import annotations

import base64
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

from memory_core.devservices.poll import wait_for
from memory_core.devservices.ports import free_port
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


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret"}
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

    wait_for(up, 60, "flower", lambda: (tmp_path / "flower.log").read_text())
    yield base
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(20)


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


def test_flower_refuses_to_start_without_credentials(tmp_path: Path) -> None:
    out = run_module("memory_core.cli", "flower", env={"FLOWER_BASIC_AUTH": ""})
    assert out.returncode == 1
    assert (
        out.stderr.strip() == "error: Flower needs basic auth: set FLOWER_BASIC_AUTH=user:password"
    )
