"""The connection pools hand out the connection used last (LIFO, memory_core/io/db.py): its
backend is warm, and surplus connections rest instead of taking turns (bench core: the
FIFO pool's alternation cost a save ~100 µs)."""

from __future__ import annotations

import asyncio

from memory_core.io.aio import make_async_engine
from memory_core.io.db import make_engine
from memory_core.settings import get_settings


def test_the_blocking_pool_hands_out_the_connection_returned_last() -> None:
    engine = make_engine(get_settings().database_url)
    try:
        first, second = engine.raw_connection(), engine.raw_connection()
        returned_last = second.dbapi_connection
        assert first.dbapi_connection is not returned_last
        first.close()
        second.close()
        again = engine.raw_connection()
        assert again.dbapi_connection is returned_last  # FIFO would give `first`'s back
        again.close()
    finally:
        engine.dispose()


def test_the_asyncio_pool_hands_out_the_connection_returned_last() -> None:
    async def scenario() -> bool:
        engine = make_async_engine(get_settings().database_url)
        try:
            first, second = await engine.connect(), await engine.connect()
            returned_last = (await second.get_raw_connection()).driver_connection
            await first.close()
            await second.close()
            async with engine.connect() as again:
                return (await again.get_raw_connection()).driver_connection is returned_last
        finally:
            await engine.dispose()

    assert asyncio.run(scenario())
