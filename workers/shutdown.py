"""Shutdown signals handled where the worker's event loop holds no lock, not wherever they land.

Celery runs its whole cold/soft shutdown inside the Python signal handler (`on_cold_shutdown`,
what SIGTERM means with REMAP_SIGTERM=SIGQUIT; also SIGQUIT and a second SIGINT): it sleeps
`worker_soft_shutdown_timeout`, cancels the running jobs and joins the pool, all in the main
thread, on top of whatever code the signal interrupted. If that code holds a non-reentrant lock
the shutdown needs, the worker waits for itself forever. It does: kombu's `Hub._ready_lock` is
held for a moment by every `Hub.call_soon` (each ack, each buffered task event) and by every loop
iteration, and cancelling a running job sends a `task-cancelled` event, which calls
`Hub.call_soon`. Celery's event dispatcher mutex (held for a whole PUBLISH round trip, the
likeliest place for a signal to land) is another: the handler flushes events through it once 24
are buffered. The log then ends at "Initiating Soft Shutdown, terminating in N seconds" and the
process never exits, on Redis and RabbitMQ alike (tests/workers/test_shutdown.py).

`DeferShutdownSignals` wraps those handlers: a signal that lands while the event loop runs only
records itself, bounds the broker sockets (as Celery's handler would) and wakes the loop through
a pipe the hub polls; the loop then runs Celery's own handler from that pipe's callback, a point
where it holds no lock. Everything else is as before: a signal that lands outside the loop
(startup, a reconnect, the shutdown itself) or during the deferred shutdown (a second Ctrl+C
must still cut it short) runs Celery's handler at once, and one recorded just before the loop
stops (a broker connection lost at the same moment) runs when this step stops.

SIGHUP ends the worker as SIGTERM does. Celery makes it a restart (an exec of the same command)
when stdout is not a terminal, and leaves it fatal otherwise; a worker that a hangup restarts
outlives the command, the supervisor or the terminal that started it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from celery import bootsteps
from celery.signals import worker_init
from celery.utils.threads import bound_open_broker_sockets
from celery.worker.consumer import Consumer
from celery.worker.worker import SHUTDOWN_SOCKET_TIMEOUT
from kombu.asynchronous.hub import Hub

Handler = Callable[[int, FrameType | None], Any]

SIGNALS = (signal.SIGTERM, signal.SIGQUIT, signal.SIGINT)
_LOOP_CODE = Hub.create_loop.__code__


def _in_event_loop(frame: FrameType | None) -> bool:
    """Whether the interrupted code runs inside the hub's loop, which polls the wake-up pipe."""
    while frame is not None:
        if frame.f_code is _LOOP_CODE:
            return True
        frame = frame.f_back
    return False


class _Deferral:
    def __init__(self) -> None:
        self.wake: tuple[int, int] | None = None  # (read, write) ends, made once per process
        self.hub: Hub | None = None  # the loop polling the pipe; None: run handlers at once
        self.consumer: Consumer | None = None
        self.pending: list[tuple[int, Handler]] = []
        self.running = False  # a deferred handler is running: later signals run at once

    def attach(self, consumer: Consumer, hub: Hub) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # an embedded worker: signals are not its own (and cannot be set here)
        if self.wake is None:
            self.wake = os.pipe()
            for fd in self.wake:
                os.set_blocking(fd, False)
        self.consumer, self.hub = consumer, hub
        hub.add_reader(self.wake[0], self.run_pending)
        self.wrap_installed()

    def detach(self) -> None:
        hub, self.hub = self.hub, None
        if hub is not None and self.wake is not None:
            with contextlib.suppress(KeyError, OSError, ValueError):
                hub.remove_reader(self.wake[0])

    def wrap_installed(self) -> None:
        for signum in SIGNALS:
            current = signal.getsignal(signum)
            if callable(current) and not hasattr(current, "deferred_original"):
                signal.signal(signum, self.deferring(current))

    def deferring(self, original: Handler) -> Handler:
        def handler(signum: int, frame: FrameType | None) -> None:
            # A signal handler: no locks, no I/O beyond one write to a non-blocking pipe.
            if self.running or self.hub is None or self.wake is None or not _in_event_loop(frame):
                original(signum, frame)
                return
            self.pending.append((signum, original))
            connection = getattr(self.consumer, "connection", None)
            if connection is not None:
                # A loop callback stuck on a silent broker must not postpone the shutdown.
                bound_open_broker_sockets(connection, SHUTDOWN_SOCKET_TIMEOUT)
            with contextlib.suppress(OSError):  # full: the loop has been woken already
                os.write(self.wake[1], b"\0")

        handler.deferred_original = original  # type: ignore[attr-defined]
        return handler

    def run_pending(self) -> None:
        """Run the recorded signals' handlers, from the loop (or when this step stops)."""
        if self.wake is not None:
            try:
                while os.read(self.wake[0], 512):
                    pass
            except BlockingIOError:
                pass
        while self.pending:
            signum, original = self.pending.pop(0)
            self.running = True
            try:
                original(signum, None)
            finally:
                self.running = False
                self.wrap_installed()  # Celery installs new handlers as the shutdown goes on


_DEFERRAL = _Deferral()


class DeferShutdownSignals(bootsteps.StartStopStep):
    """Consumer step: Celery's shutdown signal handlers run from the event loop (module doc)."""

    def register_with_event_loop(self, c: Consumer, hub: Hub) -> None:
        _DEFERRAL.attach(c, hub)

    def stop(self, c: Consumer) -> None:
        # The loop has stopped (a reconnect or the shutdown): nothing may wait for it.
        _DEFERRAL.detach()
        _DEFERRAL.run_pending()

    def shutdown(self, c: Consumer) -> None:
        _DEFERRAL.detach()


def _hangup_as_sigterm(signum: int, frame: FrameType | None) -> Any:
    handler = signal.getsignal(signal.SIGTERM)  # Celery's current one, wrapped as above
    if callable(handler):
        return handler(signum, frame)
    raise SystemExit(128 + signum)


@worker_init.connect
def _end_on_hangup(sender: Any = None, **_: Any) -> None:
    """Install SIGHUP = SIGTERM right after Celery installs its handlers (`on_start`)."""
    tweaks = getattr(sender, "install_platform_tweaks", None)
    if tweaks is None or threading.current_thread() is not threading.main_thread():
        return

    def install_platform_tweaks(worker: Any) -> None:
        tweaks(worker)
        signal.signal(signal.SIGHUP, _hangup_as_sigterm)

    sender.install_platform_tweaks = install_platform_tweaks
