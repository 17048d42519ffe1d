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
import uuid
import warnings

from sqlalchemy import text

from memory_core import RedisConversationMemory, save_session_to_thread_safe
from memory_core.db import get_engine
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
        with get_engine().connect() as conn:
            print(conn.execute(QUERY).scalar_one(), flush=True)
    os._exit(0)  # no interpreter teardown noise


if __name__ == "__main__":
    main(int(sys.argv[1]))
