"""What the asyncio driver (async_driver.py) does when its caller is cancelled.

A cancellation (a client disconnect, a request timeout) cuts a step short, perhaps after it
took effect: a COMMIT whose reply was in flight. The driver throws `Cancelled` into the logic
at that `yield` at once, synchronously, so whatever the logic marks there (a copy behind) is
marked before anything else runs. The steps the logic yields next to put things right (drop
the copy) run on a task of their own, shielded: the caller gets its `CancelledError` when they
are done, or at once on a second cancellation (the task then finishes alone). Their time is
bounded by the clients' timeouts (Redis: the socket timeout).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from contextlib import suppress
from typing import Any, Protocol, TypeVar

from memory_core.logs import describe_error, get_logger


class Performs(Protocol):
    """What unwinding needs of the asyncio driver (async_driver.AsyncIO), so this module sits
    below the driver instead of importing it back."""

    async def do(self, step: Any) -> Any: ...

    async def close(self) -> None: ...


T = TypeVar("T")
log = get_logger(__name__)


class Cancelled(BaseException):
    """Thrown into the logic at the `yield` whose step the asyncio caller's cancellation cut
    short. The logic may catch it to put things right, by plain code and by yielding steps,
    and raises it again. The blocking driver never throws it."""


# Strong references to the tasks putting things right (the loop keeps only weak ones).
_UNWINDING: set[asyncio.Future[None]] = set()


async def unwind(steps: Generator[Any, Any, Any], io: Performs) -> None:
    """Throw `Cancelled` into `steps` now, then perform what they yield, shielded; closes
    both when done."""
    first = _resume(steps.throw, Cancelled())
    job = asyncio.ensure_future(_finish(steps, io, first))
    _UNWINDING.add(job)
    job.add_done_callback(_UNWINDING.discard)
    with suppress(asyncio.CancelledError):  # cancelled again: the job finishes alone
        await asyncio.shield(job)


async def never_lose_cancellation(call: Coroutine[Any, Any, T]) -> T:
    """`await call`, raising CancelledError if the task was cancelled meanwhile and the
    cancellation was swallowed below (Python 3.11's `wait_for` does when the awaited call
    completes at that moment; redis-py awaits every write through it). The call is complete
    then: nothing to put right, and the caller still hears of its cancellation."""
    task = asyncio.current_task()
    before = task.cancelling() if task is not None else 0
    try:
        result = await call
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if task is not None and task.cancelling() > before:
            raise asyncio.CancelledError() from exc  # the cancellation wins, as it would have
        raise
    if task is not None and task.cancelling() > before:
        raise asyncio.CancelledError()
    return result


async def _finish(steps: Generator[Any, Any, Any], io: Performs, step: Any) -> None:
    try:
        while step is not None:
            try:
                value = await io.do(step)
            except Exception as exc:
                step = _resume(steps.throw, exc)
            else:
                step = _resume(steps.send, value)
    finally:
        steps.close()
        await io.close()


def _resume(resume: Callable[[Any], Any], arg: Any) -> Any | None:
    """The logic's next step while it puts things right; None once it is done."""
    try:
        return resume(arg)
    except (Cancelled, StopIteration):
        return None
    except Exception as exc:  # a defect: the cancellation still reaches the caller
        log.error("memory.cancel_cleanup_failed", error=describe_error(exc))
        return None
