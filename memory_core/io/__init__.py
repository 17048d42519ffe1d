"""How the memory talks to Postgres, Redis and the broker.

- `steps.py`: the memory's I/O as data (the steps its logic yields); `sync_driver.py` and
  `async_driver.py` perform them, `cancellation.py` says what happens when a caller is cancelled.
- `fast_write.py`: a `Write` step on the blocking driver, one prebuilt statement on a pooled
  DBAPI connection (the finalize's and the fold's single statements).
- `db.py` and `aio.py`: the engines and clients, blocking and asyncio.
- `redis_client.py`: Redis clients tuned to fail fast, one server or a Redis Cluster;
  `redis_kinds.py`: which of the two a `REDIS_URL` names (the settings check it too).
- `memory_clients.py`: the clients a `RedisConversationMemory` talks through.
- `queues.py` and `broker_connections.py`: the queue topology and the publishers' connections.
"""
