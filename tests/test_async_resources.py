"""The asyncio clients' resources stay bounded whatever the host does with its event loops.

- A host that runs each call in its own `asyncio.run()` and never closes anything does not
  pile up Postgres connections: the entries of closed loops are dropped (memory_core/io/aio.py).
- A broker that stops answering holds only the publish threads: the loop's default executor
  (which resolves host names for new connections) stays free.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

from memory_core import RedisConversationMemory, aenqueue_turn
from memory_core.io.aio import PUBLISH_THREADS
from memory_core.settings import get_settings
from tests.support.snapshots import make_snapshot
from tests.support.tcp_proxy import TcpProxy


def test_asyncio_run_per_call_without_closing_keeps_at_most_one_loops_connections() -> None:
    env = {**os.environ, "DATABASE_URL": get_settings().database_url}
    ran = subprocess.run(
        [sys.executable, "-m", "tests.support.loop_per_call", "8"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    held = [int(line) for line in ran.stdout.split()]
    assert len(held) == 8
    # Each call opened a connection on its own loop; only the newest loop's may remain.
    assert max(held) <= 1


def test_a_stuck_broker_never_starves_the_loops_default_executor() -> None:
    memory = RedisConversationMemory()
    broker = get_settings().celery_broker_url

    async def scenario(proxy: TcpProxy) -> tuple[bool, set[str]]:
        proxy.pause()  # the broker accepts connections and answers nothing
        sends = [
            asyncio.create_task(
                aenqueue_turn(make_snapshot(uuid.uuid4(), 1), memory=memory, broker_url=proxy.url)
            )
            for _ in range(PUBLISH_THREADS * 6)
        ]
        await asyncio.sleep(0)  # every send has started and waits for a publish thread
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: None)  # the default executor is free...
        pending = any(not send.done() for send in sends)  # ...while the publishes still hang
        proxy.resume()
        outcomes = await asyncio.gather(*sends)
        await memory.aclose()
        return pending, {o.status for o in outcomes}

    with TcpProxy.in_front_of(broker) as proxy:
        pending, statuses = asyncio.run(scenario(proxy))
    assert pending
    # A publish that timed out fell back to the in-process save; none was lost.
    assert statuses <= {"enqueued", "saved"}
