"""The world of the model-based tests (tests/test_model.py, tests/clusters/): one Redis (a
`FaultyRedis` or a `FaultyCluster`), a fake LLM, an engine with a lock timeout, and the
settings the machine's arithmetic is written for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from memory_core.devservices.fake_llm import FakeLLMServer
from memory_core.devservices.ports import free_port
from memory_core.settings import Settings, get_settings
from tests.support.cluster_faults import FaultyCluster
from tests.support.faults import FaultyRedis, RowLock, engine_with_lock_timeout
from tests.support.memory_model import (
    APP,
    RECENT,
    SUMMARY_MAX_TOKENS,
    THRESHOLD,
    TOKEN_TRIGGER,
    World,
)


@contextmanager
def model_world(server: FaultyRedis | FaultyCluster) -> Iterator[World]:
    """The servers, engine and settings a `MemoryMachine` runs against, on `server`."""
    database_url = get_settings().database_url
    engine = engine_with_lock_timeout(database_url, APP, lock_timeout_ms=300)
    base: dict[str, Any] = {
        "database_url": database_url,
        "redis_url": server.url,
        # Folds are run by the test itself: publishing meets a closed port, fast.
        "celery_broker_url": f"redis://127.0.0.1:{free_port()}/0",
        "langfuse_public_key": None,
        "langfuse_secret_key": None,
        "memory_llm_timeout_s": 5.0,
        "memory_compression_threshold": THRESHOLD,
        "memory_max_recent_messages": RECENT,
        "memory_fold_token_trigger": TOKEN_TRIGGER,
        "memory_summary_max_tokens": SUMMARY_MAX_TOKENS,
        "memory_local_cache_size": 4,
    }
    with FakeLLMServer() as llm:
        world = World(
            redis=server,
            llm=llm,
            settings=Settings(
                _env_file=None,
                openai_base_url=llm.base_url,
                openai_api_key="sk-test",
                **base,
            ),
            llm_free=Settings(
                _env_file=None,
                openai_base_url=None,
                openai_api_key=None,
                **base,
            ),
            engine=engine,
            lock=RowLock(database_url),
            dead_redis_url=f"redis://127.0.0.1:{free_port()}/0",
        )
        try:
            yield world
        finally:
            world.lock.close()
            engine.dispose()
