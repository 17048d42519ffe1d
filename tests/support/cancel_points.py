"""Cancel a coroutine at its N-th suspension: each await that really waits (a round trip to
Postgres or Redis, a thread's result, a pause) is where a client disconnect or a request
timeout can cut an asyncio call short. `cut_at(coro, n)` runs `coro` as a task and cancels it
exactly when it suspends for the n-th time; `suspensions(coro)` counts them on a run left
alone. No clock decides where the cut falls.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


@types.coroutine
def _counting(
    coro: Coroutine[Any, Any, T], seen: list[int], cut: int | None
) -> Generator[Any, Any, T]:
    """`coro`, counting the futures it suspends on; cancels its own task at the `cut`-th (the
    task then cancels that very future: the await receives CancelledError)."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            future = coro.send(value) if error is None else coro.throw(error)
        except StopIteration as stop:
            return stop.value
        seen[0] += 1
        if seen[0] == cut:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
        try:
            value, error = (yield future), None
        except BaseException as exc:  # handed to the coroutine, as a task does
            value, error = None, exc


async def cut_at(coro: Coroutine[Any, Any, T], n: int | None) -> tuple[T | None, int, bool]:
    """Run `coro` and cancel it at its `n`-th suspension (None: never). Returns (its result,
    the suspensions seen, whether it ended cancelled). Any other exception propagates."""
    seen = [0]

    async def run() -> T:
        return await _counting(coro, seen, n)

    task = asyncio.ensure_future(run())
    try:
        return await task, seen[0], False
    except asyncio.CancelledError:
        if not task.cancelled():
            raise  # the caller itself was cancelled
        return None, seen[0], True


async def suspensions(coro: Coroutine[Any, Any, Any]) -> int:
    """How many times `coro` suspends when nothing cuts it."""
    return (await cut_at(coro, None))[1]
