"""Celery task events as Flower receives them: an `EventReceiver` on the broker, in a thread."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from celery import Celery

from memory_core.devservices.poll import wait_for


class TaskEvents:
    """Every Celery event on `url` from `start()` on; `stop()` ends the receiver."""

    def __init__(self, url: str) -> None:
        self.app = Celery("test-task-events", broker=url, set_as_current=False)
        self.events: list[dict[str, Any]] = []
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self.events.append})
            try:
                self._receiver.capture(limit=None, timeout=None, wakeup=False)
            except Exception:  # the broker went away under it (a vhost dropped at teardown)
                if not self._receiver.should_stop:
                    raise

    def start(self) -> TaskEvents:
        self._thread.start()
        probe = f"probe-{uuid.uuid4().hex}"

        def seen() -> bool:  # subscribed: our own event comes back
            with self.app.connection_for_write() as conn:
                self.app.events.Dispatcher(conn).send("task-probe", uuid=probe)
            return any(e.get("uuid") == probe for e in self.events)

        wait_for(seen, 30, "the event receiver")
        return self

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(10)
        self.app.close()

    def of(self, task_id: str) -> list[dict[str, Any]]:
        return [e for e in list(self.events) if e.get("uuid") == task_id]

    def types(self, task_id: str) -> set[str]:
        return {str(e.get("type")) for e in self.of(task_id)}


def strings(value: Any) -> list[str]:
    """Every string inside an event (keys and values, nested)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*strings(k), *strings(v))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in strings(v)]
    return []
