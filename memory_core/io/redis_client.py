"""Redis clients tuned to fail fast: an unreachable cache must degrade to Postgres quickly."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memory_core.settings import get_settings

_CLIENTS: dict[str, redis.Redis] = {}


def make_redis(url: str, *, socket_timeout: float = 2.0) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=1.0,
        socket_timeout=socket_timeout,
        health_check_interval=30,
        # One quick retry covers a stale pooled connection after a Redis restart; more would
        # only delay the fallback to Postgres. Never after a timeout: a Redis that hangs costs
        # one socket timeout per call, not two or four (tests/test_core_faults_hostile.py).
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
        decode_responses=False,
    )


def get_redis(url: str | None = None) -> redis.Redis:
    url = url or get_settings().redis_url
    if url not in _CLIENTS:
        _CLIENTS[url] = make_redis(url)
    return _CLIENTS[url]


def reset_redis_clients() -> None:
    for client in _CLIENTS.values():
        client.close()
    _CLIENTS.clear()
