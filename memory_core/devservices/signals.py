"""A command that starts processes ends them on SIGTERM, SIGINT and SIGHUP alike.

`ending_on_signals()` installs one handler for the three (main thread only). Once `arm()`ed,
the first signal raises `Interrupted` (a KeyboardInterrupt) where the main thread is, so its
`finally` blocks stop what was started; later signals are only recorded: a stop under way is
never cut short. Inside `deferred()` (a process started and recorded as one step, or a stop)
a signal is recorded, and raised when the step ends: nothing is started and left unrecorded.
Without `ending_on_signals()`, `deferred()` changes nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

ENDING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """The command was told to end by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _Guard:
    def __init__(self) -> None:
        self.installed = False
        self.armed = False
        self.raised = False
        self.depth = 0
        self.received: int | None = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.armed and not self.depth:
            self.raise_once()

    def raise_once(self) -> None:
        if self.received is not None and not self.raised:
            self.raised = True
            raise Interrupted(self.received)


_GUARD = _Guard()


@contextlib.contextmanager
def ending_on_signals() -> Iterator[_Guard]:
    """Handle ENDING for the duration (see the module doc); the previous handlers after."""
    if threading.current_thread() is not threading.main_thread():
        yield _GUARD
        return
    previous: dict[signal.Signals, Any] = {s: signal.getsignal(s) for s in ENDING}
    _GUARD.__init__()  # type: ignore[misc]  # a fresh state per command
    for signum in ENDING:
        signal.signal(signum, _GUARD.handler)
    _GUARD.installed = True
    try:
        yield _GUARD
    finally:
        _GUARD.armed = False
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _GUARD.installed = False


def arm() -> None:
    """From now on the first signal raises `Interrupted`; one already received raises now."""
    _GUARD.armed = _GUARD.installed
    if _GUARD.armed and not _GUARD.depth:
        _GUARD.raise_once()


def received() -> int | None:
    """The first ending signal received since `ending_on_signals()`, if any."""
    return _GUARD.received if _GUARD.installed else None


@contextlib.contextmanager
def deferred(*, raise_after: bool = True) -> Iterator[None]:
    """A step a signal must not cut in two; the signal is raised when it ends (`raise_after`)."""
    main = threading.current_thread() is threading.main_thread()
    if main:
        _GUARD.depth += 1
    try:
        yield
    finally:
        if main:
            _GUARD.depth -= 1
            if raise_after and _GUARD.armed and not _GUARD.depth:
                _GUARD.raise_once()
