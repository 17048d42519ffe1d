"""Poll until something holds: the one waiting loop of dev services, the demo, benches and tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DIAGNOSTICS_CHARS = 6000  # the tail of a long log is what explains a timeout


class WaitTimeout(RuntimeError):
    """What was awaited did not happen in time; the message says what, and shows diagnostics."""


def wait_for(
    predicate: Callable[[], T | None],
    timeout_s: float,
    what: str,
    diagnostics: Callable[[], str] | None = None,
    interval_s: float = 0.1,
) -> T:
    """Call `predicate` every `interval_s` until it returns something truthy, and return that.

    Raises `WaitTimeout` ("timed out after ...s waiting for <what>", then the tail of
    `diagnostics()`) once `timeout_s` has passed. Errors raised by `predicate` propagate: a
    predicate can fail fast (a process that exited, say) instead of waiting out the timeout.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = "\n" + diagnostics()[-DIAGNOSTICS_CHARS:] if diagnostics else ""
            raise WaitTimeout(f"timed out after {timeout_s:g}s waiting for {what}{extra}")
        time.sleep(interval_s)
