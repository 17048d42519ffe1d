"""`BoundedCache`: the one kind of per-process cache the library keeps.

Bounded in entries *and* in bytes (the caller states each entry's size), least recently used
evicted first, thread-safe. A long-running worker folds an unbounded stream of distinct texts;
a cache keyed by text without a byte bound grew a fold worker by tens of MiB and never gave
it back.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """LRU map with at most `max_entries` entries and `max_bytes` bytes; either 0 disables it.

    An entry larger than `max_bytes / 8` is not cached at all: one huge value must not
    flush everything else.
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._data.get(key)
            if found is None:
                return None
            self._data.move_to_end(key)
            return found[0]

    def put(self, key: K, value: V, size: int) -> None:
        if self.max_entries <= 0 or self.max_bytes <= 0 or size > self.max_bytes // 8:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._data[key] = (value, size)
            self._bytes += size
            while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._data.popitem(last=False)
                self._bytes -= dropped

    def pop(self, key: K) -> None:
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= old[1]

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    @property
    def entries(self) -> int:
        return len(self._data)

    @property
    def bytes(self) -> int:
        return self._bytes
