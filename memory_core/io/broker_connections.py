"""Broker connections kept for reuse by the publishers (`send_by_name`: enqueued turns, folds).

A new connection per publish cost more than the rest of a finalize: a TCP connect, AMQP's
handshake on RabbitMQ, kombu's set-up, 5-15 ms against a ~3 ms finalize (docs/BENCHMARKS.md,
"Publishing"). A few idle connections per broker URL are kept instead, per process:

- bounded: IDLE_PER_BROKER idle connections for each of at most MAX_BROKERS URLs; a connection
  in use is not kept, so threads that publish at once each get their own;
- a connection whose publish failed is dropped at once, never kept;
- a forked child starts with none, and never uses nor closes its parent's: closing an AMQP
  connection shuts its socket down, for the parent too (the parent's are left to the child's
  garbage collector, which only closes the child's copy of each descriptor).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import suppress
from typing import Any

IDLE_PER_BROKER = 4
MAX_BROKERS = 4


class IdleConnections:
    """Idle kombu connections by broker URL (thread-safe; see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_url: OrderedDict[str, list[Any]] = OrderedDict()

    def take(self, url: str) -> Any | None:
        """An idle connection to `url`, now the caller's; None when there is none."""
        with self._lock:
            kept = self._by_url.get(url)
            return kept.pop() if kept else None

    def keep(self, url: str, conn: Any) -> None:
        """Give back a connection whose publish succeeded (closed if enough are kept)."""
        surplus: list[Any] = []
        with self._lock:
            kept = self._by_url.setdefault(url, [])
            self._by_url.move_to_end(url)
            if len(kept) < IDLE_PER_BROKER:
                kept.append(conn)
            else:
                surplus.append(conn)
            while len(self._by_url) > MAX_BROKERS:
                surplus.extend(self._by_url.popitem(last=False)[1])
        for extra in surplus:
            drop(extra)

    def count(self, url: str) -> int:
        with self._lock:
            return len(self._by_url.get(url, ()))

    def clear(self) -> None:
        """Close every idle connection (tests, and a process that changes brokers)."""
        with self._lock:
            kept, self._by_url = self._by_url, OrderedDict()
        for conns in kept.values():
            for conn in conns:
                drop(conn)

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's connections are not ours to use or to close."""
        self._lock = threading.Lock()  # the parent may have held it when it forked
        self._by_url = OrderedDict()


def drop(conn: Any) -> None:
    """Close `conn` without waiting on a broker that may be gone; never raises.

    py-amqp's transport can drop its socket without the close handshake (`collect`). For the
    others kombu's `collect` would set the *process's* default socket timeout for a moment,
    which other threads' new sockets would take: Redis's `close` waits on nothing anyway.
    """
    with suppress(Exception):
        if hasattr(conn.transport, "_collect"):
            conn.collect()
        else:
            conn.close()


IDLE = IdleConnections()
os.register_at_fork(after_in_child=IDLE.forget_after_fork)
