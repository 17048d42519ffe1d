"""A host that runs every memory call in its own `asyncio.run()` and never closes anything.

Run as a script (tests/test_async_resources.py) so the garbage collector, not pytest's
unraisable-exception hook, decides when abandoned connections go. Prints, after each call,
how many Postgres backends this process holds through the asyncio engine.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
import uuid
import warnings

from sqlalchemy import text

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.io.db import get_engine
from tests.support.snapshots import make_snapshot

QUERY = text(
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'agent-memory-async' "
    "AND datname = current_database() AND client_port IS NOT NULL"
)


def main(calls: int) -> None:
    warnings.simplefilter("ignore", ResourceWarning)  # abandoned on purpose
    memory = RedisConversationMemory()
    tid = uuid.uuid4()
    assert save_session_to_thread_safe(make_snapshot(tid, 1), memory=memory).ok
    for _ in range(calls):
        memory.invalidate(tid)  # a miss: every call reads Postgres on its own loop
        ctx = asyncio.run(memory.aget_context(tid, "user-42"))
        assert [t.seq for t in ctx.recent] == [1]
        gc.collect()
        print(_held(), flush=True)
    os._exit(0)  # no interpreter teardown noise


def _held() -> int:
    """Backends of this engine, once those whose client hung up have gone: a backend ends a
    moment after its socket closes, so one count taken at once may still see it."""
    deadline = time.monotonic() + 5
    while True:
        with get_engine().connect() as conn:
            held = int(conn.execute(QUERY).scalar_one())
        if held <= 1 or time.monotonic() > deadline:
            return held
        time.sleep(0.05)


if __name__ == "__main__":
    main(int(sys.argv[1]))
