"""Proof that a coroutine never blocks its event loop, without measuring any time.

`Heartbeat` is a task that counts ticks (`await asyncio.sleep(0.001)` in a loop): it ticks
only while the loop is free. `step_through(call, proxies, heartbeat)` runs `call` with every
byte to its servers held by paused `TcpProxy`s; each time the call's bytes are stuck on a
proxy it waits until the heartbeat ticked `ticks` more times, checks that the call is still
pending (bytes it does not wait for, such as a closing connection's goodbye, may still be
held when it returns), then lets that round trip through (`release_held`). A call
that waited on a socket synchronously would freeze the loop with its bytes held: no tick, and
the held bytes are only released by the watchdog (a thread that resumes the proxies if nothing
moves for `guard_s`), which fails the test. So every round trip the call makes to Redis or
PostgreSQL is shown to be awaited, not blocked on, and the number of round trips is reported.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, TypeVar

from tests.support.tcp_proxy import TcpProxy

T = TypeVar("T")
TICKS = 20
GUARD_S = 30.0


class Heartbeat:
    """Counts ticks of a 1 ms sleep loop; `async with Heartbeat() as hb:`."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self.ticks += 1

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._beat())
        await asyncio.sleep(0)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def until(self, ticks: int, while_pending: asyncio.Future[Any] | None = None) -> bool:
        """Wait until the heartbeat reached `ticks`: True; False if `while_pending` finished
        first."""
        while self.ticks < ticks:
            if while_pending is not None and while_pending.done():
                return False
            await asyncio.sleep(0.001)
        return True


class Watchdog:
    """Resumes the proxies from a thread if the test's loop stops stepping them (blocked)."""

    def __init__(self, proxies: Sequence[TcpProxy], guard_s: float) -> None:
        self.proxies = proxies
        self.fired = False
        self._progress = threading.Event()
        self._done = threading.Event()
        self._guard_s = guard_s
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def _watch(self) -> None:
        while not self._done.is_set():
            if self._progress.wait(self._guard_s):
                self._progress.clear()
                continue
            if self._done.is_set():
                return
            self.fired = True
            for proxy in self.proxies:
                proxy.resume()
            return

    def progress(self) -> None:
        self._progress.set()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._progress.set()
        self._thread.join(5)


@dataclass
class Stepped:
    """What `step_through` saw: the call's result, its held round trips, the ticks meanwhile."""

    result: Any
    round_trips: int = 0
    ticks_while_held: int = 0
    by_proxy: dict[int, int] = field(default_factory=dict)


async def step_through(
    call: Awaitable[T],
    proxies: Sequence[TcpProxy],
    heartbeat: Heartbeat,
    *,
    ticks: int = TICKS,
    guard_s: float = GUARD_S,
) -> Stepped:
    """Run `call` with `proxies` paused, one held round trip at a time (module docstring)."""
    for proxy in proxies:
        proxy.pause()
    task: asyncio.Task[T] = asyncio.ensure_future(call)
    seen = Stepped(result=None)
    try:
        with Watchdog(proxies, guard_s) as dog:
            while not task.done():
                dog.progress()  # this loop runs: it is not frozen
                held = [p for p in proxies if p.held_bytes > 0]
                if not held:
                    await asyncio.sleep(0.001)
                    continue
                start = heartbeat.ticks
                if not await heartbeat.until(start + ticks, while_pending=task):
                    break  # it did not wait for these bytes (a connection's goodbye)
                seen.ticks_while_held += heartbeat.ticks - start
                seen.round_trips += 1
                for proxy in held:
                    seen.by_proxy[proxy.port] = seen.by_proxy.get(proxy.port, 0) + 1
                    proxy.release_held()
            assert not dog.fired, "the watchdog had to resume the proxies: the loop was blocked"
    finally:
        for proxy in proxies:
            proxy.resume()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    seen.result = task.result()
    return seen
