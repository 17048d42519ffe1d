"""Simulated agents for the outage scenarios: job senders and in-process savers.

`JobLoad`: agent threads that enqueue `memory.finalize_turn` at a steady pace; a send the broker
refuses (Redis down) is retried, as an agent would; only accepted sends count as sent.
`EnqueueLoad`: the same through the core's `enqueue_turn`, which never raises: a publish the
broker did not confirm is saved in-process instead (`fallbacks`).
`InProcessAgent`: agent threads that call `save_session_to_thread_safe` directly, retry a
`failed` outcome after a pause, and record every outcome with its time.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Self

from memory_core import RedisConversationMemory, enqueue_turn, save_session_to_thread_safe
from tests.support.snapshots import make_snapshot
from tests.support.tally import Tally
from tests.support.workers import producer, send_finalize


class _AgentThreads:
    """One daemon thread per conversation thread, running `_run(tid)` until stopped."""

    join_s = 30.0

    def __init__(self, threads: int, interval_s: float) -> None:
        self.tids = [uuid.uuid4() for _ in range(threads)]
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(tid,), daemon=True) for tid in self.tids
        ]

    def _run(self, tid: uuid.UUID) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        for t in self.threads:
            t.start()
        return self

    def running(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            if t.ident is not None:  # started: a load stopped before its start has none to join
                t.join(self.join_s)


class JobLoad(_AgentThreads):
    """`query(k, n)`, if given, is the user query of turn n of the k-th thread."""

    def __init__(
        self,
        threads: int,
        interval_s: float,
        *,
        max_turns: int | None = None,
        query: Callable[[int, int], str] | None = None,
    ) -> None:
        super().__init__(threads, interval_s)
        self.max_turns = max_turns
        self.query = query
        self.tally = Tally(sent={})
        self.sent_at: dict[str, float] = {}  # session_id -> time.monotonic() of the send
        self.task_sessions: dict[str, str] = {}  # task id -> session_id, of accepted sends
        self.send_failures = 0

    def _snapshot(self, tid: uuid.UUID, n: int) -> dict[str, Any]:
        if self.query is None:
            return make_snapshot(tid, n)
        return make_snapshot(tid, n, user_query=self.query(self.tids.index(tid), n))

    def _run(self, tid: uuid.UUID) -> None:
        app = producer()  # one broker connection per agent thread
        n = 0
        while not self.stopping.is_set() and (self.max_turns is None or n < self.max_turns):
            n += 1
            snap = self._snapshot(tid, n)
            while True:
                try:
                    task_id = send_finalize(app, snap)
                    break
                except Exception:  # the broker is down: an agent retries the send
                    with self.lock:
                        self.send_failures += 1
                    if self.stopping.wait(0.2):
                        return
            with self.lock:
                self.tally.sent[snap["session_id"]] = tid
                self.sent_at[snap["session_id"]] = time.monotonic()
                self.task_sessions[task_id] = snap["session_id"]
            self.stopping.wait(self.interval_s)


class EnqueueLoad(_AgentThreads):
    """`max_turns` turns per thread through `enqueue_turn(broker_url=...)`: `tally.sent` holds
    every turn handed over; `enqueued` those the broker confirmed, `fallbacks` the others."""

    def __init__(self, threads: int, interval_s: float, *, max_turns: int, broker_url: str):
        super().__init__(threads, interval_s)
        self.max_turns, self.broker_url = max_turns, broker_url
        self.tally = Tally(sent={})
        self.enqueued: dict[str, float] = {}  # session_id -> time.monotonic() of the confirm
        self.fallbacks: dict[str, str] = {}  # session_id -> the in-process save's status

    def _run(self, tid: uuid.UUID) -> None:
        memory = RedisConversationMemory()
        for n in range(1, self.max_turns + 1):
            if self.stopping.is_set():
                return
            snap = make_snapshot(tid, n)
            out = enqueue_turn(snap, memory=memory, broker_url=self.broker_url)
            with self.lock:
                self.tally.sent[snap["session_id"]] = tid
                if out.status == "enqueued":
                    self.enqueued[snap["session_id"]] = time.monotonic()
                else:
                    self.fallbacks[snap["session_id"]] = out.status
            self.stopping.wait(self.interval_s)


@dataclass(frozen=True)
class Outcome:
    started: float
    ended: float
    status: str  # saved | duplicate | failed | rejected | raised
    cache: str | None
    session_id: str
    thread_id: uuid.UUID
    seq: int | None


class InProcessAgent(_AgentThreads):
    join_s = 60.0

    def __init__(self, threads: int, interval_s: float) -> None:
        self.outcomes: list[Outcome] = []
        self.errors: list[str] = []
        super().__init__(threads, interval_s)

    @property
    def tally(self) -> Tally:
        """Every turn this agent has handed to the core at least once."""
        return Tally(sent={o.session_id: o.thread_id for o in self.outcomes})

    def save(self, memory: RedisConversationMemory, snap: dict[str, Any]) -> Outcome:
        t0 = time.monotonic()
        status: str  # a SaveOutcome's, or "raised"
        try:
            out = save_session_to_thread_safe(snap, memory=memory)
            status, cache, seq = out.status, out.cache, out.seq
        except Exception as exc:  # the core promises never to raise into the agent
            status, cache, seq = "raised", None, None
            with self.lock:
                self.errors.append(repr(exc))
        outcome = Outcome(
            t0,
            time.monotonic(),
            status,
            cache,
            snap["session_id"],
            uuid.UUID(snap["thread_id"]),
            seq,
        )
        with self.lock:
            self.outcomes.append(outcome)
        return outcome

    def _run(self, tid: uuid.UUID) -> None:
        memory = RedisConversationMemory()
        n = 0
        while not self.stopping.is_set():
            n += 1
            snap = make_snapshot(tid, n)
            give_up_at = float("inf")
            while self.save(memory, snap).status == "failed":
                # The agent retries the same turn; after stop() it still tries for a minute.
                if self.stopping.is_set():
                    give_up_at = min(give_up_at, time.monotonic() + 60)
                if time.monotonic() > give_up_at:
                    return
                time.sleep(0.25)
            self.stopping.wait(self.interval_s)
